// Flash attention core (FA2 scheme on mma.sync m16n8k16, BF16 in, fp32 accumulate), shared by
// the vision encoder (packed qkv, per-segment, non-causal) and text prefill (K/V from the paged
// cache, causal). Included only by attention_*.cu.
//
// A block owns BM = 16·WARPS·MT query rows of one head; warp w owns rows [16·MT·w, 16·MT·(w+1))
// as MT m-tiles of 16 (MT = 2 reuses every K/V fragment for two mmas). Key
// tiles of BN = 64 rows (32: the prefill's layout for 100 KB GPUs) stream through a two-stage
// cp.async ring in shared memory (an FP8 cache: raw
// tiles two ahead, each widened into one stage in its turn, to f16, with Q converted to f16 and P
// rounded to f16); S = Q·Kᵀ stays
// in registers, the softmax is online (running max m and sum l per row, in the log2 domain),
// P is rounded to BF16 and multiplied by V from the same registers (the S accumulator layout
// of two n-tiles is the A-fragment layout of one k-step). Nothing is N²: memory per block is
// fixed. Head dims that are not a multiple of 16 (72) are zero-padded to HDP in shared memory
// for Q·Kᵀ; the output uses exactly HD/8 n-tiles.
//
// The policy P says where rows live and which keys a query row may see:
//   bool locate(const Params&, Tile&)            -> this block's tile (false: nothing to do)
//   const bf16* q_row(const Params&, const Tile&, int i)  i < tile.qn
//   k_row(..., int j)                                       j < tile.kn (BF16, or FP8 with kFp8Kv)
//   int64_t kv_delta(const Params&, const Tile&)  V row j = k_row(j) + kv_delta elements
//   bf16* o_row(..., int i)
// and Tile carries qn (valid query rows), kn (keys to scan, from 0) and causal_offset (row i
// sees keys j <= i + causal_offset). locate() gets the query tile's index (blockIdx.x / SPLIT).
//
// Key split over a thread-block cluster (SPLIT > 1, sm_90+ only; the host picks SPLIT = 1
// elsewhere): the SPLIT blocks of a cluster (consecutive blockIdx.x, rank = blockIdx.x % SPLIT)
// own the same query tile and each scans a contiguous share of its key tiles (a share may be
// empty: causal tiles near the start). Each keeps its partial (unnormalised O in fp32, running
// max m and sum l per row) in its own shared memory; after a cluster barrier, rank r merges
// rows [r·BM/SPLIT, (r+1)·BM/SPLIT) of every rank's partial through distributed shared memory
// (O = Σ 2^(m_s - M)·O_s / Σ 2^(m_s - M)·l_s, M = max m_s) and writes them; a second barrier
// keeps every block's shared memory alive until the others have read it. The result equals the
// unsplit online softmax up to fp32 reassociation (and P's BF16 rounding relative to a share's
// own running max). No global scratch, one launch.
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda::flash {

struct Tile {
  int qn = 0;
  int kn = 0;
  int causal_offset = 1 << 30;
  int head = 0;
  int64_t a = 0, b = 0, c = 0;  // policy data (first row, sequence, ...)
};

template <int HD>
struct Dims {
  static_assert(HD % 8 == 0, "head_dim must be a multiple of 8");
  static constexpr int HDP = (HD + 15) / 16 * 16;                           // Q·Kᵀ contraction, zero-padded
  static constexpr int SK = ((HDP + 8) / 8 % 2 == 1) ? HDP + 8 : HDP + 16;  // odd count of 16 B
  static constexpr int CPR = HD / 8;                                        // 16-byte chunks per row that hold data
  static constexpr int BN = 64;        // keys per tile by default (a kernel's BN template argument)
  static constexpr int KS = HDP / 16;  // k-steps of Q·Kᵀ
  static constexpr int NO = HD / 8;    // output n-tiles
};

// Row pitch (floats) of a split partial O in shared memory: ≡ 8 (mod 16), so the float2 stores
// of a half-warp (rows g..g+3, columns 2t) and the merge's float4 reads hit distinct banks.
template <int HD>
constexpr int partial_pitch() {
  return HD + (8 - HD % 16 + 16) % 16;
}
// A split partial: O [BM][pitch], then m [BM] and l [BM], all fp32, over the Q/K/V tiles.
template <int HD, int WARPS, int MT = 1>
constexpr size_t partial_bytes() {
  return static_cast<size_t>(16 * WARPS * MT) * (partial_pitch<HD>() + 2) * sizeof(float);
}

// An FP8 key tile as the cache holds it: K rows [BN][HD] bytes, then V rows [BN][HD] bytes.
template <int HD, int BN = Dims<HD>::BN>
constexpr size_t raw_tile_bytes() {
  return static_cast<size_t>(2 * BN * HD);
}

// MT: 16-row m-tiles per warp (BM = 16·WARPS·MT). QA: Q has no region of its own; it is loaded
// into the K stage the first key tile does not use and moved to registers before that stage is
// refilled (a quarter less shared memory: a third 4-warp block per SM for head dim 128).
// QK: Q (up to 2·BN rows) has no region either; it comes through both K stages into registers
// before the first key tile is copied (a third less shared memory at head dim 64 and BM 128:
// two blocks per multiprocessor where 100 KB held one; the first tile's copy no longer overlaps
// Q's).
// FP8 (an FP8 KV cache): one K/V stage (f16) and two raw tiles, with Q in the V stage (in the K
// and V stages where BM > BN) until the first tile is widened into it (flash_body), whatever QA
// says: 66.8 KB at head dim 128 where QA's BF16 layout takes 69.6.
// BN: keys per tile, 64 or 32 (32: half the stages, for 100 KB GPUs; flash_body).
template <int HD, int WARPS, int MT = 1, bool QA = false, bool FP8 = false, bool QK = false, int BN = Dims<HD>::BN>
constexpr size_t smem_bytes() {
  using D = Dims<HD>;
  static_assert(!QK || (!QA && !FP8 && 16 * WARPS * MT <= 2 * BN), "QK: a BF16 Q of at most two K stages' rows");
  const size_t tiles = FP8 ? 2 * BN * D::SK * sizeof(bf16) + 2 * raw_tile_bytes<HD, BN>()
                           : static_cast<size_t>((QA || QK ? 0 : 16 * WARPS * MT) + 4 * BN) * D::SK * sizeof(bf16);
  return tiles > partial_bytes<HD, WARPS, MT>() ? tiles : partial_bytes<HD, WARPS, MT>();
}

// Copies rows [0, ROWS) of a tile into shared memory; rows >= valid are zero-filled.
template <int HD, int ROWS, int THREADS, class RowFn>
__device__ __forceinline__ void load_rows(bf16* dst, int valid, RowFn row) {
  using D = Dims<HD>;
  for (int c = threadIdx.x; c < ROWS * D::CPR; c += THREADS) {
    const int r = c / D::CPR, col = c % D::CPR;
    const bool ok = r < valid;
    const bf16* src = row(ok ? r : 0) + col * 8;
    cp_async16(dst + r * D::SK + col * 8, src, ok);
  }
}

// The K and V rows [0, BN) of a key tile: one row address per K/V pair (V lies `delta`
// elements after K), so a paged policy looks each page up once per row, not once per 16 bytes
// of each of K and V (with a division and a modulo each time, that address arithmetic was, by a
// count of the code, about two thirds of the prefill kernel's instructions per key tile).
template <int HD, int ROWS, int THREADS, class RowFn>
__device__ __forceinline__ void load_kv_rows(bf16* dk, bf16* dv, int valid, int64_t delta, RowFn row) {
  using D = Dims<HD>;
  for (int c = threadIdx.x; c < ROWS * D::CPR; c += THREADS) {
    const int r = c / D::CPR, col = c % D::CPR;
    const bool ok = r < valid;
    const bf16* src = row(ok ? r : 0) + col * 8;
    cp_async16(dk + r * D::SK + col * 8, src, ok);
    cp_async16(dv + r * D::SK + col * 8, src + delta, ok);
  }
}

// An FP8 E4M3 source (the FP8 KV cache) is copied as it is, by cp.async two tiles ahead, into a
// raw tile (raw_tile_bytes), and widened (to f16) only when its turn comes (widen_kv_rows). Each
// thread widens exactly the 16-byte columns it copied (the same loop over the same THREADS), so a
// raw tile needs no barrier between its copies landing and their widening. Rows >= valid are
// zero-filled, and widen to zeros.
template <int HD, int BN, int THREADS, class RowFn>
__device__ __forceinline__ void copy_kv_rows_fp8(uint8_t* raw, int valid, int64_t delta, RowFn row) {
  constexpr int CPR = HD / 16;
  for (int c = threadIdx.x; c < BN * CPR; c += THREADS) {
    const int r = c / CPR, col = c % CPR;
    const bool ok = r < valid;
    const uint8_t* src = row(ok ? r : 0) + col * 16;
    cp_async16(raw + r * HD + col * 16, src, ok);
    cp_async16(raw + (BN + r) * HD + col * 16, src + delta, ok);
  }
}
// Widens this thread's columns of a landed raw tile into the stage, exactly, to f16 (fp8x8_to_f16x8:
// flash_body reads an FP8 cache in f16).
// A column's 32 bytes go out as two 16-byte stores; columns 4..7 of a row store their upper half
// first, so the 8 threads of a store phase (one row at head dim 128) fill distinct banks.
template <int HD, int BN, int THREADS>
__device__ __forceinline__ void widen_kv_rows(bf16* dk, bf16* dv, const uint8_t* raw) {
  using D = Dims<HD>;
  constexpr int CPR = HD / 16;
  for (int c = threadIdx.x; c < BN * CPR; c += THREADS) {
    const int r = c / CPR, col = c % CPR, h = (col >> 2) & 1;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 x = *reinterpret_cast<const uint4*>(raw + (v * BN + r) * HD + col * 16);
      const uint4 lo = fp8x8_to_f16x8(make_uint2(x.x, x.y)), hi = fp8x8_to_f16x8(make_uint2(x.z, x.w));
      uint4* dst = reinterpret_cast<uint4*>((v ? dv : dk) + r * D::SK + col * 16);
      dst[h] = h ? hi : lo;
      dst[h ^ 1] = h ? lo : hi;
    }
  }
}

