// torch's CPU uint8 antialiased bicubic resize (torch 2.11, aten/src/ATen/native/cpu/
// UpSampleKernel.cpp: separable_upsample_generic_Nd_kernel_impl with HelperInterpCubic, and
// UpSampleKernelAVXAntialias.h, whose integer arithmetic is the same), re-derived here:
//
//  * per axis, double weights from Keys' cubic (a = -0.5) stretched by the downscale factor,
//    PIL-style bounds xmin/xsize, normalised to sum 1 (_compute_indices_min_size_weights_aa);
//  * converted to int16 with a precision chosen so the largest weight stays below 2^15
//    (_compute_index_ranges_int16_weights), rounded half away from zero;
//  * horizontal pass (if the width changes) then vertical pass (if the height changes), each
//    sum_k u8 * w16 in int32 plus 2^(precision-1), arithmetic shift, clamp to [0, 255].
//
// Any deviation (other rounding, float accumulation, pass order) changes about a pixel in
// three by one level, which the golden test would report.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "core/check.h"
#include "image/buffer.h"
#include "image/image.h"

namespace qvl::image {
namespace {

// Keys' cubic convolution kernel with a = -0.5 (torch's aa_filter<double, true>), evaluated
// in the same operation order as torch's cubic_convolution1/2.
double keys_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// Fixed-point weights of one axis: output i reads inputs [xmin[i], xmin[i] + xsize[i]) with
// weights w[i * taps + j].
struct AxisWeights {
  int taps = 0;
  int precision = 0;
  std::vector<int> xmin, xsize;
  std::vector<int16_t> w;
};

AxisWeights axis_weights(int in_size, int out_size) {
  constexpr double kInterpSize = 4;  // bicubic
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = (scale >= 1.0) ? (kInterpSize * 0.5) * scale : kInterpSize * 0.5;
  const int taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  const double invscale = (scale >= 1.0) ? 1.0 / scale : 1.0;

  AxisWeights aw;
  aw.taps = taps;
  aw.xmin.resize(out_size);
  aw.xsize.resize(out_size);
  std::vector<double> wd(static_cast<size_t>(out_size) * taps, 0.0);
  double wt_max = 0.0;
  for (int i = 0; i < out_size; ++i) {
    const double center = scale * (i + 0.5);
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), static_cast<int64_t>(0));
    int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), static_cast<int64_t>(in_size)) - xmin;
    xsize = std::clamp(xsize, static_cast<int64_t>(0), static_cast<int64_t>(taps));
    double* wp = wd.data() + static_cast<size_t>(i) * taps;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      const double w = keys_cubic((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      wp[j] = w;
      total += w;
    }
    double wt_max_i = 0.0;
    if (total != 0.0) {
      for (int64_t j = 0; j < xsize; ++j) {
        wp[j] /= total;
        wt_max_i = std::max(wt_max_i, wp[j]);
      }
    }
    wt_max = std::max(wt_max, wt_max_i);
    aw.xmin[i] = static_cast<int>(xmin);
    aw.xsize[i] = static_cast<int>(xsize);
  }
  // The largest precision p (< 22) with round(wt_max * 2^(p+1)) < 2^15.
  int precision = 0;
  for (precision = 0; precision < 22; ++precision) {
    const int next_value = static_cast<int>(0.5 + wt_max * (1 << (precision + 1)));
    if (next_value >= (1 << 15)) break;
  }
  aw.precision = precision;
  aw.w.resize(wd.size());
  for (size_t k = 0; k < wd.size(); ++k) {
    const double v = wd[k] * (1 << precision);
    aw.w[k] = static_cast<int16_t>((v < 0) ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return aw;
}

// Below this much work (output pixels x taps) a pass runs on the calling thread: small images
// are common, and a server calls this from many request threads at once.
constexpr int64_t kParallelWork = 4 << 20;

inline uint8_t clamp_shift(int32_t acc, int precision) {
  return static_cast<uint8_t>(std::clamp(acc >> precision, 0, 255));
}

// (H, in_w, 3) -> (H, out_w, 3).
void horizontal_pass(const uint8_t* src, int height, int in_w, uint8_t* dst, int out_w, const AxisWeights& aw) {
  const int32_t bias = 1 << (aw.precision - 1);
  [[maybe_unused]] const bool big = static_cast<int64_t>(height) * out_w * aw.taps >= kParallelWork;
#pragma omp parallel for schedule(static) if (big)
  for (int y = 0; y < height; ++y) {
    const uint8_t* in = src + static_cast<int64_t>(y) * in_w * 3;
    uint8_t* out = dst + static_cast<int64_t>(y) * out_w * 3;
    for (int x = 0; x < out_w; ++x) {
      const int16_t* w = aw.w.data() + static_cast<int64_t>(x) * aw.taps;
      const uint8_t* p = in + static_cast<int64_t>(aw.xmin[x]) * 3;
      int32_t r = bias, g = bias, b = bias;
      for (int j = 0, n = aw.xsize[x]; j < n; ++j) {
        r += p[3 * j + 0] * w[j];
        g += p[3 * j + 1] * w[j];
        b += p[3 * j + 2] * w[j];
      }
      out[3 * x + 0] = clamp_shift(r, aw.precision);
      out[3 * x + 1] = clamp_shift(g, aw.precision);
      out[3 * x + 2] = clamp_shift(b, aw.precision);
    }
  }
}

// acc[k] += in0[k] * w0 + in1[k] * w1 for k < n: two taps per step. SSE2 (always present on
// x86-64) does it with pmaddwd on interleaved (in0, in1) int16 pairs - exact int32 sums, so
// the result is the same as the scalar loop.
void accumulate_pair(int32_t* acc, const uint8_t* in0, const uint8_t* in1, int16_t w0, int16_t w1, int64_t n) {
  int64_t k = 0;
#ifdef __SSE2__
  const __m128i zero = _mm_setzero_si128();
  const __m128i w = _mm_set1_epi32(
      static_cast<int32_t>((static_cast<uint32_t>(static_cast<uint16_t>(w1)) << 16) | static_cast<uint16_t>(w0)));
  for (; k + 16 <= n; k += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in0 + k));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in1 + k));
    const __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b);  // a0 b0 a1 b1 ...
    __m128i* out = reinterpret_cast<__m128i*>(acc + k);
    _mm_storeu_si128(out + 0, _mm_add_epi32(_mm_loadu_si128(out + 0), _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), w)));
    _mm_storeu_si128(out + 1, _mm_add_epi32(_mm_loadu_si128(out + 1), _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), w)));
    _mm_storeu_si128(out + 2, _mm_add_epi32(_mm_loadu_si128(out + 2), _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), w)));
    _mm_storeu_si128(out + 3, _mm_add_epi32(_mm_loadu_si128(out + 3), _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), w)));
  }
