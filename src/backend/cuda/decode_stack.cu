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
// an item go through shared memory in rounds of kKeys; the first round, which holds no key
// written in this step, is fetched before the item waits for qkv. The last item of a head to
// arrive merges the S partials.
//
// All G blocks must be resident at once (the counters are spin-waited): one block per
// multiprocessor, launched as a cooperative kernel.
#include <algorithm>

#include "backend/cuda/attention_cache.cuh"
#include "backend/cuda/cuda_backend.h"

namespace qvl::cuda {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
constexpr int kSegRows = 128;              // rows whose per-warp partial sums wait in shared memory
constexpr int kMaxGroup = 8;
constexpr int kMaxStages = 8;
constexpr int kMaxSplits = 64;
enum Counter { kQkv = 0, kAttn, kO, kGu, kDown, kDone, kArrive = 8 };  // kArrive + g: kv head g
constexpr int kNumCounters = kArrive + 24;

struct StackLayer {
  const void* w[4];       // qkv, o, gate_up, down: [N, K] BF16 or FP8 E4M3
  const float* scale[4];  // FP8: [ceil(N / 128), ceil(K / 128)] block scales; BF16: null
  const void* norm[4];    // input_norm, post_attention_norm, q_norm, k_norm (F32 or BF16)
};

struct StackParams {
  StackLayer layer[kStackMaxLayers];
  int num_layers;
  int H, I, hq, hkv;
  bool norm_f32;
  float eps, scale_log2;
  bf16* x;
  bf16* qkv;
  bf16* attn;
  bf16* gu;
  const int32_t* context_len;
  const int32_t* page_table;
  const int32_t* slots;
  const int32_t* positions;
  CacheGeometry cache;  // layer_offset of layer 0; + l * layer_bytes
  int64_t layer_bytes;
  MropeParams rope;
  float* partial;  // [hq][splits][hd + 2]
  uint32_t* counters;
  int splits, keys;  // attention splits per kv head (at most; fewer for short contexts); keys per round
  int prefetch;      // chunks past the ring's reach asked of L2
  int stages, stage_bytes;
  // Shared-memory carve-up (bytes from the start): ring, x, attention, partial sums, barriers.
  int off_x, off_attn, off_part, off_bar;
  // Diagnostics (qvl bench --profile): per-block clock64() stamps [layer][block][kStamps], and
  // kDebug* bits that switch parts off (wrong results; for timing what is left).
  long long* trace;
  int debug;
};
constexpr int kDebugNoWait = 1, kDebugNoMath = 2, kDebugNoAttention = 4, kDebugNoPrefetch = 8;

// ---- small PTX wrappers (sm_90+; empty elsewhere, where the kernel body is compiled out) ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QVL_SM90(...) __VA_ARGS__
#else
#define QVL_SM90(...)
#endif
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  QVL_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  QVL_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                        : "memory"));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  QVL_SM90(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory"));
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  QVL_SM90(
      asm volatile("{\n"
                   ".reg .pred p;\n"
                   "WAIT_%=:\n"
                   "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                   "@!p bra WAIT_%=;\n"
                   "}\n" ::"r"(smem_addr(bar)),
                   "r"(parity)
                   : "memory"));
}
// Global -> shared bulk copy completing on `bar` (bytes and addresses multiples of 16).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  QVL_SM90(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory"));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  QVL_SM90(asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src)));
}
__device__ __forceinline__ void cp_async_wait_all() {
  QVL_SM90(asm volatile("cp.async.wait_all;" ::: "memory"));
}
// The consumer warps' own barrier (the producer warp never joins it).
__device__ __forceinline__ void consumer_sync() {
  QVL_SM90(asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"));
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v = 0;
  QVL_SM90(asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"));
  return v;
}

// Consumer side of a counter: thread 0 spins until it reaches `target`, then all consumers go.
__device__ __forceinline__ void wait_counter(const uint32_t* c, uint32_t target, int debug = 0) {
  if (threadIdx.x == 0 && !(debug & kDebugNoWait))
    while (load_acquire(c) < target) __nanosleep(32);
  consumer_sync();
}
// After every consumer's writes of a phase: make them visible, then count this block.
__device__ __forceinline__ void signal_counter(uint32_t* c) {
  consumer_sync();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(c, 1u);
  }
}

__device__ __forceinline__ void stamp(const StackParams& p, int l, int i) {
  if (p.trace && threadIdx.x == 0)
    p.trace[(static_cast<int64_t>(l) * gridDim.x + blockIdx.x) * kDecodeStackStamps + i] = clock64();
}

// ---- the row slices ----
// Rows [r0, r1) of op `op` (0..3) of layer l that this block streams and computes: R rows over
// G blocks, the R % G longer slices rotated from op to op so that every block streams about the
// same number of bytes over a step.
__device__ __forceinline__ void op_rows(int R, int l, int op, int& r0, int& r1) {
  const int G = gridDim.x;
  const int q = (blockIdx.x + (l * 4 + op) * 37) % G;
  const int base = R / G, extra = R % G;
  r0 = q * base + min(q, extra);
  r1 = r0 + base + (q < extra ? 1 : 0);
}
// N x K of op `op` of a layer.
template <int HD>
__device__ __forceinline__ void op_dims(const StackParams& p, int op, int& N, int& K) {
  switch (op) {
    case 0:
      N = (p.hq + 2 * p.hkv) * HD, K = p.H;
      break;
    case 1:
      N = p.H, K = p.hq * HD;
      break;
    case 2:
      N = 2 * p.I, K = p.H;
      break;
    default:
      N = p.H, K = p.I;
      break;
  }
}

// Weight rows per ring chunk (the producer and the consumers must agree).
__device__ __forceinline__ int chunk_rows(bool fp8, int row_bytes, int stage_bytes) {
  return min(fp8 ? 16 : 8, stage_bytes / row_bytes);
}

// ---- the producer ----
// Walks this block's chunks in consumption order: (layer, op, rows [r, r + n)).
template <int HD>
struct ChunkCursor {
  int l = 0, op = -1, r = 0, r1 = 0, rows = 1, row_bytes = 0;
  const char* w = nullptr;
  __device__ bool done(const StackParams& p) const { return l >= p.num_layers; }
  // Moves to the next chunk (from the initial state: the first one).
  __device__ void next(const StackParams& p) {
    r += rows;
    while (r >= r1 && l < p.num_layers) {
      if (++op == 4) {
        op = 0;
        if (++l >= p.num_layers) return;
      }
      int N, K, r0;
      op_dims<HD>(p, op, N, K);
      op_rows(N, l, op, r0, r1);
      const bool fp8 = p.layer[l].scale[op] != nullptr;
      row_bytes = K * (fp8 ? 1 : 2);
      rows = chunk_rows(fp8, row_bytes, p.stage_bytes);
      w = static_cast<const char*>(p.layer[l].w[op]);
      r = r0;
    }
  }
  __device__ uint32_t bytes() const { return static_cast<uint32_t>(min(rows, r1 - r) * row_bytes); }
  __device__ const char* src() const { return w + static_cast<int64_t>(r) * row_bytes; }
};

__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  QVL_SM90(asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory"));
}

// Copies the chunks into the ring, each once its stage is free. `lead` runs p.prefetch chunks
// past the ring's reach and asks L2 for them: while the consumers wait on a dependency and the
// ring is full, the weights keep coming from DRAM into L2 (the ring's copies then hit L2).
template <int HD>
__device__ void producer(const StackParams& p, char* ring, uint64_t* full, uint64_t* empty) {
  ChunkCursor<HD> cur, lead;
  cur.next(p);
  lead.next(p);
  const int ahead = p.prefetch > 0 && !(p.debug & kDebugNoPrefetch) ? p.stages + p.prefetch : 0;
  for (int i = 0; i < p.stages && !lead.done(p); ++i) lead.next(p);  // the ring's first fill
  for (int i = p.stages; i < ahead && !lead.done(p); ++i) {
    prefetch_l2(lead.src(), lead.bytes());
    lead.next(p);
  }
  for (uint32_t it = 0; !cur.done(p); ++it, cur.next(p)) {
    const int stage = it % p.stages;
    if (it >= static_cast<uint32_t>(p.stages)) mbar_wait(&empty[stage], ((it / p.stages) - 1) & 1);
    const uint32_t bytes = cur.bytes();
    mbar_expect_tx(&full[stage], bytes);
    bulk_load(ring + static_cast<size_t>(stage) * p.stage_bytes, cur.src(), bytes, &full[stage]);
    if (ahead > 0 && !lead.done(p)) {
      prefetch_l2(lead.src(), lead.bytes());
      lead.next(p);
    }
  }
}

// ---- the consumers' Linear work ----
__device__ __forceinline__ float norm_weight(const StackParams& p, const void* w, int i) {
  return p.norm_f32 ? static_cast<const float*>(w)[i] : __bfloat162float(static_cast<const bf16*>(w)[i]);
}

// xs = the Linear's input, as the op-by-op path writes it: RMSNorm(x) * w, attention output,
// or SiLU(gate) * up. Reads through L2 (other blocks wrote these).
__device__ void load_input(const StackParams& p, int op, int l, int K, bf16* xs, float* red) {
  const int tid = threadIdx.x;
  if (op == 0 || op == 2) {
    const void* w = p.layer[l].norm[op == 0 ? 0 : 1];
    float ss = 0.0f;
    for (int v = tid; v < K / 8; v += kConsumers) {
      const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(p.x) + v);
      reinterpret_cast<uint4*>(xs)[v] = raw;
      float f[8];
      unpack8(raw, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
    }
    ss = warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    consumer_sync();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kConsumerWarps; ++i) total += red[i];
    const float rstd = rsqrtf(total / static_cast<float>(K) + p.eps);
    for (int v = tid; v < K / 8; v += kConsumers) {
      float f[8];
      unpack8(reinterpret_cast<const uint4*>(xs)[v], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = norm_weight(p, w, v * 8 + e) * bf16_round(f[e] * rstd);
      reinterpret_cast<uint4*>(xs)[v] = pack8(f);
    }
  } else if (op == 1) {
    for (int v = tid; v < K / 8; v += kConsumers)
      reinterpret_cast<uint4*>(xs)[v] = __ldcg(reinterpret_cast<const uint4*>(p.attn) + v);
  } else {
    for (int v = tid; v < K / 8; v += kConsumers) {
      float g[8], u[8];
      unpack8(__ldcg(reinterpret_cast<const uint4*>(p.gu) + v), g);
      unpack8(__ldcg(reinterpret_cast<const uint4*>(p.gu + p.I) + v), u);
#pragma unroll
      for (int e = 0; e < 8; ++e) g[e] = bf16_round(silu(g[e])) * u[e];
      reinterpret_cast<uint4*>(xs)[v] = pack8(g);
    }
  }
  consumer_sync();
}

// Two FP8 E4M3 values (the low / high byte pair of `w`) -> float2, exactly.
__device__ __forceinline__ float2 e4m3x2(uint16_t w) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// acc[j] += row j of the stage (n <= R rows of K values) · xs over this warp's share of the
// columns (16-byte vectors warp * 32 + lane + 256 i).
template <bool kFp8, int R>
__device__ __forceinline__ void chunk_dot(const char* stage, int n, int K, const bf16* xs, const float* scale,
                                          int scale_cols, int row0, float (&acc)[R]) {
  const int tid = threadIdx.x;
  if constexpr (!kFp8) {
    const int V = K / 8;
    for (int v = tid; v < V; v += kConsumers) {
      float x[8];
      unpack8(reinterpret_cast<const uint4*>(xs)[v], x);
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (j < n) {
          float w[8];
          unpack8(reinterpret_cast<const uint4*>(stage + static_cast<int64_t>(j) * K * 2)[v], w);
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            s0 = fmaf(w[e], x[e], s0);
            s1 = fmaf(w[e + 1], x[e + 1], s1);
          }
          acc[j] += s0 + s1;
        }
      }
    }
  } else {
    // 8 weights (8 bytes) per thread and step, so that all warps share a 2048-wide row.
    const int V = K / 8;
    const int rb0 = row0 / 128;
    for (int v = tid; v < V; v += kConsumers) {
      float x[8];
      unpack8(reinterpret_cast<const uint4*>(xs)[v], x);
      const int sc = (v * 8) / 128;
      // The chunk's rows span at most two 128-row scale blocks.
      const float s_lo = __ldg(scale + static_cast<int64_t>(rb0) * scale_cols + sc);
      const float s_hi = __ldg(scale + static_cast<int64_t>(min(rb0 + 1, (row0 + n - 1) / 128)) * scale_cols + sc);
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (j < n) {
          const uint2 raw = reinterpret_cast<const uint2*>(stage + static_cast<int64_t>(j) * K)[v];
          const float2 a = e4m3x2(static_cast<uint16_t>(raw.x & 0xffff));
          const float2 b = e4m3x2(static_cast<uint16_t>(raw.x >> 16));
          const float2 c = e4m3x2(static_cast<uint16_t>(raw.y & 0xffff));
          const float2 d = e4m3x2(static_cast<uint16_t>(raw.y >> 16));
          float s0 = a.x * x[0], s1 = a.y * x[1];
          s0 = fmaf(b.x, x[2], s0);
          s1 = fmaf(b.y, x[3], s1);
          s0 = fmaf(c.x, x[4], s0);
          s1 = fmaf(c.y, x[5], s1);
          s0 = fmaf(d.x, x[6], s0);
          s1 = fmaf(d.y, x[7], s1);
          acc[j] = fmaf(s0 + s1, (row0 + j) / 128 == rb0 ? s_lo : s_hi, acc[j]);
        }
      }
    }
  }
}