// Policies without the flag read BF16 K/V.
template <class P, class = void>
struct KvIsFp8 : std::false_type {};
template <class P>
struct KvIsFp8<P, std::void_t<decltype(P::kFp8Kv)>> : std::bool_constant<P::kFp8Kv> {};

// 2^x on the special-function unit, subnormal results flushed to zero (p below 2^-126
// contributes nothing a BF16 P can carry into the sum anyway).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Writes this block's partial (O, m, l of its key share) to shared memory, waits for the
// cluster, merges its slice of rows from every rank and writes them; see the header.
template <int HD, int WARPS, int SPLIT, class P, int MT, int NO>
__device__ __forceinline__ void merge_split(const typename P::Params& prm, const Tile& tile, float* part,
                                            const float (&o)[MT][NO][4], const float (&m)[MT][2],
                                            const float (&l)[MT][2]) {
  constexpr int BM = 16 * WARPS * MT, OS = partial_pitch<HD>(), THREADS = WARPS * 32;
  static_assert(BM % SPLIT == 0, "rows must divide evenly over the split");
  float* pm = part + BM * OS;
  float* pl = pm + BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  __syncthreads();  // every warp is done with the Q/K/V tiles this partial overwrites
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = (warp * MT + mt) * 16 + g + r * 8;
#pragma unroll
      for (int n = 0; n < NO; ++n)
        *reinterpret_cast<float2*>(part + row * OS + n * 8 + 2 * t) = make_float2(o[mt][n][2 * r], o[mt][n][2 * r + 1]);
      if (t == 0) {
        pm[row] = m[mt][r];
        pl[row] = l[mt][r];
      }
    }
  cluster_barrier();
  constexpr int RPR = BM / SPLIT, C4 = HD / 4;
  const int rank = static_cast<int>(blockIdx.x % SPLIT);
  const float* peer[SPLIT];
