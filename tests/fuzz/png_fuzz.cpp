// libFuzzer target: the PNG decoder (header probe, decode, convert to RGB8) and, for what
// decodes, the resize + patchify under a small token cap. Any input must give a Status or a
// well-formed image; ASan/UBSan catch the rest.
#include <cstddef>
#include <cstdint>
#include <span>

#include "image/decoders.h"
#include "image/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qvl::image;
  const std::span<const uint8_t> bytes(data, size);
  DecodeLimits limits;
  limits.max_pixels = 4 << 20;  // keeps each run fast; the limit logic itself is exercised
  (void)detail::probe_png(bytes, limits);
  auto decoded = detail::decode_png(bytes, limits);
  if (!decoded.is_ok()) return 0;
  const RgbImage& rgb = decoded->rgb;
  if (rgb.pixels.size() != static_cast<size_t>(rgb.width) * rgb.height * 3) __builtin_trap();
  PreprocessOptions opts;
  opts.max_image_tokens = 64;
  auto prepared = preprocess(rgb, opts);
  if (prepared.is_ok() && prepared->pixel_values.size() != static_cast<size_t>(prepared->num_patches()) * 1536)
    __builtin_trap();
  return 0;
}