// Sums each of v[0..R) over the warp's 32 lanes in log2(R) exchange steps (each lane hands half
// of its values to its partner) plus the remaining halvings: 9 shuffles for R = 8, 16 for 16,
// instead of 5 per value. Returns the total of row reduced_row<R>(lane) (lanes L and L^1 hold
// the same row). The order of additions is fixed: deterministic.
template <int R>
__device__ __forceinline__ float reduce_rows(float (&v)[R], int lane) {
  int off = 16;
#pragma unroll
  for (int cnt = R / 2; cnt >= 1; cnt >>= 1, off >>= 1) {
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int k = 0; k < cnt; ++k) {
      const float send = upper ? v[k] : v[k + cnt];
      const float keep = upper ? v[k + cnt] : v[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
  }
  for (; off >= 1; off >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
  return v[0];
}
template <int R>
__device__ __forceinline__ int reduced_row(int lane) {
  int row = 0, off = 16;
#pragma unroll
  for (int cnt = R / 2; cnt >= 1; cnt >>= 1, off >>= 1)
    if (lane & off) row += cnt;
  return row;
}

// The rows [s0, s1) of a segment are summed over the warps' partials and stored as the
// op-by-op path stores them (qkv / gate_up: BF16; o / down: x = bf16(x + bf16(acc))).
__device__ __forceinline__ void store_segment(const StackParams& p, int op, int s0, int s1, const float* part) {
  consumer_sync();  // every warp's partials of the segment are in
  bf16* out = op == 0 ? p.qkv : op == 2 ? p.gu : p.x;
  for (int i = threadIdx.x; i < s1 - s0; i += kConsumers) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) v += part[w * kSegRows + i];
    v = bf16_round(v);
    const int row = s0 + i;
    if (op == 1 || op == 3) v += __bfloat162float(__ldcg(out + row));
    out[row] = __float2bfloat16_rn(v);
  }
  consumer_sync();  // the partials are read before the next segment writes them
}