#pragma unroll
  for (int s = 0; s < SPLIT; ++s) peer[s] = cluster_peer(part, static_cast<unsigned>(s));
  for (int it = threadIdx.x; it < RPR * C4; it += THREADS) {
    const int row = rank * RPR + it / C4, c = it % C4;
    if (row >= tile.qn) break;  // rows only grow with it
    float ms[SPLIT], ls[SPLIT];
    float4 os[SPLIT];
#pragma unroll
    for (int s = 0; s < SPLIT; ++s) {
      ms[s] = peer[s][BM * OS + row];
      ls[s] = peer[s][BM * OS + BM + row];
      os[s] = *reinterpret_cast<const float4*>(peer[s] + row * OS + 4 * c);
    }
    float mmax = ms[0];
#pragma unroll
    for (int s = 1; s < SPLIT; ++s) mmax = fmaxf(mmax, ms[s]);
    // A share that saw no visible key of this row has m = -inf, l = 0, O = 0: weight 0. A row
    // no share saw (mmax = -inf) gets 0, as the unsplit kernel writes for l = 0.
    const float base = mmax == -INFINITY ? 0.0f : mmax;
    float sum = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < SPLIT; ++s) {
      const float w = exp2_ftz(ms[s] - base);
      sum += w * ls[s];
      acc[0] += w * os[s].x;
      acc[1] += w * os[s].y;
      acc[2] += w * os[s].z;
      acc[3] += w * os[s].w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    bf16* out = P::o_row(prm, tile, row) + 4 * c;
    reinterpret_cast<bf162*>(out)[0] = __floats2bfloat162_rn(acc[0] * inv, acc[1] * inv);
    reinterpret_cast<bf162*>(out)[1] = __floats2bfloat162_rn(acc[2] * inv, acc[3] * inv);
  }
  cluster_barrier();  // the other ranks have read this block's partial before it exits
}

