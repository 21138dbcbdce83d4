// The decode attention's fused text_qkv_prepare (attention_decode.cu, its only user): per-warp
// q/k RMSNorm, M-RoPE and the cache store of the step's newest K and V, with the numerics of
// attention_text.cu's text_qkv_prepare kernel. Params is attention_decode.cu's DecodeParams
// (slots, positions, rope, q_norm / k_norm, norm_f32, eps, cache, hq, hkv).
#pragma once

#include "backend/cuda/attention_cache.cuh"

namespace qvl::cuda::decode_prepare {

// Shared-memory row pitch (bytes) of one BF16 row of HD values: +16 bytes keeps the 8 rows of
// an ldmatrix on distinct banks.
template <int HD>
constexpr int pitch() {
  return HD * 2 + 16;
}

// The value a cache element holds once v is stored (store_kv), as the bits of a BF16 (an FP8
// cache: of an f16, exact, as the decode attention reads an FP8 cache).
__device__ __forceinline__ uint16_t as_cached(float v, int esize) {
  if (esize == 2) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  return __half_as_ushort(__float2half_rn(fp8_e4m3_to_float_dev(float_to_fp8_e4m3_dev(bf16_round(v)))));
}

// What a lane of the fused text_qkv_prepare needs besides qkv, all from host-written inputs
// and weights, so it is gathered before the PDL wait: the row's slot, and for the lane's
// rotary pairs (j, j + dh/2), j = lane + 32 i: cos/sin of the M-RoPE angle (rounded to BF16
// like the reference's table); and the q/k norm weights of those pairs (PrepNorm: weights, read
// by every warp for itself; the rest by one warp, shared through shared memory).
template <int HD>
struct PrepLane {
  static constexpr int kPairs = (HD / 2 + 31) / 32;
  int32_t slot;
  float cs[kPairs], sn[kPairs];
};
template <int HD>
struct PrepNorm {
  float wq[2][PrepLane<HD>::kPairs], wk[2][PrepLane<HD>::kPairs];
};

template <int HD, class Params>
__device__ __forceinline__ void prepare_inputs(const Params& p, int row, PrepLane<HD>& in) {
  constexpr int kHalf = HD / 2;
  const int lane = threadIdx.x & 31;
  in.slot = p.slots[row];
  const int32_t pos3[3] = {p.positions[row * 3], p.positions[row * 3 + 1], p.positions[row * 3 + 2]};
#pragma unroll
  for (int i = 0; i < PrepLane<HD>::kPairs; ++i) {
    const int j = min(lane + 32 * i, kHalf - 1);  // lanes past the pairs compute a copy, unused
    const int axis = p.rope.axis[j];
    const float pos = static_cast<float>(axis == 0 ? pos3[0] : axis == 1 ? pos3[1] : pos3[2]);
    float sn, cs;
    sincosf(pos * p.rope.inv_freq[j], &sn, &cs);
    in.cs[i] = bf16_round(cs);
    in.sn[i] = bf16_round(sn);
  }
}
template <int HD, class Params>
__device__ __forceinline__ void prepare_norms(const Params& p, PrepNorm<HD>& nw) {
  constexpr int kHalf = HD / 2;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < PrepLane<HD>::kPairs; ++i) {
    const int j = min(lane + 32 * i, kHalf - 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int jj = j + h * kHalf;
      nw.wq[h][i] = p.norm_f32 ? static_cast<const float*>(p.q_norm)[jj]
                               : __bfloat162float(static_cast<const bf16*>(p.q_norm)[jj]);
      nw.wk[h][i] = p.norm_f32 ? static_cast<const float*>(p.k_norm)[jj]
                               : __bfloat162float(static_cast<const bf16*>(p.k_norm)[jj]);
    }
  }
}

// One warp of the fused text_qkv_prepare (attention_text.cu's kernel, the same numerics): task
// h < group rotates q head kvh * group + h into qs; task group normalises and rotates the
// newest key's k head kvh, task group + 1 copies its v head; both go to the cache (at the
// row's slot, unless it is < 0) and, as the cache holds them, to nbuf.
template <int HD, class Params>
__device__ __forceinline__ void prepare_head(const Params& p, const bf16* qkv_row, const PrepLane<HD>& in,
                                             const PrepNorm<HD>& nw, int kvh, int group, int task, char* qs,
                                             char* nbuf) {
  constexpr int kHalf = HD / 2;
  constexpr int kPairs = PrepLane<HD>::kPairs;
  const int lane = threadIdx.x & 31;
  const int32_t slot = in.slot;
  const int page = slot >= 0 ? slot / p.cache.page_size : 0, off = slot >= 0 ? slot % p.cache.page_size : 0;
  const int esize = p.cache.esize;
  if (task == group + 1) {  // v
    const bf16* src = qkv_row + static_cast<int64_t>(p.hq + p.hkv + kvh) * HD;
    char* dst = slot >= 0 ? cache_row(p.cache, page, off, kvh, HD, true) : nullptr;
    uint16_t* buf = reinterpret_cast<uint16_t*>(nbuf + pitch<HD>());
    for (int d = lane; d < HD; d += 32) {
      const float v = __bfloat162float(src[d]);
      if (dst) store_kv(dst, d, v, esize);
      buf[d] = as_cached(v, esize);
    }
    return;
  }
  const bool is_q = task < group;
  const bf16* src = qkv_row + static_cast<int64_t>(is_q ? kvh * group + task : p.hq + kvh) * HD;
  float a[kPairs], b[kPairs], ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = lane + 32 * i;
    a[i] = j < kHalf ? __bfloat162float(src[j]) : 0.0f;
    b[i] = j < kHalf ? __bfloat162float(src[j + kHalf]) : 0.0f;
    ss += a[i] * a[i] + b[i] * b[i];
  }
  const float rstd = rsqrtf(warp_sum(ss) / static_cast<float>(HD) + p.eps);
  char* kdst = !is_q && slot >= 0 ? cache_row(p.cache, page, off, kvh, HD, false) : nullptr;
  bf16* out = reinterpret_cast<bf16*>(is_q ? qs + task * pitch<HD>() : nbuf);
  uint16_t* kout = reinterpret_cast<uint16_t*>(nbuf);
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = lane + 32 * i;
    if (j >= kHalf) continue;
    const float x1 = bf16_round((is_q ? nw.wq[0][i] : nw.wk[0][i]) * bf16_round(a[i] * rstd));
    const float x2 = bf16_round((is_q ? nw.wq[1][i] : nw.wk[1][i]) * bf16_round(b[i] * rstd));
    const float cs = in.cs[i], sn = in.sn[i];
    const float o1 = bf16_round(x1 * cs) + bf16_round(-x2 * sn);
    const float o2 = bf16_round(x2 * cs) + bf16_round(x1 * sn);
    if (is_q) {
      out[j] = __float2bfloat16_rn(o1);
      out[j + kHalf] = __float2bfloat16_rn(o2);
    } else {
      if (kdst) {
        store_kv(kdst, j, o1, esize);
        store_kv(kdst, j + kHalf, o2, esize);
      }
      kout[j] = as_cached(o1, esize);
      kout[j + kHalf] = as_cached(o2, esize);
    }
  }
}

}  // namespace qvl::cuda::decode_prepare
