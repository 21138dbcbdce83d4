// Helpers for the GPU op tests: the two backends (CPU oracle, CUDA under test), tensors that
// hold the same values on both (F32 activations on the CPU, BF16 on CUDA), fresh random
// inputs that BF16 represents exactly, and the comparison that records one row of the summary
// table printed at the end of the run (gpu_main_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "support/tolerances.h"

namespace qvl::test::gpu {

// The backends; cuda() is null when there is no CUDA device.
Backend& cpu();
Backend* cuda();
// A generator seeded from the run seed (printed in the table header) and a per-test salt.
std::mt19937& rng();

#define QVL_REQUIRE_CUDA() \
  if (::qvl::test::gpu::cuda() == nullptr) GTEST_SKIP() << "no CUDA device"

// One row of the summary table.
struct CheckRow {
  std::string op, shape;
  double max_abs = 0, max_ref = 0, rel_l2 = 0;
  tol::GpuTol tol{};
  bool pass = false;
};
void record(const CheckRow& row);

// Memory that lives until the end of the test (DeviceBuffers of either backend).
class Scratch {
 public:
  Tensor alloc(Backend& be, DType dt, std::initializer_list<int64_t> dims) {
    Tensor t(nullptr, dt, dims, be.device());
    auto buf = be.allocate(std::max<size_t>(t.nbytes(), 1), "test");
    EXPECT_TRUE(buf.is_ok()) << buf.status().to_string();
    t.data = buf->data();
    keep_.push_back(std::move(buf).value());
    return t;
  }

 private:
  std::vector<DeviceBuffer> keep_;
};

// Same values on both backends.
struct Pair {
  Tensor c;  // CPU
  Tensor g;  // CUDA
};

inline std::vector<float> random_values(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = round_to_bf16(dist(rng()));
  return v;
}
inline std::vector<float> random_uniform(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = round_to_bf16(dist(rng()));
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  return b;
}

// Activations: F32 on the CPU, BF16 on CUDA, from BF16-representable values.
inline Pair activation(Scratch& s, std::initializer_list<int64_t> dims, const std::vector<float>& values) {
  Pair p{s.alloc(cpu(), DType::kF32, dims), s.alloc(*cuda(), DType::kBF16, dims)};
  EXPECT_EQ(static_cast<int64_t>(values.size()), p.c.numel());
  cpu().copy_to_device(p.c, values.data());
  std::vector<uint16_t> b = to_bf16_bits(values);
  cuda()->copy_to_device(p.g, b.data());
  return p;
}
// The same bytes on both backends (indices, F32 tables, BF16 weights used as tensors).
inline Pair same_bytes(Scratch& s, DType dt, std::initializer_list<int64_t> dims, const void* host) {
  Pair p{s.alloc(cpu(), dt, dims), s.alloc(*cuda(), dt, dims)};
  cpu().copy_to_device(p.c, host);
  cuda()->copy_to_device(p.g, host);
  return p;
}
inline Pair ints(Scratch& s, std::initializer_list<int64_t> dims, const std::vector<int32_t>& v) {
  return same_bytes(s, DType::kI32, dims, v.data());
}

// A device tensor's values as floats (F32 or BF16).
// Elements of a and b (same size) whose bits differ.
inline int64_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

inline std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kF32) {
    be.copy_to_host(out.data(), t);
  } else {
    EXPECT_TRUE(t.dtype == DType::kBF16) << t.describe();
    std::vector<uint16_t> b(out.size());
    be.copy_to_host(b.data(), t);
    for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_float(b[i]);
  }
  return out;
}

// Compares the CUDA result with the CPU reference, records a table row, and fails the test
// when the error exceeds `tol` (NaN never passes; an all-zero reference needs an all-zero result).
::testing::AssertionResult compare(const std::string& op, const std::string& shape, const std::vector<float>& actual,
                                   const std::vector<float>& expected, tol::GpuTol tol);

inline ::testing::AssertionResult compare_pair(const std::string& op, const std::string& shape, const Pair& p,
                                               tol::GpuTol tol) {
  return compare(op, shape, download(*cuda(), p.g), download(cpu(), p.c), tol);
}

// "[1, 2048]"-style strings for table rows.
std::string dims(std::initializer_list<int64_t> d);

}  // namespace qvl::test::gpu
