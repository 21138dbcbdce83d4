// Decoders and PIL's convert("RGB") rules, on images encoded here with libpng / libjpeg /
// libwebp so that every expected pixel follows from the encoded samples and PIL's formulas
// (quoted next to each case). Also: limits checked from the header, truncated and corrupt
// data as errors, and format sniffing.
#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>
#include <zlib.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "image/image.h"

namespace qvl::image {
namespace {

using Bytes = std::vector<uint8_t>;

// ---- encoders (test-only) ----

void png_write_to_vector(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

// `samples` are big-endian for 16 bit and packed for < 8 bit, `rowbytes` per row.
Bytes encode_png(int w, int h, int bit_depth, int color_type, const Bytes& samples, size_t rowbytes,
                 const std::vector<png_color>& palette = {}, const Bytes& trns = {}, bool interlace = false) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return {};
  }
  png_set_write_fn(png, &out, png_write_to_vector, nullptr);
  png_set_IHDR(png, info, w, h, bit_depth, color_type, interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  if (!trns.empty()) png_set_tRNS(png, info, trns.data(), static_cast<int>(trns.size()), nullptr);
  png_write_info(png, info);
  std::vector<png_bytep> rows(h);
  for (int y = 0; y < h; ++y) rows[y] = const_cast<png_bytep>(samples.data() + y * rowbytes);
  png_write_image(png, rows.data());
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return out;
}

// components 1 (gray), 3 (RGB -> YCbCr), 4 (CMYK as is, or YCCK when ycck).
Bytes encode_jpeg(int w, int h, int components, const Bytes& samples, int quality, bool ycck = false,
                  bool progressive = false) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* mem = nullptr;
  unsigned long mem_size = 0;
  jpeg_mem_dest(&cinfo, &mem, &mem_size);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : (components == 3 ? JCS_RGB : JCS_CMYK);
  jpeg_set_defaults(&cinfo);
  if (ycck) jpeg_set_colorspace(&cinfo, JCS_YCCK);
  jpeg_set_quality(&cinfo, quality, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(samples.data() + static_cast<size_t>(cinfo.next_scanline) * w * components);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  Bytes out(mem, mem + mem_size);
  jpeg_destroy_compress(&cinfo);
  free(mem);
  return out;
}

DecodedImage decode_ok(const Bytes& data) {
  auto r = decode_image(data);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : DecodedImage{};
}

// ---- PNG: every mode PIL opens, with PIL's conversion ----

TEST(DecodePng, Gray1Bit) {
  // Row of 10 pixels 1010110001 packed MSB first: PIL "1", 1 -> 255.
  Bytes s = {0b10101100, 0b01000000};
  DecodedImage d = decode_ok(encode_png(10, 1, 1, PNG_COLOR_TYPE_GRAY, s, 2));
  EXPECT_EQ(d.info.mode, "1");
  const int bits[10] = {1, 0, 1, 0, 1, 1, 0, 0, 0, 1};
  for (int x = 0; x < 10; ++x) EXPECT_EQ(d.rgb.pixels[3 * x + 1], bits[x] ? 255 : 0) << x;
}

TEST(DecodePng, Gray2And4BitScaleLikeUnpackL2L4) {
  // 2 bit: 0,1,2,3 -> *0x55 = 0,85,170,255. 4 bit: 0,5,15 -> *0x11 = 0,85,255.
  DecodedImage d2 = decode_ok(encode_png(4, 1, 2, PNG_COLOR_TYPE_GRAY, {0b00011011}, 1));
  EXPECT_EQ(d2.info.mode, "L");
  EXPECT_EQ(d2.rgb.pixels, (Bytes{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));
  DecodedImage d4 = decode_ok(encode_png(3, 1, 4, PNG_COLOR_TYPE_GRAY, {0x05, 0xF0}, 2));
  EXPECT_EQ(d4.rgb.pixels, (Bytes{0, 0, 0, 85, 85, 85, 255, 255, 255}));
}

TEST(DecodePng, Gray16BitClipsLikeI16ToRgb) {
  // PIL opens 16-bit gray as "I;16" and I16_RGB clips at 255 (no shift): 0x0042 -> 0x42,
  // 0x00FF -> 255, 0x0100 -> 255, 0xABCD -> 255.
  Bytes s = {0x00, 0x42, 0x00, 0xFF, 0x01, 0x00, 0xAB, 0xCD};
  DecodedImage d = decode_ok(encode_png(4, 1, 16, PNG_COLOR_TYPE_GRAY, s, 8));
  EXPECT_EQ(d.info.mode, "I;16");
  EXPECT_EQ(d.rgb.pixels, (Bytes{0x42, 0x42, 0x42, 255, 255, 255, 255, 255, 255, 255, 255, 255}));
}

TEST(DecodePng, Rgb16TakesTheHighByte) {
  // unpackRGB16B keeps in[0], in[2], in[4]: 0x12FF -> 0x12 (truncation, not rounding).
  Bytes s = {0x12, 0xFF, 0x80, 0x80, 0xFF, 0x01};
  DecodedImage d = decode_ok(encode_png(1, 1, 16, PNG_COLOR_TYPE_RGB, s, 6));
  EXPECT_EQ(d.info.mode, "RGB");
  EXPECT_EQ(d.rgb.pixels, (Bytes{0x12, 0x80, 0xFF}));
}

TEST(DecodePng, AlphaIsDroppedNotComposited) {
  // RGBA 8: (10,20,30, a=0) stays (10,20,30) - no white background (transformers 5.17).
  DecodedImage d = decode_ok(encode_png(1, 1, 8, PNG_COLOR_TYPE_RGB_ALPHA, {10, 20, 30, 0}, 4));
  EXPECT_EQ(d.info.mode, "RGBA");
  EXPECT_EQ(d.rgb.pixels, (Bytes{10, 20, 30}));
  // RGBA 16: high bytes, alpha dropped.
  DecodedImage d16 =
      decode_ok(encode_png(1, 1, 16, PNG_COLOR_TYPE_RGB_ALPHA, {0xA0, 0x01, 0xB0, 0x02, 0xC0, 0x03, 0, 0}, 8));
  EXPECT_EQ(d16.rgb.pixels, (Bytes{0xA0, 0xB0, 0xC0}));
  // LA 8: gray replicated; LA 16 opens as "RGBA" in PIL with the high byte of gray.
  DecodedImage la = decode_ok(encode_png(1, 1, 8, PNG_COLOR_TYPE_GRAY_ALPHA, {77, 9}, 2));
  EXPECT_EQ(la.info.mode, "LA");
  EXPECT_EQ(la.rgb.pixels, (Bytes{77, 77, 77}));
  DecodedImage la16 = decode_ok(encode_png(1, 1, 16, PNG_COLOR_TYPE_GRAY_ALPHA, {0x91, 0xFF, 0x00, 0x10}, 4));
  EXPECT_EQ(la16.info.mode, "RGBA");
  EXPECT_EQ(la16.rgb.pixels, (Bytes{0x91, 0x91, 0x91}));
}

TEST(DecodePng, PaletteWithTransparencyAndShortPalette) {
  // 4-bit indices 0, 1, 2, 5 against a 3-entry palette with tRNS: entries past the palette
  // are black (PIL's zeroed palette), tRNS does not change RGB.
  std::vector<png_color> pal = {{255, 0, 0}, {0, 255, 0}, {1, 2, 3}};
  DecodedImage d = decode_ok(encode_png(4, 1, 4, PNG_COLOR_TYPE_PALETTE, {0x01, 0x25}, 2, pal, Bytes{0, 128, 255}));
  EXPECT_EQ(d.info.mode, "P");
  EXPECT_EQ(d.rgb.pixels, (Bytes{255, 0, 0, 0, 255, 0, 1, 2, 3, 0, 0, 0}));
}

TEST(DecodePng, InterlacedEqualsNonInterlaced) {
  const int w = 13, h = 11;
  Bytes s(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(i * 37 + 11);
  DecodedImage a = decode_ok(encode_png(w, h, 8, PNG_COLOR_TYPE_RGB, s, w * 3, {}, {}, false));
  DecodedImage b = decode_ok(encode_png(w, h, 8, PNG_COLOR_TYPE_RGB, s, w * 3, {}, {}, true));
  EXPECT_EQ(a.rgb.pixels, s);
  EXPECT_EQ(b.rgb.pixels, s);
}

// ---- JPEG ----

Bytes gradient(int w, int h, int comps) {
  Bytes s(static_cast<size_t>(w) * h * comps);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < comps; ++c)
        s[(static_cast<size_t>(y) * w + x) * comps + c] = static_cast<uint8_t>(40 + x * 3 + y * 2 + 20 * c);
  return s;
}

int max_abs_diff(const Bytes& a, const Bytes& b) {
  int m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return a.size() == b.size() ? m : 999;
}

TEST(DecodeJpeg, GrayAndRgbAndProgressive) {
  const int w = 40, h = 24;
  DecodedImage g = decode_ok(encode_jpeg(w, h, 1, gradient(w, h, 1), 100));
  EXPECT_EQ(g.info.mode, "L");
  Bytes g3;
  for (uint8_t v : gradient(w, h, 1)) g3.insert(g3.end(), {v, v, v});
  EXPECT_LE(max_abs_diff(g.rgb.pixels, g3), 2);  // quality 100 on a smooth gradient
  Bytes rgb = gradient(w, h, 3);
  DecodedImage c = decode_ok(encode_jpeg(w, h, 3, rgb, 100));
  EXPECT_EQ(c.info.mode, "RGB");
  EXPECT_LE(max_abs_diff(c.rgb.pixels, rgb), 4);  // chroma subsampling of a smooth gradient
  DecodedImage p = decode_ok(encode_jpeg(w, h, 3, rgb, 100, false, true));
  EXPECT_LE(max_abs_diff(p.rgb.pixels, rgb), 4);
}

// PIL's CMYK path on raw stored bytes (C, M, Y, K): invert ("CMYK;I"), then cmyk2rgb.
Bytes pil_cmyk_to_rgb(const Bytes& stored) {
  Bytes out;
  for (size_t i = 0; i < stored.size(); i += 4) {
    const int nk = 255 - (255 - stored[i + 3]);
    for (int c = 0; c < 3; ++c) {
      const int v = 255 - stored[i + c];
      const int t = v * nk + 128;
      out.push_back(static_cast<uint8_t>(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255)));
    }
  }
  return out;
}

TEST(DecodeJpeg, CmykAndYcckAreInvertedLikePil) {
  const int w = 16, h = 16;
  // Flat CMYK bytes survive JPEG at quality 100 exactly (DC-only blocks).
  Bytes s;
  for (int i = 0; i < w * h; ++i) s.insert(s.end(), {200, 100, 30, 180});
  const Bytes expect = pil_cmyk_to_rgb(s);
  // Worked: c' = 55, nk = 180: t = 55*180+128 = 10028, (39 + 10028) >> 8 = 39, 180-39 = 141.
  EXPECT_EQ(expect[0], 141);
  DecodedImage c = decode_ok(encode_jpeg(w, h, 4, s, 100));
  EXPECT_EQ(c.info.mode, "CMYK");
  EXPECT_LE(max_abs_diff(c.rgb.pixels, expect), 1);
  DecodedImage y = decode_ok(encode_jpeg(w, h, 4, s, 100, /*ycck=*/true));
  EXPECT_EQ(y.info.mode, "CMYK");
  EXPECT_LE(max_abs_diff(y.rgb.pixels, expect), 2);
}

TEST(DecodeJpeg, TruncatedIsAnErrorNamingJpeg) {
  Bytes full = encode_jpeg(64, 64, 3, gradient(64, 64, 3), 90);
  for (size_t cut : {size_t(20), full.size() / 2, full.size() - 2}) {
    Bytes part(full.begin(), full.begin() + cut);
    auto r = decode_image(part);
    ASSERT_FALSE(r.is_ok()) << cut;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("JPEG"), std::string::npos) << r.status().message();
  }
}

// ---- WebP ----

TEST(DecodeWebp, LosslessIsExactAndAlphaDropped) {
  const int w = 9, h = 7;
  Bytes rgba(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < rgba.size(); ++i) rgba[i] = static_cast<uint8_t>(i * 13 + 5);
  for (size_t i = 3; i < rgba.size(); i += 4) rgba[i] = static_cast<uint8_t>(255 - i);  // varied alpha, never 0
  uint8_t* enc = nullptr;
  size_t n = WebPEncodeLosslessRGBA(rgba.data(), w, h, w * 4, &enc);
  ASSERT_GT(n, 0u);
  Bytes file(enc, enc + n);
  WebPFree(enc);
  DecodedImage d = decode_ok(file);
  EXPECT_EQ(d.info.mode, "RGBA");
  Bytes rgb;
  for (size_t i = 0; i < rgba.size(); i += 4) rgb.insert(rgb.end(), {rgba[i], rgba[i + 1], rgba[i + 2]});
  EXPECT_EQ(d.rgb.pixels, rgb);
  auto t = decode_image(Bytes(file.begin(), file.begin() + file.size() / 2));
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("WEBP"), std::string::npos);
}

