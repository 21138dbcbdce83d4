// See region.h.
#include "backend/cuda/region.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

namespace qvl::cuda {
namespace {

using ReserveFn = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
using FreeFn = CUresult (*)(CUdeviceptr, size_t);
using CreateFn = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
using ReleaseFn = CUresult (*)(CUmemGenericAllocationHandle);
using MapFn = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
using UnmapFn = CUresult (*)(CUdeviceptr, size_t);
using AccessFn = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
using GranularityFn = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);

struct Driver {
  ReserveFn reserve = nullptr;
  FreeFn free = nullptr;
  CreateFn create = nullptr;
  ReleaseFn release = nullptr;
  MapFn map = nullptr;
  UnmapFn unmap = nullptr;
  AccessFn access = nullptr;
  GranularityFn granularity = nullptr;
  Status status;
};

template <typename Fn>
Status lookup(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError();
    return failed_precondition(std::string("CUDA driver entry point ") + name + " unavailable");
  }
  *fn = reinterpret_cast<Fn>(p);
  return Status::ok();
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    Status s = lookup("cuMemAddressReserve", &d.reserve);
    if (s.is_ok()) s = lookup("cuMemAddressFree", &d.free);
    if (s.is_ok()) s = lookup("cuMemCreate", &d.create);
    if (s.is_ok()) s = lookup("cuMemRelease", &d.release);
    if (s.is_ok()) s = lookup("cuMemMap", &d.map);
    if (s.is_ok()) s = lookup("cuMemUnmap", &d.unmap);
    if (s.is_ok()) s = lookup("cuMemSetAccess", &d.access);
    if (s.is_ok()) s = lookup("cuMemGetAllocationGranularity", &d.granularity);
    d.status = s;
  });
  return d;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

class VmmRegion final : public DeviceRegion {
 public:
  VmmRegion(int device, CUdeviceptr base, size_t reserved, size_t granularity, std::string tag,
            std::shared_ptr<AllocationStats> stats)
      : device_(device),
        base_(base),
        reserved_(reserved),
        granularity_(granularity),
        tag_(std::move(tag)),
        stats_(std::move(stats)) {}

  ~VmmRegion() override {
    const Driver& d = driver();
    for (const Chunk& c : chunks_) {
      d.unmap(base_ + c.offset, c.size);
      d.release(c.handle);
      stats_->sub(c.size);
    }
    d.free(base_, reserved_);
  }

  void* base() const override { return reinterpret_cast<void*>(base_); }
  size_t reserved_bytes() const override { return reserved_; }
  size_t committed_bytes() const override { return committed_; }

  Status grow_to(size_t bytes) override {
    if (bytes <= committed_) return Status::ok();
    if (bytes > reserved_)
      return out_of_range(tag_ + ": grow to " + std::to_string(bytes) + " bytes past the " + std::to_string(reserved_) +
                          " reserved");
    const size_t target = std::min(reserved_, (bytes + granularity_ - 1) / granularity_ * granularity_);
    const size_t size = target - committed_;
    const Driver& d = driver();
    CUmemAllocationProp prop = device_prop(device_);
    CUmemGenericAllocationHandle handle{};
    CUresult r = d.create(&handle, size, &prop, 0);
    if (r != CUDA_SUCCESS) {
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      cudaGetLastError();
      return resource_exhausted(tag_ + ": cannot commit " + std::to_string(size >> 20) + " MiB more (" +
                                std::to_string(committed_ >> 20) + " MiB committed, " + std::to_string(free_b >> 20) +
                                " MiB free on the device; CUresult " + std::to_string(static_cast<int>(r)) + ")");
    }
    r = d.map(base_ + committed_, size, 0, handle, 0);
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device_;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r = d.access(base_ + committed_, size, &access, 1);
      if (r != CUDA_SUCCESS) d.unmap(base_ + committed_, size);
    }
    if (r != CUDA_SUCCESS) {
      d.release(handle);
      return internal_error(tag_ + ": mapping " + std::to_string(size) + " bytes failed (CUresult " +
                            std::to_string(static_cast<int>(r)) + ")");
    }
    chunks_.push_back({committed_, size, handle});
    committed_ = target;
    stats_->add(size);
    return Status::ok();
  }

 private:
  struct Chunk {
    size_t offset, size;
    CUmemGenericAllocationHandle handle;
  };
  int device_;
  CUdeviceptr base_;
  size_t reserved_, granularity_;
  size_t committed_ = 0;
  std::string tag_;
  std::shared_ptr<AllocationStats> stats_;
  std::vector<Chunk> chunks_;
};

}  // namespace

Result<std::unique_ptr<DeviceRegion>> reserve_vmm_region(int device, size_t max_bytes, const std::string& tag,
                                                         std::shared_ptr<AllocationStats> stats) {
  const Driver& d = driver();
  if (!d.status.is_ok()) return d.status;
  CUmemAllocationProp prop = device_prop(device);
  size_t gran = 0;
  if (d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || gran == 0)
    return failed_precondition(tag + ": the device does not report a virtual-memory granularity");
  const size_t reserved = (std::max<size_t>(max_bytes, 1) + gran - 1) / gran * gran;
  CUdeviceptr base = 0;
  if (d.reserve(&base, reserved, 0, 0, 0) != CUDA_SUCCESS)
    return resource_exhausted(tag + ": cannot reserve " + std::to_string(reserved >> 20) + " MiB of address space");
  return std::unique_ptr<DeviceRegion>(new VmmRegion(device, base, reserved, gran, tag, std::move(stats)));
}

}  // namespace qvl::cuda