// One Linear phase of this block: rows [r0, r1) out of the ring. Warps run through the chunks
// independently (each releases a stage with its own arrival); their per-row partial sums wait in
// shared memory and are added and stored every kSegRows rows.
template <bool kFp8>
__device__ void linear_rows(const StackParams& p, int l, int op, int K, int r0, int r1, char* ring, uint64_t* full,
                            uint64_t* empty, uint32_t& it, const bf16* xs, float* part) {
  constexpr int R = kFp8 ? 16 : 8;
  const float* scale = p.layer[l].scale[op];
  const int row_bytes = K * (kFp8 ? 1 : 2);
  const int rows = chunk_rows(kFp8, row_bytes, p.stage_bytes);
  const int scale_cols = (K + 127) / 128;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int seg0 = r0;
  for (int r = r0; r < r1; r += rows, ++it) {
    const int n = min(rows, r1 - r);
    if (r + n - seg0 > kSegRows) {  // the segment is full: store it first
      store_segment(p, op, seg0, r, part);
      seg0 = r;
    }
    const int stage = it % p.stages;
    mbar_wait(&full[stage], (it / p.stages) & 1);
    const char* st = ring + static_cast<size_t>(stage) * p.stage_bytes;
    if (p.debug & kDebugNoMath) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[stage]);
      continue;
    }
    float acc[R];
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] = 0.0f;
    chunk_dot<kFp8, R>(st, n, K, xs, scale, scale_cols, r, acc);
    __syncwarp();  // this warp has read the stage
    if (lane == 0) mbar_arrive(&empty[stage]);
    const float total = reduce_rows<R>(acc, lane);
    const int j = reduced_row<R>(lane);
    if ((lane & (32 / R - 1)) == 0 && j < n) part[warp * kSegRows + (r - seg0) + j] = total;
  }
  if (!(p.debug & kDebugNoMath)) store_segment(p, op, seg0, r1, part);
}

