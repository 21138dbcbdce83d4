// The image pipeline against the transformers 5.17 processor on every committed test image
// (tests/fixtures/images/, references in tests/fixtures/image_refs/ written by
// tools/reference/image_refs.py on the GPU machine):
//   * decode + convert("RGB"): PIL's mode, size, and the RGB8 bytes identical (sha256);
//   * smart_resize: resized size and image_grid_thw identical;
//   * resize: every stored row of the reference's uint8 image within one level, and the
//     fraction bit-identical reported (aim: all of it);
//   * pixel_values: patchify(reference uint8) reproduces the reference tensor bit for bit
//     (crc32), and ours is within tol::kPixelAbs of it elementwise.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/mmap.h"
#include "image/image.h"
#include "io/download_sha256.h"
#include "support/test_support.h"
#include "support/tolerances.h"

namespace qvl::image {
namespace {

using nlohmann::json;

uint32_t crc_of(const void* p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  const auto* b = static_cast<const Bytef*>(p);
  while (n > 0) {  // zlib's length is a uInt
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, b, chunk);
    b += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Refs {
  json j;
  bool ok = false;
};

const Refs& refs() {
  static Refs r = [] {
    Refs out;
    std::ifstream in(test::fixture_path("image_refs/refs.json"));
    if (!in) return out;
    out.j = json::parse(in);
    out.ok = true;
    return out;
  }();
  return r;
}

#define REQUIRE_REFS()                                                                                            \
  if (!refs().ok)                                                                                                 \
  GTEST_SKIP() << "fixture tests/fixtures/image_refs/refs.json missing: run tools/reference/make_test_images.py " \
                  "and tools/reference/image_refs.py on the GPU machine"

// Hex SHA-256 of decoded pixels (io/download_sha256.h; its known answers are in download_test).
std::string pixels_sha256(const std::vector<uint8_t>& px) {
  return sha256_hex(std::string_view(reinterpret_cast<const char*>(px.data()), px.size()));
}

TEST(ImageGolden, AtLeastThirtyImagesCoverEveryFormat) {
  REQUIRE_REFS();
  const json& images = refs().j["images"];
  EXPECT_GE(images.size(), 30u);
  std::set<std::string> modes;
  for (const json& e : images) modes.insert(e["format"].get<std::string>() + "/" + e["mode"].get<std::string>());
  for (const char* m : {"JPEG/RGB", "JPEG/L", "JPEG/CMYK", "PNG/1", "PNG/L", "PNG/I;16", "PNG/P", "PNG/LA", "PNG/RGB",
                        "PNG/RGBA", "WEBP/RGB", "WEBP/RGBA"})
    EXPECT_TRUE(modes.count(m)) << "no test image in " << m;
}

TEST(ImageGolden, EveryImageMatchesTheReferenceProcessor) {
  REQUIRE_REFS();
  const PreprocessOptions opts;
  int64_t compared = 0, identical = 0;
  int decode_mismatches = 0, images_not_identical = 0;
  for (const json& e : refs().j["images"]) {
    const std::string name = e["name"];
    SCOPED_TRACE(name);
    auto file = MappedFile::open(test::fixture_path("images/" + name));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto decoded = decode_image(file.value()->bytes());
    ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
    const DecodedImage& d = decoded.value();

    // Decode + convert("RGB").
    EXPECT_EQ(image_format_name(d.info.format), e["format"].get<std::string>());
    EXPECT_EQ(d.info.mode, e["mode"].get<std::string>());
    ASSERT_EQ(d.rgb.width, e["width"].get<int>());
    ASSERT_EQ(d.rgb.height, e["height"].get<int>());
    const bool decode_same = pixels_sha256(d.rgb.pixels) == e["rgb_sha256"].get<std::string>();
    EXPECT_TRUE(decode_same) << "decoded RGB8 differs from PIL's convert(\"RGB\")";
    decode_mismatches += !decode_same;

    // smart_resize and the grid.
    auto target = target_size(d.rgb.height, d.rgb.width, opts);
    ASSERT_TRUE(target.is_ok()) << target.status().to_string();
    const int rh = e["resized_height"], rw = e["resized_width"];
    ASSERT_EQ(target->height, rh);
    ASSERT_EQ(target->width, rw);
    const std::vector<int> grid = e["image_grid_thw"];
    ASSERT_EQ(grid, (std::vector<int>{1, rh / 16, rw / 16}));

    // The uint8 resize, against the stored rows of the reference.
    const RgbImage ours = resize_bicubic_antialias(d.rgb, rh, rw);
    if (e.value("resized_is_decoded", false)) {
      // Same size: the reference's uint8 image is its decode, so equality is the sha256 check.
      ASSERT_EQ(rh, d.rgb.height);
      ASSERT_EQ(rw, d.rgb.width);
      const bool same_as_ref = pixels_sha256(d.rgb.pixels) == e["resized_sha256"].get<std::string>();
      EXPECT_TRUE(same_as_ref);
      const int64_t n = static_cast<int64_t>(d.rgb.pixels.size());
      compared += n;
      identical += same_as_ref ? n : 0;
      images_not_identical += !same_as_ref;
      const PreparedImage mine = patchify(d.rgb, opts);
      EXPECT_EQ(crc_of(mine.pixel_values.data(), mine.pixel_values.size() * 4), e["pv_crc32"].get<uint32_t>());
      std::printf("[ image    ] %-32s %-4s %-5s %5dx%-5d    unchanged size, %s\n", name.c_str(),
                  image_format_name(d.info.format), d.info.mode.c_str(), d.rgb.width, d.rgb.height,
                  same_as_ref ? "identical" : "DIFFERENT");
      continue;
    }
    std::vector<int> rows;
    if (e.contains("resized_rows")) {
      rows = e["resized_rows"].get<std::vector<int>>();
    } else {
      for (int y = 0; y < rh; ++y) rows.push_back(y);
    }
    const std::string z = slurp(test::fixture_path("image_refs/resized/" + name + ".u8z"));
    std::vector<uint8_t> ref(rows.size() * static_cast<size_t>(rw) * 3);
    uLongf ref_len = ref.size();
    ASSERT_EQ(uncompress(ref.data(), &ref_len, reinterpret_cast<const Bytef*>(z.data()), z.size()), Z_OK);
    ASSERT_EQ(ref_len, ref.size());
    int max_diff = 0;
    int64_t same = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const uint8_t* a = ours.pixels.data() + static_cast<size_t>(rows[r]) * rw * 3;
      const uint8_t* b = ref.data() + r * static_cast<size_t>(rw) * 3;
      for (int k = 0; k < rw * 3; ++k) {
        const int diff = std::abs(int(a[k]) - int(b[k]));
        max_diff = std::max(max_diff, diff);
        same += diff == 0;
      }
    }
    const int64_t n = static_cast<int64_t>(ref.size());
    compared += n;
    identical += same;
    // One uint8 level is the tolerance on pixel_values: |d| / 127.5 <= kPixelAbs.
    EXPECT_LE(max_diff / 127.5, test::tol::kPixelAbs) << "resized uint8 differs by " << max_diff << " levels";
    const bool resized_same = pixels_sha256(ours.pixels) == e["resized_sha256"].get<std::string>();
    images_not_identical += !resized_same;

    // pixel_values: our patchify of the reference uint8 must be the reference tensor exactly
    // (normalisation and order); ours must be within one level of it.
    const PreparedImage mine = patchify(ours, opts);
    ASSERT_EQ(mine.pixel_values.size(), e["pv_shape"][0].get<size_t>() * e["pv_shape"][1].get<size_t>());
    if (!e.contains("resized_rows")) {
      RgbImage ref_img{rw, rh, ref};
      const PreparedImage ref_pv = patchify(ref_img, opts);
      EXPECT_EQ(crc_of(ref_pv.pixel_values.data(), ref_pv.pixel_values.size() * 4), e["pv_crc32"].get<uint32_t>())
          << "patchify((u8 - 127.5) / 127.5) does not reproduce the reference pixel_values";
      auto cmp = test::compare_allclose(mine.pixel_values.data(), ref_pv.pixel_values.data(),
                                        static_cast<int64_t>(mine.pixel_values.size()), test::tol::kPixelAbs, 0);
      EXPECT_TRUE(cmp.ok) << cmp.message;
    } else {
      double sum = 0, sumsq = 0;
      for (float v : mine.pixel_values) sum += v, sumsq += double(v) * v;
      // Sums differ by at most one level per element; identical images agree to rounding.
      const double pv_sum = e["pv_sum"], pv_sumsq = e["pv_sumsq"];
      const double count = static_cast<double>(mine.pixel_values.size());
      EXPECT_LE(std::abs(sum - pv_sum), count * test::tol::kPixelAbs);
      if (resized_same) {
        EXPECT_NEAR(sum, pv_sum, 1e-9 * count);
        EXPECT_NEAR(sumsq, pv_sumsq, 1e-9 * count);
      }
    }
    std::printf("[ image    ] %-32s %-4s %-5s %5dx%-5d -> %5dx%-5d decode %s, resize %.4f%% identical (max %d)\n",
                name.c_str(), image_format_name(d.info.format), d.info.mode.c_str(), d.rgb.width, d.rgb.height, rw, rh,
                decode_same ? "same" : "DIFFERENT", 100.0 * same / std::max<int64_t>(n, 1), max_diff);
  }
  std::printf(
      "[ summary  ] pixel_values bit-identical: %.6f%% of %lld compared uint8 values; %d images not "
      "bit-identical; %d decode mismatches\n",
      100.0 * identical / std::max<int64_t>(compared, 1), static_cast<long long>(compared), images_not_identical,
      decode_mismatches);
}

TEST(ImageGolden, InspectImageCliReportsTheReferenceNumbers) {
  REQUIRE_REFS();
  for (const json& e : refs().j["images"]) {
    const std::string name = e["name"];
    if (name.rfind("j01", 0) != 0 && name.rfind("p13", 0) != 0) continue;
    auto r = test::run_command(test::qvl_binary() + " inspect-image --json " + test::fixture_path("images/" + name));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["mode"], e["mode"]);
    EXPECT_EQ(j["image_grid_thw"], e["image_grid_thw"]);
    EXPECT_EQ(j["tokens"], e["tokens"]);
    const double count = e["pv_shape"][0].get<double>() * e["pv_shape"][1].get<double>();
    EXPECT_NEAR(j["sum"].get<double>(), e["pv_sum"].get<double>(), count * test::tol::kPixelAbs) << name;
  }
}

}  // namespace
}  // namespace qvl::image
