// The image pipeline: the bytes a user sent -> PreparedImage (engine/engine.h), producing what
// the reference produces for `processor(images=PIL.Image.open(bytes))` with transformers 5.17's
// Qwen2VLImageProcessor (torchvision backend, CPU) and the Qwen3-VL preprocessor_config:
//
//   sniff (magic bytes) -> header limits -> decode (libjpeg-turbo / libpng / libwebp)
//   -> RGB8 exactly as PIL 12.3's Image.convert("RGB") -> smart_resize -> torch's uint8
//   antialiased bicubic resize -> (u8 - 127.5) / 127.5 -> temporal duplication -> patchify.
//
// Invariants: every size limit is checked from the header before any pixel memory is
// allocated, so a decompression bomb costs nothing; every problem with the input is a Status
// that names the format and the numbers (truncated data, corrupt data, over a limit), never a
// crash or an abort; no EXIF orientation is applied (the reference applies none when it is
// handed a PIL image); alpha is dropped, not composited (PIL's convert("RGB")).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"

namespace qvl::image {

enum class ImageFormat { kJpeg, kPng, kWebp };
const char* image_format_name(ImageFormat format);  // "JPEG", "PNG", "WEBP" (PIL's names)

// Checked before decoding. Defaults allow a 64-megapixel photo; PIL's own bomb limit is
// 2 x 89,478,485 pixels.
struct DecodeLimits {
  int64_t max_file_bytes = 64ll << 20;
  int max_width = 32768;
  int max_height = 32768;
  int64_t max_pixels = 64ll << 20;
};

// What the header says, without decoding pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0, height = 0;
  // The mode PIL 12.3 gives the opened image: "1", "L", "LA", "I;16", "P", "RGB", "RGBA",
  // "CMYK" (16-bit gray+alpha PNG opens as "RGBA" in PIL, and so it is reported here).
  std::string mode;
};

// 8-bit RGB, row-major, interleaved (H, W, 3) - the layout of PIL's tobytes() / pil_to_tensor
// before its permute.
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height * width * 3
};

struct DecodedImage {
  ImageInfo info;
  RgbImage rgb;
};

// Identifies the format from the magic bytes (never the file name). Unknown or unsupported
// formats (GIF, BMP, TIFF, HEIF, AVIF, ...) are kUnimplemented naming what was recognised.
Result<ImageFormat> sniff_format(std::span<const uint8_t> data);

// Reads only the header: format, size, PIL mode; checks `limits`.
Result<ImageInfo> probe_image(std::span<const uint8_t> data, const DecodeLimits& limits = {});

// Decodes and converts to RGB8 as PIL's convert("RGB") would.
Result<DecodedImage> decode_image(std::span<const uint8_t> data, const DecodeLimits& limits = {});

// The processor's settings (preprocessor_config.json of Qwen3-VL) plus qvl's own caps.
struct PreprocessOptions {
  int64_t min_pixels = 65536;     // size.shortest_edge (a pixel count, not an edge)
  int64_t max_pixels = 16777216;  // size.longest_edge
  // qvl caps (0 = none). They lower max_pixels exactly as passing max_pixels to the
  // reference would; max_image_tokens counts merged tokens, so it is tokens x 32^2 pixels.
  // When a cap is below min_pixels the minimum is lowered to the cap, and the result never
  // exceeds the cap (see effective_max_pixels / target_size).
  int64_t max_image_pixels = 0;
  int64_t max_image_tokens = 0;
  int patch_size = 16;
  int merge_size = 2;
  int temporal_patch_size = 2;
  // preprocess() keeps the resized RGB8 image (PreparedImage::rgb) instead of expanding it into
  // f32 pixel_values: the model patchifies it where it runs (Backend::patchify_rgb), moving 3
  // bytes per pixel instead of 4 x 3 x temporal_patch_size.
  bool rgb_output = false;

  int factor() const { return patch_size * merge_size; }
  int64_t effective_max_pixels() const;
  int64_t effective_min_pixels() const;
  Status validate() const;  // positive sizes, caps not below one token
};

struct ResizeTarget {
  int height = 0, width = 0;
};

// The reference's smart_resize (qwen2_vl/image_processing_qwen2_vl.py): aspect ratio > 200 is
// an error; round half to even on height/factor; shrink by sqrt(H*W/max) with floor, or grow
// by sqrt(min/(H*W)) with ceil.
Result<ResizeTarget> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);

// smart_resize with the effective bounds of `options`, then the qvl cap made hard (the grow
// branch's ceil may overshoot a cap that sits near min_pixels; then the shrink formula
// against the cap is used).
Result<ResizeTarget> target_size(int height, int width, const PreprocessOptions& options);

// Header-only plan for a request: lets the server count image tokens and reject over-limit
// images before decoding anything.
struct ImagePlan {
  ImageInfo info;
  ResizeTarget resized;
  int grid_t = 1, grid_h = 0, grid_w = 0;
  int64_t num_patches() const { return static_cast<int64_t>(grid_t) * grid_h * grid_w; }
  int64_t num_tokens = 0;  // num_patches / merge_size^2: the <|image_pad|> run length
};
Result<ImagePlan> plan_image(std::span<const uint8_t> data, const DecodeLimits& limits,
                             const PreprocessOptions& options);

// torchvision 0.26 resize(uint8 [3,H,W], (out_h, out_w), BICUBIC, antialias=True) on CPU, bit
// for bit: torch's separable uint8 kernel (int16 fixed-point weights, horizontal pass then
// vertical pass, each rounded and clamped to uint8). Same size returns a copy.
RgbImage resize_bicubic_antialias(const RgbImage& src, int out_height, int out_width);

// Resized image -> pixel_values [grid_t*grid_h*grid_w, 3*T*p*p] in the reference's order,
// (u8 - 127.5f) / 127.5f in float32. `rgb` must already have the target size (multiples of
// factor()).
PreparedImage patchify(const RgbImage& rgb, const PreprocessOptions& options);

// The same for a bare (height, width, 3) RGB8 buffer into out [height/patch * width/patch,
// 3 * temporal * patch^2] (height and width multiples of patch * merge); the CPU backend's
// patchify_rgb and patchify() share it.
void patchify_into(const uint8_t* rgb, int height, int width, int patch, int merge, int temporal, float* out);

// RGB8 -> PreparedImage: target_size, resize, normalize, patchify.
Result<PreparedImage> preprocess(const RgbImage& rgb, const PreprocessOptions& options);

// Everything: bytes -> PreparedImage.
Result<PreparedImage> prepare_image(std::span<const uint8_t> data, const DecodeLimits& limits,
                                    const PreprocessOptions& options);

// <|image_pad|> tokens for a prepared image: t*h*w / merge_size^2.
inline int64_t image_token_count(const PreparedImage& image, int merge_size = 2) {
  return image.num_patches() / (static_cast<int64_t>(merge_size) * merge_size);
}

}  // namespace qvl::image
