// The decoder stack of a one-sequence decode step as one persistent kernel (Backend::
// decoder_stack): every layer's qkv, attention (q/k-norm, M-RoPE, K/V store, split-K over the
// paged cache), o_proj + residual, gate_up, down + residual, with no kernel boundary anywhere.
//
// Why: at batch 1 the step is a stream of weights (3.4 GB for 2B) with a little arithmetic, and
// op-by-op kernels lose ~2 us of memory pipeline at every boundary (drain, launch, ramp up:
// about 10 us per layer, measured). Here the weight stream never stops: each block (one per
// multiprocessor) owns a fixed slice of rows of every Linear of every layer, and its producer
// warp copies them, in the order they will be used, into a ring of shared-memory stages with
// bulk asynchronous copies (cp.async.bulk, completion on an mbarrier). Weights depend on
// nothing, so the producer runs up to the ring's size ahead, across ops and layers, while the
// consumer warps wait for activations.
//
// Activations move between blocks through global memory (L2) with release/acquire counters
// instead of kernel boundaries; each phase waits only for what it reads:
//   qkv(l)       needs x after down(l-1)             (counter kDown reaches G * l)
//   attention(l) needs all of qkv(l)                  (kQkv = G * (l + 1))
//   o(l)         needs every head's merged output     (kAttn = Hkv * (l + 1))
//   gate_up(l)   needs x after o(l)                   (kO = G * (l + 1))
//   down(l)      needs all of gate_up(l)              (kGu = G * (l + 1))
// Write-after-read hazards are covered by the same chain (a buffer is rewritten only after a
// counter that every reader had to pass first). Counters only grow during a launch; the last
// block to finish puts them back to zero (the scratch is zero between launches).
//
// Numerics follow the op-by-op path: RMSNorm / SiLU·mul into the Linear's input exactly as the
// fused prologues write it (bf16 rounding points included), Linear outputs rounded to BF16 and
// residuals added in fp32 then rounded, q/k prepare as text_qkv_prepare (attention_text.cu),
// P rounded to BF16 for P·V. Sums run in fp32 in a different order than the tensor-core
// kernels: results agree to fp32 rounding, not bit for bit.
//
// Attention of kv head g is split over S blocks (item (g, s) on block g * S + s); the keys of
// an item go through shared memory in rounds of p.keys; the first round, which holds no key
// written in this step, is fetched before the item waits for qkv. The last item of a head to
// arrive merges the S partials.
//
// All G blocks must be resident at once (the counters are spin-waited): one block per
// multiprocessor, launched as a cooperative kernel.
//
// This file holds the kernel's outline and its launch; the building blocks are in
// decode_stack.cuh (parameters, PTX wrappers, counters, producer, Linear work) and
// decode_stack_attention.cuh (attention), both included by this file alone.
#include <algorithm>

#include "backend/cuda/attention_cache.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decode_stack.cuh"
#include "backend/cuda/decode_stack_attention.cuh"

namespace qvl::cuda {
namespace {

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) decode_stack_kernel(const __grid_constant__ StackParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // bulk copies and mbarrier waits: sm_90+
  extern __shared__ __align__(128) char smem[];
  char* ring = smem;
  bf16* xs = reinterpret_cast<bf16*>(smem + p.off_x);
  const AttnSmem a = attn_smem<HD>(p, smem + p.off_attn);
  float* part = reinterpret_cast<float*>(smem + p.off_part);  // [warps][kSegRows], then [warps]
  float* red = part + kConsumerWarps * kSegRows;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + p.off_bar);
  uint64_t* empty = full + kMaxStages;
  __shared__ bool s_last;