// ---- limits, sniffing, corruption ----

TEST(DecodeLimits, BombIsRejectedFromTheHeader) {
  // A 1x1 PNG whose IHDR is rewritten to 60000 x 60000 (CRC fixed up): refused before any
  // pixel allocation, with the numbers.
  Bytes png = encode_png(1, 1, 8, PNG_COLOR_TYPE_GRAY, {7}, 1);
  const uint32_t big = 60000;
  for (int k = 0; k < 2; ++k)
    for (int b = 0; b < 4; ++b) png[16 + 4 * k + b] = static_cast<uint8_t>(big >> (24 - 8 * b));
  const uint32_t crc = static_cast<uint32_t>(crc32(0, png.data() + 12, 17));
  for (int b = 0; b < 4; ++b) png[29 + b] = static_cast<uint8_t>(crc >> (24 - 8 * b));
  auto r = probe_image(png);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("60000x60000"), std::string::npos) << r.status().message();
  DecodeLimits small;
  small.max_pixels = 100;
  Bytes ok = encode_png(20, 10, 8, PNG_COLOR_TYPE_GRAY, Bytes(200, 1), 20);
  auto r2 = decode_image(ok, small);
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("200 pixels"), std::string::npos) << r2.status().message();
  small = DecodeLimits{};
  small.max_file_bytes = 10;
  EXPECT_EQ(decode_image(ok, small).status().code(), StatusCode::kOutOfRange);
}