template <int HD>
__device__ __forceinline__ void linear_phase(const StackParams& p, int l, int op, int N, int K, char* ring,
                                             uint64_t* full, uint64_t* empty, uint32_t& it, const bf16* xs,
                                             float* part) {
  int r0, r1;
  op_rows(N, l, op, r0, r1);
  if (p.layer[l].scale[op])
    linear_rows<true>(p, l, op, K, r0, r1, ring, full, empty, it, xs, part);
  else
    linear_rows<false>(p, l, op, K, r0, r1, ring, full, empty, it, xs, part);
}

// ---- attention ----
// Shared-memory row pitch of one K or V row: HD BF16 + 16 bytes, so that the 16-byte loads of
// consecutive rows by consecutive lanes fall on distinct banks.
template <int HD>
constexpr int kv_pitch() {
  return HD * 2 + 16;
}

struct AttnSmem {
  char* kv;      // [keys] K rows, then [keys] V rows (BF16, kv_pitch bytes apart)
  float* q;      // [kMaxGroup][HD] rotated q (BF16 values)
  float* sc;     // [kMaxGroup][keys] scores, then P; the merge's [kMaxGroup][kMaxSplits] weights
  bf16* nkv;     // [2][HD] this step's K and V as the cache holds them
  float* stats;  // [3][kMaxGroup]: running max, sum, rescale
};

