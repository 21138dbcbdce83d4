// smart_resize, qvl's caps, the torch-exact resize and patchify. Expected sizes come from the
// reference's smart_resize worked by hand (and the probe values quoted in the spec, §3);
// resize expectations are worked out in the comments from torch's weight formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "image/image.h"

namespace qvl::image {
namespace {

ResizeTarget sr(int h, int w, int64_t min_px = 65536, int64_t max_px = 16777216) {
  auto r = smart_resize(h, w, 32, min_px, max_px);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r.value() : ResizeTarget{};
}

#define EXPECT_SIZE(t, h, w)   \
  do {                         \
    ResizeTarget t_ = (t);     \
    EXPECT_EQ(t_.height, (h)); \
    EXPECT_EQ(t_.width, (w));  \
  } while (0)

TEST(SmartResize, ProbeExamplesFromTheSpec) {
  EXPECT_SIZE(sr(1365, 2048), 1376, 2048);  // round(42.66) = 43
  EXPECT_SIZE(sr(3000, 4000), 3008, 4000);  // round(93.75) = 94
  EXPECT_SIZE(sr(203, 317), 224, 320);      // 7*32 x 10*32 = 71680 >= 65536
  // 224x224 = 50176 < 65536: beta = sqrt(65536/50176) = 8/7, 224 * 8/7 / 32 = 8 -> 256.
  EXPECT_SIZE(sr(224, 224), 256, 256);
  // 48/32 = 1.5 and 80/32 = 2.5 both round to 2 (ties to even); 64x64 is then grown:
  // beta = sqrt(65536/3840) = 4.131, ceil(48*4.131/32) = 7, ceil(80*4.131/32) = 11.
  EXPECT_SIZE(sr(48, 80), 224, 352);
}

TEST(SmartResize, TiesToEvenAndTinyAndExtreme) {
  // 6000/32 = 187.5 -> 188 (even); 40/32 = 1.25 -> 1.
  EXPECT_SIZE(sr(40, 6000), 32, 6016);
  EXPECT_SIZE(sr(6000, 40), 6016, 32);
  // 1x1 rounds to 0x0 and is grown by sqrt(65536) = 256: 256x256.
  EXPECT_SIZE(sr(1, 1), 256, 256);
  // 3x5: beta = sqrt(65536/15) = 66.1, ceil(198.3/32) = 7, ceil(330.5/32) = 11.
  EXPECT_SIZE(sr(3, 5), 224, 352);
  // Exactly 200:1 is allowed, 200.1:1 is not.
  EXPECT_TRUE(smart_resize(20, 4000, 32, 65536, 16777216).is_ok());
  auto bad = smart_resize(10, 3000, 32, 65536, 16777216);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("aspect ratio"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("300"), std::string::npos) << bad.status().message();
}

TEST(SmartResize, ShrinkBranch) {
  // 10000^2 > 2^24: beta = sqrt(1e8 / 2^24) = 2.4414, 10000 / 2.4414 / 32 = 128.0 -> 4096.
  EXPECT_SIZE(sr(10000, 10000), 4096, 4096);
  // 5000x7000: beta = sqrt(3.5e7 / 2^24) = 1.4444; floor(5000/1.4444/32) = 108, floor(7000/1.4444/32) = 151.
  EXPECT_SIZE(sr(5000, 7000), 108 * 32, 151 * 32);
}

TEST(TargetSize, CapsActLikeTheReferenceMaxPixels) {
  PreprocessOptions o;
  o.max_image_tokens = 256;  // 256 * 32^2 = 262144 pixels
  EXPECT_EQ(o.effective_max_pixels(), 262144);
  // 992x992 > 262144: beta = sqrt(1e6/262144) = 1.953125, 1000/1.953125/32 = 16 -> 512.
  auto t = target_size(1000, 1000, o);
  ASSERT_TRUE(t.is_ok());
  EXPECT_SIZE(t.value(), 512, 512);
  o = PreprocessOptions{};
  o.max_image_pixels = 100000;  // the smaller of max_pixels and the pixel cap
  EXPECT_EQ(o.effective_max_pixels(), 100000);
  o.max_image_tokens = 50;  // 51200 pixels, below min_pixels: the minimum follows the cap
  EXPECT_EQ(o.effective_max_pixels(), 51200);
  EXPECT_EQ(o.effective_min_pixels(), 51200);
}

TEST(TargetSize, CapIsHardWhereTheGrowBranchWouldOvershoot) {
  // The reference with max_pixels = min_pixels = 65536 grows 100x150 to 224x320 (70 tokens).
  // With a 64-token cap qvl shrinks against the cap instead: beta = sqrt(15000/65536) = 0.4784,
  // floor(100/0.4784/32) = 6, floor(150/0.4784/32) = 9 -> 192x288 = 54 tokens.
  PreprocessOptions o;
  o.max_image_tokens = 64;
  auto t = target_size(100, 150, o);
  ASSERT_TRUE(t.is_ok());
  EXPECT_SIZE(t.value(), 192, 288);
  // Without caps the reference's answer stands.
  auto u = target_size(100, 150, PreprocessOptions{});
  ASSERT_TRUE(u.is_ok());
  EXPECT_SIZE(u.value(), 224, 320);
}

TEST(TargetSize, RejectsBadOptions) {
  PreprocessOptions o;
  o.max_image_pixels = 500;  // below one token (1024 pixels)
  auto t = target_size(100, 100, o);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("500"), std::string::npos);
}

RgbImage constant_image(int h, int w, uint8_t r, uint8_t g, uint8_t b) {
  RgbImage img;
  img.height = h;
  img.width = w;
  img.pixels.resize(static_cast<size_t>(h) * w * 3);
  for (size_t i = 0; i < img.pixels.size(); i += 3) {
    img.pixels[i] = r;
    img.pixels[i + 1] = g;
    img.pixels[i + 2] = b;
  }
  return img;
}

TEST(Resize, ConstantImagesStayConstant) {
  // The int16 weights of each output sum to 2^precision within rounding, and the +2^(p-1)
  // bias makes the small excess vanish in the shift: constants are preserved.
  for (auto [h, w, oh, ow] :
       std::vector<std::array<int, 4>>{{37, 53, 224, 320}, {300, 200, 64, 96}, {5, 900, 32, 192}}) {
    RgbImage out = resize_bicubic_antialias(constant_image(h, w, 0, 128, 255), oh, ow);
    ASSERT_EQ(out.height, oh);
    ASSERT_EQ(out.width, ow);
    for (size_t i = 0; i < out.pixels.size(); i += 3) {
      ASSERT_EQ(out.pixels[i], 0) << i;
      ASSERT_EQ(out.pixels[i + 1], 128) << i;
      ASSERT_EQ(out.pixels[i + 2], 255) << i;
    }
  }
}

TEST(Resize, WorkedExampleHalvingAWidthOfFour) {
  // in = 4, out = 2: scale 2, support 4, invscale 0.5. Output 0: center 1, inputs 0..3 at
  // distances -0.25, 0.25, 0.75, 1.25 -> Keys(a=-0.5) = 0.8671875, 0.8671875, 0.2265625,
  // -0.0703125, total 1.890625 -> 0.45868, 0.45868, 0.11983, -0.03719. wt_max 0.45868 gives
  // precision 16 (0.45868 * 2^17 >= 2^15, * 2^16 is not), int16 weights 30060, 30060, 7853,
  // -2437. Row [0, 100, 200, 255]: 32768 + 100*30060 + 200*7853 - 255*2437 = 3987933,
  // >> 16 = 60. Output 1 mirrors it: center 3, inputs 0..3 with weights -2437, 7853, 30060,
  // 30060: 32768 + 0 + 785300 + 6012000 + 7665300 = 14495368 >> 16 = 221.
  RgbImage img;
  img.height = 1;
  img.width = 4;
  const uint8_t row[4] = {0, 100, 200, 255};
  img.pixels.assign(12, 0);
  for (int x = 0; x < 12; ++x) img.pixels[static_cast<size_t>(x)] = row[x / 3];
  RgbImage out = resize_bicubic_antialias(img, 1, 2);
  ASSERT_EQ(out.pixels.size(), 6u);
  EXPECT_EQ(out.pixels[0], 60);
  EXPECT_EQ(out.pixels[3], 221);
  // The vertical pass uses the same weights: the transposed image gives the same numbers.
  RgbImage col;
  col.height = 4;
  col.width = 1;
  col.pixels = img.pixels;
  RgbImage out_v = resize_bicubic_antialias(col, 2, 1);
  EXPECT_EQ(out_v.pixels[0], 60);
  EXPECT_EQ(out_v.pixels[3], 221);
}

TEST(Resize, VerticalPassEqualsHorizontalPassOnTheTransposedImage) {
  // The two passes are separate code (the vertical one vectorised two taps at a time); with
  // the same weights, resizing the height of an image must equal resizing the width of its
  // transpose, byte for byte. Sizes cover up- and downscaling, odd tap counts and row
  // lengths that are not multiples of the vector width.
  for (auto [n, out] : std::vector<std::pair<int, int>>{{37, 224}, {300, 64}, {1001, 288}, {64, 63}}) {
    const int other = 29;  // the unchanged side
    RgbImage tall, wide;
    tall.height = n, tall.width = other;
    wide.height = other, wide.width = n;
    tall.pixels.resize(static_cast<size_t>(n) * other * 3);
    wide.pixels.resize(tall.pixels.size());
    uint32_t s = 12345;
    for (int y = 0; y < n; ++y)
      for (int x = 0; x < other; ++x)
        for (int c = 0; c < 3; ++c) {
          s = s * 1664525u + 1013904223u;
          const uint8_t v = static_cast<uint8_t>(s >> 24);
          tall.pixels[(static_cast<size_t>(y) * other + x) * 3 + c] = v;
          wide.pixels[(static_cast<size_t>(x) * n + y) * 3 + c] = v;
        }
    RgbImage a = resize_bicubic_antialias(tall, out, other);
    RgbImage b = resize_bicubic_antialias(wide, other, out);
    for (int y = 0; y < out; ++y)
      for (int x = 0; x < other; ++x)
        for (int c = 0; c < 3; ++c)
          ASSERT_EQ(a.pixels[(static_cast<size_t>(y) * other + x) * 3 + c],
                    b.pixels[(static_cast<size_t>(x) * out + y) * 3 + c])
              << n << " -> " << out << " at " << y << "," << x << "," << c;
  }
}

TEST(Resize, SameSizeIsACopy) {
  RgbImage img = constant_image(7, 9, 1, 2, 3);
  img.pixels[5] = 77;
  RgbImage out = resize_bicubic_antialias(img, 7, 9);
  EXPECT_EQ(out.pixels, img.pixels);
}

TEST(Patchify, ReferenceRowAndColumnOrder) {
  // 64x96 image: gh = 4, gw = 6. Pixel value encodes position: v = (7*y + 3*x + 50*c) % 256.
  const int h = 64, w = 96;
  RgbImage img;
  img.height = h;
  img.width = w;
  img.pixels.resize(static_cast<size_t>(h) * w * 3);
  auto value = [](int y, int x, int c) { return static_cast<uint8_t>((7 * y + 3 * x + 50 * c) % 256); };
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) img.pixels[(static_cast<size_t>(y) * w + x) * 3 + c] = value(y, x, c);
  PreprocessOptions o;
  PreparedImage p = patchify(img, o);
  ASSERT_EQ(p.grid_t, 1);
  ASSERT_EQ(p.grid_h, 4);
  ASSERT_EQ(p.grid_w, 6);
  ASSERT_EQ(p.pixel_values.size(), 24u * 1536u);
  EXPECT_EQ(image_token_count(p), 6);
  // Spec §3.6: row = ((hb*(gw/2) + wb)*2 + hi)*2 + wi, origin y0 = (2hb+hi)*16, x0 = (2wb+wi)*16;
  // col = ((c*2 + tt)*16 + py)*16 + px.
  for (int hb = 0; hb < 2; ++hb)
    for (int wb = 0; wb < 3; ++wb)
      for (int hi = 0; hi < 2; ++hi)
        for (int wi = 0; wi < 2; ++wi) {
          const int row = ((hb * 3 + wb) * 2 + hi) * 2 + wi;
          const int y0 = (2 * hb + hi) * 16, x0 = (2 * wb + wi) * 16;
          for (int c = 0; c < 3; ++c)
            for (int tt = 0; tt < 2; ++tt)
              for (int py = 0; py < 16; py += 5)
                for (int px = 0; px < 16; px += 3) {
                  const int col = ((c * 2 + tt) * 16 + py) * 16 + px;
                  const float expect = (static_cast<float>(value(y0 + py, x0 + px, c)) - 127.5f) / 127.5f;
                  ASSERT_EQ(p.pixel_values[static_cast<size_t>(row) * 1536 + col], expect)
                      << "row " << row << " col " << col;
                }
        }
}