TEST(PlanAndPrepare, TokensFromTheHeaderMatchThePreparedImage) {
  // 48x80 gray PNG: smart_resize gives 224x352 (see SmartResize.ProbeExamplesFromTheSpec),
  // grid 14x22 = 308 patches = 77 tokens - known from the header alone.
  Bytes s(48 * 80, 100);
  Bytes png = encode_png(80, 48, 8, PNG_COLOR_TYPE_GRAY, s, 80);
  auto plan = plan_image(png, DecodeLimits{}, PreprocessOptions{});
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->info.mode, "L");
  EXPECT_EQ(plan->resized.height, 224);
  EXPECT_EQ(plan->resized.width, 352);
  EXPECT_EQ(plan->num_tokens, 77);
  auto prepared = prepare_image(png, DecodeLimits{}, PreprocessOptions{});
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  EXPECT_EQ(prepared->num_patches(), 308);
  EXPECT_EQ(image_token_count(prepared.value()), 77);
  // A constant image stays constant through the resize: every value is (100 - 127.5) / 127.5.
  for (float v : prepared->pixel_values) ASSERT_EQ(v, (100.0f - 127.5f) / 127.5f);
  // 3000x10 is refused by its header (aspect ratio 300 > 200) before any decoding.
  Bytes wide = encode_png(3000, 10, 8, PNG_COLOR_TYPE_GRAY, Bytes(30000, 7), 3000);
  auto bad = prepare_image(wide, DecodeLimits{}, PreprocessOptions{});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("aspect ratio"), std::string::npos) << bad.status().message();
}

