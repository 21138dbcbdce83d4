#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/parallel_copy.h"
#include "core/status.h"
#include "core/tensor.h"

namespace qvl {
namespace {

TEST(Status, CarriesCodeAndMessage) {
  Status s = not_found("config.json not found in /x");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.to_string(), "NOT_FOUND: config.json not found in /x");
  EXPECT_EQ(s.with_context("model").message(), "model: config.json not found in /x");
}

Result<int> half(int x) {
  if (x % 2) return invalid_argument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> quarter(int x) {
  QVL_ASSIGN_OR_RETURN(int h, half(x));
  return half(h);
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(quarter(8).value(), 2);
  Result<int> r = quarter(6);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "odd: 3");
  EXPECT_THROW(r.value(), CheckFailure);
}

TEST(Check, ThrowsWithBothValues) {
  try {
    int a = 3, b = 4;
    QVL_CHECK_EQ(a, b) << "context";
    FAIL() << "no throw";
  } catch (const CheckFailure& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("(3 vs 4)"), std::string::npos) << what;
    EXPECT_NE(what.find("context"), std::string::npos) << what;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even -> 1.0.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd mantissa) and 1 + 2^-6: ties to even -> up.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, Fp8E4M3RoundTripsEveryFiniteValue) {
  for (int v = 0; v < 256; ++v) {
    float f = fp8_e4m3_to_float(static_cast<uint8_t>(v));
    if (std::isnan(f)) continue;
    uint8_t back = fp8_e4m3_from_float(f);
    if (f == 0.0f) {
      EXPECT_EQ(back & 0x7f, 0) << v;
      continue;
    }
    EXPECT_EQ(back, v) << "value " << f;
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  // Halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): ties to even -> 1.0.
  EXPECT_EQ(fp8_e4m3_from_float(1.0625f), 0x38);
}

TEST(DType, F16Conversions) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(f16_to_float(float_to_f16(f)), f) << f;
  }
}

// Every byte lands where memcpy would put it, on one thread and split over several (sizes around
// the threshold, not a multiple of the thread count, more threads than a copy has bytes per
// thread), and nothing outside the destination range is written.
TEST(ParallelCopy, CopiesExactlyTheRange) {
  const size_t big = kParallelCopyMinBytes;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, big - 1, big, big + 7, 3 * big + 5}) {
    for (int threads : {1, 2, 3, 8, 64}) {
      std::vector<unsigned char> src(bytes), dst(bytes + 2, 0xA5);
      for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>((i * 131 + bytes) % 251);
      parallel_copy(dst.data() + 1, src.data(), bytes, threads);
      EXPECT_EQ(dst.front(), 0xA5) << bytes << " bytes, " << threads << " threads";
      EXPECT_EQ(dst.back(), 0xA5) << bytes << " bytes, " << threads << " threads";
      EXPECT_EQ(std::memcmp(dst.data() + 1, src.data(), bytes), 0) << bytes << " bytes, " << threads << " threads";
    }
  }
}

TEST(Tensor, RowViewsStayContiguous) {
  float data[12];
  for (int i = 0; i < 12; ++i) data[i] = static_cast<float>(i);
  Tensor t(data, DType::kF32, {4, 3});
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape_string(), "[2, 3]");
  EXPECT_EQ(r.as<float>()[0], 3.0f);
  EXPECT_THROW(t.rows(2, 5), CheckFailure);
  EXPECT_EQ(t.reshape({2, 6}).dim(1), 6);
  EXPECT_THROW(t.reshape({5}), CheckFailure);
}

}  // namespace
}  // namespace qvl
