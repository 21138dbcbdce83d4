#include "core/dtype.h"

#include <cmath>

namespace qvl {

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypeInfo) {
    if (info.safetensors_name == name) return info.dtype;
  }
  return std::nullopt;
}

float f16_to_float(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to inf
  if (abs < 0x38800000) {                                              // subnormal or zero
    float a;
    std::memcpy(&a, &abs, 4);
    float scaled = a * 16777216.0f;  // 2^24: units of the smallest subnormal
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  abs += rounding;
  abs -= 0x38000000u;  // rebias exponent 127 -> 15
  return static_cast<uint16_t>(sign | (abs >> 13));
}

uint8_t fp8_e4m3_from_float(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;
  // Find the nearest representable magnitude, ties to even mantissa.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp_unbiased = e - 1;
  if (exp_unbiased < -6) exp_unbiased = -6;  // subnormal range shares the 2^-9 step
  float step = std::ldexp(1.0f, exp_unbiased - 3);
  float q = std::nearbyint(a / step) * step;  // nearbyint: ties to even under default rounding
  if (q >= kFp8E4M3Max) return sign | 0x7e;
  // Encode q exactly.
  if (q == 0.0f) return sign;
  int qe;
  float qm = std::frexp(q, &qe);
  int biased = qe - 1 + 7;
  if (biased <= 0) {  // subnormal
    int mant = static_cast<int>(std::lround(q / std::ldexp(1.0f, -9)));
    return sign | static_cast<uint8_t>(mant);
  }
  int mant = static_cast<int>(std::lround((qm * 2.0f - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>((biased << 3) | mant);
}

}  // namespace qvl