  if (threadIdx.x == 0) {
    for (int i = 0; i < p.stages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerWarps);  // every consumer warp releases the stage
    }
    QVL_SM90(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
    QVL_SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) producer<HD>(p, ring, full, empty);
    return;
  }

  const int G = gridDim.x;
  // Splits per kv head: one per round of keys, at most p.splits (a short context needs no merge).
  const int splits = min(p.splits, max(1, (p.context_len[0] + p.keys - 1) / p.keys));
  const int items = p.hkv * splits;
  const bool has_item = static_cast<int>(blockIdx.x) < items;
  const int g = blockIdx.x / splits, s = blockIdx.x % splits;
  uint32_t it = 0;
  for (int l = 0; l < p.num_layers; ++l) {
    // Round 0 of this layer's attention item: keys written before this step, fetched now.
    if (has_item) {
      CacheGeometry c = p.cache;
      c.layer_offset += static_cast<int64_t>(l) * p.layer_bytes;
      const int ctx = p.context_len[0];
      int k0, k1;
      item_keys(ctx, splits, s, k0, k1);
      if (k1 > k0) fetch_keys<HD>(p, c, g, k0, min(k1, k0 + p.keys), ctx - 1, a);
    }
    // One Linear of the layer: wait for its input, build it, stream the rows, count this block.
    auto linear = [&](int op, Counter after, uint32_t target, Counter done, int stamp_ready) {
      wait_counter(&p.counters[after], target, p.debug);
      int N, K;
      op_dims<HD>(p, op, N, K);
      if (!(p.debug & kDebugNoMath)) load_input(p, op, l, K, xs, red);
      stamp(p, l, stamp_ready);
      linear_phase<HD>(p, l, op, N, K, ring, full, empty, it, xs, part);
      signal_counter(&p.counters[done]);
      stamp(p, l, stamp_ready + 1);
    };
    const uint32_t all = static_cast<uint32_t>(G) * (l + 1);
    stamp(p, l, 0);
    linear(0, kDown, static_cast<uint32_t>(G) * l, kQkv, 1);  // qkv (layer 0 waits for nothing)
    stamp(p, l, 3);
    if (has_item && !(p.debug & kDebugNoAttention)) attention_item<HD>(p, l, g, s, splits, a, &s_last);
    if (has_item && (p.debug & kDebugNoAttention)) signal_counter(&p.counters[kAttn]);
    stamp(p, l, 4);
    // o_proj + residual after one arrival per merged kv head (per item with attention off)
    linear(1, kAttn, static_cast<uint32_t>((p.debug & kDebugNoAttention) ? items : p.hkv) * (l + 1), kO, 5);
    linear(2, kO, all, kGu, 7);     // gate_up
    linear(3, kGu, all, kDown, 9);  // down + residual
  }
  // The last block out puts every counter back to zero for the next launch.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&p.counters[kDone], 1u) == static_cast<uint32_t>(G) - 1) {
      for (int i = 0; i < kNumCounters; ++i) p.counters[i] = 0;
      __threadfence();
    }
  }
#endif
}

}  // namespace

size_t decode_stack_counter_count() {
  return kNumCounters;
}

