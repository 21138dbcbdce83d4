// The CUDA backend (backend.h on one device and one stream), part 1 of 3 (cuda_backend_impl.h
// says which methods live where): construction and the workspaces, memory and copies, the
// dispatch of every op but Linear to its kernel (deferring a small RMSNorm / SiLU·mul into the
// Linear that reads it and a decode batch's q/k prepare into its attention, see flush()), and
// the factory and accessors that cuda_backend.h declares.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/log.h"

namespace qvl {
namespace cuda {

CudaBackend::~CudaBackend() {
  release_staging();
  clear_graphs();
  gemm_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaBackend::init() {
  QVL_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  ctx_.stream = stream_;
  ctx_.pdl = options_.programmatic_launch && info_.compute_capability >= 90;
  ctx_.clusters = options_.cluster_attention && info_.compute_capability >= 90;
  ctx_.token_prepare = options_.token_qkv_prepare;
  ctx_.vision_mt = options_.vision_attention_mt == 1 ? 1 : 2;
  ctx_.prefill_q_alias = options_.prefill_q_alias;
  ctx_.prefill_key_tiles = std::max(1, options_.prefill_key_tiles);
  ctx_.decode_split_blocks = std::clamp(options_.decode_split_blocks, 0, kDecodeSplitBlocks);
  ctx_.num_sms = std::max(1, info_.multiprocessors);
  fusion_ = options_.fuse_prologues;
  rms_rows_ = std::clamp(options_.fused_rms_norm_max_rows, 0, cuda::kFusedPrologueMaxRows);
  silu_rows_ = std::clamp(options_.fused_silu_mul_max_rows, 0, cuda::kFusedPrologueMaxRows);
  glu_rows_ = std::clamp(options_.silu_mul_epilogue_max_rows, 0, kSkinnyGluMaxRows);
  ctx_.skinny = options_.skinny;
  skinny_bf16_rows_ = std::clamp(options_.skinny_bf16_max_rows, 0, kSkinnyMaxRows);
  QVL_ASSIGN_OR_RETURN(gemm_ws_, allocate(options_.gemm_workspace_bytes, "cuBLASLt workspace"));
  if (const size_t bytes = cuda_fp8_act_workspace_bytes(options_, info_.compute_capability); bytes > 0) {
    QVL_ASSIGN_OR_RETURN(fp8_act_ws_, allocate(bytes, "FP8 activation workspace"));
  }
  QVL_ASSIGN_OR_RETURN(decode_scratch_, allocate(cuda_decode_scratch_bytes(options_), "decode attention scratch"));
  // The argmax keys and counters and the arrival counters at the end of the scratch start at
  // zero (and the kernels leave them so).
  QVL_CUDA_OK(cudaMemset(argmax_scratch(), 0, kArgmaxScratchBytes + kDecodeSplitBlocks * sizeof(uint32_t)));
  gemm_ = std::make_unique<cuda::GemmRunner>(stream_, gemm_ws_.data(), gemm_ws_.size());
  cuda::configure_vision_attention();
  const bool wgmma = cuda::wgmma_attention_available(info_.compute_capability);
  ctx_.vision_wgmma = options_.vision_wgmma && wgmma;
  if (ctx_.vision_wgmma) cuda::configure_vision_wgmma();
  ctx_.prefill_wgmma = options_.prefill_wgmma && wgmma;
  if (ctx_.prefill_wgmma) cuda::configure_prefill_wgmma();
  // The ring kernels' shared memory: their attribute from the device's own opt-in limit, the
  // budget the launches choose within from the (possibly emulated) profile's, which is no more.
  const bool ring = info_.compute_capability >= 90;
  cuda::configure_skinny(ring ? cuda::ring_smem_budget(device_smem_) : 0);
  ctx_.ring_smem = ring ? cuda::ring_smem_budget(info_.max_smem_per_block) : 0;
  // The wide FP8 decode Linear (skinny_wide.cu) was measured on sm_90 only (H100): elsewhere the
  // one-tile kernel stays the default, and the wide one runs only where a benchmark forces it.
  ctx_.wide_fp8 = ctx_.clusters && measured_arch();
  ctx_.fp8_glu_ring = measured_arch();
  ctx_.wide_launches = &fp8_counts_.skinny_wide;
  ctx_.warps16_launches = &fp8_counts_.skinny_16_warps;
  ctx_.pair_launches = &fp8_counts_.skinny_pairs;
  ctx_.glu_launches = &fp8_counts_.skinny_glu;
  ctx_.prologue_launches = &fp8_counts_.skinny_prologue;
  ctx_.early_launches = &fp8_counts_.skinny_early;
  ctx_.early_launch = std::clamp(options_.decode_early_launch, -1, 1);
  // Clusters over the portable 8 blocks only on the compute capabilities that allow them.
  const int family = info_.compute_capability / 10;
  const bool non_portable_clusters = family == 9 || family == 10;
  const int decode_cluster = cuda::configure_text_attention(ctx_.clusters, non_portable_clusters);
  ctx_.decode_cluster = options_.decode_cluster_merge ? decode_cluster : 0;
  ctx_.decode_tma = options_.decode_attention_tma && info_.compute_capability >= 90;
  ctx_.decode_tma_launches = &fp8_counts_.decode_tma;
  ctx_.prefill_wgmma_fp8_launches = &fp8_counts_.prefill_wgmma_fp8;
  ctx_.ring_prologue_first = options_.ring_prologue_first;
  ctx_.smem_per_sm = info_.max_smem_per_block + kReservedSmemPerBlock;
  ctx_.vision_q_through_k = std::clamp(options_.vision_q_through_k, -1, 1);
  ctx_.prefill_small_tiles = std::clamp(options_.prefill_small_tiles, -1, 1);
  if (info_.emulated) {  // a profile's (its options' or set_cuda_test_profile's): check every launch
    ctx_.emulated_smem = info_.max_smem_per_block;
    ctx_.emulated_max_cluster = !ctx_.clusters ? 1 : non_portable_clusters ? 16 : 8;
    if (options_.emulate_occupancy) {
      ctx_.emulated_threads_per_sm = threads_per_sm(info_.compute_capability);
      ctx_.device_smem_per_sm = device_smem_ + kReservedSmemPerBlock;
    }
  }
  ctx_.ring_prologue_first_launches = &fp8_counts_.ring_prologue_first;
  if (options_.decode_attention_trace) {  // measurement only: not part of any memory plan
    const size_t bytes = sizeof(uint64_t) * kDecodeTraceStamps * kDecodeTraceLayers * kDecodeSplitBlocks;
    QVL_ASSIGN_OR_RETURN(decode_trace_, allocate(bytes, "decode attention trace"));
    QVL_CUDA_OK(cudaMemset(decode_trace_.data(), 0, bytes));
    ctx_.decode_trace = static_cast<unsigned long long*>(decode_trace_.data());
  }
  skip_rules_ = cuda::parse_skip_rules(options_.skip_kernels);
  if (!skip_rules_.empty() || options_.decode_attention_exit != 0) {
    log_warn("CUDA backend: kernels left out or cut short for a measurement; every result is wrong");
    ctx_.skip = skip_rules_.empty() ? nullptr : &skip_rules_;
    ctx_.decode_attention_exit = options_.decode_attention_exit;
  }
  return Status::ok();
}

CudaMemoryStats CudaBackend::memory_stats() const {
  CudaMemoryStats s;
  s.allocated_bytes = stats_->allocated.load();
  s.peak_allocated_bytes = stats_->peak.load();
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) s.device_used_bytes = total_b - free_b;
  s.context_bytes = context_bytes_;
  return s;
}

// ---- memory ----
Result<DeviceBuffer> CudaBackend::allocate(size_t bytes, const std::string& tag) {
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

void CudaBackend::copy_to_device(Tensor dst, const void* host_src) {
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

void CudaBackend::copy_to_device_async(Tensor dst, const void* host_src) {
  flush();
  QVL_CHECK(!capturing()) << "copy_to_device_async while recording a graph";
  QVL_CHECK(dst.device == Device::kCuda) << dst.describe();
  if (dst.nbytes() == 0) return;
  QVL_CUDA_OK(cudaMemcpyAsync(dst.data, host_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::copy_to_host(void* host_dst, const Tensor& src) {
  flush();
  QVL_CHECK(!capturing()) << "copy_to_host while recording a graph";
  QVL_CHECK(src.device == Device::kCuda) << src.describe();
  if (src.nbytes() == 0) return;
  QVL_CUDA_OK(cudaMemcpyAsync(host_dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
  QVL_CUDA_OK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(Tensor dst, const Tensor& src) {
  flush();
  QVL_CHECK_EQ(dst.nbytes(), src.nbytes()) << dst.describe() << " <- " << src.describe();
  if (dst.nbytes() == 0 || dst.data == src.data) return;
  if (ctx_.profiler) note("copy " + std::to_string(dst.nbytes()) + " B", 2.0 * dst.nbytes());
  cuda::ProfileRange range(ctx_, "memcpy d2d");
  QVL_CUDA_OK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::synchronize() {
  flush();
  QVL_CHECK(!capturing()) << "synchronize while recording a graph";
  QVL_CUDA_OK(cudaStreamSynchronize(stream_));
  QVL_CUDA_OK(cudaGetLastError());
}

// ---- layer offload ----
Result<DeviceBuffer> CudaBackend::allocate_host(size_t bytes, const std::string& tag) {
  QVL_RETURN_IF_ERROR(weight_stream_.init());
  return cuda::allocate_pinned(bytes, tag);
}

void CudaBackend::prefetch(int slot, void* dst, const void* host_src, size_t bytes) {
  flush();
  weight_stream_.prefetch(stream_, slot, dst, host_src, bytes);
}

void CudaBackend::wait_prefetch(int slot) {
  flush();
  weight_stream_.wait(stream_, slot);
}

// ---- ops ----
void CudaBackend::embedding(Tensor out, const Tensor& table, const Tensor& ids) {
  flush();
  if (ctx_.profiler) note("embedding " + out.shape_string(), 2.0 * out.nbytes());
  cuda::launch_embedding(ctx_, out, table, ids);
}

void CudaBackend::scatter_rows(Tensor x, const Tensor& rows, const Tensor& src, bool accumulate) {
  flush();
  if (ctx_.profiler) note("scatter_rows " + src.shape_string(), (accumulate ? 3.0 : 2.0) * src.nbytes());
  cuda::launch_scatter_rows(ctx_, x, rows, src, accumulate);
}

void CudaBackend::gather_rows(Tensor out, const Tensor& x, const Tensor& rows) {
  flush();
  if (ctx_.profiler) note("gather_rows " + out.shape_string(), 2.0 * out.nbytes());
  cuda::launch_gather_rows(ctx_, out, x, rows);
}

void CudaBackend::rms_norm(Tensor out, const Tensor& x, const Tensor& weight, float eps) {
  flush();
  // Few rows: defer, so that the Linear reading `out` next can compute it in its prologue.
  if (fusion_ && x.dtype == DType::kBF16 && out.dtype == DType::kBF16 && x.ndim == 2 && out.same_shape(x) &&
      x.dim(0) <= rms_rows_ && x.dim(1) % 8 == 0 && x.data != out.data && weight.numel() == x.dim(1) &&
      (weight.dtype == DType::kF32 || weight.dtype == DType::kBF16)) {
    pending_ = {Pending::kRmsNorm, out, x, weight, eps};
    return;
  }
  if (ctx_.profiler) note("rms_norm " + x.shape_string(), 2.0 * x.nbytes());
  cuda::launch_rms_norm(ctx_, out, x, weight, eps);
}

void CudaBackend::layer_norm(Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  flush();
  if (ctx_.profiler) note("layer_norm " + x.shape_string(), 2.0 * x.nbytes());
  cuda::launch_layer_norm(ctx_, out, x, weight, bias, eps);
}

namespace {
// Whether two tensors' bytes overlap.
bool overlap(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const char*>(a.data);
  const auto* pb = static_cast<const char*>(b.data);
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}
}  // namespace

void CudaBackend::silu_mul(Tensor out, const Tensor& gate_up) {
  // The pending Linear wrote gate_up: SiLU·mul as its epilogue, where out is nothing it reads or
  // writes.
  if (lin_.active && gate_up.data == lin_.out.data && gate_up.same_shape(lin_.out) && out.dtype == DType::kBF16 &&
      out.ndim == 2 && out.dim(0) == gate_up.dim(0) && 2 * out.dim(1) == gate_up.dim(1) && !overlap(out, gate_up) &&
      !overlap(out, lin_.x) && (lin_.pro.kind == cuda::SkinnyPrologue::kNone || !overlap(out, lin_.pro.src))) {
    launch_pending_linear(out);
    return;
  }
  flush();
  if (fusion_ && out.dtype == DType::kBF16 && gate_up.dtype == DType::kBF16 && out.ndim == 2 &&
      out.dim(0) <= silu_rows_ && out.dim(1) % 8 == 0 && gate_up.dim(0) == out.dim(0) &&
      gate_up.row_numel() == 2 * out.dim(1)) {
    pending_ = {Pending::kSiluMul, out, gate_up, Tensor(), 0.0f};
    return;
  }
  if (ctx_.profiler) note("silu_mul " + out.shape_string(), 3.0 * out.nbytes());
  cuda::launch_silu_mul(ctx_, out, gate_up);
}

void CudaBackend::argmax_rows(Tensor ids, const Tensor& logits) {
  flush();
  if (ctx_.profiler) note("argmax_rows " + logits.shape_string(), static_cast<double>(logits.nbytes()));
  cuda::launch_argmax_rows(ctx_, ids, logits, argmax_scratch(), kArgmaxScratchBytes);
}

void CudaBackend::top_k_rows(Tensor keys, const Tensor& logits) {
  flush();
  if (ctx_.profiler) note("top_k_rows " + logits.shape_string(), 2.0 * static_cast<double>(logits.nbytes()));
  cuda::launch_top_k_rows(ctx_, keys, logits);
}

void CudaBackend::convert(Tensor out, const Tensor& x) {
  flush();
  if (out.dtype == x.dtype) return copy(out, x);
  if (ctx_.profiler) note("convert " + x.shape_string(), static_cast<double>(x.nbytes() + out.nbytes()));
  cuda::launch_convert(ctx_, out, x);
}

void CudaBackend::patchify_rgb(Tensor out, const Tensor& rgb, int grid_h, int grid_w, int patch, int merge,
                               int temporal) {
  flush();
  if (ctx_.profiler) note("patchify_rgb " + out.shape_string(), static_cast<double>(rgb.nbytes() + out.nbytes()));
  cuda::launch_patchify_rgb(ctx_, out, rgb, grid_h, grid_w, patch, merge, temporal);
}

void CudaBackend::add_interpolated(Tensor x, const Tensor& table, const Tensor& idx, const Tensor& w) {
  flush();
  if (ctx_.profiler) note("add_interpolated " + x.shape_string(), 2.0 * x.nbytes());
  cuda::launch_add_interpolated(ctx_, x, table, idx, w);
}

void CudaBackend::vision_rope(Tensor qkv, const Tensor& rope, int num_heads, int head_dim) {
  flush();
  if (ctx_.profiler) note("vision_rope " + qkv.shape_string(), 4.0 / 3.0 * qkv.nbytes() + rope.nbytes());
  cuda::launch_vision_rope(ctx_, qkv, rope, num_heads, head_dim);
}

void CudaBackend::vision_rope_table(Tensor rope, const Tensor& row_col, const Tensor& angles) {
  flush();
  if (ctx_.profiler) note("vision_rope_table " + rope.shape_string(), static_cast<double>(rope.nbytes()));
  cuda::launch_vision_rope_table(ctx_, rope, row_col, angles);
}

void CudaBackend::vision_attention(Tensor out, const Tensor& qkv, const VisionSegments& seg, int num_heads,
                                   int head_dim, float scale) {
  flush();
  if (ctx_.profiler) {
    double flops = 0;
    for (size_t i = 0; i + 1 < seg.host_cu_seqlens.size(); ++i) {
      const double len = seg.host_cu_seqlens[i + 1] - seg.host_cu_seqlens[i];
      flops += 4.0 * len * len * head_dim * num_heads;
    }
    note("vision_attention " + qkv.shape_string() + " heads " + std::to_string(num_heads), qkv.nbytes() + out.nbytes(),
         flops);
  }
  cuda::launch_vision_attention(ctx_, out, qkv, seg, num_heads, head_dim, scale);
}

void CudaBackend::text_qkv_prepare(Tensor qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                   const MropeSpec& rope, const TextBatch& batch, const KvCacheView& cache, int layer,
                                   const TextAttentionShape& shape) {
  flush();
  const size_t half = static_cast<size_t>(shape.head_dim / 2);
  QVL_CHECK(rope.inv_freq.size() == half && rope.axis.size() == half)
      << "M-RoPE spec has " << rope.inv_freq.size() << " frequencies and " << rope.axis.size() << " axes for head_dim "
      << shape.head_dim;
  QVL_CHECK_LE(half, 128u);
  cuda::MropeParams params{};
  params.half = static_cast<int>(half);
  for (size_t j = 0; j < half; ++j) {
    QVL_CHECK_LT(rope.axis[j], 3) << "M-RoPE axis of frequency " << j;
    params.inv_freq[j] = rope.inv_freq[j];
    params.axis[j] = rope.axis[j];
  }
  // Decode batches: deferred into the decode attention kernel that reads qkv next.
  if (fusion_ && batch.num_tokens == batch.num_seqs && batch.num_tokens > 0 && cuda::decode_attention_fusable(shape)) {
    prep_ = {true, qkv, {q_norm, k_norm, eps, params}, batch, cache, layer, shape};
    return;
  }
  if (ctx_.profiler) note("text_qkv_prepare " + qkv.shape_string(), 2.0 * qkv.nbytes());
  cuda::launch_text_qkv_prepare(ctx_, qkv, q_norm, k_norm, eps, params, batch, cache, layer, shape);
}

void CudaBackend::text_attention(Tensor out, const Tensor& qkv, const TextBatch& batch, const KvCacheView& cache,
                                 int layer, const TextAttentionShape& shape, float scale) {
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
  if (ctx_.profiler && batch.num_tokens != batch.num_seqs)
    note("text_attention prefill seqs " + std::to_string(batch.num_seqs) + " rows " + std::to_string(batch.num_tokens) +
         " max_context " + std::to_string(batch.max_context));
  if (batch.num_tokens == batch.num_seqs) {
    attn_ = {true, out, qkv, batch, cache, layer, shape, scale, fuse, fused};
  } else {
    cuda::launch_text_prefill_attention(ctx_, out, qkv, batch, cache, layer, shape, scale);
  }
}

bool CudaBackend::decoder_stack(Tensor x, const DecoderStack& stack, const TextBatch& batch, const KvCacheView& cache,
                                const DecoderStackBuffers& buffers) {
  note_decode_layers(stack);
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

void CudaBackend::note_decode_layers(const DecoderStack& stack) {
  l2_prefetch_.assign(stack.layers.size(), {});
  for (size_t l = 0; l < stack.layers.size(); ++l) {
    const LinearWeight* w[2] = {stack.layers[l].gate_up, stack.layers[l].down};
    for (int r = 0; r < 2; ++r)
      if (w[r] && w[r]->parts.size() == 1 && w[r]->parts[0].weight.device == Device::kCuda)
        l2_prefetch_[l][r] = {w[r]->parts[0].weight.data, static_cast<size_t>(w[r]->parts[0].weight.nbytes())};
  }
}

cuda::DecodeL2Prefetch CudaBackend::decode_l2_prefetch(int layer, int num_seqs) const {
  cuda::DecodeL2Prefetch l2;
  const int64_t option = options_.decode_l2_prefetch_bytes;
  const bool by_default = option < 0 && num_seqs == 1 && measured_arch();
  if ((option <= 0 && !by_default) || info_.compute_capability < 90 || layer < 0 ||
      static_cast<size_t>(layer) >= l2_prefetch_.size())
    return l2;
  const int64_t cap =
      cuda_peak_dram_gbps(info_) > kDecodeL2PrefetchFastGBps ? kDecodeL2PrefetchBytesFast : kDecodeL2PrefetchBytes;
  for (int r = 0; r < 2; ++r) {
    const auto& [data, bytes] = l2_prefetch_[layer][r];
    if (data == nullptr || reinterpret_cast<uintptr_t>(data) % 16 != 0) continue;
    const size_t want = by_default ? std::min<size_t>(cap, bytes / 2) : static_cast<size_t>(option);
    l2.bytes[r] = std::min(want, bytes) & ~size_t{15};
    l2.data[r] = data;
  }
  return l2;
}

void CudaBackend::launch_decode_attention(const LinearWeight* next) {
  const PendingAttention a = attn_;
  attn_ = {};
  if (ctx_.profiler)
    note(std::string(a.fused ? "text_qkv_prepare+attention decode" : "text_attention decode") + " seqs " +
         std::to_string(a.batch.num_seqs) + " rows " + std::to_string(a.batch.num_tokens) + " max_context " +
         std::to_string(a.batch.max_context));
  int trigger = options_.decode_attention_trigger;
  if (trigger < 0 && a.batch.num_seqs > 1) {
    trigger = 3;
  } else if (trigger < 0) {
    double bytes = 0;
    if (next)
      for (const LinearPart& part : next->parts) bytes += part.weight.nbytes() + part.scale_inv.nbytes();
    const bool crowded = next != nullptr && bytes <= kLateLaunchMaxBytes &&
                         cuda::over_one_and_a_half_blocks_per_sm(cuda::skinny_tiles(next->out_features), ctx_.num_sms);
    trigger = next == nullptr || (bytes > kEarlyLaunchBytes && !crowded) ? 1 : 3;
  }
  // Layer 0 writes the step table, the later layers of the same batch read it; at batch 1 only
  // (H100, medians of 3 per decode step: 2B BF16 -2.0%, 2B FP8 and 4B FP8 +-0.1% at batch 1; at
  // batch 8 -0.4 / -0.6 / +1.7%).
  int mode = 0;
  const bool tabled = a.fused && a.batch.num_seqs == 1;
  if (tabled && a.layer == 0) {
    mode = 1;
  } else if (tabled && step_table_ready_ && same_batch(step_batch_, a.batch) && step_cache_ == a.cache.base &&
             step_shape_.num_q_heads == a.shape.num_q_heads && step_shape_.num_kv_heads == a.shape.num_kv_heads &&
             step_shape_.head_dim == a.shape.head_dim) {
    mode = 2;
  }
  if (a.layer == 0) step_table_ready_ = false;
  const cuda::DecodeStepTable table = decode_step_table(mode);
  const cuda::DecodeL2Prefetch l2 = decode_l2_prefetch(a.layer, a.batch.num_seqs);
  if (l2.bytes[0] + l2.bytes[1] > 0) ++fp8_counts_.decode_l2_prefetch;
  const int used = cuda::launch_text_decode_attention(
      ctx_, a.out, a.qkv, a.batch, a.cache, a.layer, a.shape, a.scale, static_cast<float*>(decode_scratch_.data()),
      decode_partial_bytes(), decode_counters(), a.fused ? &a.prepare : nullptr, &table, trigger, l2);
  if (used == 1) {
    step_table_ready_ = true;
    step_batch_ = a.batch;
    step_cache_ = a.cache.base;
    step_shape_ = a.shape;
  }
}

void CudaBackend::flush() {
  if (lin_.active) launch_pending_linear({});
  if (attn_.active) launch_decode_attention(nullptr);
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

size_t check_emulated_launch(const LaunchContext& ctx, const char* name, const void* kernel, size_t smem,
                             unsigned cluster_x, unsigned threads) {
  cudaFuncAttributes a{};
  const cudaError_t err = cudaFuncGetAttributes(&a, kernel);
  QVL_CHECK(err == cudaSuccess) << name << ": cudaFuncGetAttributes: " << cudaGetErrorString(err);
  const size_t total = smem + a.sharedSizeBytes;
  QVL_CHECK_LE(total, static_cast<size_t>(ctx.emulated_smem))
      << name << ": " << smem << " B of dynamic and " << a.sharedSizeBytes
      << " B of static shared memory per block, over the emulated device's limit";
  QVL_CHECK_LE(cluster_x, static_cast<unsigned>(ctx.emulated_max_cluster))
      << name << ": a cluster of " << cluster_x << " blocks on the emulated device";
  if (ctx.emulated_threads_per_sm <= 0) return smem;
  // By shared memory and threads (the register file is 64K registers from sm_80 on, and the
  // code's registers are the device's own).
  const size_t padded = emulated_occupancy_smem(smem, a.sharedSizeBytes, static_cast<int>(threads),
                                                ctx.emulated_smem + kReservedSmemPerBlock, ctx.emulated_threads_per_sm,
                                                ctx.device_smem_per_sm);
  QVL_CHECK_GE(padded, smem) << name << ": " << threads << " threads per block on the emulated device";
  if (padded > static_cast<size_t>(a.maxDynamicSharedSizeBytes)) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(padded));
    QVL_CHECK(e == cudaSuccess) << name << ": padding to " << padded << " B: " << cudaGetErrorString(e);
  }
  return padded;
}

}  // namespace cuda

using cuda::CudaBackend;

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  // Under set_cuda_test_profile, info is that profile already (emulated); the options' own profile
  // goes over it.
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
  const int device_smem = info.max_smem_per_block;
  QVL_RETURN_IF_ERROR(apply_emulated_profile(options, info));
  auto backend = std::make_unique<CudaBackend>(options, info, total_b - free_b, device_smem);
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

std::vector<uint64_t> cuda_decode_attention_trace(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  QVL_CHECK(cuda != nullptr) << "cuda_decode_attention_trace of a " << backend.name() << " backend";
  return cuda->decode_attention_trace();
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

void cuda_memory_reset_peak(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  QVL_CHECK(cuda != nullptr) << "cuda_memory_reset_peak of a " << backend.name() << " backend";
  cuda->reset_peak();
}

}  // namespace qvl