template <int HD>
__device__ __forceinline__ AttnSmem attn_smem(const StackParams& p, char* base) {
  AttnSmem a;
  a.kv = base;
  a.q = reinterpret_cast<float*>(base + static_cast<size_t>(p.keys) * 2 * kv_pitch<HD>());
  a.sc = a.q + kMaxGroup * HD;
  a.nkv = reinterpret_cast<bf16*>(a.sc + kMaxGroup * kMaxSplits);
  a.stats = reinterpret_cast<float*>(a.nkv + 2 * HD);
  return a;
}
template <int HD>
constexpr size_t attn_smem_bytes(int keys) {
  return static_cast<size_t>(keys) * 2 * kv_pitch<HD>() + kMaxGroup * HD * 4 + kMaxGroup * kMaxSplits * 4 + 2 * HD * 2 +
         3 * kMaxGroup * 4;
}

// Keys [k0, k1) of this item (an empty range when the split lies past the context).
__device__ __forceinline__ void item_keys(int ctx, int splits, int s, int& k0, int& k1) {
  const int len = (ctx + splits - 1) / splits;
  k0 = min(ctx, s * len);
  k1 = min(ctx, k0 + len);
}

// Issues the cp.async copies of K and V rows of keys [kb, ke) of kv head g (skipping `skip`).
template <int HD>
__device__ void fetch_keys(const StackParams& p, const CacheGeometry& c, int g, int kb, int ke, int skip,
                           const AttnSmem& a) {
  constexpr int CPR = HD / 8;
  const int n = ke - kb;
  for (int i = threadIdx.x; i < 2 * n * CPR; i += kConsumers) {
    const int rr = i / CPR, chunk = i % CPR;
    const bool v = rr >= n;
    const int r = v ? rr - n : rr;
    const int key = kb + r;
    if (key == skip) continue;
    const char* src = cache_row(c, p.page_table[key / c.page_size], key % c.page_size, g, HD, v);
    cp_async16(a.kv + (static_cast<size_t>(v ? p.keys : 0) + r) * kv_pitch<HD>() + chunk * 16, src + chunk * 16);
  }
}