bool launch_decode_stack(const LaunchContext& ctx, const DecodeStackArgs& args) {
  const DecoderStack& st = *args.stack;
  const TextAttentionShape& sh = st.shape;
  const int hd = sh.head_dim;
  const int L = static_cast<int>(st.layers.size());
  if (hd != 64 && hd != 128) return false;
  if (L == 0 || L > kStackMaxLayers) return false;
  if (sh.num_kv_heads <= 0 || sh.num_q_heads % sh.num_kv_heads != 0) return false;
  const int group = sh.num_q_heads / sh.num_kv_heads;
  if (group > kMaxGroup || sh.num_kv_heads + kArrive > kNumCounters) return false;
  if (args.cache.dtype != DType::kBF16 || args.x.dtype != DType::kBF16) return false;
  if (!st.rope || static_cast<int>(st.rope->inv_freq.size()) != hd / 2) return false;
  const int64_t H = st.hidden, I = st.intermediate;
  if (H % 16 != 0 || I % 16 != 0 || (int64_t{sh.num_q_heads} * hd) % 16 != 0) return false;

  StackParams p{};
  p.num_layers = L;
  p.H = static_cast<int>(H);
  p.I = static_cast<int>(I);
  p.hq = sh.num_q_heads;
  p.hkv = sh.num_kv_heads;
  const DType norm_dt = st.layers[0].input_norm->dtype;
  if (norm_dt != DType::kF32 && norm_dt != DType::kBF16) return false;
  p.norm_f32 = norm_dt == DType::kF32;
  int64_t max_row_bytes = 0;
  for (int l = 0; l < L; ++l) {
    const DecoderLayerRefs& r = st.layers[l];
    const Tensor* norms[4] = {r.input_norm, r.post_attention_norm, r.q_norm, r.k_norm};
    for (int i = 0; i < 4; ++i) {
      if (norms[i]->dtype != norm_dt) return false;
      p.layer[l].norm[i] = norms[i]->data;
    }
    const LinearWeight* lw[4] = {r.qkv, r.o, r.gate_up, r.down};
    for (int i = 0; i < 4; ++i) {
      const LinearWeight& w = *lw[i];
      if (w.parts.size() != 1 || !w.bias.empty()) return false;
      const LinearPart& part = w.parts[0];
      if (part.weight.dtype == DType::kF8E4M3) {
        // One scale row per 128 weight rows (block scales as loaded), F32.
        if (w.block_size != 128 || part.scale_inv.dtype != DType::kF32 ||
            part.scale_inv.dim(0) != (w.out_features + 127) / 128)
          return false;
        p.layer[l].scale[i] = part.scale_inv.as<float>();
      } else if (part.weight.dtype != DType::kBF16) {
        return false;
      }
      p.layer[l].w[i] = part.weight.data;
      max_row_bytes = std::max<int64_t>(max_row_bytes, w.in_features * dtype_size(part.weight.dtype));
    }
  }
  p.eps = st.eps;
  p.scale_log2 = st.scale * 1.4426950408889634f;
  p.x = args.x.as<bf16>();
  p.qkv = args.buffers.qkv.as<bf16>();
  p.attn = args.buffers.attn.as<bf16>();
  p.gu = args.buffers.gate_up.as<bf16>();
  p.context_len = args.batch->context_len.as<int32_t>();
  p.page_table = args.batch->page_table.as<int32_t>();
  p.slots = args.batch->slots.as<int32_t>();
  p.positions = args.batch->positions.as<int32_t>();
  p.cache = geometry(args.cache, 0);
  p.layer_bytes = static_cast<int64_t>(args.cache.layer_bytes());
  p.rope.half = hd / 2;
  for (int j = 0; j < hd / 2; ++j) {
    p.rope.inv_freq[j] = st.rope->inv_freq[j];
    p.rope.axis[j] = st.rope->axis[j];
  }
  p.partial = args.partial;
  p.counters = args.counters;
  p.trace = args.trace;
  p.debug = args.debug;

  // One block per multiprocessor; the kv heads' items spread over them.
  const int G = ctx.num_sms;
  int splits = args.max_splits > 0 ? args.max_splits : G / sh.num_kv_heads;
  splits = std::clamp(splits, 1, kMaxSplits);
  if (sh.num_kv_heads * splits > G) return false;
  if (static_cast<size_t>(sh.num_q_heads) * splits * (hd + 2) * sizeof(float) > args.partial_bytes) return false;
  p.splits = splits;
  // L2 prefetch past the ring: off. Measured on an H100 (2B BF16, 4 x 32 KiB per block): the
  // bare weight stream slowed from 1.29 to 1.78 ms per step, the whole step from 2.15 to 2.74 ms.
  p.prefetch = 0;

  // Shared memory: the ring gets what the rest leaves.
  const size_t smem_max = static_cast<size_t>(args.max_smem);
  p.keys = smem_max >= (160u << 10) ? 64 : 32;
  const size_t attn = hd == 128 ? attn_smem_bytes<128>(p.keys) : attn_smem_bytes<64>(p.keys);
  const size_t xbytes = static_cast<size_t>(std::max({H, I, int64_t{sh.num_q_heads} * hd})) * 2;
  const size_t partb = (kConsumerWarps * kSegRows + kConsumerWarps) * sizeof(float);
  const size_t bars = 2 * kMaxStages * sizeof(uint64_t);
  auto up = [](size_t v, size_t a) { return (v + a - 1) / a * a; };
  const size_t fixed = up(xbytes, 128) + up(attn, 128) + up(partb, 128) + bars + 1024;  // + static smem
  if (smem_max <= fixed) return false;
  size_t stage = smem_max >= (160u << 10) ? (32u << 10) : (16u << 10);
  stage = std::max(stage, up(static_cast<size_t>(max_row_bytes), 1024));
  const int stages = static_cast<int>(std::min<size_t>(kMaxStages, (smem_max - fixed) / stage));
  if (stages < 2) return false;
  p.stages = stages;
  p.stage_bytes = static_cast<int>(stage);
  size_t off = static_cast<size_t>(stages) * stage;
  p.off_x = static_cast<int>(off);
  off += up(xbytes, 128);
  p.off_attn = static_cast<int>(off);
  off += up(attn, 128);
  p.off_part = static_cast<int>(off);
  off += up(partb, 128);
  p.off_bar = static_cast<int>(off);
  off += bars;

  auto kernel = hd == 128 ? decode_stack_kernel<128> : decode_stack_kernel<64>;
  QVL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(off)));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(G));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = off;
  cfg.stream = ctx.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (ctx.profiler) ctx.profiler->before("decode_stack");
  QVL_CUDA_CHECK_NAMED(cudaLaunchKernelEx(&cfg, kernel, p), "decode_stack");
  if (ctx.profiler) ctx.profiler->after();
  return true;
}

}  // namespace qvl::cuda
