// Tensor: a non-owning view of a contiguous, row-major block of elements on one device.
// It is plain data (pointer, dtype, up to 4 dims, device) and never allocates or frees; memory
// belongs to whoever made it (an mmap'd checkpoint, a backend arena, a host vector). Views of a
// row range of the first dimension stay contiguous, which is the only slicing qvl needs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace qvl {

enum class Device : uint8_t { kCpu, kCuda };

inline constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* data_, DType dtype_, std::initializer_list<int64_t> dims, Device device_ = Device::kCpu)
      : data(data_), dtype(dtype_), device(device_) {
    QVL_CHECK_LE(dims.size(), static_cast<size_t>(kMaxDims));
    for (int64_t d : dims) shape[ndim++] = d;
  }

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const {
    if (i < 0) i += ndim;
    QVL_CHECK(i >= 0 && i < ndim) << "dim " << i << " of a " << ndim << "-d tensor";
    return shape[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Elements per row of the first dimension.
  int64_t row_numel() const { return ndim == 0 ? 1 : numel() / shape[0]; }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  // Rows [begin, end) of the first dimension.
  Tensor rows(int64_t begin, int64_t end) const {
    QVL_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0])
        << "rows(" << begin << ", " << end << ") of " << shape_string();
    Tensor t = *this;
    t.shape[0] = end - begin;
    t.data = static_cast<char*>(data) + begin * row_numel() * dtype_size(dtype);
    return t;
  }
  Tensor row(int64_t i) const { return rows(i, i + 1); }

  // Same memory, new shape with the same element count.
  Tensor reshape(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims, device);
    QVL_CHECK_EQ(t.numel(), numel()) << "reshape of " << shape_string();
    return t;
  }

  // "[2, 3, 4]"
  std::string shape_string() const;
  // "bf16[2, 3, 4]"
  std::string describe() const;
  bool same_shape(const Tensor& o) const;
};

}  // namespace qvl
