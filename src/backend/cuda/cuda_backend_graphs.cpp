// The CUDA backend, part 3 of 3 (see cuda_backend_impl.h): growable regions, CUDA graphs (one
// recording per key, replayed with one launch) and profiling (per-launch device times, plus the
// fused decoder stack's phase stamps turned into records).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/log.h"

namespace qvl::cuda {

// ---- regions and graphs ----
Result<std::unique_ptr<DeviceRegion>> CudaBackend::reserve_region(size_t max_bytes, const std::string& tag) {
  flush();
  QVL_CHECK(!capturing()) << "reserve_region(" << tag << ") while recording a graph";
  return cuda::reserve_vmm_region(info_.ordinal, max_bytes, tag, stats_);
}

void CudaBackend::run_graph(const std::string& key, const std::function<void()>& record) {
  if (capturing() || ctx_.profiler) {  // nested: part of the outer recording; profiling: eager
    record();
    return;
  }
  flush();
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    QVL_CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      record();
      flush();
    } catch (...) {
      pending_ = {};
      prep_ = {};
      attn_ = {};
      lin_ = {};
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream_, &broken);
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    cudaGraph_t graph = nullptr;
    QVL_CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    QVL_CUDA_OK(err);
    it = graphs_.emplace(key, exec).first;
    log_debug("cuda: recorded graph '" + key + "'");
  }
  QVL_CUDA_OK(cudaGraphLaunch(it->second, stream_));
}

void CudaBackend::clear_graphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

// ---- profiling ----
void CudaBackend::profile_start(double hold_ms) {
  flush();
  QVL_CHECK(!capturing()) << "profile_start while recording a graph";
  if (!profiler_) profiler_ = std::make_unique<cuda::OpProfiler>(stream_);
  if (!stack_trace_.data()) {  // diagnostics only: not part of any memory plan
    const size_t bytes = sizeof(long long) * cuda::kStackMaxLayers * ctx_.num_sms * cuda::kDecodeStackStamps;
    Result<DeviceBuffer> buf = allocate(bytes, "decode stack trace");
    if (buf.is_ok()) stack_trace_ = std::move(buf).value();
  }
  ctx_.profiler = profiler_.get();
  profiler_->hold(hold_ms);
}

std::vector<CudaKernelTime> CudaBackend::profile_stop() {
  flush();
  QVL_CHECK(ctx_.profiler != nullptr) << "profile_stop without profile_start";
  ctx_.profiler = nullptr;
  std::vector<CudaKernelTime> times = profiler_->collect();
  if (trace_layers_ > 0) append_stack_trace(times);
  return times;
}

void CudaBackend::append_stack_trace(std::vector<CudaKernelTime>& times) {
  const int L = trace_layers_, G = ctx_.num_sms, S = cuda::kDecodeStackStamps;
  trace_layers_ = 0;
  std::vector<long long> t(static_cast<size_t>(L) * G * S);
  const cudaError_t err =
      cudaMemcpy(t.data(), stack_trace_.data(), t.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  QVL_CHECK(err == cudaSuccess) << "decode stack trace: " << cudaGetErrorString(err);
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, info_.ordinal);
  const double us_per_tick = clock_khz > 0 ? 1e3 / clock_khz : 0.0;
  static const char* names[] = {
      "qkv wait+input", "qkv rows",           "(none)",       "attention (wait+work)", "o wait+input",
      "o rows",         "gate_up wait+input", "gate_up rows", "down wait+input",       "down rows"};
  for (int ph = 0; ph + 1 < S; ++ph) {
    if (ph == 2) continue;
    double mean = 0, worst = 0;
    for (int l = 0; l < L; ++l) {
      double sum = 0, mx = 0;
      for (int b = 0; b < G; ++b) {
        const long long* st = &t[(static_cast<size_t>(l) * G + b) * S];
        const double d = static_cast<double>(st[ph + 1] - st[ph]) * us_per_tick;
        sum += d;
        mx = std::max(mx, d);
      }
      mean += sum / G;
      worst += mx;
    }
    times.push_back({std::string("decoder_stack phase ") + names[ph] + " (mean over blocks)",
                     std::string("trace:") + names[ph], mean, 0, 0, 0});
    times.push_back({std::string("decoder_stack phase ") + names[ph] + " (slowest block)",
                     std::string("trace-max:") + names[ph], worst, 0, 0, 0});
  }
}

}  // namespace qvl::cuda
