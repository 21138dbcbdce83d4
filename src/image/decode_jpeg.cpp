// JPEG through libjpeg-turbo, as PIL 12.3 decodes it (JpegImagePlugin.py + JpegDecode.c):
// the mode comes from the frame's component count (1 -> "L", 3 -> "RGB", 4 -> "CMYK");
// libjpeg's defaults otherwise (islow IDCT, fancy upsampling, its own YCbCr/YCCK guess from
// JFIF/Adobe markers); CMYK is always read with PIL's "CMYK;I" unpacker (every byte
// inverted: PIL assumes Adobe polarity whether or not an Adobe marker is present), then
// PIL's cmyk2rgb. EXIF orientation is ignored, as the reference ignores it.
//
// Errors: libjpeg's error_exit longjmps back to the one function that called into libjpeg
// (which owns no C++ objects, so nothing is skipped); a premature end of data, which libjpeg
// only reports as a warning, is an error here, as it is in PIL ("image file is truncated").
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "image/buffer.h"
#include "image/decoders.h"

namespace qvl::image::detail {
namespace {

// A progressive file with thousands of tiny scans costs seconds of CPU for a few bytes of
// input; real encoders write fewer than 20.
constexpr int kMaxScans = 1000;

struct JpegContext {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  jpeg_progress_mgr progress{};
  jmp_buf jump{};
  char message[JMSG_LENGTH_MAX] = {};
  bool created = false;
  ~JpegContext() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

JpegContext* context_of(j_common_ptr cinfo) {
  return static_cast<JpegContext*>(cinfo->client_data);
}

void on_error_exit(j_common_ptr cinfo) {
  JpegContext* ctx = context_of(cinfo);
  (*cinfo->err->format_message)(cinfo, ctx->message);
  longjmp(ctx->jump, 1);
}

void on_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  JpegContext* ctx = context_of(cinfo);
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    std::snprintf(ctx->message, sizeof(ctx->message), "data is truncated (premature end of JPEG data)");
    longjmp(ctx->jump, 1);
  }
  cinfo->err->num_warnings++;  // recoverable corruption: decoded anyway, as PIL does
}

void on_output_message(j_common_ptr) {}  // library code never prints

void on_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxScans) {
    JpegContext* ctx = context_of(cinfo);
    std::snprintf(ctx->message, sizeof(ctx->message), "more than %d progressive scans", kMaxScans);
    longjmp(ctx->jump, 1);
  }
}

// Reads the header. Returns false after a libjpeg error (message in ctx->message).
bool read_header(JpegContext* ctx, std::span<const uint8_t> data) {
  if (setjmp(ctx->jump)) return false;
  ctx->cinfo.err = jpeg_std_error(&ctx->err);
  ctx->err.error_exit = on_error_exit;
  ctx->err.emit_message = on_emit_message;
  ctx->err.output_message = on_output_message;
  ctx->cinfo.client_data = ctx;
  jpeg_create_decompress(&ctx->cinfo);
  ctx->created = true;
  ctx->progress.progress_monitor = on_progress;
  ctx->cinfo.progress = &ctx->progress;
  jpeg_mem_src(&ctx->cinfo, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&ctx->cinfo, TRUE);
  return true;
}

// Decompresses into `rows` (one pointer per output row, each width * output_components).
bool read_pixels(JpegContext* ctx, J_COLOR_SPACE out_space, uint8_t** rows) {
  if (setjmp(ctx->jump)) return false;
  ctx->cinfo.out_color_space = out_space;
  jpeg_start_decompress(&ctx->cinfo);
  while (ctx->cinfo.output_scanline < ctx->cinfo.output_height) {
    JDIMENSION got = jpeg_read_scanlines(&ctx->cinfo, rows + ctx->cinfo.output_scanline,
                                         ctx->cinfo.output_height - ctx->cinfo.output_scanline);
    if (got == 0) {
      std::snprintf(ctx->message, sizeof(ctx->message), "decoder returned no rows at row %u",
                    ctx->cinfo.output_scanline);
      return false;
    }
  }
  // Trailing data after the last scan is not needed; PIL does not read it either.
  jpeg_abort_decompress(&ctx->cinfo);
  return true;
}