// BN: keys per tile, 64 or 32. S of a tile is NT = BN / 8 n-tiles of 8 keys, P·V KK = BN / 16
// k-steps.
template <int HD, int WARPS, class P, int SPLIT, int MT, bool QA, bool QK, int BN>
__device__ __forceinline__ void flash_body(const typename P::Params& prm, float scale_log2) {
  using D = Dims<HD>;
  constexpr int BM = 16 * WARPS * MT, SK = D::SK, THREADS = WARPS * 32, NT = BN / 8, KK = BN / 16;
  constexpr bool kFp8 = KvIsFp8<P>::value;
  static_assert(BN == 64 || BN == 32, "key tiles of 64 or 32");
  static_assert(!QA || (BM <= BN && D::HDP == HD), "Q fits a K stage and needs no padded columns");
  static_assert(!kFp8 || (BM <= 2 * BN && D::HDP == HD), "FP8: Q fits the K/V stage and needs no padded columns");
  static_assert(!QK || (!QA && !kFp8 && BM <= 2 * BN), "QK: a BF16 Q fits the two K stages");
  extern __shared__ uint4 smem_raw[];
  // BF16 cache: Q [BM][SK] (QA: set below, inside sk; QK: the K stages), K [2][BN][SK], V [2][BN][SK].
  // FP8 cache: K [BN][SK], V [BN][SK] (Q in V, or in K and V where BM > BN, until the first tile is
  // widened), raw tiles [2].
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = QA || QK || kFp8 ? sq : sq + BM * SK;
  bf16* sv = sk + (kFp8 ? 1 : 2) * BN * SK;
  uint8_t* raw = reinterpret_cast<uint8_t*>(sv + BN * SK);  // FP8 only
  if constexpr (kFp8 && BM <= BN) sq = sv;

  grid_dep_wait();
  grid_dep_launch();
  Tile tile;
  if (!P::locate(prm, static_cast<int>(blockIdx.x / SPLIT), tile)) return;  // the whole cluster returns

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  // This block's key tiles [kt_begin, kt_end): all of them, or its rank's contiguous share.
  int kt_begin = 0, kt_end = (tile.kn + BN - 1) / BN;
  if constexpr (SPLIT > 1) {
    const int all = kt_end, rank = static_cast<int>(blockIdx.x % SPLIT);
    kt_begin = all * rank / SPLIT;
    kt_end = all * (rank + 1) / SPLIT;
  }
  if constexpr (QA && !kFp8) sq = sk + ((kt_begin + 1) & 1) * BN * SK;  // the stage kt_begin does not use

  // Columns [HD, HDP) of Q and K take part in Q·Kᵀ: zero them once (cp.async never writes them).
  if (D::HDP > HD) {
    for (int r = threadIdx.x; r < BM + 2 * BN; r += THREADS) {
      bf16* row = r < BM ? sq + r * SK : sk + (r - BM) * SK;
      for (int c = HD; c < D::HDP; ++c) row[c] = __float2bfloat16_rn(0.0f);
    }
  }

  const int64_t kv_delta = P::kv_delta(prm, tile);
  // BF16: key tile kt into stage `stage`. FP8: its raw bytes into raw tile `stage`.
  auto load_kv = [&](int kt, int stage) {
    const int base = kt * BN;
    const int valid = min(BN, tile.kn - base);
    auto row = [&](int j) { return P::k_row(prm, tile, base + j); };
    if constexpr (kFp8)
      copy_kv_rows_fp8<HD, BN, THREADS>(raw + stage * raw_tile_bytes<HD, BN>(), valid, kv_delta, row);
    else
      load_kv_rows<HD, BN, THREADS>(sk + stage * BN * SK, sv + stage * BN * SK, valid, kv_delta, row);
  };
  // FP8: two commit groups ahead, the first with Q; tile kt's raw bytes are in raw tile
  // (kt - kt_begin) & 1, and tile kt + 2's follow them there.
  if (kt_begin < kt_end) {
    load_rows<HD, BM, THREADS>(sq, tile.qn, [&](int i) { return P::q_row(prm, tile, i); });
    if constexpr (!QK) load_kv(kt_begin, kFp8 ? 0 : kt_begin & 1);  // QK: once Q has left the K stages
    if constexpr (kFp8) {
      cp_async_commit();
      if (kt_begin + 1 < kt_end) load_kv(kt_begin + 1, 1);
    }
  }
  cp_async_commit();

  // Warp w owns m-tiles w·MT .. w·MT + MT − 1 (16 rows each): every K/V fragment it loads from
  // shared memory feeds MT mmas.
  float o[MT][D::NO][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < D::NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  uint32_t qf[MT][D::KS][4];
  const int warp_row0 = warp * MT * 16;  // first tile row of this warp
  // tile rows of this thread in m-tile mt: row_lo(mt) and row_lo(mt) + 8
  auto row_lo = [&](int mt) { return warp_row0 + mt * 16 + g; };

  auto load_q_fragments = [&] {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int ks = 0; ks < D::KS; ++ks) {
        ldmatrix_x4(qf[mt][ks], sq + (warp_row0 + mt * 16 + (lane & 15)) * SK + ks * 16 + (lane >> 4) * 8);
        if constexpr (kFp8) {  // an FP8 cache's K and V are read in f16: Q too
#pragma unroll
          for (int i = 0; i < 4; ++i) qf[mt][ks][i] = bf16x2_to_f16x2(qf[mt][ks][i]);
        }
      }
  };
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    if constexpr (kFp8) {
      const int stage = (kt - kt_begin) & 1;
      cp_async_wait<1>();  // this thread's copies of tile kt (and at kt_begin, of Q)
      __syncthreads();     // every warp is done with the K/V stage (at kt_begin: Q has landed)
      if (kt == kt_begin) {
        load_q_fragments();
        __syncthreads();  // Q is in registers before its stage is overwritten
      }
      widen_kv_rows<HD, BN, THREADS>(sk, sv, raw + stage * raw_tile_bytes<HD, BN>());
      __syncthreads();  // the tile is in the K/V stage, and its raw bytes are read
      if (kt + 2 < kt_end) load_kv(kt + 2, stage);
      cp_async_commit();
    } else {
      if (QA && kt == kt_begin) {  // Q into registers before the next prefetch overwrites its stage
        cp_async_wait<0>();
        __syncthreads();
        load_q_fragments();
        __syncthreads();
      }
      if (QK && kt == kt_begin) {  // Q (in both K stages) into registers, then the first key tile
        cp_async_wait<0>();
        __syncthreads();
        load_q_fragments();
        __syncthreads();
        load_kv(kt, kt & 1);
        cp_async_commit();
      }
      if (kt + 1 < kt_end) load_kv(kt + 1, (kt + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      if (!QA && !QK && kt == kt_begin) load_q_fragments();
    }
    const bf16* kb = kFp8 ? sk : sk + (kt & 1) * BN * SK;
    const bf16* vb = kFp8 ? sv : sv + (kt & 1) * BN * SK;

    // S = Q·Kᵀ for BN keys: NT n-tiles of 8 keys.
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D::KS; ++ks) {
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        // matrices: (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15)
        const int mi = lane >> 3;
        ldmatrix_x4(b, kb + (np * 16 + (mi >> 1) * 8 + (lane & 7)) * SK + ks * 16 + (mi & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<kFp8>(s[mt][2 * np], qf[mt][ks], b[0], b[1]);
          mma_m16n8k16<kFp8>(s[mt][2 * np + 1], qf[mt][ks], b[2], b[3]);
        }
      }
    }

    // Mask, and update the running max (log2 domain: scaled by scale_log2 > 0, so the max of
    // the raw scores scales to the max of the scaled ones) and sum; p = exp2(s * scale - m) is
    // one FFMA and one EX2. Only a tile that reaches past the keys or past this warp's first
    // row's causal limit needs the mask.
    const bool masked = (kt + 1) * BN > tile.kn || (kt + 1) * BN - 1 > warp_row0 + tile.causal_offset;
    uint32_t pf[MT][KK][4];  // P as A fragments: k-step kk = n-tiles 2kk, 2kk+1
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx[2] = {-INFINITY, -INFINITY};
      if (masked) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kt * BN + n * 8 + 2 * t + (e & 1);
            const int row = row_lo(mt) + (e >> 1) * 8;
            const bool visible = key < tile.kn && key <= row + tile.causal_offset;
            s[mt][n][e] = visible ? s[mt][n][e] : -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
      }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[mt][r], mx[r] * scale_log2);
        // A row that has seen no visible key yet keeps m = -inf; use 0 as its base (all p = 0).
        const float base = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = exp2_ftz(m[mt][r] - base);
        m[mt][r] = m_new;
        mx[r] = -base;
        l[mt][r] *= alpha[r];
      }
