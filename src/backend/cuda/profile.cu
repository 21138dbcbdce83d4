// Per-launch timing for `qvl bench --profile` (see kernels.h: OpProfiler). Each kernel launch,
// cuBLASLt call and device copy made while a profile runs is bracketed by a pair of CUDA
// events on the backend's stream; the op label (set by the backend op that launched it) and
// the bytes / FLOPs that op must move or compute travel with the first launch of the op.
//
// The hold kernel spins on the GPU for a fixed time before the profiled work, so the host can
// queue the launches ahead of the device: the event times are then device times, not the
// host's launch rate (a decode step's ~200 short kernels would otherwise be host-bound here,
// where events break graph capture and programmatic dependent launch).
#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda {
namespace {

__global__ void hold_kernel(uint64_t ns) {
  uint64_t t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

}  // namespace

OpProfiler::OpProfiler(cudaStream_t stream) : stream_(stream) {}

OpProfiler::~OpProfiler() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

void OpProfiler::set_op(std::string label, double bytes, double flops) {
  op_ = std::move(label);
  bytes_ = bytes;
  flops_ = flops;
}

cudaEvent_t OpProfiler::event() {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    QVL_CUDA_CHECK(cudaEventCreate(&e));
    pool_.push_back(e);
  }
  return pool_[used_++];
}

void OpProfiler::before(const char* kernel) {
  Record r;
  r.op = op_.empty() ? std::string("(no op)") : op_;
  r.kernel = kernel;
  r.bytes = bytes_;
  r.flops = flops_;
  bytes_ = flops_ = 0;  // counted once per op, on its first launch
  r.start = event();
  r.stop = event();
  QVL_CUDA_CHECK(cudaEventRecord(r.start, stream_));
  records_.push_back(std::move(r));
}

void OpProfiler::after() {
  QVL_CHECK(!records_.empty());
  QVL_CUDA_CHECK(cudaEventRecord(records_.back().stop, stream_));
}

void OpProfiler::hold(double ms) {
  if (ms <= 0) return;
  hold_kernel<<<1, 1, 0, stream_>>>(static_cast<uint64_t>(ms * 1e6));
  QVL_CUDA_CHECK_LAUNCH("profile hold kernel");
}

std::vector<KernelTime> OpProfiler::collect() {
  QVL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<KernelTime> out;
  out.reserve(records_.size());
  for (const Record& r : records_) {
    KernelTime t;
    t.op = r.op;
    t.kernel = r.kernel;
    t.bytes = r.bytes;
    t.flops = r.flops;
    float ms = 0, at = 0;
    QVL_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
    QVL_CUDA_CHECK(cudaEventElapsedTime(&at, records_.front().start, r.start));
    t.us = ms * 1e3;
    t.start_us = at * 1e3;
    out.push_back(std::move(t));
  }
  records_.clear();
  used_ = 0;
  op_.clear();
  bytes_ = flops_ = 0;
  return out;
}

}  // namespace qvl::cuda
