// Arena: a bump allocator over one block of memory on one device (a DeviceBuffer or a host
// vector). Forward passes take their activations from an arena sized by the memory plan and
// reset it afterwards, so nothing is allocated while generating. Allocation past the end is a
// programmer error (the plan was wrong), reported with the numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/tensor.h"

namespace qvl {

class Arena {
 public:
  static constexpr size_t kAlignment = 256;  // cuBLASLt and vector loads want >= 16; 256 keeps rows tidy

  Arena() = default;
  Arena(void* base, size_t capacity, Device device, std::string name = "arena")
      : base_(static_cast<char*>(base)), capacity_(capacity), device_(device), name_(std::move(name)) {}

  // A tensor of `dtype` and `dims` from the arena (uninitialised).
  Tensor alloc(DType dtype, std::initializer_list<int64_t> dims) {
    Tensor t(nullptr, dtype, dims, device_);
    t.data = alloc_bytes(t.nbytes());
    return t;
  }

  void* alloc_bytes(size_t bytes) {
    size_t start = (used_ + kAlignment - 1) / kAlignment * kAlignment;
    QVL_CHECK_LE(start + bytes, capacity_) << name_ << ": out of planned memory (" << bytes << " bytes asked, "
                                           << capacity_ - used_ << " left of " << capacity_ << ")";
    used_ = start + bytes;
    if (used_ > high_water_) high_water_ = used_;
    return base_ + start;
  }

  // Releases everything allocated after `mark` (a value returned by used()).
  void reset(size_t mark = 0) {
    QVL_CHECK_LE(mark, used_);
    used_ = mark;
  }

  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }
  Device device() const { return device_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t high_water_ = 0;
  Device device_ = Device::kCpu;
  std::string name_;
};

}  // namespace qvl
