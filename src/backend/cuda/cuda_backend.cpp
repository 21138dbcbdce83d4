// The CUDA backend (backend.h on one device and one stream). Ordinary C++: kernels are reached
// through kernels.h, cuBLASLt through gemm.h, growable regions through region.h. Everything the
// ops need beyond their arguments (workspaces, scratch) is allocated in the constructor.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/region.h"
#include "backend/cuda/weight_stream.h"
#include "core/log.h"

namespace qvl {
namespace {

using cuda::AllocationStats;
using cuda::LaunchContext;

#define QVL_CUDA_OK(expr)                                                                 \
  do {                                                                                    \
    cudaError_t qvl_e_ = (expr);                                                          \
    QVL_CHECK(qvl_e_ == cudaSuccess) << #expr << ": " << cudaGetErrorName(qvl_e_) << " (" \
                                     << cudaGetErrorString(qvl_e_) << ")";                \
  } while (0)

// Host-side conversion of n elements to BF16 or F32 (weights whose checkpoint dtype differs
// from what the model asks for; rare, small tensors).
bool host_convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  auto read = [&](int64_t i) -> float {
    switch (from) {
      case DType::kF32:
        return static_cast<const float*>(src)[i];
      case DType::kBF16:
        return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
      case DType::kF16:
        return f16_to_float(static_cast<const uint16_t*>(src)[i]);
      default:
        return 0.0f;
    }
  };
  if (from != DType::kF32 && from != DType::kBF16 && from != DType::kF16) return false;
  if (to == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = float_to_bf16(read(i));
  } else if (to == DType::kF32) {
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = read(i);
  } else {
    return false;
  }
  return true;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const CudaBackendOptions& options, const CudaDeviceInfo& info, size_t context_bytes)
      : options_(options), info_(info), context_bytes_(context_bytes), stats_(std::make_shared<AllocationStats>()) {}

