// The decode attention's key rounds (attention_decode.cu, its only user): how a round of kRound
// keys of one kv head gets from the paged cache into a shared-memory stage, by cp.async from
// every thread (BF16), cp.async of the raw bytes widened in shared memory (FP8), or TMA boxes
// from one thread (kTma), and where a key's row then lies in the stage. Params is
// attention_decode.cu's DecodeParams (cache, and kv_map for TMA).
#pragma once

#include <cuda.h>

#include "backend/cuda/attention_cache.cuh"
#include "backend/cuda/attention_decode_prepare.cuh"

namespace qvl::cuda::decode_keys {

using decode_prepare::pitch;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRound = 16 * kWarps;  // keys per round

// 8 elements of a cache row as 16 bytes: BF16 as they are, FP8 widened exactly to f16 (the
// decode attention reads an FP8 cache in f16).
template <bool kFp8>
__device__ __forceinline__ uint4 load_kv_chunk(const char* row, int chunk) {
  if constexpr (kFp8) {
    return fp8x8_to_f16x8(*reinterpret_cast<const uint2*>(row + chunk * 8));
  } else {
    return *reinterpret_cast<const uint4*>(row + chunk * 16);
  }
}

// The page and in-page offset of key k0 + key(i) for each i < N, the loads issued together: from
// the page table pt, or from `pages` (shared memory: the pages from key k0's page on).
template <int N, class Params, class KeyOf>
__device__ __forceinline__ void lookup_pages(const Params& p, const int32_t* pt, const int32_t* pages, int k0,
                                             KeyOf key, int32_t (&page)[N], int (&off)[N]) {
  int pi0 = 0, off0 = 0;
  if (pages) pi0 = page_index(p.cache, k0, off0);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int pi = page_index(p.cache, k0 + key(i), off[i]);
    page[i] = pages ? pages[pi - pi0] : pt[pi];
  }
}

// How threads [0, NT) share the rows of a round in copies of 16 bytes: each keeps one 16-byte
// column of rows r0, r0 + kRpp, ... (kPasses of them at most), so that its rows' page lookups are
// independent loads issued together, and K and V of a row share one address. A loop with a lookup
// per copy, each before its cp.async, runs its dependent loads in a row: on the critical path of
// every key round, and of the first round of a block that becomes resident late.
template <int kRowBytes, int NT>
struct RowColumns {
  static constexpr int kCpr = kRowBytes / 16;                 // 16-byte columns per row
  static constexpr int kRpp = NT / kCpr;                      // rows per pass of the NT threads
  static constexpr int kPasses = (kRound + kRpp - 1) / kRpp;  // rows per thread, at most
  static_assert(NT % kCpr == 0, "whole rows per pass");
};

// A raw stage (kFp8) holds a round's K rows, then its V rows, HD bytes each, as the cache holds
// them. The loop keeps two raw stages beside one BF16 stage (the cp.async layout): two rounds'
// bytes are in flight while a third is worked on, in fewer bytes than the BF16 cache's two
// stages. Each thread widens what it copied itself (widen_fp8), so a raw stage needs no barrier of
// its own.
template <int HD>
constexpr int raw_stage_bytes() {
  return 2 * kRound * HD;
}

// Copies the K and V rows of keys [k0, k0 + rows) into a stage by cp.async from threads [0, NT)
// (RowColumns), row r < kRound: K of key k0 + r, row kRound + r: V. A BF16 cache into a BF16
// stage (rows pitch<HD>() apart); an FP8 cache (kFp8) into a raw stage (rows HD bytes apart).
template <int HD, int NT, bool kFp8, class Params>
__device__ __forceinline__ void load_round(const Params& p, char* stage, const int32_t* pt, int kvh, int k0, int rows,
                                           int newest, const int32_t* pages = nullptr) {
  using C = RowColumns<kFp8 ? HD : 2 * HD, NT>;
  constexpr int kPitch = kFp8 ? HD : pitch<HD>();
  const int chunk = static_cast<int>(threadIdx.x) % C::kCpr, r0 = static_cast<int>(threadIdx.x) / C::kCpr;
  int32_t page[C::kPasses];
  int off[C::kPasses];
  lookup_pages(
      p, pt, pages, k0, [&](int i) { return min(r0 + i * C::kRpp, rows - 1); }, page, off);
#pragma unroll
  for (int i = 0; i < C::kPasses; ++i) {
    const int r = r0 + i * C::kRpp;
    if (r >= rows || k0 + r == newest) continue;  // rows >= kRound never come; the newest key has its own buffer
    const char* src = cache_row(p.cache, page[i], off[i], kvh, HD, false) + chunk * 16;
    char* dst = stage + r * kPitch + chunk * 16;
    cp_async16(dst, src);
    cp_async16(dst + kRound * kPitch, src + p.cache.v_offset);
  }
}

