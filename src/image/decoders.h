// Internal: one decoder per format behind decode_image/probe_image (image.h). Each decoder
// reads the header first, checks DecodeLimits, and only then allocates pixel memory; each
// turns its library's errors (libjpeg error_exit, libpng png_error, libwebp status codes)
// into a Status naming the format; each converts to RGB8 with PIL 12.3's arithmetic for the
// mode PIL would open the file in.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "image/image.h"

namespace qvl::image::detail {

// Width, height and pixel count against the limits (kOutOfRange with the numbers).
Status check_limits(ImageFormat format, int64_t width, int64_t height, const DecodeLimits& limits);

Result<ImageInfo> probe_jpeg(std::span<const uint8_t> data, const DecodeLimits& limits);
Result<DecodedImage> decode_jpeg(std::span<const uint8_t> data, const DecodeLimits& limits);

Result<ImageInfo> probe_png(std::span<const uint8_t> data, const DecodeLimits& limits);
Result<DecodedImage> decode_png(std::span<const uint8_t> data, const DecodeLimits& limits);

Result<ImageInfo> probe_webp(std::span<const uint8_t> data, const DecodeLimits& limits);
Result<DecodedImage> decode_webp(std::span<const uint8_t> data, const DecodeLimits& limits);

// PIL's cmyk2rgb (Convert.c) on a pixel that was already inverted by the "CMYK;I" unpacker:
// nk = 255 - k; out = clip8(nk - muldiv255(c, nk)), muldiv255(a, b) = ((t >> 8) + t) >> 8
// with t = a * b + 128.
inline uint8_t pil_cmyk_channel(int c, int nk) {
  const int t = c * nk + 128;
  const int v = nk - (((t >> 8) + t) >> 8);
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace qvl::image::detail
