// The pieces of `qvl pull` (io/download*.h) without the binary: SHA-256 against the FIPS 180-4
// example vectors and coreutils' sha256sum, glob matching against Python's fnmatch rules, the
// Hub listing parser (and what it refuses), URL quoting as urllib.parse.quote, and a file
// download that meets a full disk (/dev/full), a lying server and a resumable cut.
#include "io/download.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io/download_sha256.h"
#include "unit/fake_hub.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

// FIPS 180-4 / NIST "SHA256.pdf" example messages and digests.
TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Streaming in uneven pieces (across block and padding boundaries) and hashing a file prefix
// agree with coreutils on the same bytes.
TEST(Sha256, StreamingMatchesSha256sum) {
  std::string data;
  uint32_t x = 12345;
  for (int i = 0; i < 300007; ++i) data += static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
  const std::string dir = test::temp_dir("sha256");
  test::spit(dir + "/data.bin", data);
  auto r = test::run_command("sha256sum " + dir + "/data.bin");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string expected = r.out.substr(0, 64);
  Sha256 h;
  for (size_t at = 0, step = 1; at < data.size(); at += step, step = step * 3 % 1000 + 1)
    h.update(data.data() + at, std::min(step, data.size() - at));
  EXPECT_EQ(h.finish_hex(), expected);
  for (size_t cut : {size_t{0}, size_t{55}, size_t{64}, size_t{100001}}) {
    Sha256 g;
    ASSERT_TRUE(sha256_update_from_file(g, dir + "/data.bin", cut).is_ok());
    g.update(data.data() + cut, data.size() - cut);
    EXPECT_EQ(g.finish_hex(), expected) << "prefix of " << cut;
  }
  Sha256 g;
  Status s = sha256_update_from_file(g, dir + "/data.bin", data.size() + 1);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(s.message(), "end of file after 300007 of 300008 bytes");
}

// Expected values are Python's fnmatch.fnmatchcase (which huggingface_hub's allow_patterns use).
TEST(Glob, FnmatchRules) {
  EXPECT_TRUE(glob_match("*.md", "README.md"));
  EXPECT_TRUE(glob_match("*.md", "docs/x.md"));  // '*' crosses '/'
  EXPECT_FALSE(glob_match("*.md", "README.mdx"));
  EXPECT_TRUE(glob_match("model-0000?-of-*.safetensors", "model-00002-of-00003.safetensors"));
  EXPECT_FALSE(glob_match("model-0000?-of-*.safetensors", "model-00012-of-00013.safetensors"));
  EXPECT_FALSE(glob_match("[!a]*", "abc"));
  EXPECT_TRUE(glob_match("[!a]*", "bcd"));
  EXPECT_TRUE(glob_match("[a-c]x", "bx"));
  EXPECT_FALSE(glob_match("[a-c]x", "dx"));
  EXPECT_TRUE(glob_match("a[", "a["));  // an unclosed '[' is itself
  EXPECT_TRUE(glob_match("[]]x", "]x"));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXbYbZ"));
  EXPECT_FALSE(glob_match("?", "ab"));
  EXPECT_TRUE(glob_match("", ""));
}

TEST(UrlQuote, AsUrllibQuote) {
  EXPECT_EQ(url_quote("refs/pr/1", false), "refs%2Fpr%2F1");             // quote(rev, safe="")
  EXPECT_EQ(url_quote("dir/a b+c~.json", true), "dir/a%20b%2Bc~.json");  // quote(filename)
}

const std::string kSha = "0123456789abcdef0123456789abcdef01234567";
const std::string kLfs = "3f5a2c0e0f8b0a7d8e2b1c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081";

nlohmann::json sibling(const std::string& name, uint64_t size, bool lfs) {
  nlohmann::json s = {{"rfilename", name}, {"size", size}, {"blobId", kSha}};
  if (lfs) s["lfs"] = {{"sha256", kLfs}, {"size", size}, {"pointerSize", 134}};
  return s;
}

TEST(HubListing, ParsesWhatTheHubSends) {
  nlohmann::json j = {{"id", "org/m"},
                      {"sha", kSha},
                      {"siblings", {sibling("config.json", 1234, false), sibling("sub/model.safetensors", 99, true)}}};
  auto l = parse_hub_listing(j.dump(), "U");
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_EQ(l->commit, kSha);
  ASSERT_EQ(l->files.size(), 2u);
  EXPECT_EQ(l->files[0].blob_name(), kSha);  // git files are stored under their git id
  EXPECT_EQ(l->files[0].size, 1234u);
  EXPECT_EQ(l->find("sub/model.safetensors")->blob_name(), kLfs);  // LFS files under their sha256
  EXPECT_EQ(l->find("nope"), nullptr);
}

