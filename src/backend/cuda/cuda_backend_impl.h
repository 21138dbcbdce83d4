// Internal to the CUDA backend: the CudaBackend class (backend.h on one device and one stream),
// whose methods are defined in three translation units:
//   cuda_backend.cpp         construction, memory and copies, the dispatch of every op but
//                            Linear (with the deferral of small prologues), the factory and the
//                            public accessors of cuda_backend.h;
//   cuda_backend_linear.cpp  weights (load_tensor, load_linear) and the Linear dispatch
//                            (skinny kernels, fused prologues, the deferred decode Linear whose
//                            epilogue a silu_mul may join, cuBLASLt, FP8 paths);
//   cuda_backend_graphs.cpp  regions, CUDA graphs and profiling.
// Ordinary C++: kernels are reached through kernels.h, cuBLASLt through gemm.h, growable regions
// through region.h. Everything the ops need beyond their arguments (workspaces, scratch) is
// allocated in init(), so nothing is allocated while generating.
//
// Invariant: at most one op is deferred at a time (pending_, prep_, attn_ or lin_); every op
// that does not fuse it calls flush() first, so results never depend on whether a fusion
// happened.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/region.h"
#include "backend/cuda/weight_stream.h"

#define QVL_CUDA_OK(expr)                                                                 \
  do {                                                                                    \
    cudaError_t qvl_e_ = (expr);                                                          \
    QVL_CHECK(qvl_e_ == cudaSuccess) << #expr << ": " << cudaGetErrorName(qvl_e_) << " (" \
                                     << cudaGetErrorString(qvl_e_) << ")";                \
  } while (0)

namespace qvl::cuda {

class CudaBackend final : public Backend {
 public:
  // info: the device as the backend treats it (apply_emulated_profile); device_smem: the
  // device's own opt-in shared memory per block.
  CudaBackend(const CudaBackendOptions& options, const CudaDeviceInfo& info, size_t context_bytes, int device_smem)
      : options_(options),
        info_(info),
        device_smem_(device_smem),
        context_bytes_(context_bytes),
        stats_(std::make_shared<AllocationStats>()) {}
  ~CudaBackend() override;

  // Creates the stream and every workspace (resource-exhausted when they do not fit).
  Status init();

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda:" + std::to_string(info_.ordinal) + " (" + info_.name + ")"; }
  DType activation_dtype() const override { return DType::kBF16; }

  CudaFp8GemmCounts fp8_gemm_counts() const { return fp8_counts_; }
  std::vector<uint64_t> decode_attention_trace() {
    std::vector<uint64_t> t;
    if (!decode_trace_.data()) return t;
    synchronize();
    t.resize(decode_trace_.size() / sizeof(uint64_t));
    QVL_CUDA_OK(cudaMemcpy(t.data(), decode_trace_.data(), decode_trace_.size(), cudaMemcpyDeviceToHost));
    return t;
  }
  void quantize_fp8_rows(Tensor q, Tensor scales, Tensor tail_scales, const Tensor& x);
  CudaMemoryStats memory_stats() const;
  void reset_peak() { stats_->peak.store(stats_->allocated.load()); }

  // ---- memory ----
  Result<DeviceBuffer> allocate(size_t bytes, const std::string& tag) override;
  void copy_to_device(Tensor dst, const void* host_src) override;
  void copy_to_device_async(Tensor dst, const void* host_src) override;
  void copy_to_host(void* host_dst, const Tensor& src) override;
  void copy(Tensor dst, const Tensor& src) override;
  void synchronize() override;

  // ---- weights ----
  Result<Tensor> load_tensor(const Tensor& host, DType as) override;
  Result<LinearWeight> load_linear(std::span<const LinearPart> parts, const Tensor& host_bias, int block_size) override;

  // ---- layer offload ----
  bool can_stream_weights() const override { return true; }
  Result<DeviceBuffer> allocate_host(size_t bytes, const std::string& tag) override;
  void set_weight_placement(WeightPlacement* placement) override { placement_ = placement; }
  void prefetch(int slot, void* dst, const void* host_src, size_t bytes) override;
  void wait_prefetch(int slot) override;

