// gen-model against the GPU machine: tools/reference/check_load.py records, for the tiny
// checkpoints it generated there with build-dev/qvl, each file's size and crc32, and whether
// transformers 5.17 loaded every checkpoint with no missing / unexpected / mismatched keys and
// finite logits. Here the same presets and seed are generated again and must match byte for
// byte (the generator promises identical output on every machine). Skips until the fixture
// tests/fixtures/check_load/ exists.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>

#include "unit/io_test_util.h"

namespace qvl {
namespace {

uint32_t crc32(const std::string& bytes) {  // zlib's CRC-32 (reflected 0xEDB88320), as Python's zlib.crc32
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

TEST(Crc32, MatchesZlib) {
  EXPECT_EQ(crc32("123456789"), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32(""), 0u);
}

nlohmann::json load_fixture() {
  const std::string path = test::fixture_path("check_load/check_load.json");
  if (!std::filesystem::exists(path)) return nullptr;
  return nlohmann::json::parse(test::slurp(path));
}

TEST(GenModelGolden, TransformersLoadedEveryCheckpoint) {
  auto fx = load_fixture();
  if (fx.is_null()) GTEST_SKIP() << "fixture tests/fixtures/check_load/ missing: run tools/reference/check_load.py";
  ASSERT_FALSE(fx["results"].empty());
  for (const auto& r : fx["results"]) {
    const std::string label = r.value("case", "?");
    EXPECT_TRUE(r.value("ok", false)) << label << ": " << r.dump().substr(0, 2000);
    if (!r.contains("loading_info")) continue;
    EXPECT_TRUE(r["loading_info"]["missing_keys"].empty()) << label;
    EXPECT_TRUE(r["loading_info"]["unexpected_keys"].empty()) << label;
    EXPECT_TRUE(r["keys"]["missing"].empty()) << label;
    EXPECT_TRUE(r["forward"]["text"].value("finite", false)) << label;
    EXPECT_TRUE(r["forward"]["image"].value("finite", false)) << label;
  }
}

TEST(GenModelGolden, SameBytesAsOnTheGpuMachine) {
  auto fx = load_fixture();
  if (fx.is_null()) GTEST_SKIP() << "fixture tests/fixtures/check_load/ missing: run tools/reference/check_load.py";
  const uint64_t seed = fx["seed"].get<uint64_t>();
  int compared = 0;
  for (const auto& r : fx["results"]) {
    if (!r.contains("files") || !r.contains("preset")) continue;
    const std::string preset = r["preset"].get<std::string>();
    std::string dir = test::generate_preset(preset, seed, r.value("fp8_flag", false));
    ASSERT_FALSE(dir.empty()) << preset;
    for (const auto& [name, info] : r["files"].items()) {
      const std::string bytes = test::slurp(dir + "/" + name);
      EXPECT_EQ(bytes.size(), info["bytes"].get<uint64_t>()) << preset << " " << name;
      char hex[16];
      std::snprintf(hex, sizeof(hex), "%08x", crc32(bytes));
      EXPECT_EQ(hex, info["crc32"].get<std::string>()) << preset << " " << name;
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << "the fixture has no tiny checkpoint digests";
}

}  // namespace
}  // namespace qvl
