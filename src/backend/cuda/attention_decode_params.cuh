// The decode attention's kernel parameters (attention_decode.cu, their only user), with the two
// things the kernel does with them besides attention: asking L2 for the next Linears' weights
// (prefetch_l2) and stamping its stages for a trace (stamp).
#pragma once

#include <cuda.h>

#include "backend/cuda/attention_cache.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"

namespace qvl::cuda::decode_params {

struct DecodeParams {
  // kTma: the layer's cache as [pages][kv heads][HD / 64 halves][2 * page_size rows: K, then V]
  // [64 values] (innermost last), boxes of 16 rows of one head (tma_round).
  CUtensorMap kv_map;
  const bf16* qkv;
  bf16* out;
  float* partial;      // [num_seqs, hq, splits, hd + 2]
  uint32_t* counters;  // [num_seqs * hkv] arrivals of the current step's splits (zero between steps)
  const int32_t* query_start;
  const int32_t* context_len;
  const int32_t* page_table;
  CacheGeometry cache;
  int max_pages, hq, hkv, splits;
  float scale_log2;
  // Fused q/k-norm + M-RoPE + K/V store (text_qkv_prepare) of the step's new rows; else the
  // rows' q is already rotated in qkv and their K/V are in the cache.
  bool fused;
  const void* q_norm;  // [hd] F32 or BF16
  const void* k_norm;
  bool norm_f32;
  float eps;
  const int32_t* positions;  // [n, 3]
  const int32_t* slots;      // [n]
  MropeParams rope;
  // Measurement only (CudaBackendOptions::decode_attention_exit; the output is wrong): where the
  // kernel stops. 4: at once (after the PDL wait); 5: after reading the context length; 6: after
  // round 0 of the keys, issued before the wait, has landed; 7: after the prepare's host inputs
  // (no keys); 1: after both. 8 runs to the end but loads no round after round 0: each later
  // round works on its stage as it stands, zeroed at entry or holding round 0's keys (a round's
  // arithmetic and barriers, without its keys' latency).
  int debug_exit;
  // Measurement only (CudaBackendOptions::decode_attention_trace): thread 0 of each block stamps
  // %globaltimer at trace[((layer * kDecodeSplitBlocks) + block) * kDecodeTraceStamps + stage].
  unsigned long long* trace;
  int layer;
  // The per-step table (step_mode 1: this launch writes it, layer 0; 2: reads it, the later
  // layers of the same step; 0: unused). Per sequence [head_dim + 2]: the row's slot, then the
  // rotary cos and sin of its head-dim pairs (what prepare_inputs computes); per (sequence,
  // split) [kDecodeStepKeyInts]: the context length, then the pages of the split's first key
  // round from its first key's page on. The later layers read them with one load before their PDL
  // wait instead of chains of dependent loads (context length -> page table; query start ->
  // slot, position -> sin/cos), which blocks that become resident late run on the critical path.
  int32_t* step_prep;
  int32_t* step_keys;
  int step_mode;
  // When the block lets the next kernel launch (CudaBackendOptions::decode_attention_trigger):
  // 0 right after the PDL wait, 1 once its keys are done, 2 once its partial is written, 3 when
  // it exits.
  int trigger;
  // Weights of the kernels after this one (DecodeL2Prefetch): the blocks ask L2 for them once
  // their first keys are issued. bytes 0: none.
  const char* l2_data[2];
  uint32_t l2_bytes[2];
};

// This block's share of each region of p.l2_data, asked of L2 in bulk prefetches of at most
// 64 KB, spread over threads tid of nthreads.
__device__ __forceinline__ void prefetch_l2(const DecodeParams& p, int tid, int nthreads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t blocks = gridDim.x * gridDim.y, b = blockIdx.x + blockIdx.y * gridDim.x;
  constexpr uint32_t kPiece = 65536;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t bytes = p.l2_bytes[r];
    const uint32_t share = ((bytes + blocks - 1) / blocks + 255u) & ~255u;  // covers the region
    const uint32_t end = min(bytes, (b + 1) * share);
    for (uint32_t at = b * share + tid * kPiece; at < end; at += nthreads * kPiece)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.l2_data[r] + at), "r"(min(kPiece, end - at))
                   : "memory");
  }
#endif
}

// Stages: 0 entry, 1 first key round issued, 2 PDL wait passed, 3 q/k prepared, 4 first key round
// landed, 5 keys done, 6 partial written, 7 exit (after the merge); in the merges: 8 the warps'
// (m, l) shared, 9 the block's inbox complete, 10 the split weights computed, 11 the
// block's outputs written. Slot kDecodeTraceUnit holds the block's (sequence, kv head) unit + 1.
__device__ __forceinline__ unsigned long long* trace_slot(const DecodeParams& p) {
  if (p.trace == nullptr || threadIdx.x != 0) return nullptr;
  const unsigned b = blockIdx.x + blockIdx.y * gridDim.x;
  if (p.layer >= kDecodeTraceLayers || b >= static_cast<unsigned>(kDecodeSplitBlocks)) return nullptr;
  return p.trace + (static_cast<size_t>(p.layer) * kDecodeSplitBlocks + b) * kDecodeTraceStamps;
}
__device__ __forceinline__ void stamp(const DecodeParams& p, int stage) {
  unsigned long long* slot = trace_slot(p);
  if (slot == nullptr) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  slot[stage] = t;
}
__device__ __forceinline__ void stamp_unit(const DecodeParams& p, int unit) {
  if (unsigned long long* slot = trace_slot(p)) slot[kDecodeTraceUnit] = static_cast<unsigned long long>(unit) + 1;
}

}  // namespace qvl::cuda::decode_params