TEST(Patchify, NormalisationEndpoints) {
  RgbImage img = constant_image(32, 32, 0, 255, 127);
  PreparedImage p = patchify(img, PreprocessOptions{});
  EXPECT_EQ(p.pixel_values[0], -1.0f);              // (0 - 127.5) / 127.5
  EXPECT_EQ(p.pixel_values[512], 1.0f);             // channel 1 starts at 2*16*16
  EXPECT_EQ(p.pixel_values[1024], -0.5f / 127.5f);  // (127 - 127.5) / 127.5, one rounding
}

TEST(Preprocess, SkipsTheResizeWhenTheSizeIsAlreadyAMultiple) {
  // 256x320 is already a valid target: the reference returns the tensor unchanged, so the
  // pixel values are the normalised input exactly.
  RgbImage img = constant_image(256, 320, 10, 20, 30);
  img.pixels[0] = 200;
  auto p = preprocess(img, PreprocessOptions{});
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->grid_h, 16);
  EXPECT_EQ(p->grid_w, 20);
  EXPECT_EQ(p->pixel_values[0], (200.0f - 127.5f) / 127.5f);
}

// rgb_output keeps the resized bytes; patchifying them gives the pixel_values preprocess()
// would have produced, with and without a resize.
TEST(Preprocess, RgbOutputIsTheResizedImageThatPatchifiesToThePixelValues) {
  RgbImage img;
  img.height = 203;  // -> 224 x 320 (ProbeExamplesFromTheSpec): a real resize
  img.width = 317;
  img.pixels.resize(static_cast<size_t>(img.height) * img.width * 3);
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>((i * 7919u) >> 3);
  for (const bool resize : {true, false}) {
    SCOPED_TRACE(resize ? "resized" : "already a multiple");
    const RgbImage src = resize ? img : resize_bicubic_antialias(img, 224, 320);
    PreprocessOptions plain, bytes;
    bytes.rgb_output = true;
    auto px = preprocess(src, plain);
    auto rgb = preprocess(src, bytes);
    ASSERT_TRUE(px.is_ok() && rgb.is_ok());
    EXPECT_TRUE(rgb->pixel_values.empty());
    EXPECT_EQ(rgb->grid_t, 1);
    EXPECT_EQ(rgb->grid_h, 14);  // 224 / 16
    EXPECT_EQ(rgb->grid_w, 20);  // 320 / 16
    EXPECT_EQ(rgb->rgb, resize_bicubic_antialias(img, 224, 320).pixels);
    std::vector<float> again(px->pixel_values.size());
    patchify_into(rgb->rgb.data(), 224, 320, 16, 2, 2, again.data());
    EXPECT_EQ(again, px->pixel_values);
  }
}

}  // namespace
}  // namespace qvl::image