// This thread's columns of a landed raw stage (the ones it copied by load_round<HD, NT, true>, the
// same NT, or any share of a stage that came through TMA), widened exactly into the stage as f16;
// its rows past `rows` as zeros (see zero_tail).
template <int HD, int NT>
__device__ __forceinline__ void widen_fp8(const char* raw, char* stage, int k0, int rows, int newest) {
  using C = RowColumns<HD, NT>;
  const int chunk = static_cast<int>(threadIdx.x) % C::kCpr, r0 = static_cast<int>(threadIdx.x) / C::kCpr;
#pragma unroll
  for (int i = 0; i < C::kPasses; ++i) {
    const int r = r0 + i * C::kRpp;
    if (r >= kRound || k0 + r == newest) continue;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 x =
          r < rows ? *reinterpret_cast<const uint4*>(raw + (v * kRound + r) * HD + chunk * 16) : make_uint4(0, 0, 0, 0);
      uint4* dst = reinterpret_cast<uint4*>(stage + (v * kRound + r) * pitch<HD>() + chunk * 32);
      dst[0] = fp8x8_to_f16x8(make_uint2(x.x, x.y));
      dst[1] = fp8x8_to_f16x8(make_uint2(x.z, x.w));
    }
  }
}

// Zeroes V rows [valid, kRound) of a stage: keys past the split's end get P = 0, and 0 times
// whatever the stage held before (possibly NaN bits) must stay 0. K rows past the end are
// masked to -inf before use and need nothing.
template <int HD>
__device__ __forceinline__ void zero_tail(char* stage, int valid) {
  constexpr int CPR = HD / 8;
  for (int c = threadIdx.x; c < (kRound - valid) * CPR; c += kThreads)
    *reinterpret_cast<uint4*>(stage + (kRound + valid + c / CPR) * pitch<HD>() + (c % CPR) * 16) =
        make_uint4(0, 0, 0, 0);
}

// ---- the key rounds through TMA (kTma) ----
// A 16-key group's K (or V) rows of one kv head land as one box: [HD / 64 halves][16 rows][64
// values], each 128-byte line in the 128-byte swizzle (its 16-byte column c at c ^ (row mod 8)),
// so that the 8 rows of an ldmatrix fall on distinct banks without the cp.async layout's padding.
// A stage holds its round's 4 groups as (K box, V box) pairs, every box 1024-aligned (the
// swizzle's atom): 32 KB at HD 128 where the padded rows take 34 KB.
template <int HD>
constexpr int box_bytes() {
  return 16 * HD * 2;
}
template <int HD>
constexpr int tma_stage_bytes() {
  return (kRound / 16) * 2 * box_bytes<HD>();
}
template <int HD, bool kTma>
constexpr int stage_bytes() {
  return kTma ? tma_stage_bytes<HD>() : 2 * kRound * pitch<HD>();
}

__device__ __forceinline__ void tma_load_5d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, int c4,
                                            uint64_t* bar) {
  QVL_SM90(
      asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                   "%3, %4, %5, %6}], [%7];" ::"r"(smem_u32(dst)),
                   "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar))
                   : "memory"));
}

// The pages and in-page offsets of a round's 16-key groups (keys [k0, k0 + rows)), from the page
// table pt or from `pages` (as in lookup_pages). Looked up apart from the boxes' issue, so that the
// loop can look up a round's pages a round ahead: their loads are dependent global reads (an L2
// round trip behind the keys in flight) that would otherwise precede every round's boxes.
struct RoundPages {
  int32_t page[kRound / 16];
  int off[kRound / 16];
};
template <class Params>
__device__ __forceinline__ void tma_lookup(const Params& p, const int32_t* pt, int k0, int rows, RoundPages& rp,
                                           const int32_t* pages = nullptr) {
  const int groups = (rows + 15) / 16;
  lookup_pages(
      p, pt, pages, k0, [&](int q) { return 16 * min(q, groups - 1); }, rp.page, rp.off);
}