  ~CudaBackend() override {
    clear_graphs();
    gemm_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init() {
    QVL_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ctx_.stream = stream_;
    ctx_.pdl = options_.programmatic_launch && info_.compute_capability >= 90;
    ctx_.clusters = options_.cluster_attention && info_.compute_capability >= 90;
    ctx_.token_prepare = options_.token_qkv_prepare;
    ctx_.vision_mt = options_.vision_attention_mt == 1 ? 1 : 2;
    ctx_.prefill_q_alias = options_.prefill_q_alias;
    ctx_.prefill_key_tiles = std::max(1, options_.prefill_key_tiles);
    ctx_.num_sms = std::max(1, info_.multiprocessors);
    fusion_ = options_.fuse_prologues;
    ctx_.skinny = {options_.skinny_variant, options_.skinny_depth, options_.skinny_split};
    QVL_ASSIGN_OR_RETURN(gemm_ws_, allocate(options_.gemm_workspace_bytes, "cuBLASLt workspace"));
    QVL_ASSIGN_OR_RETURN(dequant_ws_, allocate(options_.dequant_workspace_bytes, "FP8 dequant workspace"));
    if (const size_t bytes = cuda_fp8_act_workspace_bytes(options_, info_.compute_capability); bytes > 0) {
      QVL_ASSIGN_OR_RETURN(fp8_act_ws_, allocate(bytes, "FP8 activation workspace"));
    }
    QVL_ASSIGN_OR_RETURN(decode_scratch_, allocate(cuda_decode_scratch_bytes(options_), "decode attention scratch"));
    // The argmax keys and counters and the arrival counters at the end of the scratch start at
    // zero (and the kernels leave them so).
    QVL_CUDA_OK(cudaMemset(argmax_scratch(), 0, kArgmaxScratchBytes + kDecodeSplitBlocks * sizeof(uint32_t)));
    gemm_ = std::make_unique<cuda::GemmRunner>(stream_, gemm_ws_.data(), gemm_ws_.size());
    cuda::configure_vision_attention();
    cuda::configure_text_attention();
    return Status::ok();
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda:" + std::to_string(info_.ordinal) + " (" + info_.name + ")"; }
  DType activation_dtype() const override { return DType::kBF16; }

  CudaFp8GemmCounts fp8_gemm_counts() const { return fp8_counts_; }
  void quantize_fp8_rows(Tensor q, Tensor scales, Tensor tail_scales, const Tensor& x) {
    flush();
    QVL_CHECK(q.dtype == DType::kF8E4M3 && q.same_shape(x)) << "q " << q.describe() << " for x " << x.describe();
    const int64_t groups = (x.row_numel() + cuda::kFp8ActGroup - 1) / cuda::kFp8ActGroup;
    QVL_CHECK(scales.dtype == DType::kF32 && scales.ndim == 2 && scales.dim(0) == groups)
        << "scales " << scales.describe() << " for x " << x.describe();
    QVL_CHECK(tail_scales.empty() ||
              (tail_scales.dtype == DType::kF32 && tail_scales.numel() == groups * cuda::kFp8GemmRowMultiple))
        << "tail scales " << tail_scales.describe() << " for x " << x.describe();
    cuda::launch_quantize_fp8_rows(ctx_, q.data, scales.as<float>(), scales.dim(1),
                                   tail_scales.empty() ? nullptr : tail_scales.as<float>(), x);
  }

  CudaMemoryStats memory_stats() const {
    CudaMemoryStats s;
    s.allocated_bytes = stats_->allocated.load();
    s.peak_allocated_bytes = stats_->peak.load();
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) s.device_used_bytes = total_b - free_b;
    s.context_bytes = context_bytes_;
    return s;
  }

  // ---- memory ----
  Result<DeviceBuffer> allocate(size_t bytes, const std::string& tag) override {
    flush();
    QVL_CHECK(!capturing()) << "allocate(" << tag << ") while recording a graph";
    void* p = nullptr;
    const size_t size = std::max<size_t>(bytes, 1);
    cudaError_t err = cudaMalloc(&p, size);
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return resource_exhausted(tag + ": cannot allocate " + std::to_string(bytes >> 20) + " MiB on " + name() + " (" +
                                std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) + ")");
    }
    stats_->add(size);
    auto stats = stats_;
    std::shared_ptr<void> owner(p, [stats, size](void* q) {
      cudaFree(q);
      stats->sub(size);
    });
    return DeviceBuffer(p, bytes, std::move(owner));
  }

  void copy_to_device(Tensor dst, const void* host_src) override {
    flush();
    QVL_CHECK(!capturing()) << "copy_to_device while recording a graph";
    QVL_CHECK(dst.device == Device::kCuda) << dst.describe();
    if (dst.nbytes() == 0) return;
    QVL_CUDA_OK(cudaMemcpyAsync(dst.data, host_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    // A pageable source is staged before the call returns; a pinned one is read later, so wait
    // for it: the caller may reuse its buffer as soon as we return.
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, host_src) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
      QVL_CUDA_OK(cudaStreamSynchronize(stream_));
    }
    cudaGetLastError();
  }

  void copy_to_device_async(Tensor dst, const void* host_src) override {
    flush();
    QVL_CHECK(!capturing()) << "copy_to_device_async while recording a graph";
    QVL_CHECK(dst.device == Device::kCuda) << dst.describe();
    if (dst.nbytes() == 0) return;
    QVL_CUDA_OK(cudaMemcpyAsync(dst.data, host_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
  }

  void copy_to_host(void* host_dst, const Tensor& src) override {
    flush();
    QVL_CHECK(!capturing()) << "copy_to_host while recording a graph";
    QVL_CHECK(src.device == Device::kCuda) << src.describe();
    if (src.nbytes() == 0) return;
    QVL_CUDA_OK(cudaMemcpyAsync(host_dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    QVL_CUDA_OK(cudaStreamSynchronize(stream_));
  }

  void copy(Tensor dst, const Tensor& src) override {
    flush();
    QVL_CHECK_EQ(dst.nbytes(), src.nbytes()) << dst.describe() << " <- " << src.describe();
    if (dst.nbytes() == 0 || dst.data == src.data) return;
    if (ctx_.profiler) note("copy " + std::to_string(dst.nbytes()) + " B", 2.0 * dst.nbytes());
    cuda::ProfileRange range(ctx_, "memcpy d2d");
    QVL_CUDA_OK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  void synchronize() override {
    flush();
    QVL_CHECK(!capturing()) << "synchronize while recording a graph";
    QVL_CUDA_OK(cudaStreamSynchronize(stream_));
    QVL_CUDA_OK(cudaGetLastError());
  }

  // ---- weights ----
  Result<Tensor> load_tensor(const Tensor& host, DType as) override {
    flush();
    Tensor out = host;
    out.dtype = as;
    out.device = Device::kCuda;
    QVL_ASSIGN_OR_RETURN(DeviceBuffer buf, weight_memory(out.nbytes(), "weight " + host.shape_string()));
    out.data = buf.data();
    QVL_RETURN_IF_ERROR(upload_converted(out.data, host, as));
    weights_.push_back(std::move(buf));
    return out;
  }

  Result<LinearWeight> load_linear(std::span<const LinearPart> parts, const Tensor& host_bias, int block_size) override;

  // ---- layer offload ----
  bool can_stream_weights() const override { return true; }
  Result<DeviceBuffer> allocate_host(size_t bytes, const std::string& tag) override {
    QVL_RETURN_IF_ERROR(weight_stream_.init());
    return cuda::allocate_pinned(bytes, tag);
  }
  void set_weight_placement(WeightPlacement* placement) override { placement_ = placement; }
  void prefetch(int slot, void* dst, const void* host_src, size_t bytes) override {
    flush();
    weight_stream_.prefetch(stream_, slot, dst, host_src, bytes);
  }
  void wait_prefetch(int slot) override {
    flush();
    weight_stream_.wait(stream_, slot);
  }

  // ---- ops ----
  void embedding(Tensor out, const Tensor& table, const Tensor& ids) override {
    flush();
    if (ctx_.profiler) note("embedding " + out.shape_string(), 2.0 * out.nbytes());
    cuda::launch_embedding(ctx_, out, table, ids);
  }
  void scatter_rows(Tensor x, const Tensor& rows, const Tensor& src, bool accumulate) override {
    flush();
    if (ctx_.profiler) note("scatter_rows " + src.shape_string(), (accumulate ? 3.0 : 2.0) * src.nbytes());
    cuda::launch_scatter_rows(ctx_, x, rows, src, accumulate);
  }
  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override {
    flush();
    if (ctx_.profiler) note("gather_rows " + out.shape_string(), 2.0 * out.nbytes());
    cuda::launch_gather_rows(ctx_, out, x, rows);
  }
  void rms_norm(Tensor out, const Tensor& x, const Tensor& weight, float eps) override {
    flush();
    // Few rows: defer, so that the Linear reading `out` next can compute it in its prologue.
    if (fusion_ && x.dtype == DType::kBF16 && out.dtype == DType::kBF16 && x.ndim == 2 && out.same_shape(x) &&
        x.dim(0) <= cuda::kFusedPrologueMaxRows && x.dim(1) % 8 == 0 && x.data != out.data &&
        weight.numel() == x.dim(1) && (weight.dtype == DType::kF32 || weight.dtype == DType::kBF16)) {
      pending_ = {Pending::kRmsNorm, out, x, weight, eps};
      return;
    }
    if (ctx_.profiler) note("rms_norm " + x.shape_string(), 2.0 * x.nbytes());
    cuda::launch_rms_norm(ctx_, out, x, weight, eps);
  }
  void layer_norm(Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) override {
    flush();
    if (ctx_.profiler) note("layer_norm " + x.shape_string(), 2.0 * x.nbytes());
    cuda::launch_layer_norm(ctx_, out, x, weight, bias, eps);
  }
  void linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) override;
  void silu_mul(Tensor out, const Tensor& gate_up) override {
    flush();
    if (fusion_ && out.dtype == DType::kBF16 && gate_up.dtype == DType::kBF16 && out.ndim == 2 &&
        out.dim(0) <= cuda::kFusedPrologueMaxRows && out.dim(1) % 8 == 0 && gate_up.dim(0) == out.dim(0) &&
        gate_up.row_numel() == 2 * out.dim(1)) {
      pending_ = {Pending::kSiluMul, out, gate_up, Tensor(), 0.0f};
      return;
    }
    if (ctx_.profiler) note("silu_mul " + out.shape_string(), 3.0 * out.nbytes());
    cuda::launch_silu_mul(ctx_, out, gate_up);
  }
  void argmax_rows(Tensor ids, const Tensor& logits) override {
    flush();
    if (ctx_.profiler) note("argmax_rows " + logits.shape_string(), static_cast<double>(logits.nbytes()));
    cuda::launch_argmax_rows(ctx_, ids, logits, argmax_scratch(), kArgmaxScratchBytes);
  }
  void convert(Tensor out, const Tensor& x) override {
    flush();
    if (out.dtype == x.dtype) return copy(out, x);
    if (ctx_.profiler) note("convert " + x.shape_string(), static_cast<double>(x.nbytes() + out.nbytes()));
    cuda::launch_convert(ctx_, out, x);
  }
  void patchify_rgb(Tensor out, const Tensor& rgb, int grid_h, int grid_w, int patch, int merge,
                    int temporal) override {
    flush();
    if (ctx_.profiler) note("patchify_rgb " + out.shape_string(), static_cast<double>(rgb.nbytes() + out.nbytes()));
    cuda::launch_patchify_rgb(ctx_, out, rgb, grid_h, grid_w, patch, merge, temporal);
  }
  void add_interpolated(Tensor x, const Tensor& table, const Tensor& idx, const Tensor& w) override {
    flush();
    if (ctx_.profiler) note("add_interpolated " + x.shape_string(), 2.0 * x.nbytes());
    cuda::launch_add_interpolated(ctx_, x, table, idx, w);
  }
  void vision_rope(Tensor qkv, const Tensor& rope, int num_heads, int head_dim) override {
    flush();
    if (ctx_.profiler) note("vision_rope " + qkv.shape_string(), 4.0 / 3.0 * qkv.nbytes() + rope.nbytes());
    cuda::launch_vision_rope(ctx_, qkv, rope, num_heads, head_dim);
  }
  void vision_attention(Tensor out, const Tensor& qkv, const VisionSegments& seg, int num_heads, int head_dim,
                        float scale) override {
    flush();
    if (ctx_.profiler) {
      double flops = 0;
      for (size_t i = 0; i + 1 < seg.host_cu_seqlens.size(); ++i) {
        const double len = seg.host_cu_seqlens[i + 1] - seg.host_cu_seqlens[i];
        flops += 4.0 * len * len * head_dim * num_heads;
      }
      note("vision_attention " + qkv.shape_string() + " heads " + std::to_string(num_heads),
           qkv.nbytes() + out.nbytes(), flops);
    }
    cuda::launch_vision_attention(ctx_, out, qkv, seg, num_heads, head_dim, scale);
  }
  void text_qkv_prepare(Tensor qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, const MropeSpec& rope,
                        const TextBatch& batch, const KvCacheView& cache, int layer,
                        const TextAttentionShape& shape) override {
    flush();
    const size_t half = static_cast<size_t>(shape.head_dim / 2);
    QVL_CHECK(rope.inv_freq.size() == half && rope.axis.size() == half)
        << "M-RoPE spec has " << rope.inv_freq.size() << " frequencies and " << rope.axis.size()
        << " axes for head_dim " << shape.head_dim;
    QVL_CHECK_LE(half, 128u);
    cuda::MropeParams params{};
    params.half = static_cast<int>(half);
    for (size_t j = 0; j < half; ++j) {
      QVL_CHECK_LT(rope.axis[j], 3) << "M-RoPE axis of frequency " << j;
      params.inv_freq[j] = rope.inv_freq[j];
      params.axis[j] = rope.axis[j];
    }
    // Decode batches: deferred into the decode attention kernel that reads qkv next.
    if (fusion_ && batch.num_tokens == batch.num_seqs && batch.num_tokens > 0 &&
        cuda::decode_attention_fusable(shape)) {
      prep_ = {true, qkv, {q_norm, k_norm, eps, params}, batch, cache, layer, shape};
      return;
    }
    if (ctx_.profiler) note("text_qkv_prepare " + qkv.shape_string(), 2.0 * qkv.nbytes());
    cuda::launch_text_qkv_prepare(ctx_, qkv, q_norm, k_norm, eps, params, batch, cache, layer, shape);
  }
  void text_attention(Tensor out, const Tensor& qkv, const TextBatch& batch, const KvCacheView& cache, int layer,
                      const TextAttentionShape& shape, float scale) override {
    // A deferred text_qkv_prepare of exactly this step is done by the decode kernel itself.
    const bool fuse = prep_.active && prep_.qkv.data == qkv.data && prep_.layer == layer &&
                      prep_.cache.base == cache.base && prep_.cache.dtype == cache.dtype &&
                      same_batch(prep_.batch, batch) && prep_.shape.num_q_heads == shape.num_q_heads &&
                      prep_.shape.num_kv_heads == shape.num_kv_heads && prep_.shape.head_dim == shape.head_dim;
    cuda::FusedPrepare fused;
    if (fuse) {
      fused = prep_.prepare;
      prep_ = {};
    }
    flush();
    if (batch.num_tokens == 0) return;
    if (ctx_.profiler)
      note(std::string(batch.num_tokens == batch.num_seqs
                           ? (fuse ? "text_qkv_prepare+attention decode" : "text_attention decode")
                           : "text_attention prefill") +
           " seqs " + std::to_string(batch.num_seqs) + " rows " + std::to_string(batch.num_tokens) + " max_context " +
           std::to_string(batch.max_context));
    if (batch.num_tokens == batch.num_seqs) {
      cuda::launch_text_decode_attention(
          ctx_, out, qkv, batch, cache, layer, shape, scale, static_cast<float*>(decode_scratch_.data()),
          decode_scratch_.size() - kArgmaxScratchBytes - kDecodeSplitBlocks * sizeof(uint32_t), decode_counters(),
          fuse ? &fused : nullptr);
    } else {
      cuda::launch_text_prefill_attention(ctx_, out, qkv, batch, cache, layer, shape, scale);
    }
  }

  bool decoder_stack(Tensor x, const DecoderStack& stack, const TextBatch& batch, const KvCacheView& cache,
                     const DecoderStackBuffers& buffers) override {
    if (!fusion_ || !options_.fused_decode || info_.compute_capability < 90) return false;
    if (batch.num_seqs != 1 || batch.num_tokens != 1 || x.ndim != 2 || x.dim(0) != 1) return false;
    flush();
    cuda::DecodeStackArgs a;
    a.stack = &stack;
    a.x = x;
    a.buffers = buffers;
    a.batch = &batch;
    a.cache = cache;
    a.partial = static_cast<float*>(decode_scratch_.data());
    a.partial_bytes = decode_scratch_.size() - kArgmaxScratchBytes - kDecodeSplitBlocks * sizeof(uint32_t);
    QVL_CHECK_LE(cuda::decode_stack_counter_count(), static_cast<size_t>(kDecodeSplitBlocks));
    a.counters = decode_counters();
    a.max_smem = info_.max_smem_per_block;
    a.max_splits = options_.decode_stack_splits;
    a.debug = options_.decode_stack_debug;
    if (ctx_.profiler && stack_trace_.data()) {
      a.trace = static_cast<long long*>(stack_trace_.data());
      trace_layers_ = static_cast<int>(stack.layers.size());
    }
    if (ctx_.profiler) {
      double bytes = 0;
      for (const DecoderLayerRefs& l : stack.layers)
        for (const LinearWeight* w : {l.qkv, l.o, l.gate_up, l.down})
          for (const LinearPart& p : w->parts) bytes += static_cast<double>(p.weight.nbytes() + p.scale_inv.nbytes());
      note("decoder_stack fused " + std::to_string(stack.layers.size()) + " layers max_context " +
               std::to_string(batch.max_context),
           bytes);
    }
    return cuda::launch_decode_stack(ctx_, a);
  }

  // ---- regions and graphs ----
  Result<std::unique_ptr<DeviceRegion>> reserve_region(size_t max_bytes, const std::string& tag) override {
    flush();
    QVL_CHECK(!capturing()) << "reserve_region(" << tag << ") while recording a graph";
    return cuda::reserve_vmm_region(info_.ordinal, max_bytes, tag, stats_);
  }

  void run_graph(const std::string& key, const std::function<void()>& record) override;
  void clear_graphs() override {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

 private:
  // The decode scratch: split partials, then the argmax keys and counters, then the split
  // decode's arrival counters.
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
  Result<DeviceBuffer> weight_memory(size_t bytes, const std::string& tag) {
    if (!placement_) return allocate(bytes, tag);
    void* p = placement_->take(bytes);
    if (!p)
      return resource_exhausted(tag + ": does not fit the offload staging buffer (" +
                                std::to_string(placement_->wanted()) + " bytes wanted of " +
                                std::to_string(placement_->capacity()) + ")");
    return DeviceBuffer(p, bytes, nullptr);
  }

  // Copies `host` to device memory at dst as dtype `as` (converting on the host if needed).
  Status upload_converted(void* dst, const Tensor& host, DType as) {
    const int64_t n = host.numel();
    if (host.dtype == as) {
      QVL_CUDA_OK(cudaMemcpy(dst, host.data, host.nbytes(), cudaMemcpyHostToDevice));
      return Status::ok();
    }
    std::vector<char> tmp(static_cast<size_t>(n) * dtype_size(as));
    if (!host_convert(host.data, host.dtype, tmp.data(), as, n))
      return unimplemented("cannot convert a " + std::string(dtype_name(host.dtype)) + " tensor " +
                           host.shape_string() + " to " + std::string(dtype_name(as)) + " on the CUDA backend");
    QVL_CUDA_OK(cudaMemcpy(dst, tmp.data(), tmp.size(), cudaMemcpyHostToDevice));
    return Status::ok();
  }

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
  static bool same_batch(const TextBatch& a, const TextBatch& b) {
    return a.num_seqs == b.num_seqs && a.num_tokens == b.num_tokens && a.max_pages_per_seq == b.max_pages_per_seq &&
           a.query_start.data == b.query_start.data && a.context_len.data == b.context_len.data &&
           a.page_table.data == b.page_table.data && a.slots.data == b.slots.data &&
           a.positions.data == b.positions.data;
  }
  void flush() {
    if (prep_.active) {
      PendingPrepare q = prep_;
      prep_ = {};
      if (ctx_.profiler) note("text_qkv_prepare " + q.qkv.shape_string() + " (unfused)", 2.0 * q.qkv.nbytes());
      cuda::launch_text_qkv_prepare(ctx_, q.qkv, q.prepare.q_norm, q.prepare.k_norm, q.prepare.eps, q.prepare.rope,
                                    q.batch, q.cache, q.layer, q.shape);
    }
    if (pending_.kind == Pending::kNone) return;
    Pending p = pending_;
    pending_ = {};
    if (ctx_.profiler)
      note(std::string(p.kind == Pending::kRmsNorm ? "rms_norm " : "silu_mul ") + p.out.shape_string() + " (unfused)",
           (p.kind == Pending::kRmsNorm ? 2.0 : 3.0) * p.out.nbytes());
    if (p.kind == Pending::kRmsNorm)
      cuda::launch_rms_norm(ctx_, p.out, p.src, p.weight, p.eps);
    else
      cuda::launch_silu_mul(ctx_, p.out, p.src);
  }

 public:
  // Profiling (cuda_profile_start / cuda_profile_stop).
  void profile_start(double hold_ms) {
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
  std::vector<CudaKernelTime> profile_stop() {
    flush();
    QVL_CHECK(ctx_.profiler != nullptr) << "profile_stop without profile_start";
    ctx_.profiler = nullptr;
    std::vector<CudaKernelTime> times = profiler_->collect();
    if (trace_layers_ > 0) append_stack_trace(times);
    return times;
  }

 private:
  // The fused decoder stack's phase stamps of the last profiled launch, as extra records
  // ("trace:" kernels, not launches): per phase, the mean over blocks of its time in each layer,
  // summed over layers, and the same for the slowest block of each layer.
  void append_stack_trace(std::vector<CudaKernelTime>& times) {
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

 public:
 private:
  // Names the op whose launches follow (profiling only; callers test ctx_.profiler first so
  // that no label is built otherwise).
  void note(std::string label, double bytes = 0, double flops = 0) {
    ctx_.profiler->set_op(std::move(label), bytes, flops);
  }
  // "linear 1x2048->4096 bf16 +bias +res +rms_norm", with the weight, input and output bytes.
  void note_linear(const Tensor& out, const Tensor& x, const LinearWeight& w, const Epilogue& ep, const char* extra) {
    double bytes = static_cast<double>(x.nbytes() + out.nbytes() + w.bias.nbytes());
    for (const LinearPart& p : w.parts) bytes += static_cast<double>(p.weight.nbytes() + p.scale_inv.nbytes());
    if (!ep.residual.empty()) bytes += static_cast<double>(ep.residual.nbytes());
    std::string label = "linear " + std::to_string(x.dim(0)) + "x" + std::to_string(w.in_features) + "->" +
                        std::to_string(w.out_features) + (w.is_fp8() ? " fp8" : " bf16");
    if (!w.bias.empty()) label += " +bias";
    if (ep.act == Activation::kGeluTanh) label += " +gelu_tanh";
    if (ep.act == Activation::kGeluErf) label += " +gelu_erf";
    if (!ep.residual.empty()) label += " +res";
    label += extra;
    note(std::move(label), bytes, 2.0 * x.dim(0) * w.in_features * w.out_features);
  }

  CudaBackendOptions options_;
  CudaDeviceInfo info_;
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
  Pending pending_;
  WeightPlacement* placement_ = nullptr;
  cuda::WeightStream weight_stream_;  // created by the first allocate_host
  PendingPrepare prep_;
  std::unique_ptr<cuda::OpProfiler> profiler_;
  DeviceBuffer stack_trace_;  // decoder_stack phase stamps while profiling
  int trace_layers_ = 0;      // layers of the last traced decoder_stack launch (0: none pending)
};

Result<LinearWeight> CudaBackend::load_linear(std::span<const LinearPart> parts, const Tensor& host_bias,
                                              int block_size) {
  if (parts.empty()) return invalid_argument("load_linear: no weight parts");
  const bool fp8 = parts[0].weight.dtype == DType::kF8E4M3;
  const int64_t in = parts[0].weight.dim(1);
  int64_t out = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& w = parts[i].weight;
    if (w.ndim != 2 || w.dim(1) != in)
      return invalid_argument("load_linear: part " + std::to_string(i) + " is " + w.describe() + ", expected [*, " +
                              std::to_string(in) + "]");
    if ((w.dtype == DType::kF8E4M3) != fp8)
      return invalid_argument("load_linear: part " + std::to_string(i) + " is " + w.describe() + " but part 0 is " +
                              parts[0].weight.describe());
    out += w.dim(0);
  }
  LinearWeight lw;
  lw.out_features = out;
  lw.in_features = in;
  lw.block_size = block_size;
  LinearPart merged;
  if (!fp8) {
    Tensor wt(nullptr, DType::kBF16, {out, in}, Device::kCuda);
    QVL_ASSIGN_OR_RETURN(DeviceBuffer buf, weight_memory(wt.nbytes(), "linear " + wt.shape_string()));
    wt.data = buf.data();
    int64_t row = 0;
    for (const LinearPart& p : parts) {
      QVL_RETURN_IF_ERROR(upload_converted(static_cast<char*>(wt.data) + row * in * 2, p.weight, DType::kBF16));
      row += p.weight.dim(0);
    }
    weights_.push_back(std::move(buf));
    merged.weight = wt;
  } else {
    if (block_size <= 0) return invalid_argument("load_linear: FP8 block size " + std::to_string(block_size));
    const int64_t kb = (in + block_size - 1) / block_size;
    // Block scales stay one row per block when every part but the last starts on a block
    // boundary (all Qwen3-VL shapes); otherwise each weight row gets its own scale row.
    bool aligned = true;
    for (size_t i = 0; i + 1 < parts.size(); ++i) aligned &= parts[i].weight.dim(0) % block_size == 0;
    const int64_t scale_rows = aligned ? (out + block_size - 1) / block_size : out;
    Tensor wt(nullptr, DType::kF8E4M3, {out, in}, Device::kCuda);
    Tensor st(nullptr, DType::kF32, {scale_rows, kb}, Device::kCuda);
    QVL_ASSIGN_OR_RETURN(DeviceBuffer wbuf, weight_memory(wt.nbytes(), "fp8 linear " + wt.shape_string()));
    QVL_ASSIGN_OR_RETURN(DeviceBuffer sbuf, weight_memory(st.nbytes(), "fp8 scales " + st.shape_string()));
    wt.data = wbuf.data();
    st.data = sbuf.data();
    std::vector<float> scales(static_cast<size_t>(scale_rows * kb));
    int64_t row = 0, srow = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const LinearPart& p = parts[i];
      const int64_t rows = p.weight.dim(0), prow = (rows + block_size - 1) / block_size;
      const Tensor& s = p.scale_inv;
      if (s.ndim != 2 || s.dim(0) != prow || s.dim(1) != kb)
        return invalid_argument("load_linear: part " + std::to_string(i) + " scale_inv is " + s.describe() +
                                ", expected [" + std::to_string(prow) + ", " + std::to_string(kb) + "] for " +
                                p.weight.describe() + " with " + std::to_string(block_size) + "-blocks");
      std::vector<float> ps(static_cast<size_t>(prow * kb));
      if (!host_convert(s.data, s.dtype, ps.data(), DType::kF32, prow * kb))
        return invalid_argument("load_linear: scale_inv dtype " + std::string(dtype_name(s.dtype)));
      QVL_CUDA_OK(
          cudaMemcpy(static_cast<char*>(wt.data) + row * in, p.weight.data, p.weight.nbytes(), cudaMemcpyHostToDevice));
      if (aligned) {
        std::copy(ps.begin(), ps.end(), scales.begin() + srow * kb);
        srow += prow;
      } else {
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(ps.begin() + (r / block_size) * kb, kb, scales.begin() + (row + r) * kb);
      }
      row += rows;
    }
    QVL_CUDA_OK(cudaMemcpy(st.data, scales.data(), st.nbytes(), cudaMemcpyHostToDevice));
    weights_.push_back(std::move(wbuf));
    weights_.push_back(std::move(sbuf));
    merged.weight = wt;
    merged.scale_inv = st;
  }
  lw.parts.push_back(merged);
  if (!host_bias.empty()) {
    if (host_bias.numel() != out)
      return invalid_argument("load_linear: bias " + host_bias.describe() + " for " + std::to_string(out) + " outputs");
    QVL_ASSIGN_OR_RETURN(lw.bias, load_tensor(host_bias.reshape({out}), DType::kBF16));
  }
  return lw;
}

void CudaBackend::linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) {
  if (pending_.kind != Pending::kNone) {
    const Pending& p = pending_;
    const bool fp8 = w.is_fp8();
    const bool fusable = x.data == p.out.data && x.same_shape(p.out) && x.dim(0) <= cuda::kFusedPrologueMaxRows &&
                         static_cast<size_t>(x.nbytes()) <= cuda::kFusedPrologueMaxBytes &&
                         cuda::fused_prologue_pays(w.out_features, ctx_.num_sms) && w.parts.size() == 1 &&
                         x.row_numel() == w.in_features && x.row_numel() % (fp8 ? 16 : 8) == 0 &&
                         (!fp8 || w.block_size == 128) && out.data != p.src.data && out.data != x.data &&
                         (ep.residual.empty() || (ep.residual.data != x.data && ep.residual.data != p.src.data));
    if (fusable) {
      cuda::SkinnyPrologue pro;
      pro.kind = p.kind == Pending::kRmsNorm ? cuda::SkinnyPrologue::kRmsNorm : cuda::SkinnyPrologue::kSiluMul;
      pro.src = p.src;
      pro.weight = p.weight;
      pro.eps = p.eps;
      pending_ = {};
      if (ctx_.profiler)
        note_linear(out, x, w, ep, pro.kind == cuda::SkinnyPrologue::kRmsNorm ? " +rms_norm" : " +silu_mul");
      cuda::launch_skinny_linear(ctx_, out, x, w, ep, pro);
      return;
    }
    flush();
  }
  QVL_CHECK_EQ(w.parts.size(), 1u) << "linear: weight was not loaded by the CUDA backend";
  const int64_t n = x.dim(0);
  QVL_CHECK_EQ(out.dim(0), n);
  QVL_CHECK_EQ(x.row_numel(), w.in_features);
  QVL_CHECK_EQ(out.row_numel(), w.out_features);
  if (n == 0) return;
  if (ctx_.profiler) note_linear(out, x, w, ep, "");
  const bool fp8 = w.is_fp8();
  const int64_t k = w.in_features;
  const bool skinny_ok = k % (fp8 ? 16 : 8) == 0 && (!fp8 || w.block_size == 128);
  if (skinny_ok && n <= kSkinnyMaxRows) {
    cuda::launch_skinny_linear(ctx_, out, x, w, ep);
    return;
  }
  if (skinny_ok && fp8 && n <= kSkinnyFp8MaxRows) {
    for (int64_t r = 0; r < n; r += kSkinnyMaxRows) {
      const int64_t e = std::min(n, r + kSkinnyMaxRows);
      Epilogue part{ep.act, ep.residual.empty() ? Tensor() : ep.residual.rows(r, e)};
      cuda::launch_skinny_linear(ctx_, out.rows(r, e), x.rows(r, e), w, part);
    }
    return;
  }
  gemm_linear(out, x, w, ep);
}

void CudaBackend::gemm_linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) {
  QVL_CHECK(x.dtype == DType::kBF16 && out.dtype == DType::kBF16) << x.describe() << " -> " << out.describe();
  QVL_CHECK(x.data != out.data) << "linear: x aliases out";
  const int64_t n = x.dim(0), k = w.in_features, m = w.out_features;
  const bool act = ep.act != Activation::kNone;
  const bool res = !ep.residual.empty();
  if (res) {
    QVL_CHECK(ep.residual.dtype == DType::kBF16 && ep.residual.same_shape(out))
        << "residual " << ep.residual.describe() << " vs out " << out.describe();
    QVL_CHECK(!act || ep.residual.data != out.data) << "linear: an activation with a residual that aliases out";
  }
  // cuBLASLt adds the bias (and, without an activation, the residual through beta = 1);
  // activations are applied afterwards so that the linear output is rounded first, as in
  // the reference. (cuBLASLt's own GELU epilogue was measured slower on the vision fc1 shape,
  // 45.8 us against 35.4 us with the separate pass, on an H200.)
  const void* bias = w.bias.empty() ? nullptr : w.bias.data;
  const void* gemm_res = res && !act ? ep.residual.data : nullptr;
  const Tensor& weight = w.parts[0].weight;
  if (!w.is_fp8()) {
    cuda::ProfileRange range(ctx_, "cublasLt bf16 gemm");
    gemm_->bf16_gemm(out.data, m, x.data, weight.data, m, n, k, bias, gemm_res);
  } else if (options_.fp8_gemm == CudaFp8Gemm::kW8A8 &&
             cuda::w8a8_linear(ctx_, *gemm_, fp8_act_ws_.data(), fp8_act_ws_.size(), out, x, w, bias, gemm_res)) {
    ++fp8_counts_.w8a8;
  } else {
    ++fp8_counts_.dequant;
    const Tensor& scale = w.parts[0].scale_inv;
    const int bs = w.block_size;
    const int rows_per_scale = scale.dim(0) == (m + bs - 1) / bs ? bs : 1;
    int64_t chunk = static_cast<int64_t>(dequant_ws_.size() / (static_cast<size_t>(k) * 2));
    chunk = chunk >= bs ? chunk / bs * bs : chunk;
    QVL_CHECK_GT(chunk, 0) << "FP8 dequant workspace of " << dequant_ws_.size() << " bytes holds no row of " << k;
    for (int64_t r0 = 0; r0 < m; r0 += chunk) {
      const int64_t r1 = std::min(m, r0 + chunk);
      cuda::launch_dequant_fp8(ctx_, dequant_ws_.data(), weight, scale, rows_per_scale, bs, r0, r1);
      cuda::ProfileRange range(ctx_, "cublasLt bf16 gemm");
      gemm_->bf16_gemm(static_cast<uint16_t*>(out.data) + r0, m, x.data, dequant_ws_.data(), r1 - r0, n, k,
                       bias ? static_cast<const uint16_t*>(bias) + r0 : nullptr,
                       gemm_res ? static_cast<const uint16_t*>(gemm_res) + r0 : nullptr);
    }
  }
  if (act) cuda::launch_epilogue(ctx_, out, ep.act, ep.residual);
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

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  QVL_ASSIGN_OR_RETURN(CudaDeviceInfo info, cuda_device_info(options.device));
  if (info.compute_capability < 80)
    return failed_precondition("CUDA device " + std::to_string(options.device) + " (" + info.name +
                               ") has compute capability " + std::to_string(info.compute_capability / 10) + "." +
                               std::to_string(info.compute_capability % 10) + "; qvl needs 8.0 or newer");
  cudaError_t err = cudaSetDevice(options.device);
  if (err != cudaSuccess) return failed_precondition(std::string("cudaSetDevice: ") + cudaGetErrorString(err));
  cudaFree(nullptr);  // create the context now, so the next reading includes it
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  auto backend = std::make_unique<CudaBackend>(options, info, total_b - free_b);
  QVL_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

void cuda_profile_start(Backend& backend, double hold_ms) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  QVL_CHECK(cuda != nullptr) << "cuda_profile_start on a " << backend.name() << " backend";
  cuda->profile_start(hold_ms);
}

std::vector<CudaKernelTime> cuda_profile_stop(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  QVL_CHECK(cuda != nullptr) << "cuda_profile_stop on a " << backend.name() << " backend";
  return cuda->profile_stop();
}

CudaFp8GemmCounts cuda_fp8_gemm_counts(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  QVL_CHECK(cuda != nullptr) << "cuda_fp8_gemm_counts of a " << backend.name() << " backend";
  return cuda->fp8_gemm_counts();
}

void cuda_quantize_fp8_rows(Backend& backend, Tensor q, Tensor scales, Tensor tail_scales, const Tensor& x) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  QVL_CHECK(cuda != nullptr) << "cuda_quantize_fp8_rows on a " << backend.name() << " backend";
  cuda->quantize_fp8_rows(q, scales, tail_scales, x);
}

CudaMemoryStats cuda_memory_stats(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  QVL_CHECK(cuda != nullptr) << "cuda_memory_stats of a " << backend.name() << " backend";
  return cuda->memory_stats();
}

}  // namespace qvl