  // ---- ops ----
  void embedding(Tensor out, const Tensor& table, const Tensor& ids) override;
  void scatter_rows(Tensor x, const Tensor& rows, const Tensor& src, bool accumulate) override;
  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override;
  void rms_norm(Tensor out, const Tensor& x, const Tensor& weight, float eps) override;
  void layer_norm(Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) override;
  void linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) override;
  void silu_mul(Tensor out, const Tensor& gate_up) override;
  void argmax_rows(Tensor ids, const Tensor& logits) override;
  void top_k_rows(Tensor keys, const Tensor& logits) override;
  void convert(Tensor out, const Tensor& x) override;
  void patchify_rgb(Tensor out, const Tensor& rgb, int grid_h, int grid_w, int patch, int merge, int temporal) override;
  void add_interpolated(Tensor x, const Tensor& table, const Tensor& idx, const Tensor& w) override;
  void vision_rope(Tensor qkv, const Tensor& rope, int num_heads, int head_dim) override;
  void vision_rope_table(Tensor rope, const Tensor& row_col, const Tensor& angles) override;
  void vision_attention(Tensor out, const Tensor& qkv, const VisionSegments& seg, int num_heads, int head_dim,
                        float scale) override;
  void text_qkv_prepare(Tensor qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, const MropeSpec& rope,
                        const TextBatch& batch, const KvCacheView& cache, int layer,
                        const TextAttentionShape& shape) override;
  void text_attention(Tensor out, const Tensor& qkv, const TextBatch& batch, const KvCacheView& cache, int layer,
                      const TextAttentionShape& shape, float scale) override;
  bool decoder_stack(Tensor x, const DecoderStack& stack, const TextBatch& batch, const KvCacheView& cache,
                     const DecoderStackBuffers& buffers) override;

  // ---- regions and graphs ----
  Result<std::unique_ptr<DeviceRegion>> reserve_region(size_t max_bytes, const std::string& tag) override;
  void run_graph(const std::string& key, const std::function<void()>& record) override;
  void clear_graphs() override;
  void end_loading() override { release_staging(); }

  // Profiling (cuda_profile_start / cuda_profile_stop).
  void profile_start(double hold_ms);
  std::vector<CudaKernelTime> profile_stop();

