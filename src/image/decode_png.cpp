// PNG through libpng, converted as PIL 12.3 opens and converts it (PngImagePlugin._MODES,
// Unpack.c, Convert.c):
//
//   gray 1 bit      "1"     0 -> 0, 1 -> 255
//   gray 2/4/8 bit  "L"     value * 85 / * 17 / as is            (unpackL2, unpackL4)
//   gray 16 bit     "I;16"  min(value, 255)                      (I16_RGB: clips, no shift)
//   RGB 8/16        "RGB"   16 bit: the high byte                (unpackRGB16B)
//   palette 1-8     "P"     palette lookup; entries past PLTE are black; tRNS ignored
//   gray+alpha 8    "LA"    gray, alpha dropped                  (la2rgb)
//   gray+alpha 16   "RGBA"  high byte of gray, alpha dropped     (unpackRGBALA16B)
//   RGBA 8/16       "RGBA"  16 bit: high bytes, alpha dropped    (rgba2rgb)
//
// No gamma, sBIT or colour management is applied (PIL applies none). Interlaced images are
// de-interlaced by libpng. Errors longjmp back to the function that called libpng.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "image/buffer.h"
#include "image/decoders.h"

namespace qvl::image::detail {
namespace {

struct PngContext {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  char message[256] = {};
  ~PngContext() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

void on_error(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->message, sizeof(ctx->message), "%s", msg);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // library code never prints

void on_read(png_structp png, png_bytep out, size_t length) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (length > ctx->size - ctx->pos) {
    std::snprintf(ctx->message, sizeof(ctx->message), "data is truncated after %zu bytes", ctx->size);
    png_longjmp(png, 1);
  }
  std::memcpy(out, ctx->data + ctx->pos, length);
  ctx->pos += length;
}

struct Header {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
};

// Creates the reader and reads everything up to the first IDAT. False after a libpng error.
bool read_header(PngContext* ctx, const DecodeLimits& limits, Header* h) {
  ctx->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, ctx, on_error, on_warning);
  if (!ctx->png) {
    std::snprintf(ctx->message, sizeof(ctx->message), "cannot create the libpng reader");
    return false;
  }
  ctx->info = png_create_info_struct(ctx->png);
  if (!ctx->info) {
    std::snprintf(ctx->message, sizeof(ctx->message), "cannot create the libpng info struct");
    return false;
  }
  if (setjmp(png_jmpbuf(ctx->png))) return false;
  png_set_read_fn(ctx->png, ctx, on_read);
  // libpng's own checks, so that absurd sizes fail inside png_read_info already; the exact
  // limits are checked with a message by the caller.
  png_set_user_limits(ctx->png, static_cast<png_uint_32>(limits.max_width),
                      static_cast<png_uint_32>(limits.max_height));
  png_set_chunk_malloc_max(ctx->png, 16u << 20);  // text/ICC chunk bombs
  png_set_chunk_cache_max(ctx->png, 1000);
  png_read_info(ctx->png, ctx->info);
  png_get_IHDR(ctx->png, ctx->info, &h->width, &h->height, &h->bit_depth, &h->color_type, &h->interlace, nullptr,
               nullptr);
  return true;
}

// Reads all rows (de-interlaced) into `rows`, each `row_bytes` long. False after a libpng
// error.
bool read_rows(PngContext* ctx, size_t row_bytes, uint8_t** rows) {
  if (setjmp(png_jmpbuf(ctx->png))) return false;
  png_set_interlace_handling(ctx->png);
  png_read_update_info(ctx->png, ctx->info);
  if (png_get_rowbytes(ctx->png, ctx->info) != row_bytes) {  // the buffers were sized for row_bytes
    std::snprintf(ctx->message, sizeof(ctx->message), "unexpected row size %zu (expected %zu)",
                  static_cast<size_t>(png_get_rowbytes(ctx->png, ctx->info)), row_bytes);
    return false;
  }
  png_read_image(ctx->png, rows);
  // No png_read_end: chunks after the image data are not needed (PIL stops there too).
  return true;
}

const char* pil_mode(const Header& h) {
  switch (h.color_type) {
    case PNG_COLOR_TYPE_GRAY:
      return h.bit_depth == 1 ? "1" : (h.bit_depth == 16 ? "I;16" : "L");
    case PNG_COLOR_TYPE_RGB:
      return "RGB";
    case PNG_COLOR_TYPE_PALETTE:
      return "P";
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return h.bit_depth == 16 ? "RGBA" : "LA";
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return "RGBA";
  }
  return nullptr;
}

Status png_error(const PngContext& ctx, const char* stage) {
  return data_loss(std::string("PNG: ") + (ctx.message[0] ? ctx.message : "unknown libpng error") + " (" + stage + ")");
}

Result<ImageInfo> header_info(PngContext* ctx, std::span<const uint8_t> data, const DecodeLimits& limits, Header* h) {
  ctx->data = data.data();
  ctx->size = data.size();
  // IHDR is the first chunk (signature, length, "IHDR", width, height): the size limits are
  // checked from it before libpng allocates anything.
  if (data.size() >= 24 && std::memcmp(data.data() + 12, "IHDR", 4) == 0) {
    const uint8_t* p = data.data() + 16;
    auto be32 = [](const uint8_t* b) {
      return (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    };
    QVL_RETURN_IF_ERROR(check_limits(ImageFormat::kPng, be32(p), be32(p + 4), limits));
  }
  if (!read_header(ctx, limits, h)) return png_error(*ctx, "reading the header");
  ImageInfo info;
  info.format = ImageFormat::kPng;
  info.width = static_cast<int>(h->width);
  info.height = static_cast<int>(h->height);
  const char* mode = pil_mode(*h);
  if (!mode) return data_loss("PNG: unknown colour type " + std::to_string(h->color_type));
  info.mode = mode;
  QVL_RETURN_IF_ERROR(check_limits(ImageFormat::kPng, h->width, h->height, limits));
  return info;
}

}  // namespace

Result<ImageInfo> probe_png(std::span<const uint8_t> data, const DecodeLimits& limits) {
  PngContext ctx;
  Header h;
  return header_info(&ctx, data, limits, &h);
}

Result<DecodedImage> decode_png(std::span<const uint8_t> data, const DecodeLimits& limits) {
  PngContext ctx;
  Header h;
  DecodedImage out;
  QVL_ASSIGN_OR_RETURN(out.info, header_info(&ctx, data, limits, &h));
  const size_t w = h.width, ht = h.height;

  // Palette: 256 entries, black past the PLTE chunk (PIL's ImagingPaletteNew is zeroed).
  uint8_t palette[256 * 3] = {};
  if (h.color_type == PNG_COLOR_TYPE_PALETTE) {
    png_colorp plte = nullptr;
    int num = 0;
    if (png_get_PLTE(ctx.png, ctx.info, &plte, &num) & PNG_INFO_PLTE) {
      for (int i = 0; i < num && i < 256; ++i) {
        palette[3 * i] = plte[i].red;
        palette[3 * i + 1] = plte[i].green;
        palette[3 * i + 2] = plte[i].blue;
      }
    }
  }
  const int channels = png_get_channels(ctx.png, ctx.info);
  const int bytes_per_sample = h.bit_depth == 16 ? 2 : 1;
  if (h.bit_depth < 8) png_set_packing(ctx.png);  // one byte per sample, values unscaled
  const size_t row_bytes = w * channels * bytes_per_sample;
  std::vector<uint8_t> raw;
  detail::resize_large(raw, row_bytes * ht);
  std::vector<uint8_t*> rows(ht);
  for (size_t y = 0; y < ht; ++y) rows[y] = raw.data() + y * row_bytes;
  if (!read_rows(&ctx, row_bytes, rows.data())) return png_error(ctx, "decoding pixels");

  out.rgb.width = static_cast<int>(w);
  out.rgb.height = static_cast<int>(ht);
  detail::resize_large(out.rgb.pixels, w * ht * 3);
  uint8_t* dst = out.rgb.pixels.data();
  const size_t n = w * ht;
  const uint8_t* s = raw.data();
  switch (h.color_type) {
    case PNG_COLOR_TYPE_GRAY: {
      if (h.bit_depth == 16) {
        for (size_t i = 0; i < n; ++i) {
          const uint8_t v = s[2 * i] == 0 ? s[2 * i + 1] : 255;  // I16_RGB: clip to 255
          dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = v;
        }
      } else {
        const int scale = h.bit_depth == 1 ? 255 : (h.bit_depth == 2 ? 0x55 : (h.bit_depth == 4 ? 0x11 : 1));
        for (size_t i = 0; i < n; ++i)
          dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = static_cast<uint8_t>(s[i] * scale);
      }
      break;
    }
    case PNG_COLOR_TYPE_PALETTE:
      for (size_t i = 0; i < n; ++i) std::memcpy(dst + 3 * i, palette + 3 * s[i], 3);
      break;
    case PNG_COLOR_TYPE_RGB:
    case PNG_COLOR_TYPE_RGB_ALPHA:
    case PNG_COLOR_TYPE_GRAY_ALPHA: {
      const size_t stride = static_cast<size_t>(channels) * bytes_per_sample;  // bytes per pixel
      const bool gray = h.color_type == PNG_COLOR_TYPE_GRAY_ALPHA;
      for (size_t i = 0; i < n; ++i) {
        const uint8_t* px = s + i * stride;  // 16 bit: big-endian, the high byte first
        if (gray) {
          dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = px[0];
        } else {
          dst[3 * i] = px[0];
          dst[3 * i + 1] = px[bytes_per_sample];
          dst[3 * i + 2] = px[2 * bytes_per_sample];
        }
      }
      break;
    }
    default:
      return data_loss("PNG: unknown colour type " + std::to_string(h.color_type));
  }
  return out;
}

}  // namespace qvl::image::detail
