// smart_resize, qvl's caps, normalisation and patchify: the processor steps after decoding.
// Numbers follow transformers 5.17 qwen2_vl/image_processing_qwen2_vl.py and
// image_processing_backends.py (TorchvisionBackend) line by line; see image.h.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "core/check.h"
#include "image/buffer.h"
#include "image/decoders.h"
#include "image/image.h"

namespace qvl::image {
namespace {

// Python's round() of the exact quotient n / d (n, d > 0): nearest, ties to even. The
// reference rounds the double n / d; for the sizes allowed here (< 2^26) the double is close
// enough to the exact quotient that no tie is created or destroyed.
int64_t round_half_even_div(int64_t n, int64_t d) {
  int64_t q = n / d, r = n % d;
  if (2 * r > d) return q + 1;
  if (2 * r == d) return q + (q & 1);
  return q;
}

// The shrink branch of smart_resize: floor against max_pixels, never below one factor.
ResizeTarget shrink_to(int height, int width, int factor, int64_t max_pixels) {
  double beta = std::sqrt(static_cast<double>(static_cast<int64_t>(height) * width) / static_cast<double>(max_pixels));
  int64_t h = static_cast<int64_t>(std::floor(static_cast<double>(height) / beta / factor)) * factor;
  int64_t w = static_cast<int64_t>(std::floor(static_cast<double>(width) / beta / factor)) * factor;
  return {static_cast<int>(std::max<int64_t>(factor, h)), static_cast<int>(std::max<int64_t>(factor, w))};
}

// (u8 - 127.5f) / 127.5f for every byte, in float32 exactly as torch computes
// normalize(x.float(), mean=0.5*255, std=0.5*255): a subtraction (exact) then a correctly
// rounded division. A table keeps the per-pixel work to one load.
const std::array<float, 256>& normalize_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    const float mean = 127.5f, std_dev = 127.5f;
    for (int v = 0; v < 256; ++v) {
      const float centered = static_cast<float>(v) - mean;  // exact
      t[v] = centered / std_dev;                            // IEEE division, as torch's div_
    }
    return t;
  }();
  return table;
}

}  // namespace

int64_t PreprocessOptions::effective_max_pixels() const {
  int64_t m = max_pixels;
  if (max_image_pixels > 0) m = std::min(m, max_image_pixels);
  if (max_image_tokens > 0) m = std::min(m, max_image_tokens * factor() * factor());
  return m;
}

int64_t PreprocessOptions::effective_min_pixels() const {
  return std::min(min_pixels, effective_max_pixels());
}

Status PreprocessOptions::validate() const {
  if (patch_size <= 0 || merge_size <= 0 || temporal_patch_size <= 0)
    return invalid_argument("image options: patch_size " + std::to_string(patch_size) + ", merge_size " +
                            std::to_string(merge_size) + ", temporal_patch_size " +
                            std::to_string(temporal_patch_size) + " must all be positive");
  const int64_t one_token = static_cast<int64_t>(factor()) * factor();
  if (min_pixels <= 0 || max_pixels < one_token)
    return invalid_argument("image options: min_pixels " + std::to_string(min_pixels) + " must be positive and " +
                            "max_pixels " + std::to_string(max_pixels) + " at least one token (" +
                            std::to_string(one_token) + " pixels)");
  if (max_image_pixels < 0 || (max_image_pixels > 0 && max_image_pixels < one_token))
    return invalid_argument("--max-image-pixels " + std::to_string(max_image_pixels) + " is below one image token (" +
                            std::to_string(one_token) + " pixels)");
  if (max_image_tokens < 0)
    return invalid_argument("--max-image-tokens " + std::to_string(max_image_tokens) + " must not be negative");
  return Status::ok();
}

