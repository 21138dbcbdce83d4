// Element types qvl stores and computes with, and exact scalar conversions between them.
// Type facts (name as safetensors spells it, byte size) live in one table, kDTypeInfo.
// bf16 and fp8-e4m3 conversions follow PyTorch: float -> bf16 rounds to nearest even (NaN
// stays NaN); float -> e4m3fn rounds to nearest even (out-of-range handling: see
// fp8_e4m3_from_float).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace qvl {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI64, kI32, kU8, kBool };

struct DTypeInfo {
  DType dtype;
  std::string_view safetensors_name;  // "BF16", "F8_E4M3", ...
  int size;                           // bytes per element
  bool is_float;
};

inline constexpr DTypeInfo kDTypeInfo[] = {
    {DType::kF32, "F32", 4, true},      {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},    {DType::kF8E4M3, "F8_E4M3", 1, true},
    {DType::kI64, "I64", 8, false},     {DType::kI32, "I32", 4, false},
    {DType::kU8, "U8", 1, false},       {DType::kBool, "BOOL", 1, false},
};

constexpr const DTypeInfo& dtype_info(DType t) { return kDTypeInfo[static_cast<int>(t)]; }
constexpr int dtype_size(DType t) { return dtype_info(t).size; }
constexpr std::string_view dtype_name(DType t) { return dtype_info(t).safetensors_name; }
// Parses a safetensors dtype name; nullopt for names qvl does not handle.
std::optional<DType> dtype_from_name(std::string_view name);

// ---- bf16 ----
using bf16_bits = uint16_t;

inline float bf16_to_float(bf16_bits b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, like torch's float -> bfloat16 cast.
inline bf16_bits float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>((u + rounding) >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// ---- fp16 ----
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// ---- fp8 e4m3fn (torch.float8_e4m3fn: no infinities, 0x7f/0xff are NaN, max 448) ----
namespace detail {
constexpr float fp8_e4m3_decode(int v) {
  int exp = (v >> 3) & 0xf, mant = v & 7;
  float x = 0.0f;
  if (exp == 15 && mant == 7) {
    x = __builtin_nanf("");
  } else if (exp == 0) {
    x = static_cast<float>(mant) / 512.0f;  // subnormal: mant/8 * 2^-6
  } else {
    x = 1.0f + static_cast<float>(mant) / 8.0f;
    for (int e = exp - 7; e > 0; --e) x *= 2.0f;
    for (int e = exp - 7; e < 0; ++e) x *= 0.5f;
  }
  return (v & 0x80) ? -x : x;
}
struct Fp8Table {
  float v[256];
  constexpr Fp8Table() : v() {
    for (int i = 0; i < 256; ++i) v[i] = fp8_e4m3_decode(i);
  }
};
}  // namespace detail
inline constexpr detail::Fp8Table kFp8E4M3Table{};  // exact decode of every byte
inline float fp8_e4m3_to_float(uint8_t v) { return kFp8E4M3Table.v[v]; }
// Round to nearest even; values beyond ±448 saturate to ±448 (the quantizers clamp before
// casting, so saturation and torch's NaN agree on every value qvl ever converts).
uint8_t fp8_e4m3_from_float(float f);
inline constexpr float kFp8E4M3Max = 448.0f;

}  // namespace qvl