TEST(HubListing, RefusesUnsafeOrIncompleteEntries) {
  auto message = [](nlohmann::json s) {
    nlohmann::json j = {{"sha", kSha}, {"siblings", {s}}};
    auto l = parse_hub_listing(j.dump(), "U");
    return l.is_ok() ? std::string("accepted") : l.status().message();
  };
  EXPECT_EQ(message(sibling("../evil", 1, false)), "U: file '../evil' is not a plain relative path");
  EXPECT_EQ(message(sibling("/etc/passwd", 1, false)), "U: file '/etc/passwd' is not a plain relative path");
  EXPECT_EQ(message(sibling("a//b", 1, false)), "U: file 'a//b' is not a plain relative path");
  EXPECT_EQ(message({{"rfilename", "x"}}),
            "U: file 'x' has no 'size' and 'blobId' (does the endpoint support ?blobs=true?)");
  auto s = sibling("x", 1, false);
  s["blobId"] = "ABC";
  EXPECT_EQ(message(s), "U: file 'x': blobId 'ABC' is not a lowercase hex hash");
  s = sibling("x", 5, true);
  s["lfs"]["size"] = 6;
  EXPECT_EQ(message(s), "U: file 'x': size 5 and lfs size 6 differ");
  auto bad = parse_hub_listing(R"({"sha": "main", "siblings": []})", "U");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "U: the listing's commit 'main' is not a lowercase hex hash");
}

TEST(HubListing, IndexShards) {
  auto s = index_shards(R"({"metadata": {}, "weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors",
                                                           "c": "m-2.safetensors"}})",
                        "I");
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(*s, (std::vector<std::string>{"m-1.safetensors", "m-2.safetensors"}));
  auto bad = index_shards(R"({"weight_map": {"a": "../x.safetensors"}})", "I");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "I: tensor 'a' maps to '../x.safetensors'");
}

class Download : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 100000; ++i) bytes_ += static_cast<char>('a' + i % 23);
    test::FakeHubRepo repo;
    repo.commit = kSha;
    repo.files["cut.bin"] = test::git_file(bytes_, kSha);
    repo.files["cut.bin"].cut_first = true;
    repo.files["whole.bin"] = test::git_file(bytes_, kSha);
    repo.files["norange.bin"] = test::git_file(bytes_, kSha);
    repo.files["norange.bin"].ignore_range = true;
    hub_.add("org/m", repo);
    dir_ = test::temp_dir("download");
    options_.backoff_initial_ms = 10;
  }
  std::string url(const std::string& file) { return hub_.url() + "/org/m/resolve/" + kSha + "/" + file; }

  test::FakeHub hub_;
  std::string bytes_, dir_;
  HttpOptions options_;
};

TEST_F(Download, ResumesACutTransferAndHashesTheWhole) {
  FileTransfer t;
  t.url = url("cut.bin");
  t.path = dir_ + "/cut.bin.incomplete";
  t.expected_size = bytes_.size();
  t.hash = true;
  auto r = http_download(options_, t);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->status, 206);
  EXPECT_EQ(r->bytes, bytes_.size());
  EXPECT_EQ(r->sha256, sha256_hex(bytes_));
  EXPECT_TRUE(test::slurp(t.path) == bytes_);
  auto log = hub_.requests_for("/cut.bin");
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].range, "");
  EXPECT_EQ(log[1].range, "bytes=" + std::to_string(bytes_.size() / 2) + "-");
}

// A partial file whose bytes are wrong, and a server that answers its Range request with the
// whole file: the file restarts from zero and the hash covers only what was written.
TEST_F(Download, AServerIgnoringTheRangeRestartsTheFile) {
  FileTransfer t;
  t.url = url("norange.bin");
  t.path = dir_ + "/norange.bin.incomplete";
  t.expected_size = bytes_.size();
  t.hash = true;
  test::spit(t.path, std::string(1000, 'X'));
  std::vector<uint64_t> seen;
  t.on_bytes = [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, bytes_.size());
    seen.push_back(done);
  };
  auto r = http_download(options_, t);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->sha256, sha256_hex(bytes_));
  EXPECT_TRUE(test::slurp(t.path) == bytes_);
  ASSERT_FALSE(seen.empty());
  for (uint64_t done : seen) EXPECT_LE(done, bytes_.size());  // counted from zero again, not from 1000
  EXPECT_EQ(seen.back(), bytes_.size());
  auto log = hub_.requests_for("/norange.bin");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].range, "bytes=1000-");
}

TEST_F(Download, ASizeOtherThanListedFailsAtTheHeaders) {
  FileTransfer t;
  t.url = url("whole.bin");
  t.path = dir_ + "/whole.bin.incomplete";
  t.expected_size = bytes_.size() + 3;
  auto r = http_download(options_, t);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), t.url + ": the server announces 100000 bytes, the listing says 100003");
}

TEST_F(Download, AFullDiskIsResourceExhausted) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  FileTransfer t;
  t.url = url("whole.bin");
  t.path = "/dev/full";  // every write fails with ENOSPC
  t.expected_size = bytes_.size();
  auto r = http_download(options_, t);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_CONTAINS(r.status().message(), "writing /dev/full at byte 0: No space left on device (the disk is full");
}

TEST_F(Download, HttpErrorsComeBackAsReplies) {
  FileTransfer t;
  t.url = hub_.url() + "/org/m/resolve/" + kSha + "/missing.bin";
  t.path = dir_ + "/missing.incomplete";
  auto r = http_download(options_, t);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->headers["x-error-code"], "EntryNotFound");
  EXPECT_EQ(fs::file_size(t.path), 0u);  // the error body went to the reply, not the file
}

}  // namespace
}  // namespace qvl
