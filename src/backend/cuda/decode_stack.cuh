// Internal to decode_stack.cu, and included by it alone (everything here sits in an anonymous
// namespace): the building blocks of the fused decode stack's kernel: its parameters and
// shared-memory carve-up, PTX wrappers (sm_90+; empty elsewhere, where the kernel body is
// compiled out), the inter-block counters, the slice of rows of every Linear that each block
// owns, the producer warp that streams those rows into the shared-memory ring, and the consumer
// warps' Linear work on them. Attention is in decode_stack_attention.cuh. decode_stack.cu's
// opening comment describes the design: the phases, the counters that order them, and the
// numerics (those of the op-by-op path up to fp32 summation order).
#pragma once

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

// ---- small PTX wrappers (sm_90+; empty elsewhere, where the kernel body is compiled out): the
// mbarrier and bulk-copy ones are in cuda_common.cuh ----
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

}  // namespace
}  // namespace qvl::cuda