#endif
  for (; k < n; ++k) acc[k] += in0[k] * w0 + in1[k] * w1;
}

// out[k] = clamp(acc[k] >> precision, 0, 255).
void store_row(uint8_t* out, const int32_t* acc, int precision, int64_t n) {
  int64_t k = 0;
#ifdef __SSE2__
  const __m128i shift = _mm_cvtsi32_si128(precision);
  for (; k + 16 <= n; k += 16) {
    const __m128i* a = reinterpret_cast<const __m128i*>(acc + k);
    // Saturating packs int32 -> int16 -> uint8 equal the clamp to [0, 255].
    const __m128i s0 =
        _mm_packs_epi32(_mm_sra_epi32(_mm_loadu_si128(a + 0), shift), _mm_sra_epi32(_mm_loadu_si128(a + 1), shift));
    const __m128i s1 =
        _mm_packs_epi32(_mm_sra_epi32(_mm_loadu_si128(a + 2), shift), _mm_sra_epi32(_mm_loadu_si128(a + 3), shift));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_packus_epi16(s0, s1));
  }
#endif
  for (; k < n; ++k) out[k] = clamp_shift(acc[k], precision);
}

// (in_h, W, 3) -> (out_h, W, 3): each output row is a weighted sum of whole input rows, an
// int32 multiply-add over W*3 bytes, two taps at a time.
void vertical_pass(const uint8_t* src, int in_h, int width, uint8_t* dst, int out_h, const AxisWeights& aw) {
  (void)in_h;
  const int64_t row_len = static_cast<int64_t>(width) * 3;
  const int32_t bias = 1 << (aw.precision - 1);
  [[maybe_unused]] const bool big = static_cast<int64_t>(out_h) * row_len * aw.taps / 3 >= kParallelWork;
#pragma omp parallel if (big)
  {
    std::vector<int32_t> acc(static_cast<size_t>(row_len));
#pragma omp for schedule(static)
    for (int y = 0; y < out_h; ++y) {
      const int16_t* w = aw.w.data() + static_cast<int64_t>(y) * aw.taps;
      const uint8_t* first = src + static_cast<int64_t>(aw.xmin[y]) * row_len;
      std::fill(acc.begin(), acc.end(), bias);
      const int n = aw.xsize[y];
      int j = 0;
      for (; j + 1 < n; j += 2)
        accumulate_pair(acc.data(), first + j * row_len, first + (j + 1) * row_len, w[j], w[j + 1], row_len);
      if (j < n) accumulate_pair(acc.data(), first + j * row_len, first + j * row_len, w[j], 0, row_len);
      store_row(dst + static_cast<int64_t>(y) * row_len, acc.data(), aw.precision, row_len);
    }
  }
}

}  // namespace

RgbImage resize_bicubic_antialias(const RgbImage& src, int out_height, int out_width) {
  QVL_CHECK(out_height > 0 && out_width > 0) << out_width << "x" << out_height;
  QVL_CHECK_EQ(src.pixels.size(), static_cast<size_t>(src.height) * src.width * 3);
  if (out_width == src.width && out_height == src.height) return src;
  // torch's order: the width first (horizontal pass), then the height.
  RgbImage horizontal;
  const RgbImage* cur = &src;
  if (out_width != src.width) {
    const AxisWeights aw = axis_weights(src.width, out_width);
    horizontal.height = src.height;
    horizontal.width = out_width;
    detail::resize_large(horizontal.pixels, static_cast<size_t>(horizontal.height) * horizontal.width * 3);
    horizontal_pass(src.pixels.data(), src.height, src.width, horizontal.pixels.data(), out_width, aw);
    if (out_height == src.height) return horizontal;
    cur = &horizontal;
  }
  const AxisWeights aw = axis_weights(src.height, out_height);
  RgbImage out;
  out.height = out_height;
  out.width = cur->width;
  detail::resize_large(out.pixels, static_cast<size_t>(out.height) * out.width * 3);
  vertical_pass(cur->pixels.data(), cur->height, cur->width, out.pixels.data(), out_height, aw);
  return out;
}

}  // namespace qvl::image