Result<ResizeTarget> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
  if (height <= 0 || width <= 0)
    return invalid_argument("image size " + std::to_string(width) + "x" + std::to_string(height) + " must be positive");
  QVL_CHECK_GT(factor, 0);
  const int64_t long_side = std::max(height, width), short_side = std::min(height, width);
  // max/min > 200 in Python's float division; exact as an integer comparison for these sizes.
  if (long_side > 200 * short_side)
    return invalid_argument("image " + std::to_string(width) + "x" + std::to_string(height) +
                            ": absolute aspect ratio must be at most 200, got " +
                            std::to_string(static_cast<double>(long_side) / static_cast<double>(short_side)));
  int64_t h_bar = round_half_even_div(height, factor) * factor;
  int64_t w_bar = round_half_even_div(width, factor) * factor;
  if (h_bar * w_bar > max_pixels) {
    return shrink_to(height, width, factor, max_pixels);
  } else if (h_bar * w_bar < min_pixels) {
    double beta =
        std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(static_cast<int64_t>(height) * width));
    h_bar = static_cast<int64_t>(std::ceil(static_cast<double>(height) * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(static_cast<double>(width) * beta / factor)) * factor;
  }
  return ResizeTarget{static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

Result<ResizeTarget> target_size(int height, int width, const PreprocessOptions& options) {
  QVL_RETURN_IF_ERROR(options.validate());
  const int64_t max_px = options.effective_max_pixels();
  QVL_ASSIGN_OR_RETURN(ResizeTarget t,
                       smart_resize(height, width, options.factor(), options.effective_min_pixels(), max_px));
  const bool capped = max_px < options.max_pixels;
  if (capped && static_cast<int64_t>(t.height) * t.width > max_px)
    t = shrink_to(height, width, options.factor(), max_px);
  return t;
}

Result<ImagePlan> plan_image(std::span<const uint8_t> data, const DecodeLimits& limits,
                             const PreprocessOptions& options) {
  ImagePlan plan;
  QVL_ASSIGN_OR_RETURN(plan.info, probe_image(data, limits));
  QVL_ASSIGN_OR_RETURN(plan.resized, target_size(plan.info.height, plan.info.width, options));
  plan.grid_h = plan.resized.height / options.patch_size;
  plan.grid_w = plan.resized.width / options.patch_size;
  plan.num_tokens = plan.num_patches() / (static_cast<int64_t>(options.merge_size) * options.merge_size);
  return plan;
}

void patchify_into(const uint8_t* rgb, int height, int width, int patch, int merge, int temporal, float* out) {
  const int p = patch, m = merge, tps = temporal;
  QVL_CHECK(p > 0 && m > 0 && tps > 0 && height % (p * m) == 0 && width % (p * m) == 0)
      << "patchify needs multiples of " << p * m << ", got " << width << "x" << height;
  const int grid_w = width / p;
  const int64_t n_patches = static_cast<int64_t>(height / p) * grid_w;
  const int64_t patch_dim = 3LL * tps * p * p;
  const std::array<float, 256>& lut = normalize_table();
  const int blocks_w = grid_w / m;
  const int64_t row_stride = static_cast<int64_t>(width) * 3;

  // Row order of the reference's reshape(B, C, gh/m, m, p, gw/m, m, p).permute(0,2,5,3,6,1,4,7):
  // row = ((hb * gw/m + wb) * m + hi) * m + wi, patch origin y0 = (hb*m + hi)*p, x0 = (wb*m + wi)*p;
  // column = ((c * T + t) * p + py) * p + px, the T temporal copies identical.
  // Small images stay on the calling thread (the server prepares images on request threads).
  [[maybe_unused]] const bool big = n_patches * patch_dim >= (8 << 20);
#pragma omp parallel for schedule(static) if (big)
  for (int64_t row = 0; row < n_patches; ++row) {
    const int wi = static_cast<int>(row % m);
    const int hi = static_cast<int>((row / m) % m);
    const int64_t block = row / (static_cast<int64_t>(m) * m);
    const int wb = static_cast<int>(block % blocks_w);
    const int hb = static_cast<int>(block / blocks_w);
    const int64_t y0 = static_cast<int64_t>(hb * m + hi) * p, x0 = static_cast<int64_t>(wb * m + wi) * p;
    float* out_row = out + row * patch_dim;
    for (int c = 0; c < 3; ++c) {
      float* plane = out_row + static_cast<int64_t>(c) * tps * p * p;  // t = 0
      for (int py = 0; py < p; ++py) {
        const uint8_t* s = rgb + (y0 + py) * row_stride + x0 * 3 + c;
        float* d = plane + static_cast<int64_t>(py) * p;
        for (int px = 0; px < p; ++px) d[px] = lut[s[px * 3]];
      }
      for (int t = 1; t < tps; ++t) std::memcpy(plane + static_cast<int64_t>(t) * p * p, plane, sizeof(float) * p * p);
    }
  }
}

PreparedImage patchify(const RgbImage& rgb, const PreprocessOptions& options) {
  const int p = options.patch_size;
  QVL_CHECK(rgb.height % options.factor() == 0 && rgb.width % options.factor() == 0)
      << "patchify needs multiples of " << options.factor() << ", got " << rgb.width << "x" << rgb.height;
  QVL_CHECK_EQ(rgb.pixels.size(), static_cast<size_t>(rgb.height) * rgb.width * 3);
  PreparedImage out;
  out.grid_t = 1;
  out.grid_h = rgb.height / p;
  out.grid_w = rgb.width / p;
  detail::resize_large(out.pixel_values,
                       static_cast<size_t>(out.num_patches() * 3 * options.temporal_patch_size * p * p));
  patchify_into(rgb.pixels.data(), rgb.height, rgb.width, p, options.merge_size, options.temporal_patch_size,
                out.pixel_values.data());
  return out;
}

namespace {
// The resized image as it is (PreprocessOptions::rgb_output): the model patchifies it.
PreparedImage keep_rgb(RgbImage rgb, const PreprocessOptions& options) {
  QVL_CHECK(rgb.height % options.factor() == 0 && rgb.width % options.factor() == 0)
      << "the resized image must be multiples of " << options.factor() << ", got " << rgb.width << "x" << rgb.height;
  PreparedImage out;
  out.grid_t = 1;
  out.grid_h = rgb.height / options.patch_size;
  out.grid_w = rgb.width / options.patch_size;
  out.rgb = std::move(rgb.pixels);
  return out;
}
}  // namespace

Result<PreparedImage> preprocess(const RgbImage& rgb, const PreprocessOptions& options) {
  QVL_CHECK_EQ(rgb.pixels.size(), static_cast<size_t>(rgb.height) * rgb.width * 3);
  QVL_ASSIGN_OR_RETURN(ResizeTarget t, target_size(rgb.height, rgb.width, options));
  const bool same = t.height == rgb.height && t.width == rgb.width;
  if (options.rgb_output) return keep_rgb(same ? rgb : resize_bicubic_antialias(rgb, t.height, t.width), options);
  if (same) return patchify(rgb, options);
  RgbImage resized = resize_bicubic_antialias(rgb, t.height, t.width);
  return patchify(resized, options);
}

Result<PreparedImage> prepare_image(std::span<const uint8_t> data, const DecodeLimits& limits,
                                    const PreprocessOptions& options) {
  QVL_RETURN_IF_ERROR(options.validate());
  QVL_ASSIGN_OR_RETURN(ImageInfo info, probe_image(data, limits));
  // Size errors (aspect ratio, caps) before spending time on decoding.
  QVL_RETURN_IF_ERROR(target_size(info.height, info.width, options).status());
  QVL_ASSIGN_OR_RETURN(DecodedImage decoded, decode_image(data, limits));
  return preprocess(decoded.rgb, options);
}

}  // namespace qvl::image