// q/k-norm + M-RoPE of one head (text_qkv_prepare's numerics), by one warp: q heads into a.q,
// the new k (and v, task == group + 1) into a.nkv and the cache.
template <int HD>
__device__ void prepare_task(const StackParams& p, const CacheGeometry& c, int l, int g, int group, int task,
                             const AttnSmem& a) {
  constexpr int kHalf = HD / 2;
  const int lane = threadIdx.x & 31;
  const int32_t slot = p.slots[0];
  const bool store = slot >= 0;
  const int page = store ? slot / c.page_size : 0, off = store ? slot % c.page_size : 0;
  if (task == group + 1) {
    const bf16* src = p.qkv + static_cast<int64_t>(p.hq + p.hkv + g) * HD;
    char* dst = store ? cache_row(c, page, off, g, HD, true) : nullptr;
    for (int d = lane; d < HD; d += 32) {
      const bf16 v = __ldcg(src + d);
      if (dst) reinterpret_cast<bf16*>(dst)[d] = v;
      a.nkv[HD + d] = v;
    }
    return;
  }
  const bool is_q = task < group;
  const bf16* src = p.qkv + static_cast<int64_t>(is_q ? g * group + task : p.hq + g) * HD;
  const void* nw = p.layer[l].norm[is_q ? 2 : 3];
  constexpr int kPairs = (kHalf + 31) / 32;
  float x1[kPairs], x2[kPairs], ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = lane + 32 * i;
    x1[i] = j < kHalf ? __bfloat162float(__ldcg(src + j)) : 0.0f;
    x2[i] = j < kHalf ? __bfloat162float(__ldcg(src + j + kHalf)) : 0.0f;
    ss += x1[i] * x1[i] + x2[i] * x2[i];
  }
  const float rstd = rsqrtf(warp_sum(ss) / static_cast<float>(HD) + p.eps);
  const int32_t pos3[3] = {p.positions[0], p.positions[1], p.positions[2]};
  char* kdst = !is_q && store ? cache_row(c, page, off, g, HD, false) : nullptr;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = lane + 32 * i;
    if (j >= kHalf) continue;
    const int axis = p.rope.axis[j];
    const float pos = static_cast<float>(pos3[axis]);
    float sn, cs;
    sincosf(pos * p.rope.inv_freq[j], &sn, &cs);
    cs = bf16_round(cs);
    sn = bf16_round(sn);
    const float a1 = bf16_round(norm_weight(p, nw, j) * bf16_round(x1[i] * rstd));
    const float a2 = bf16_round(norm_weight(p, nw, j + kHalf) * bf16_round(x2[i] * rstd));
    const float o1 = bf16_round(bf16_round(a1 * cs) + bf16_round(-a2 * sn));
    const float o2 = bf16_round(bf16_round(a2 * cs) + bf16_round(a1 * sn));
    if (is_q) {
      a.q[task * HD + j] = o1;
      a.q[task * HD + j + kHalf] = o2;
    } else {
      if (kdst) {
        reinterpret_cast<bf16*>(kdst)[j] = __float2bfloat16_rn(o1);
        reinterpret_cast<bf16*>(kdst)[j + kHalf] = __float2bfloat16_rn(o2);
      }
      a.nkv[j] = __float2bfloat16_rn(o1);
      a.nkv[j + kHalf] = __float2bfloat16_rn(o2);
    }
  }
}

