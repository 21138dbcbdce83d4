// qvl inspect-image FILE: the image pipeline's debugging view. Prints the mode PIL would give
// the file, its size, the resized size, image_grid_thw, the token count, and the sum and sum
// of squares of pixel_values (float64 accumulation) for comparison with the reference;
// --dump writes pixel_values as raw little-endian float32, row-major [N, 1536]; --dump-rgb the
// decoded RGB8 image (what PIL's convert("RGB") gives), to tell decode from resize errors; --bench N
// times decode + preprocess N times and reports the median.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/mmap.h"
#include "image/image.h"

namespace {

struct InspectArgs {
  std::string file;
  int64_t max_image_pixels = 0;
  int64_t max_image_tokens = 0;
  std::string dump;
  std::string dump_rgb;
  bool json = false;
  int bench = 0;
};

int fail(const qvl::Status& s) {
  std::fprintf(stderr, "qvl inspect-image: %s\n", s.to_string().c_str());
  return 1;
}

int run_inspect(const InspectArgs& a) {
  using namespace qvl;
  using namespace qvl::image;
  auto mapped = MappedFile::open(a.file);
  if (!mapped.is_ok()) return fail(mapped.status());
  const std::span<const uint8_t> bytes = mapped.value()->bytes();
  PreprocessOptions opts;
  opts.max_image_pixels = a.max_image_pixels;
  opts.max_image_tokens = a.max_image_tokens;
  DecodeLimits limits;

  auto plan = plan_image(bytes, limits, opts);
  if (!plan.is_ok()) return fail(plan.status().with_context(a.file));
  auto prepared = prepare_image(bytes, limits, opts);
  if (!prepared.is_ok()) return fail(prepared.status().with_context(a.file));
  const PreparedImage& p = prepared.value();

  double sum = 0, sumsq = 0;
  for (float v : p.pixel_values) {
    sum += v;
    sumsq += static_cast<double>(v) * v;
  }
  const int64_t patch_dim = p.num_patches() ? static_cast<int64_t>(p.pixel_values.size()) / p.num_patches() : 0;

  std::vector<double> times_ms;
  for (int i = 0; i < a.bench; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto again = prepare_image(bytes, limits, opts);
    auto t1 = std::chrono::steady_clock::now();
    if (!again.is_ok()) return fail(again.status());
    times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(times_ms.begin(), times_ms.end());
  const double median_ms = times_ms.empty() ? 0 : times_ms[times_ms.size() / 2];

  if (!a.dump.empty()) {
    FILE* f = std::fopen(a.dump.c_str(), "wb");
    if (!f) return fail(not_found("cannot open --dump file " + a.dump + " for writing"));
    const size_t n = std::fwrite(p.pixel_values.data(), sizeof(float), p.pixel_values.size(), f);
    const bool ok = std::fclose(f) == 0 && n == p.pixel_values.size();
    if (!ok) return fail(internal_error("short write to " + a.dump));
  }

  if (!a.dump_rgb.empty()) {
    auto decoded = decode_image(bytes, limits);
    if (!decoded.is_ok()) return fail(decoded.status());
    const std::vector<uint8_t>& px = decoded->rgb.pixels;
    FILE* f = std::fopen(a.dump_rgb.c_str(), "wb");
    if (!f) return fail(not_found("cannot open --dump-rgb file " + a.dump_rgb + " for writing"));
    const size_t n = std::fwrite(px.data(), 1, px.size(), f);
    const bool ok = std::fclose(f) == 0 && n == px.size();
    if (!ok) return fail(internal_error("short write to " + a.dump_rgb));
  }

  const ImagePlan& pl = plan.value();
  if (a.json) {
    nlohmann::json j;
    j["file"] = a.file;
    j["format"] = image_format_name(pl.info.format);
    j["mode"] = pl.info.mode;
    j["width"] = pl.info.width;
    j["height"] = pl.info.height;
    j["resized_width"] = pl.resized.width;
    j["resized_height"] = pl.resized.height;
    j["image_grid_thw"] = {p.grid_t, p.grid_h, p.grid_w};
    j["num_patches"] = p.num_patches();
    j["patch_dim"] = patch_dim;
    j["tokens"] = image_token_count(p, opts.merge_size);
    j["sum"] = sum;
    j["sumsq"] = sumsq;
    if (a.bench > 0) j["bench"] = {{"runs", a.bench}, {"median_ms", median_ms}, {"min_ms", times_ms.front()}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("file:           %s\n", a.file.c_str());
    std::printf("format:         %s\n", image_format_name(pl.info.format));
    std::printf("mode:           %s\n", pl.info.mode.c_str());
    std::printf("size:           %dx%d (WxH)\n", pl.info.width, pl.info.height);
    std::printf("resized:        %dx%d\n", pl.resized.width, pl.resized.height);
    std::printf("image_grid_thw: [%d, %d, %d]\n", p.grid_t, p.grid_h, p.grid_w);
    std::printf("tokens:         %lld\n", static_cast<long long>(image_token_count(p, opts.merge_size)));
    std::printf("pixel_values:   [%lld, %lld] sum %.9g sumsq %.9g\n", static_cast<long long>(p.num_patches()),
                static_cast<long long>(patch_dim), sum, sumsq);
    if (a.bench > 0)
      std::printf("bench:          median %.2f ms, min %.2f ms over %d runs\n", median_ms, times_ms.front(), a.bench);
  }
  return 0;
}

std::function<int()> setup_inspect_image(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  app.add_option("file", args->file, "Image file (JPEG, PNG or WebP; the format is read from its bytes)")->required();
  app.add_option("--max-image-pixels", args->max_image_pixels, "Cap on resized pixels (0 = the model's 16777216)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-image-tokens", args->max_image_tokens, "Cap on image tokens (x 32^2 pixels; 0 = none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dump", args->dump, "Write pixel_values as raw little-endian float32 [N, 1536]");
  app.add_option("--dump-rgb", args->dump_rgb,
                 "Write the decoded image (before resizing) as raw RGB8, row-major [H, W, 3]");
  app.add_flag("--json", args->json, "Print JSON");
  app.add_option("--bench", args->bench, "Time decode + preprocess N times; report the median")
      ->check(CLI::NonNegativeNumber);
  return [args] { return run_inspect(*args); };
}

}  // namespace

QVL_REGISTER_COMMAND("inspect-image", "Decode and preprocess an image as the model sees it", setup_inspect_image);
