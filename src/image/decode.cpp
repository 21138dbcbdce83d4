// Format sniffing from magic bytes and dispatch to the per-format decoders (decoders.h).
#include <cstdio>
#include <cstring>
#include <string>

#include "image/decoders.h"
#include "image/image.h"

namespace qvl::image {
namespace detail {

Status check_limits(ImageFormat format, int64_t width, int64_t height, const DecodeLimits& limits) {
  const std::string name = image_format_name(format);
  if (width <= 0 || height <= 0)
    return data_loss(name + ": image size " + std::to_string(width) + "x" + std::to_string(height) +
                     " in the header is empty");
  if (width > limits.max_width || height > limits.max_height)
    return out_of_range(name + ": image size " + std::to_string(width) + "x" + std::to_string(height) +
                        " exceeds the limit of " + std::to_string(limits.max_width) + "x" +
                        std::to_string(limits.max_height));
  if (width * height > limits.max_pixels)
    return out_of_range(name + ": image has " + std::to_string(width * height) + " pixels (" + std::to_string(width) +
                        "x" + std::to_string(height) + "), over the limit of " + std::to_string(limits.max_pixels));
  return Status::ok();
}

}  // namespace detail

namespace {

bool starts_with(std::span<const uint8_t> data, const char* magic, size_t n, size_t offset = 0) {
  return data.size() >= offset + n && std::memcmp(data.data() + offset, magic, n) == 0;
}

std::string hex_prefix(std::span<const uint8_t> data) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < data.size() && i < 12; ++i) {
    std::snprintf(buf, sizeof(buf), i ? " %02x" : "%02x", data[i]);
    s += buf;
  }
  return s;
}

Status check_file_size(std::span<const uint8_t> data, const DecodeLimits& limits) {
  if (data.empty()) return invalid_argument("image data is empty");
  if (static_cast<int64_t>(data.size()) > limits.max_file_bytes)
    return out_of_range("image data is " + std::to_string(data.size()) + " bytes, over the limit of " +
                        std::to_string(limits.max_file_bytes) + " bytes");
  return Status::ok();
}

}  // namespace

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WEBP";
  }
  return "?";
}

Result<ImageFormat> sniff_format(std::span<const uint8_t> data) {
  if (data.empty()) return invalid_argument("image data is empty");
  if (starts_with(data, "\xFF\xD8\xFF", 3)) return ImageFormat::kJpeg;
  if (starts_with(data, "\x89PNG\r\n\x1A\n", 8)) return ImageFormat::kPng;
  if (starts_with(data, "RIFF", 4) && starts_with(data, "WEBP", 4, 8)) return ImageFormat::kWebp;
  const char* other = nullptr;
  if (starts_with(data, "GIF87a", 6) || starts_with(data, "GIF89a", 6))
    other = "GIF";
  else if (starts_with(data, "BM", 2))
    other = "BMP";
  else if (starts_with(data, "II*\0", 4) || starts_with(data, "MM\0*", 4))
    other = "TIFF";
  else if (starts_with(data, "ftypavif", 8, 4) || starts_with(data, "ftypavis", 8, 4))
    other = "AVIF";
  else if (starts_with(data, "ftyp", 4, 4))
    other = "HEIF/ISO-BMFF";
  else if (starts_with(data, "\0\0\0\x0CjP  ", 8))
    other = "JPEG 2000";
  if (other) return unimplemented(std::string(other) + " images are not supported (supported: JPEG, PNG, WebP)");
  return invalid_argument("unrecognised image data (" + std::to_string(data.size()) + " bytes, starting " +
                          hex_prefix(data) + "); supported: JPEG, PNG, WebP");
}

Result<ImageInfo> probe_image(std::span<const uint8_t> data, const DecodeLimits& limits) {
  QVL_RETURN_IF_ERROR(check_file_size(data, limits));
  QVL_ASSIGN_OR_RETURN(ImageFormat format, sniff_format(data));
  switch (format) {
    case ImageFormat::kJpeg:
      return detail::probe_jpeg(data, limits);
    case ImageFormat::kPng:
      return detail::probe_png(data, limits);
    case ImageFormat::kWebp:
      return detail::probe_webp(data, limits);
  }
  return internal_error("unhandled image format");
}

Result<DecodedImage> decode_image(std::span<const uint8_t> data, const DecodeLimits& limits) {
  QVL_RETURN_IF_ERROR(check_file_size(data, limits));
  QVL_ASSIGN_OR_RETURN(ImageFormat format, sniff_format(data));
  switch (format) {
    case ImageFormat::kJpeg:
      return detail::decode_jpeg(data, limits);
    case ImageFormat::kPng:
      return detail::decode_png(data, limits);
    case ImageFormat::kWebp:
      return detail::decode_webp(data, limits);
  }
  return internal_error("unhandled image format");
}

}  // namespace qvl::image
