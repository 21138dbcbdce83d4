// See weight_stream.h.
#include "backend/cuda/weight_stream.h"

#include <algorithm>

#include "core/check.h"

namespace qvl::cuda {
namespace {

#define QVL_WS_OK(expr)                                                                   \
  do {                                                                                    \
    cudaError_t qvl_e_ = (expr);                                                          \
    QVL_CHECK(qvl_e_ == cudaSuccess) << #expr << ": " << cudaGetErrorName(qvl_e_) << " (" \
                                     << cudaGetErrorString(qvl_e_) << ")";                \
  } while (0)

}  // namespace

Result<DeviceBuffer> allocate_pinned(size_t bytes, const std::string& tag) {
  void* p = nullptr;
  cudaError_t err = cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return resource_exhausted(tag + ": cannot pin " + std::to_string(bytes >> 20) + " MiB of host memory (" +
                              cudaGetErrorString(err) + ")");
  }
  return DeviceBuffer(p, bytes, std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); }));
}

WeightStream::~WeightStream() {
  if (!copy_) return;
  cudaStreamSynchronize(copy_);
  for (int s = 0; s < kPrefetchSlots; ++s) {
    cudaEventDestroy(issued_[s]);
    cudaEventDestroy(ready_[s]);
  }
  cudaStreamDestroy(copy_);
}

Status WeightStream::init() {
  if (copy_) return Status::ok();
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (int s = 0; s < kPrefetchSlots && err == cudaSuccess; ++s) {
    err = cudaEventCreateWithFlags(&issued_[s], cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&ready_[s], cudaEventDisableTiming);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return internal_error(std::string("weight streaming: cannot create the copy stream and events: ") +
                          cudaGetErrorString(err));
  }
  copy_ = stream;
  return Status::ok();
}

void WeightStream::prefetch(cudaStream_t compute, int slot, void* dst, const void* host_src, size_t bytes) {
  QVL_CHECK(copy_ != nullptr) << "prefetch before any host memory was allocated for streaming";
  QVL_CHECK(slot >= 0 && slot < kPrefetchSlots) << "prefetch slot " << slot;
  QVL_WS_OK(cudaEventRecord(issued_[slot], compute));
  QVL_WS_OK(cudaStreamWaitEvent(copy_, issued_[slot], 0));
  QVL_WS_OK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, copy_));
  QVL_WS_OK(cudaEventRecord(ready_[slot], copy_));
}

void WeightStream::wait(cudaStream_t compute, int slot) {
  QVL_CHECK(copy_ != nullptr) << "wait_prefetch before any prefetch";
  QVL_CHECK(slot >= 0 && slot < kPrefetchSlots) << "prefetch slot " << slot;
  QVL_WS_OK(cudaStreamWaitEvent(compute, ready_[slot], 0));
}

}  // namespace qvl::cuda