// Attention item (g, s) of layer l: prepare, softmax over its keys round by round, partial out,
// and the merge when it is the head's last item to arrive. Round 0 was fetched by the caller.
template <int HD>
__device__ void attention_item(const StackParams& p, int l, int g, int s, int splits, const AttnSmem& a, bool* s_last) {
  constexpr int OPT = (kMaxGroup * HD + kConsumers - 1) / kConsumers;  // outputs per thread
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int group = p.hq / p.hkv;
  CacheGeometry c = p.cache;
  c.layer_offset += static_cast<int64_t>(l) * p.layer_bytes;
  const int ctx = p.context_len[0], newest = ctx - 1;
  int k0, k1;
  item_keys(ctx, splits, s, k0, k1);

  wait_counter(&p.counters[kQkv], static_cast<uint32_t>(gridDim.x) * (l + 1), p.debug);
  stamp(p, l, 3);
  const bool own_newest = newest >= k0 && newest < k1;
  for (int task = warp; task < group + (own_newest ? 2 : 0); task += kConsumerWarps)
    prepare_task<HD>(p, c, l, g, group, task, a);
  if (tid < kMaxGroup) {
    a.stats[tid] = -INFINITY;  // running max (log2 domain)
    a.stats[kMaxGroup + tid] = 0.0f;
  }
  consumer_sync();  // q, the new K/V and the running stats are in place
  float o[OPT];
#pragma unroll
  for (int i = 0; i < OPT; ++i) o[i] = 0.0f;

  for (int kb = k0; kb < k1; kb += p.keys) {
    const int ke = min(k1, kb + p.keys), n = ke - kb;
    if (kb != k0) fetch_keys<HD>(p, c, g, kb, ke, newest, a);
    cp_async_wait_all();
    consumer_sync();
    if (newest >= kb && newest < ke) {  // this step's key joins from a.nkv
      const int r = newest - kb;
      for (int d = tid; d < HD; d += kConsumers) {
        reinterpret_cast<bf16*>(a.kv + static_cast<size_t>(r) * kv_pitch<HD>())[d] = a.nkv[d];
        reinterpret_cast<bf16*>(a.kv + static_cast<size_t>(p.keys + r) * kv_pitch<HD>())[d] = a.nkv[HD + d];
      }
      consumer_sync();
    }
    // Scores (log2 domain): one (head, key) per thread, the whole dot product in registers.
    for (int idx = tid; idx < group * n; idx += kConsumers) {
      const int h = idx / n, j = idx % n;
      const uint4* krow = reinterpret_cast<const uint4*>(a.kv + static_cast<size_t>(j) * kv_pitch<HD>());
      const float4* qh = reinterpret_cast<const float4*>(a.q + h * HD);
      float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        float kf[8];
        unpack8(krow[c], kf);
        const float4 q0 = qh[2 * c], q1 = qh[2 * c + 1];
        d0 = fmaf(q0.x, kf[0], d0);
        d1 = fmaf(q0.y, kf[1], d1);
        d0 = fmaf(q0.z, kf[2], d0);
        d1 = fmaf(q0.w, kf[3], d1);
        d0 = fmaf(q1.x, kf[4], d0);
        d1 = fmaf(q1.y, kf[5], d1);
        d0 = fmaf(q1.z, kf[6], d0);
        d1 = fmaf(q1.w, kf[7], d1);
      }
      a.sc[h * p.keys + j] = (d0 + d1) * p.scale_log2;
    }
    consumer_sync();
    // Online softmax per head (warp h): P = exp2(S - m) rounded to BF16 for P·V, l in fp32.
    if (warp < group) {
      const int h = warp;
      float mx = -INFINITY;
      for (int j = lane; j < n; j += 32) mx = fmaxf(mx, a.sc[h * p.keys + j]);
      mx = warp_max(mx);
      const float m_old = a.stats[h], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int j = lane; j < n; j += 32) {
        const float e = exp2f(a.sc[h * p.keys + j] - m_new);
        sum += e;
        a.sc[h * p.keys + j] = bf16_round(e);
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
        a.stats[h] = m_new;
        a.stats[kMaxGroup + h] = a.stats[kMaxGroup + h] * alpha + sum;
        a.stats[2 * kMaxGroup + h] = alpha;
      }
    }
    consumer_sync();
    // O = O * alpha + P · V: thread owns outputs (h, d) = tid + kConsumers * i; four keys at a
    // time into separate sums (shorter dependency chains).
    const char* vbase = a.kv + static_cast<size_t>(p.keys) * kv_pitch<HD>();
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
      const int idx = tid + kConsumers * i, h = idx / HD, d = idx % HD;
      if (h < group) {
        const float* ph = a.sc + h * p.keys;
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int j = 0;
        for (; j + 4 <= n; j += 4) {
#pragma unroll
          for (int u = 0; u < 4; ++u)
            s4[u] = fmaf(ph[j + u],
                         __bfloat162float(reinterpret_cast<const bf16*>(vbase + (j + u) * kv_pitch<HD>())[d]), s4[u]);
        }
        for (; j < n; ++j)
          s4[0] = fmaf(ph[j], __bfloat162float(reinterpret_cast<const bf16*>(vbase + j * kv_pitch<HD>())[d]), s4[0]);
        o[i] = o[i] * a.stats[2 * kMaxGroup + h] + ((s4[0] + s4[1]) + (s4[2] + s4[3]));
      }
    }
    consumer_sync();  // the stage and the scores are rewritten by the next round
  }

  if (splits == 1) {  // the only item of its head: the output itself, no merge
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
      const int idx = tid + kConsumers * i, h = idx / HD, d = idx % HD;
      if (h < group) {
        const float l_sum = a.stats[kMaxGroup + h];
        p.attn[(g * group + h) * HD + d] = __float2bfloat16_rn(l_sum > 0.0f ? o[i] / l_sum : 0.0f);
      }
    }
    signal_counter(&p.counters[kAttn]);
    return;
  }
  // Partial (unnormalised O, m, l) of this item.
  float* part = p.partial + static_cast<int64_t>(g * group) * splits * (HD + 2);