#pragma unroll
      for (int n = 0; n < D::NO; ++n) {
        o[mt][n][0] *= alpha[0];
        o[mt][n][1] *= alpha[0];
        o[mt][n][2] *= alpha[1];
        o[mt][n][3] *= alpha[1];
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = exp2_ftz(fmaf(s[mt][n][e], scale_log2, mx[e >> 1]));
          l[mt][e >> 1] += p[e];
        }
        pf[mt][n >> 1][(n & 1) * 2 + 0] = kFp8 ? pack_f16x2(p[0], p[1]) : pack_bf16x2(p[0], p[1]);
        pf[mt][n >> 1][(n & 1) * 2 + 1] = kFp8 ? pack_f16x2(p[2], p[3]) : pack_bf16x2(p[2], p[3]);
      }
    }

    // O += P·V: k-steps over 16 keys, n-tiles over 8 output dims.
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      const int mi = lane >> 3;
#pragma unroll
      for (int n = 0; n + 1 < D::NO; n += 2) {
        uint32_t b[4];
        // matrices: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15)
        ldmatrix_x4_trans(b, vb + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * SK + n * 8 + (mi >> 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<kFp8>(o[mt][n], pf[mt][kk], b[0], b[1]);
          mma_m16n8k16<kFp8>(o[mt][n + 1], pf[mt][kk], b[2], b[3]);
        }
      }
      if (D::NO % 2 == 1) {
        constexpr int n = D::NO - 1;
        uint32_t b[2];
        ldmatrix_x2_trans(b, vb + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * SK + n * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_m16n8k16<kFp8>(o[mt][n], pf[mt][kk], b[0], b[1]);
      }
    }
    if constexpr (!kFp8) __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();

  // Finish the row sums across the 4 lanes of a row, normalise, store.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
    }
  if constexpr (SPLIT > 1) {
    merge_split<HD, WARPS, SPLIT, P, MT>(prm, tile, reinterpret_cast<float*>(smem_raw), o, m, l);
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row_lo(mt) + r * 8;
        if (row >= tile.qn) continue;
        const float inv = l[mt][r] > 0.0f ? 1.0f / l[mt][r] : 0.0f;
        bf16* out = P::o_row(prm, tile, row);
#pragma unroll
        for (int n = 0; n < D::NO; ++n) {
          *reinterpret_cast<bf162*>(out + n * 8 + 2 * t) =
              __floats2bfloat162_rn(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
        }
      }
  }
}