 private:
  // The decode scratch: split partials, then the decode attention's per-step table, then the
  // argmax keys and counters, then the split decode's arrival counters.
  size_t decode_partial_bytes() const {
    return static_cast<size_t>(options_.max_head_dim + 2) * sizeof(float) * kDecodeSplitBlocks * options_.max_gqa_group;
  }
  cuda::DecodeStepTable decode_step_table(int mode) const {
    cuda::DecodeStepTable t;
    t.prep = reinterpret_cast<int32_t*>(static_cast<char*>(decode_scratch_.data()) + decode_partial_bytes());
    t.keys = t.prep + static_cast<size_t>(kDecodeSplitBlocks) * (options_.max_head_dim + 2);
    t.max_head_dim = options_.max_head_dim;
    t.mode = mode;
    return t;
  }
  static constexpr size_t kArgmaxScratchBytes = kArgmaxMaxRows * kArgmaxRowScratchBytes;
  void* argmax_scratch() const {
    return static_cast<char*>(decode_scratch_.data()) + decode_scratch_.size() - kDecodeSplitBlocks * sizeof(uint32_t) -
           kArgmaxScratchBytes;
  }
  uint32_t* decode_counters() const {
    return reinterpret_cast<uint32_t*>(static_cast<char*>(decode_scratch_.data()) + decode_scratch_.size() -
                                       kDecodeSplitBlocks * sizeof(uint32_t));
  }
  bool capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (!stream_ || cudaStreamIsCapturing(stream_, &st) != cudaSuccess) return false;
    return st != cudaStreamCaptureStatusNone;
  }

  // Device memory for a weight: carved from the weight placement while one is set (layer
  // offload lays a layer out in a staging buffer), else a fresh allocation.
  Result<DeviceBuffer> weight_memory(size_t bytes, const std::string& tag);
  // Copies `host` to device memory at dst as dtype `as` (converting on the host if needed).
  Status upload_converted(void* dst, const Tensor& host, DType as);
  // Host -> device copy of weights, `src` pageable (the checkpoint's map). Past kStagedUpload
  // bytes it goes through two pinned staging buffers on the backend's stream: threads copy one
  // chunk into a buffer while the other's DMA runs. The call returns once `src` is no longer
  // read; the device copy completes in stream order. Smaller copies: cudaMemcpy.
  Status upload(void* dst, const void* src, size_t bytes);
  void release_staging();
  static constexpr size_t kStagedUpload = size_t{4} << 20;
  static constexpr size_t kStagingChunk = size_t{32} << 20;
  struct Staging {
    void* buf[2] = {nullptr, nullptr};
    cudaEvent_t done[2] = {nullptr, nullptr};  // the DMA out of buf[i] has finished
    int next = 0;
    bool unavailable = false;  // cudaHostAlloc refused them once: not asked again
  } staging_;

  void gemm_linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep);

  // An RMSNorm or SiLU·mul over few rows whose launch is deferred to the next op: fused into
  // the prologue of the Linear that reads its output, or launched as is by flush() before any
  // other op (so results never depend on whether the fusion happened).
  struct Pending {
    enum Kind { kNone, kRmsNorm, kSiluMul } kind = kNone;
    Tensor out, src, weight;
    float eps = 0;
  };
  // A text_qkv_prepare deferred into the decode attention that follows it (see text_attention).
  struct PendingPrepare {
    bool active = false;
    Tensor qkv;
    cuda::FusedPrepare prepare;
    TextBatch batch;
    KvCacheView cache;
    int layer = 0;
    TextAttentionShape shape;
  };
  // A decode attention deferred to the next op, so that it knows what follows it: the Linear
  // that reads its output (o_proj) decides when the attention lets it launch (launch_decode_
  // attention); any other op launches it as is first (flush).
  struct PendingAttention {
    bool active = false;
    Tensor out, qkv;
    TextBatch batch;
    KvCacheView cache;
    int layer = 0;
    TextAttentionShape shape;
    float scale = 0;
    bool fused = false;
    cuda::FusedPrepare prepare;
  };
  void launch_decode_attention(const LinearWeight* next);
  // A decode Linear whose output may be the gate_up of the silu_mul that follows, deferred to
  // the next op: silu_mul of its output makes it one launch with the SwiGLU epilogue
  // (launch_skinny_linear's glu_out); any other op launches it as is first (flush).
  struct PendingLinear {
    bool active = false;
    Tensor out, x;
    LinearWeight w;  // a copy (views of the device weights): the caller's may not outlive the call
    cuda::SkinnyPrologue pro;
  };
  // Launches the decode Linear, or defers it (lin_) where a SwiGLU epilogue could follow.
  void skinny_linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep,
                     const cuda::SkinnyPrologue& pro, bool follows_attention);
  void launch_pending_linear(const Tensor& glu_out);
  static bool same_batch(const TextBatch& a, const TextBatch& b) {
    return a.num_seqs == b.num_seqs && a.num_tokens == b.num_tokens && a.max_pages_per_seq == b.max_pages_per_seq &&
           a.query_start.data == b.query_start.data && a.context_len.data == b.context_len.data &&
           a.page_table.data == b.page_table.data && a.slots.data == b.slots.data &&
           a.positions.data == b.positions.data;
  }
  // Launches the deferred op, if any, as is.
  void flush();

  // The fused decoder stack's phase stamps of the last profiled launch, as extra records
  // ("trace:" kernels, not launches): per phase, the mean over blocks of its time in each layer,
  // summed over layers, and the same for the slowest block of each layer.
  void append_stack_trace(std::vector<CudaKernelTime>& times);

  // Names the op whose launches follow (profiling only; callers test ctx_.profiler first so
  // that no label is built otherwise).
  void note(std::string label, double bytes = 0, double flops = 0) {
    ctx_.profiler->set_op(std::move(label), bytes, flops);
  }
  // "linear 1x2048->4096 bf16 +bias +res +rms_norm", with the weight, input and output bytes.
  void note_linear(const Tensor& out, const Tensor& x, const LinearWeight& w, const Epilogue& ep, const char* extra);

  CudaBackendOptions options_;
  CudaDeviceInfo info_;
  int device_smem_ = 0;
  size_t context_bytes_;
  std::shared_ptr<AllocationStats> stats_;
  cudaStream_t stream_ = nullptr;
  LaunchContext ctx_;
  DeviceBuffer gemm_ws_, dequant_ws_, fp8_act_ws_, decode_scratch_;
  CudaFp8GemmCounts fp8_counts_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  std::vector<DeviceBuffer> weights_;
  std::map<std::string, cudaGraphExec_t> graphs_;
  bool fusion_ = true;
  int rms_rows_ = cuda::kFusedPrologueMaxRows;   // CudaBackendOptions::fused_rms_norm_max_rows
  int silu_rows_ = cuda::kFusedPrologueMaxRows;  // CudaBackendOptions::fused_silu_mul_max_rows
  int skinny_bf16_rows_ = kSkinnyBf16MaxRows;    // options_.skinny_bf16_max_rows, clamped
  Pending pending_;
  WeightPlacement* placement_ = nullptr;
  cuda::WeightStream weight_stream_;  // created by the first allocate_host
  PendingPrepare prep_;
  PendingAttention attn_;
  // Per text layer, the gate_up and down_proj weights the decode attention of that layer asks
  // L2 for (CudaBackendOptions::decode_l2_prefetch_bytes), from the model's decoder_stack call;
  // empty until one. Only weights this backend loaded, which live as long as it does.
  std::vector<std::array<std::pair<const void*, size_t>, 2>> l2_prefetch_;
  void note_decode_layers(const DecoderStack& stack);
  // Compute capability 9.x (H100, H200): where the decode defaults that depend on the device
  // (the wide FP8 kernel, FP8 gate_up's ring, the L2 prefetch) were measured.
  bool measured_arch() const { return info_.compute_capability / 10 == 9; }
  cuda::DecodeL2Prefetch decode_l2_prefetch(int layer, int num_seqs) const;
  PendingLinear lin_;
  int glu_rows_ = kSkinnyGluMaxRows;  // CudaBackendOptions::silu_mul_epilogue_max_rows, clamped
  // The decode step table was written by a layer-0 decode attention of this batch and cache, and
  // no layer-0 launch has come since: the later layers read it (launch_decode_attention).
  bool step_table_ready_ = false;
  TextBatch step_batch_;
  void* step_cache_ = nullptr;
  TextAttentionShape step_shape_;
  // Weight bytes of the Linear after a one-sequence decode attention above which the attention
  // lets it launch once its keys are done (its weights stream during the attention's merge);
  // below, at the attention's exit (CudaBackendOptions::decode_attention_trigger). The measured
  // crossover, in bytes rather than time: H100 between 8.4 MB (2B BF16, exit better) and 10.5 MB
  // (4B FP8, keys done better); on an H200 4B FP8 measured keys-done better as well (2.615
  // against 2.680 ms), where 2.8 us of its bandwidth (13.4 MB) would have chosen the exit.
  static constexpr double kEarlyLaunchBytes = 9.4e6;
  // Except where that Linear's grid is over 1.5 blocks per multiprocessor and its weights are at
  // most kLateLaunchMaxBytes: its blocks then crowd every multiprocessor beside the attention's,
  // and the exit was better (8B FP8, 256 tiles of 16.8 MB: 3.785 against 3.946 ms), while 8B
  // BF16 (256 tiles of 33.6 MB) measured its weights' stream on the critical path costlier (5.765
  // against 5.716 ms; H100, RESULTS run 36). The bound lies between those two points.
  static constexpr double kLateLaunchMaxBytes = 24e6;
  // CudaBackendOptions::decode_l2_prefetch_bytes' default where it applies: at most this much of
  // each of gate_up and down_proj (a third of an H100's 50 MB L2), and at most half of it. On a
  // device whose DRAM peaks above kDecodeL2PrefetchFastGBps (an H200's 4.8 TB/s against an
  // H100's 3.35) at most kDecodeL2PrefetchBytesFast: the prefetch delays every critical read
  // behind it, and there at most 8 MB of each measured better than at most 16 on all six
  // presets (bench/RESULTS.md run 42, items 6 and 7).
  static constexpr int64_t kDecodeL2PrefetchBytes = 16'000'000;
  static constexpr int64_t kDecodeL2PrefetchBytesFast = 8'000'000;
  static constexpr double kDecodeL2PrefetchFastGBps = 4000;
  std::vector<cuda::SkipRule> skip_rules_;  // ctx_.skip points here (measurement only)
  DeviceBuffer decode_trace_;               // ctx_.decode_trace (measurement only)
  std::unique_ptr<cuda::OpProfiler> profiler_;
  DeviceBuffer stack_trace_;  // decoder_stack phase stamps while profiling
  int trace_layers_ = 0;      // layers of the last traced decoder_stack launch (0: none pending)
};

}  // namespace qvl::cuda