TEST(Sniff, ByMagicBytesNotByName) {
  EXPECT_EQ(sniff_format(Bytes{0xFF, 0xD8, 0xFF, 0xE0}).value(), ImageFormat::kJpeg);
  EXPECT_EQ(sniff_format(Bytes{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'}).value(), ImageFormat::kPng);
  EXPECT_EQ(sniff_format(Bytes{'R', 'I', 'F', 'F', 1, 2, 3, 4, 'W', 'E', 'B', 'P'}).value(), ImageFormat::kWebp);
  auto gif = sniff_format(Bytes{'G', 'I', 'F', '8', '9', 'a', 0, 0});
  EXPECT_EQ(gif.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(gif.status().message().find("GIF"), std::string::npos);
  auto junk = sniff_format(Bytes{'h', 'e', 'l', 'l', 'o'});
  EXPECT_EQ(junk.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(junk.status().message().find("68 65 6c 6c 6f"), std::string::npos) << junk.status().message();
  EXPECT_FALSE(sniff_format(Bytes{}).is_ok());
}

TEST(DecodeCorrupt, BitFlipsGiveErrorsOrImagesNeverCrashes) {
  // Each of these must return (error or image); ASan/UBSan builds check the "never crashes".
  std::vector<Bytes> files = {encode_png(33, 17, 8, PNG_COLOR_TYPE_RGB, gradient(33, 17, 3), 99),
                              encode_jpeg(33, 17, 3, gradient(33, 17, 3), 80)};
  int errors = 0, images = 0;
  for (const Bytes& f : files)
    for (size_t i = 0; i < f.size(); i += 7) {
      Bytes g = f;
      g[i] ^= 0x5A;
      auto r = decode_image(g);
      if (r.is_ok()) {
        EXPECT_EQ(r->rgb.pixels.size(), static_cast<size_t>(r->rgb.width) * r->rgb.height * 3);
        ++images;
      } else {
        EXPECT_FALSE(r.status().message().empty());
        ++errors;
      }
    }
  EXPECT_GT(errors, 0);
  EXPECT_GT(images, 0);
}

}  // namespace
}  // namespace qvl::image
