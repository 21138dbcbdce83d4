// Truncated and bit-flipped versions of real files: the fuzz seed corpus (always present) and
// the committed test images (tests/fixtures/images/, when present). Cutting a file inside
// its image data must be an error naming the format; a flipped bit must give an error or a
// well-formed image. Run it under -DQVL_SANITIZE=ON to check memory safety as well.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "image/image.h"
#include "support/test_support.h"

namespace qvl::image {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

std::vector<fs::path> corpus_files() {
  std::vector<fs::path> files;
  const fs::path seeds = fs::path(QVL_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  for (const char* d : {"jpeg", "png", "webp"})
    if (fs::exists(seeds / d))
      for (const auto& f : fs::directory_iterator(seeds / d)) files.push_back(f.path());
  const fs::path images = test::fixture_path("images");
  if (fs::exists(images))
    for (const auto& f : fs::directory_iterator(images))
      if (f.path().extension() != "" && fs::file_size(f.path()) <= (1u << 20)) files.push_back(f.path());
  std::sort(files.begin(), files.end());
  return files;
}

Bytes read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void expect_error_or_image(const Result<DecodedImage>& r, const std::string& what) {
  if (r.is_ok()) {
    EXPECT_GT(r->rgb.width, 0) << what;
    EXPECT_EQ(r->rgb.pixels.size(), static_cast<size_t>(r->rgb.width) * r->rgb.height * 3) << what;
  } else {
    EXPECT_FALSE(r.status().message().empty()) << what;
  }
}

TEST(ImageCorpus, TruncatedFilesAreErrorsNamingTheFormat) {
  const auto files = corpus_files();
  ASSERT_GE(files.size(), 10u) << "seed corpus missing under tests/fuzz/corpus";
  for (const fs::path& f : files) {
    const Bytes full = read_bytes(f);
    auto whole = decode_image(full);
    ASSERT_TRUE(whole.is_ok()) << f << ": " << whole.status().to_string();
    const std::string format = image_format_name(whole->info.format);
    // Cuts well inside the image data (the first half of the file).
    for (size_t cut : {size_t(1), size_t(7), size_t(16), full.size() / 4, full.size() / 2}) {
      if (cut >= full.size()) continue;
      auto r = decode_image(Bytes(full.begin(), full.begin() + cut));
      ASSERT_FALSE(r.is_ok()) << f << " cut at " << cut << " of " << full.size();
      const std::string& m = r.status().message();
      // Very short prefixes cannot be recognised at all; longer ones name the format.
      if (cut >= 16) {
        EXPECT_NE(m.find(format), std::string::npos) << f << " cut " << cut << ": " << m;
      }
    }
    // Cuts near the end may lose only trailing chunks/markers: an error or an image.
    for (size_t back : {size_t(1), size_t(2), size_t(13)})
      if (back < full.size()) expect_error_or_image(decode_image(Bytes(full.begin(), full.end() - back)), f.string());
  }
}

TEST(ImageCorpus, BitFlipsGiveErrorsOrWellFormedImages) {
  int errors = 0, images = 0;
  for (const fs::path& f : corpus_files()) {
    const Bytes full = read_bytes(f);
    const size_t step = std::max<size_t>(1, full.size() / 48);
    for (size_t i = 0; i < full.size(); i += step) {
      Bytes g = full;
      g[i] ^= static_cast<uint8_t>(1u << (i % 8));
      auto r = decode_image(g);
      expect_error_or_image(r, f.string() + " flip at " + std::to_string(i));
      (r.is_ok() ? images : errors) += 1;
    }
  }
  // Both outcomes occur: header/marker damage is caught, entropy-coded damage decodes.
  EXPECT_GT(errors, 0);
  EXPECT_GT(images, 0);
}

}  // namespace
}  // namespace qvl::image