__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  QVL_SM90(
      asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                   "%3, %4, %5}], [%6];" ::"r"(smem_u32(dst)),
                   "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
                   : "memory"));
}

// Issues the K and V boxes of the 16-key groups that hold a round's `rows` keys, at the pages
// tma_lookup found, completing on `bar` (one thread; a round's first key is a multiple of 16, and
// so is the page size, so a group lies in one page). Rows past the end land too: their scores are
// masked and tma_zero_tail (widen_fp8) zeroes their V rows. BF16 (kRaw false): (K box, V box)
// pairs in the 128-byte swizzle (stage_row). FP8 (kRaw): into a raw stage, a group's K (or V) rows
// of one kv head as one unswizzled box of 16 rows x HD bytes (a tensor map of BF16 pairs over the
// cache's bytes), at the rows where load_round would copy them.
template <int HD, bool kRaw, class Params>
__device__ __forceinline__ void tma_issue(const Params& p, char* stage, int kvh, int rows, const RoundPages& rp,
                                          uint64_t* bar) {
  constexpr int kGroups = kRound / 16, kBox = kRaw ? 16 * HD : box_bytes<HD>();
  const int groups = (rows + 15) / 16;
  mbar_expect_tx(bar, static_cast<uint32_t>(groups * 2 * kBox));
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    if (q >= groups) break;
    const int k_row = rp.off[q], v_row = p.cache.page_size + rp.off[q];
    if constexpr (kRaw) {
      tma_load_4d(stage + q * kBox, &p.kv_map, 0, k_row, kvh, rp.page[q], bar);
      tma_load_4d(stage + kRound * HD + q * kBox, &p.kv_map, 0, v_row, kvh, rp.page[q], bar);
    } else {
      tma_load_5d(stage + q * 2 * kBox, &p.kv_map, 0, k_row, 0, kvh, rp.page[q], bar);
      tma_load_5d(stage + q * 2 * kBox + kBox, &p.kv_map, 0, v_row, 0, kvh, rp.page[q], bar);
    }
  }
}

// Both at once: the round of keys [k0, k0 + rows).
template <int HD, bool kRaw, class Params>
__device__ __forceinline__ void tma_round(const Params& p, char* stage, const int32_t* pt, int kvh, int k0, int rows,
                                          uint64_t* bar, const int32_t* pages = nullptr) {
  RoundPages rp;
  tma_lookup(p, pt, k0, rows, rp, pages);
  tma_issue<HD, kRaw>(p, stage, kvh, rows, rp, bar);
}

// zero_tail for a landed TMA stage: V rows [valid, kRound) to zero, the last group's rows past
// the end (what the page held there) and the groups not loaded. Whole 128-byte lines, so the
// swizzle does not matter.
template <int HD>
__device__ __forceinline__ void tma_zero_tail(char* stage, int valid) {
  constexpr int kLines = HD / 64;  // per row
  for (int c = threadIdx.x; c < (kRound - valid) * kLines * 8; c += kThreads) {
    const int r = valid + c / (kLines * 8), h = (c / 8) % kLines;
    char* line = stage + (r / 16) * 2 * box_bytes<HD>() + box_bytes<HD>() + (h * 16 + r % 16) * 128;
    *reinterpret_cast<uint4*>(line + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
  }
}

// Where 16-byte column c of a key's K or V row lies: at base + (c / 8) * half + ((c % 8) ^ x) * 16.
// A TMA stage row kk: base = its line in its box, half = 16 lines, x = kk % 8; a padded row
// (cp.async stages, the newest key's buffer): base = the row, half = 128 bytes, x = 0.
struct RowAddr {
  const char* base;
  int half, x;
  __device__ __forceinline__ const char* at(int c) const { return base + (c >> 3) * half + (((c & 7) ^ x) << 4); }
  // A row laid out plainly (column c at c * 16).
  __device__ __forceinline__ static RowAddr padded(const char* row) { return {row, 128, 0}; }
};
template <int HD, bool kTma>
__device__ __forceinline__ RowAddr stage_row(const char* stage, int kk, bool v) {
  if constexpr (kTma)
    return {stage + (kk >> 4) * 2 * box_bytes<HD>() + (v ? box_bytes<HD>() : 0) + (kk & 15) * 128, 16 * 128, kk & 7};
  else
    return RowAddr::padded(stage + ((v ? kRound : 0) + kk) * pitch<HD>());
}

}  // namespace qvl::cuda::decode_keys
