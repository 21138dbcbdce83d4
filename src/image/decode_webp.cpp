// WebP through libwebp, as PIL 12.3 decodes it (_webp.c): WebPGetFeatures decides the mode
// ("RGBA" when the bitstream has alpha, else "RGB"); pixels come from libwebp's default
// decoder settings (fancy upsampling on, no dithering), non-premultiplied, so the RGB of an
// RGBA decode equals an RGB decode and alpha is simply dropped. PIL reads through
// WebPAnimDecoder, which for a still image decodes the single frame straight onto a zeroed
// canvas of the same size: identical values. Animated files are refused (PIL would take the
// first frame composited on the canvas; libwebpdemux is not linked).
#include <webp/decode.h>

#include <string>

#include "image/buffer.h"
#include "image/decoders.h"

namespace qvl::image::detail {
namespace {

std::string status_text(VP8StatusCode code) {
  switch (code) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "corrupt bitstream";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "data is truncated";
  }
  return "status " + std::to_string(static_cast<int>(code));
}

Result<ImageInfo> header_info(std::span<const uint8_t> data, const DecodeLimits& limits,
                              WebPBitstreamFeatures* features) {
  const VP8StatusCode st = WebPGetFeatures(data.data(), data.size(), features);
  if (st != VP8_STATUS_OK) return data_loss("WEBP: " + status_text(st) + " (reading the header)");
  if (features->has_animation)
    return unimplemented("WEBP: animated WebP is not supported (" + std::to_string(features->width) + "x" +
                         std::to_string(features->height) + ")");
  ImageInfo info;
  info.format = ImageFormat::kWebp;
  info.width = features->width;
  info.height = features->height;
  info.mode = features->has_alpha ? "RGBA" : "RGB";
  QVL_RETURN_IF_ERROR(check_limits(ImageFormat::kWebp, info.width, info.height, limits));
  return info;
}

}  // namespace

Result<ImageInfo> probe_webp(std::span<const uint8_t> data, const DecodeLimits& limits) {
  WebPBitstreamFeatures features;
  return header_info(data, limits, &features);
}

Result<DecodedImage> decode_webp(std::span<const uint8_t> data, const DecodeLimits& limits) {
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return internal_error("WEBP: libwebp version mismatch");
  DecodedImage out;
  QVL_ASSIGN_OR_RETURN(out.info, header_info(data, limits, &config.input));
  const int w = out.info.width, h = out.info.height;
  out.rgb.width = w;
  out.rgb.height = h;
  detail::resize_large(out.rgb.pixels, static_cast<size_t>(w) * h * 3);
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = out.rgb.pixels.data();
  config.output.u.RGBA.stride = w * 3;
  config.output.u.RGBA.size = out.rgb.pixels.size();
  const VP8StatusCode st = WebPDecode(data.data(), data.size(), &config);
  WebPFreeDecBuffer(&config.output);  // external memory: frees nothing of ours
  if (st != VP8_STATUS_OK) return data_loss("WEBP: " + status_text(st) + " (decoding pixels)");
  return out;
}

}  // namespace qvl::image::detail