// The blocks per multiprocessor a kernel's registers must allow, for a MIN_BLOCKS the sm_90
// tuning asked for: that on sm_90, at most two elsewhere. Only sm_90's 228 KB of shared memory
// hold three head-dim-128 prefill blocks (69.6 KB); sm_80's 164 KB hold two and the 100 KB of
// sm_86 / 89 / 120 one, so a bound of three only capped their registers at 168, and that
// prefill spilled 8-36 bytes (ptxas, sm_80 / 89 / 120). Two 128-thread blocks cap nothing.
template <int MIN_BLOCKS>
constexpr int flash_min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
  return MIN_BLOCKS > 2 ? 2 : MIN_BLOCKS;
#else
  return MIN_BLOCKS;
#endif
}

// MIN_BLOCKS: blocks per multiprocessor the registers must allow on sm_90 (__launch_bounds__,
// through flash_min_blocks). SPLIT: blocks per cluster sharing one query tile (1: no cluster). A
// SPLIT > 1 kernel compiles to nothing below sm_90 (the host never launches it there).
template <int HD, int WARPS, class P, int MIN_BLOCKS = 1, int SPLIT = 1, int MT = 1, bool QA = false, bool QK = false,
          int BN = Dims<HD>::BN>
__global__ void __launch_bounds__(WARPS * 32, flash_min_blocks<MIN_BLOCKS>())
    flash_kernel(const typename P::Params prm, float scale_log2) {
  if constexpr (SPLIT > 1 && !kDeviceHasClusters) {
    return;
  } else {
    flash_body<HD, WARPS, P, SPLIT, MT, QA, QK, BN>(prm, scale_log2);
  }
}

}  // namespace qvl::cuda::flash
