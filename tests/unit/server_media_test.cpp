// Media policy: base64 (RFC 4648 §10 vectors), data URIs, file:// confinement to the allowed
// directory (symlinks and .. included), and URL fetching being off unless enabled.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "server/media.h"
#include "support/test_support.h"

namespace qvl::server {
namespace {

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"Zg==", "f"},
                                                         {"Zm8=", "fo"},
                                                         {"Zm9v", "foo"},
                                                         {"Zm9vYg==", "foob"},
                                                         {"Zm9vYmE=", "fooba"},
                                                         {"Zm9vYmFy", "foobar"}};
  for (auto [encoded, plain] : vectors) {
    auto r = base64_decode(encoded);
    ASSERT_TRUE(r.is_ok()) << encoded;
    EXPECT_EQ(r.value(), plain) << encoded;
  }
  // Padding may be omitted, and line breaks (MIME style) are skipped.
  EXPECT_EQ(base64_decode("Zm9vYg").value(), "foob");
  EXPECT_EQ(base64_decode("Zm9v\r\nYmFy").value(), "foobar");
}

TEST(Base64, RejectsBadInputWithOffset) {
  auto r = base64_decode("Zm9v*mFy");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "invalid base64: '*' at offset 4");
  r = base64_decode("Zg==Zg==");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "invalid base64: data after '=' padding at offset 4");
  r = base64_decode("Zm9vY");  // 5 symbols: the last carries only 6 bits
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "invalid base64: 5 symbols is not a valid length");
}

TEST(Media, DataUris) {
  MediaPolicy policy;
  policy.max_image_bytes = 6;
  EXPECT_EQ(load_image_bytes("data:image/png;base64,Zm9vYmFy", policy).value(), "foobar");
  EXPECT_EQ(load_image_bytes("DATA:image/jpeg;BASE64,Zm9v", policy).value(), "foo");
  auto r = load_image_bytes("data:text/plain;base64,Zm9v", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "data URI has media type 'text/plain'; expected image/*");
  r = load_image_bytes("data:image/png,rawbytes", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "data URI 'data:image/png,rawbytes' must be base64-encoded (data:image/...;base64,...)");
  r = load_image_bytes("data:image/png;base64,Zm9v!!", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "data URI: invalid base64: '!' at offset 4");
  // 12 base64 symbols decode to 9 bytes > 6.
  r = load_image_bytes("data:image/png;base64,Zm9vYmFyYmF6", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(), "image data is 9 bytes; the limit is 6 bytes");
  r = load_image_bytes("ftp://example.com/x.png", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "image URL 'ftp://example.com/x.png' has an unsupported scheme (expected data:, file:// or http(s)://)");
}

TEST(Media, FileUrlsStayInsideTheAllowedDirectory) {
  namespace fs = std::filesystem;
  const std::string root = test::scratch_dir("media_files");
  const std::string allowed = root + "/allowed";
  fs::create_directories(allowed + "/sub");
  std::ofstream(allowed + "/sub/a b.png") << "IMGDATA";
  std::ofstream(root + "/secret.png") << "SECRET";
  fs::create_symlink(root + "/secret.png", allowed + "/link.png");
  fs::create_symlink(allowed + "/sub/a b.png", allowed + "/inside_link.png");

  MediaPolicy off;
  auto r = load_image_bytes("file://" + allowed + "/sub/a%20b.png", off);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "file:// image URLs are disabled on this server (start it with --allowed-media-dir DIR)");

  MediaPolicy on;
  on.allowed_media_dir = allowed;
  EXPECT_EQ(load_image_bytes("file://" + allowed + "/sub/a%20b.png", on).value(), "IMGDATA");
  EXPECT_EQ(load_image_bytes("file://localhost" + allowed + "/inside_link.png", on).value(), "IMGDATA");
  const std::string outside = "' is outside the allowed media directory (--allowed-media-dir)";
  r = load_image_bytes("file://" + allowed + "/../secret.png", on);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image file '" + allowed + "/../secret.png" + outside);
  r = load_image_bytes("file://" + allowed + "/link.png", on);  // symlink pointing out
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image file '" + allowed + "/link.png" + outside);
  r = load_image_bytes("file:///etc/passwd", on);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image file '/etc/passwd" + outside);
  r = load_image_bytes("file://" + allowed + "/missing.png", on);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  r = load_image_bytes("file://" + allowed + "/sub", on);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image file '" + allowed + "/sub' is not a regular file");
  // A directory whose name merely starts with the allowed one is outside it.
  fs::create_directories(allowed + "2");
  std::ofstream(allowed + "2/x.png") << "X";
  r = load_image_bytes("file://" + allowed + "2/x.png", on);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image file '" + allowed + "2/x.png" + outside);
  on.max_image_bytes = 3;
  r = load_image_bytes("file://" + allowed + "/sub/a%20b.png", on);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image file '" + allowed + "/sub/a b.png' is 7 bytes; the limit is 3 bytes");
}

TEST(Media, UrlFetchIsOffByDefault) {
  MediaPolicy policy;
  auto r = load_image_bytes("http://127.0.0.1:1/cat.png", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "image URL 'http://127.0.0.1:1/cat.png' refused: fetching http(s) image URLs is disabled on this server "
            "(start it with --allow-url-fetch), send the image as a data: URI instead");
}

TEST(Media, UrlFetchWithLimits) {
  httplib::Server origin;
  origin.Get("/small.png",
             [](const httplib::Request&, httplib::Response& res) { res.set_content("IMG123", "image/png"); });
  origin.Get("/big.png", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(5000, 'x'), "image/png");
  });
  origin.Get("/moved.png", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/small.png"); });
  origin.Get("/slow.png", [](const httplib::Request&, httplib::Response& res) {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    res.set_content("IMG", "image/png");
  });
  const int port = origin.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread t([&] { origin.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);

  MediaPolicy policy;
  policy.allow_url_fetch = true;
  policy.max_image_bytes = 1000;
  policy.url_timeout_ms = 300;
  EXPECT_EQ(load_image_bytes(base + "/small.png", policy).value(), "IMG123");
  EXPECT_EQ(load_image_bytes(base + "/moved.png", policy).value(), "IMG123");
  auto r = load_image_bytes(base + "/big.png", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(), "image URL '" + base + "/big.png' is larger than the limit of 1000 bytes");
  r = load_image_bytes(base + "/missing.png", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image URL '" + base + "/missing.png' answered HTTP 404");
  r = load_image_bytes(base + "/slow.png", policy);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "image URL '" + base + "/slow.png' timed out after 300 ms");
  origin.stop();
  t.join();
}

}  // namespace
}  // namespace qvl::server