#pragma unroll
  for (int i = 0; i < OPT; ++i) {
    const int idx = tid + kConsumers * i, h = idx / HD, d = idx % HD;
    if (h < group) {
      float* ph = part + (static_cast<int64_t>(h) * splits + s) * (HD + 2);
      ph[d] = o[i];
      if (d == 0) {
        ph[HD] = a.stats[h];
        ph[HD + 1] = a.stats[kMaxGroup + h];
      }
    }
  }
  consumer_sync();
  if (tid == 0) {
    __threadfence();
    const uint32_t arrived = atomicAdd(&p.counters[kArrive + g], 1u);
    *s_last = arrived == static_cast<uint32_t>(splits) * (l + 1) - 1;
  }
  consumer_sync();
  if (!*s_last) return;
  __threadfence();
  // Merge: warp h computes split weights exp2(m_s - M) / L into a.sc[h][s]; then every output.
  if (warp < group) {
    const int h = warp;
    const float* ph = part + static_cast<int64_t>(h) * splits * (HD + 2);
    float mx = -INFINITY;
    for (int sp = lane; sp < splits; sp += 32) mx = fmaxf(mx, __ldcg(ph + sp * (HD + 2) + HD));
    mx = warp_max(mx);
    float total = 0.0f;
    for (int sp = lane; sp < splits; sp += 32) {
      const float m = __ldcg(ph + sp * (HD + 2) + HD);
      const float w = m == -INFINITY ? 0.0f : exp2f(m - mx);
      a.sc[h * kMaxSplits + sp] = w;
      total += w * __ldcg(ph + sp * (HD + 2) + HD + 1);
    }
    total = warp_sum(total);
    for (int sp = lane; sp < splits; sp += 32) {
      const float w = a.sc[h * kMaxSplits + sp];
      a.sc[h * kMaxSplits + sp] = total > 0.0f ? w / total : 0.0f;
    }
  }
  consumer_sync();
  for (int idx = tid; idx < group * HD; idx += kConsumers) {
    const int h = idx / HD, d = idx % HD;
    const float* ph = part + static_cast<int64_t>(h) * splits * (HD + 2) + d;
    float acc = 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < splits; ++sp) acc = fmaf(__ldcg(ph + sp * (HD + 2)), a.sc[h * kMaxSplits + sp], acc);
    p.attn[(g * group + h) * HD + d] = __float2bfloat16_rn(acc);
  }
  signal_counter(&p.counters[kAttn]);
}

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