Status jpeg_error(const JpegContext& ctx, const char* stage) {
  std::string msg = ctx.message;
  if (msg.find("truncated") != std::string::npos || msg.find("Premature end") != std::string::npos)
    return data_loss(std::string("JPEG: ") + msg + " (" + stage + ")");
  return data_loss(std::string("JPEG: corrupt data while ") + stage + ": " + msg);
}

Result<ImageInfo> header_info(JpegContext* ctx, std::span<const uint8_t> data, const DecodeLimits& limits) {
  if (!read_header(ctx, data)) return jpeg_error(*ctx, "reading the header");
  ImageInfo info;
  info.format = ImageFormat::kJpeg;
  info.width = static_cast<int>(ctx->cinfo.image_width);
  info.height = static_cast<int>(ctx->cinfo.image_height);
  switch (ctx->cinfo.num_components) {
    case 1:
      info.mode = "L";
      break;
    case 3:
      info.mode = "RGB";
      break;
    case 4:
      info.mode = "CMYK";
      break;
    default:
      return unimplemented("JPEG: cannot handle " + std::to_string(ctx->cinfo.num_components) +
                           "-component images (1, 3 or 4 are supported)");
  }
  QVL_RETURN_IF_ERROR(check_limits(ImageFormat::kJpeg, info.width, info.height, limits));
  return info;
}

}  // namespace

Result<ImageInfo> probe_jpeg(std::span<const uint8_t> data, const DecodeLimits& limits) {
  JpegContext ctx;
  return header_info(&ctx, data, limits);
}

Result<DecodedImage> decode_jpeg(std::span<const uint8_t> data, const DecodeLimits& limits) {
  JpegContext ctx;
  DecodedImage out;
  QVL_ASSIGN_OR_RETURN(out.info, header_info(&ctx, data, limits));
  const int w = out.info.width, h = out.info.height;
  out.rgb.width = w;
  out.rgb.height = h;
  detail::resize_large(out.rgb.pixels, static_cast<size_t>(w) * h * 3);
  const int comps = ctx.cinfo.num_components;
  const J_COLOR_SPACE space = comps == 1 ? JCS_GRAYSCALE : (comps == 3 ? JCS_RGB : JCS_CMYK);

  // RGB decodes straight into the output; gray and CMYK into a staging buffer first.
  std::vector<uint8_t> staging;
  uint8_t* base = out.rgb.pixels.data();
  if (comps != 3) {
    detail::resize_large(staging, static_cast<size_t>(w) * h * comps);
    base = staging.data();
  }
  std::vector<uint8_t*> rows(static_cast<size_t>(h));
  for (int y = 0; y < h; ++y) rows[y] = base + static_cast<size_t>(y) * w * comps;
  if (!read_pixels(&ctx, space, rows.data())) return jpeg_error(ctx, "decoding pixels");

  uint8_t* dst = out.rgb.pixels.data();
  const size_t n = static_cast<size_t>(w) * h;
  if (comps == 1) {
    for (size_t i = 0; i < n; ++i) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = staging[i];  // PIL l2rgb
  } else if (comps == 4) {
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* s = &staging[4 * i];
      const int nk = s[3];  // 255 - (255 - K): PIL's inverted K, then nk = 255 - K'
      dst[3 * i + 0] = pil_cmyk_channel(255 - s[0], nk);
      dst[3 * i + 1] = pil_cmyk_channel(255 - s[1], nk);
      dst[3 * i + 2] = pil_cmyk_channel(255 - s[2], nk);
    }
  }
  return out;
}

}  // namespace qvl::image::detail
