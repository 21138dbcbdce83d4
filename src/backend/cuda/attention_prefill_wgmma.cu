// Causal text prefill attention at head dim 128 (Qwen3-VL 2B / 4B / 8B) over the paged BF16 KV
// cache on sm_90 with warpgroup MMA, in the scheme of attention_vision_wgmma.cu: one thread of a
// producer warpgroup loads tiles with the tensor memory accelerator (TMA), consumer warpgroups of
// 64 query rows run S = Q·Kᵀ and O += P·V as asynchronous wgmma, the softmax of one key tile
// beside the P·V of the previous one.
//
// Per block: one query head, BM = 128 rows (two consumer warpgroups) of one sequence's new rows,
// key tiles of 64 through a ring of kStages (K, V) stages. Rows of 128 elements (256 bytes) are
// split into two halves of 64 (128 bytes, the width of the 128-byte swizzle): a tile is
// [2 halves][rows][128 bytes], and a 16-column step of Q·Kᵀ reads half ks / 4 at 32 · (ks % 4)
// bytes; P·V runs per half of the output as m64n64k16 with V as the transposed operand (the
// vision kernel's descriptor).
// - Q comes from the packed qkv (rotated in place by text_qkv_prepare) through a 2-D tensor map.
// - K and V come from the cache through 4-D tensor maps, [pages][page_size][Hkv][128] with the
//   page and layer strides of KvCacheView; a key tile is 64 / page_size boxes (page size a power
//   of two up to 64) or part of one page (larger powers of two), the pages read from the
//   sequence's page table by the producer.
// - Causal: query row i (absolute position pos0 + i) sees keys j <= pos0 + i. Tiles past the
//   last row's keys are not loaded; only tiles that reach past pos0 or past the keys are masked.
//
// The softmax is the flash core's (flash.cuh): log2 domain, p = exp2(s · scale − m) by one FFMA
// and one EX2, P rounded to BF16, O and l in fp32, O / l at the end.
//
// 2B's prefill of 802 rows on an H100: 24.3 us per layer against 36.8 for flash.cuh (one
// consumer warpgroup, two blocks per SM: 29.4; two or four stages, or five at BM = 128: the same).
// The heaviest query tile's 13 key tiles run in one block, on one SM, at about the tensor cores'
// rate; a key split of the late tiles would spread them (not done).
//
// An FP8 cache (kFp8): the producer's thread 0 brings each key tile's raw bytes by TMA into one
// of kRawStages raw tiles (unswizzled boxes of a head's 128-byte rows, as the decode attention's
// FP8 map reads them), and the producer warpgroup's 128 threads widen them exactly
// (fp8x8_to_f16x8) into the ring's stage in the 128-byte swizzle, fence them for the async proxy,
// meet on a named barrier, and thread 0 arrives on the stage's full barrier and refills the raw
// tile. They widen to f16 (one conversion a pair, exact: E4M3 lies in f16's range), not BF16
// (five instructions a pair), and the consumers run in f16: each converts its warpgroup's Q tile
// (saturated at ±65504) once, and P is rounded to f16 (finer than BF16's rounding; P <= 1).
//
// Needs sm_90a: built with attention_vision_wgmma.cu's flags; the host asks
// prefill_wgmma_available() first. Other head dims and page sizes take flash.cuh.
#include <cuda.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/attention_cache.cuh"
#include "backend/cuda/wgmma.cuh"

namespace qvl::cuda {
namespace {

using namespace wgmma;  // the warpgroup-MMA helpers (wgmma.cuh)

constexpr int kHD = 128;
constexpr int kBN = 64;                     // keys per tile
constexpr int kHalfBytes = 64 * 128;        // one half (64 columns) of 64 rows
constexpr int kTileBytes = 2 * kHalfBytes;  // 64 rows x 128 columns, BF16
constexpr int kStages = 3;
constexpr int kCWG = 2;                            // consumer warpgroups of 64 query rows
constexpr int kBM = 64 * kCWG;                     // query rows per block
constexpr int kThreads = 128 * (kCWG + 1);         // warpgroup 0: producer
using Smem = RingSmem<kCWG, kStages, kTileBytes>;  // Q: [kCWG][2 halves][64 rows][128 B]
// FP8: a raw tile is a key tile's K rows then its V rows, 128 bytes each, after the ring's
// barriers (256 bytes past its tiles); its barriers follow the ring's.
constexpr int kRawTileBytes = 2 * kBN * kHD;
constexpr int kRawStages = 2;
template <bool kFp8>
constexpr int kSmemBytes = Smem::kBytes + (kFp8 ? kRawStages * kRawTileBytes : 0);
// Registers per thread after setmaxnreg (one block per SM): the producer's 24 (96 where it widens
// an FP8 cache's tiles, 4 columns at a time) pay for the consumers' 160.
template <bool kFp8>
constexpr int kProducerRegs = kFp8 ? 96 : 24;
constexpr int kConsumerRegs = 160;
static_assert((kProducerRegs<true> + kCWG * kConsumerRegs) * 128 <= 65536, "register file");
static_assert(1 + 2 * kStages + kRawStages <= 32, "the raw tiles' barriers fit the ring's 256 bytes");

struct Params {
  bf16* out;
  const int32_t* query_start;
  const int32_t* context_len;
  const int32_t* page_table;
  int num_seqs, max_pages, hq, hkv, page_size, page_shift;
  int grid_tiles;
  float scale_log2;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// S[64 x 64] (+)= A[64 x 16] · B[64 x 16]ᵀ, both K-major in shared memory, in BF16 or (kF16) f16.
#define QVL_WGMMA_S(TYPES)                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " " QVL_WGMMA_D32 "%32, %33, p, 1, 1, 0, 0;\n}\n"
template <bool kF16>
__device__ __forceinline__ void wgmma_s(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kF16)
    asm volatile(QVL_WGMMA_S("f16.f16") : QVL_WGMMA_ACC32(d) : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  else
    asm volatile(QVL_WGMMA_S("bf16.bf16") : QVL_WGMMA_ACC32(d) : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// A landed raw tile (K rows, then V rows, 128 bytes each) widened by the producer warpgroup's
// thread `tid` (of 128) into a stage's K and V tiles: f16 in the 128-byte swizzle, where TMA
// puts a BF16 cache's rows. Thread tid takes the raw tile's 16-byte columns tid + 128 i; a
// column's 16 values are chunks q and q + 1 of one half of its row. In the upper half the
// second chunk is stored first, so that the 8 threads of a store phase (one row) fill 8
// distinct chunk slots.
__device__ __forceinline__ void widen_raw_tile(const uint8_t* raw, uint8_t* k, uint8_t* v, int tid) {
#pragma unroll 4
  for (int i = 0; i < 2 * kBN * kHD / 16 / 128; ++i) {
    const int c = tid + 128 * i, r = (c >> 3) & (kBN - 1), ck = c & 7;
    const uint4 x = *reinterpret_cast<const uint4*>(raw + c * 16);
    const uint4 lo = fp8x8_to_f16x8(make_uint2(x.x, x.y)), hi = fp8x8_to_f16x8(make_uint2(x.z, x.w));
    const int h = ck >> 2, q = (ck & 3) * 2;
    uint8_t* row = (c >= kBN * 8 ? v : k) + h * kHalfBytes + r * 128;
    *reinterpret_cast<uint4*>(row + (((q + h) ^ (r & 7)) << 4)) = h ? hi : lo;
    *reinterpret_cast<uint4*>(row + (((q + (h ^ 1)) ^ (r & 7)) << 4)) = h ? lo : hi;
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wgmma_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap vmap, const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const Smem ring(smem_raw);
  uint64_t* raw_full = ring.bars() + 1 + 2 * kStages;  // FP8: [kRawStages], a raw tile has landed
  uint8_t* raw = reinterpret_cast<uint8_t*>(ring.bars()) + 256;

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  if (kFp8 && tid == 0)
    for (int r = 0; r < kRawStages; ++r) mbar_init(&raw_full[r], 1);  // init_ring's fence covers them
  init_ring(ring.bars(), kStages, 4 * kCWG);
  grid_dep_wait();
  grid_dep_launch();

  // This block's query tile, the heaviest first (later tiles of a sequence see more keys).
  int idx = p.grid_tiles - 1 - static_cast<int>(blockIdx.x);
  int seq = -1, row0 = 0, qn = 0, pos0 = 0, kn = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q0 = __ldg(p.query_start + s), qlen = __ldg(p.query_start + s + 1) - q0;
    const int tiles = (qlen + kBM - 1) / kBM;
    if (idx < tiles) {
      const int ctx = __ldg(p.context_len + s);
      seq = s;
      row0 = q0 + idx * kBM;
      qn = min(kBM, qlen - idx * kBM);
      pos0 = ctx - qlen + idx * kBM;
      kn = max(0, min(ctx, pos0 + qn));
      break;
    }
    idx -= tiles;
  }
  if (seq < 0 || kn == 0) return;  // the whole block
  const int head = static_cast<int>(blockIdx.y), kvh = head / (p.hq / p.hkv);
  const int tiles = (kn + kBN - 1) / kBN;

  if (warp < 4) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs<kFp8>));
    const int32_t* pt = p.page_table + static_cast<int64_t>(seq) * p.max_pages;
    const int per_box = min(p.page_size, kBN);  // keys per TMA box
    // Key tile j's K rows to kd and V rows to vd, completing on bar: BF16 as two halves of 64
    // columns in the 128-byte swizzle, FP8 as whole 128-byte rows.
    auto issue_tile = [&](int j, uint8_t* kd, uint8_t* vd, uint64_t* bar) {
      mbar_expect_tx(bar, kFp8 ? kRawTileBytes : 2 * kTileBytes);
      for (int b = 0; b < kBN / per_box; ++b) {
        // Boxes past the last key re-read the last key's page (their rows are masked, and V's
        // are zeroed before use): the page table has no entries past it.
        const int key = j * kBN + b * per_box;
        const int page = __ldg(pt + (min(key, kn - 1) >> p.page_shift)), off = key & (p.page_size - 1);
        for (int h = 0; h < (kFp8 ? 1 : 2); ++h) {
          const int dst = h * kHalfBytes + b * per_box * 128;
          tma_load_4d(kd + dst, &kmap, 64 * h, kvh, off, page, bar);
          tma_load_4d(vd + dst, &vmap, 64 * h, kvh, off, page, bar);
        }
      }
    };
    if (tid == 0) {
      mbar_expect_tx(ring.q_full(), kCWG * kTileBytes);
      for (int w = 0; w < kCWG; ++w)
        for (int h = 0; h < 2; ++h)
          tma_load_2d(ring.q() + w * kTileBytes + h * kHalfBytes, &qmap, head * kHD + 64 * h, row0 + 64 * w,
                      ring.q_full());
      if constexpr (kFp8) {
        for (int j = 0; j < min(tiles, kRawStages); ++j)
          issue_tile(j, raw + j * kRawTileBytes, raw + j * kRawTileBytes + kBN * kHD, &raw_full[j]);
      } else {
        for (int j = 0; j < tiles; ++j) {
          const int s = j % kStages;
          if (j >= kStages) mbar_wait(&ring.empty()[s], ((j / kStages) - 1) & 1);
          issue_tile(j, ring.k(s), ring.v(s), &ring.full()[s]);
        }
      }
    }
    if constexpr (kFp8) {
      for (int j = 0; j < tiles; ++j) {
        const int s = j % kStages, r = j % kRawStages;
        uint8_t* rt = raw + r * kRawTileBytes;
        if (j >= kStages) mbar_wait(&ring.empty()[s], ((j / kStages) - 1) & 1);
        mbar_wait(&raw_full[r], (j / kRawStages) & 1);
        widen_raw_tile(rt, ring.k(s), ring.v(s), tid);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stage, for wgmma
        asm volatile("bar.sync 2, 128;\n" ::: "memory");                // the producer warpgroup: widened
        if (tid == 0) {
          mbar_arrive(&ring.full()[s]);
          if (j + kRawStages < tiles) issue_tile(j + kRawStages, rt, rt + kBN * kHD, &raw_full[r]);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));

  const int wg = (warp >> 2) - 1;
  const int g = lane >> 2, t = lane & 3;
  const int r_lo = wg * 64 + (warp & 3) * 16 + g;  // this thread's rows: r_lo, r_lo + 8
  const float sl = p.scale_log2;
  const uint32_t q_addr = smem_u32(ring.q()) + wg * kTileBytes;

  float o[2][32], s[32];  // O: output columns 0-63 and 64-127
  uint32_t pk[4][4];
  RowSoftmax<32> sm;
  // Key j · 64 + c is visible to row r if it is < kn and <= pos0 + r: only tiles that reach past
  // the keys or past this warpgroup's first row need the mask.
  auto softmax = [&](int j, float(&alpha)[2]) {
    const bool masked = (j + 1) * kBN > kn || (j + 1) * kBN - 1 > pos0 + wg * 64;
    auto visible = [&](int i) {
      const int key = j * kBN + (i >> 2) * 8 + 2 * t + (i & 1);
      return key < kn && key <= pos0 + r_lo + ((i >> 1) & 1) * 8;
    };
    sm.step(s, sl, masked, visible, alpha);
  };
#pragma unroll
  for (int i = 0; i < 32; ++i) o[0][i] = o[1][i] = 0.0f;

  auto issue_s = [&](int stage) {
    const uint32_t k_addr = smem_u32(ring.k(stage));
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint32_t off = (ks >> 2) * kHalfBytes + (ks & 3) * 32;
      wgmma_s<kFp8>(s, sw128_desc(q_addr + off), sw128_desc(k_addr + off), ks);
    }
    wgmma_commit();
  };
  auto issue_o = [&](int stage) {
    const uint32_t v_addr = smem_u32(ring.v(stage));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_o<kFp8>(o[0], pk[kk], sw128_desc(v_addr + kk * 2048));
      wgmma_o<kFp8>(o[1], pk[kk], sw128_desc(v_addr + kHalfBytes + kk * 2048));
    }
    wgmma_commit();
  };
  mbar_wait(ring.q_full(), 0);
  if constexpr (kFp8) {  // K and V arrive in f16: this warpgroup's Q tile too, in place
    uint4* q = reinterpret_cast<uint4*>(ring.q() + wg * kTileBytes);
    for (int i = tid & 127; i < kTileBytes / 16; i += 128) {
      const uint4 x = q[i];
      q[i] = make_uint4(bf16x2_to_f16x2(x.x), bf16x2_to_f16x2(x.y), bf16x2_to_f16x2(x.z), bf16x2_to_f16x2(x.w));
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for wgmma
    if (wg == 0)                                                    // the warpgroup's Q is converted
      asm volatile("bar.sync 3, 128;\n" ::: "memory");
    else
      asm volatile("bar.sync 4, 128;\n" ::: "memory");
  }
  consumer_loop<kStages, kFp8>(tiles, ring.full(), ring.empty(), s, o, pk, issue_s, issue_o, softmax);
  // V rows of the last tile past the last key come from whatever the cache holds there (possibly
  // NaN bits, and 0 · NaN is NaN): zero them (generic stores, made visible to the async proxy)
  // before the last P·V. No warpgroup has issued that P·V yet; all of them meet at the barrier.
  if (const int valid = kn - (tiles - 1) * kBN; valid < kBN) {
    uint8_t* v_last = ring.v((tiles - 1) % kStages);
    const int ct = tid - 128;  // consumer thread
    for (int c = ct; c < 2 * (kBN - valid) * 8; c += 128 * kCWG) {
      const int h = c / ((kBN - valid) * 8), rc = c % ((kBN - valid) * 8);
      *reinterpret_cast<uint4*>(v_last + h * kHalfBytes + (valid + rc / 8) * 128 + (rc % 8) * 16) =
          make_uint4(0, 0, 0, 0);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync 1, %0;\n" ::"n"(128 * kCWG) : "memory");
  }
  consumer_last<kStages>(tiles, ring.empty(), o, pk, issue_o);

  float inv[2];
  sm.finish(inv);
  const int64_t ld = static_cast<int64_t>(p.hq) * kHD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r_lo + r * 8 >= qn) continue;
    bf16* out = p.out + (row0 + r_lo + r * 8) * ld + head * kHD;
    store_o_row(out, o[0], r, inv[r]);
    store_o_row(out + 64, o[1], r, inv[r]);
  }
#endif
}

}  // namespace

// The FP8 cache's kernel is configured (and so, with lazy module loading, loaded) at its first
// launch on a device, not with the BF16 one: loading its code at start moved the later device
// allocations, and the BF16 cache's decode steps were 1.5% slower at 4000 tokens for it (H200,
// bench/RESULTS.md run 46 item 2).
void configure_prefill_wgmma() {
  QVL_CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kSmemBytes<false>));
}
static void configure_prefill_wgmma_fp8() {
  static std::atomic<uint64_t> configured{0};  // a bit per device
  int device = 0;
  QVL_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (configured.load(std::memory_order_acquire) & bit) return;
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(prefill_wgmma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<true>));
  configured.fetch_or(bit, std::memory_order_release);
}

bool launch_text_prefill_attention_wgmma(const LaunchContext& ctx, Tensor out, const Tensor& qkv,
                                         const TextBatch& batch, const KvCacheView& cache, int layer,
                                         const TextAttentionShape& shape, float scale) {
  const int64_t n = qkv.dim(0), width = qkv.row_numel();
  const int ps = cache.page_size;
  const bool fp8 = cache.dtype == DType::kF8E4M3;
  if (!ctx.prefill_wgmma || shape.head_dim != kHD || (cache.dtype != DType::kBF16 && !fp8) || cache.head_dim != kHD ||
      width != int64_t{shape.num_q_heads + 2 * shape.num_kv_heads} * kHD || n <= 0 || n > INT32_MAX ||
      (ps & (ps - 1)) != 0 || ps < 8 || cache.num_pages > INT32_MAX ||
      reinterpret_cast<uintptr_t>(qkv.data) % 16 != 0 || reinterpret_cast<uintptr_t>(cache.base) % 16 != 0)
    return false;
  CUtensorMap qmap, kmap, vmap;
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(n)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(width) * sizeof(bf16)};
    const cuuint32_t box[2] = {64, 64};
    if (!encode_sw128(&qmap, 2, qkv.data, dims, strides, box, "prefill attention")) return false;
  }
  const CacheGeometry geo = geometry(cache, layer);
  for (int v = 0; v < 2; ++v) {
    // Innermost first: a head's row (BF16: 128 values, boxes of a half in the swizzle; FP8: 128
    // bytes seen as 64 BF16 pairs, boxes of the whole row, unswizzled), kv heads, a page's rows, pages.
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(fp8 ? kHD / 2 : kHD),
                                static_cast<cuuint64_t>(cache.num_kv_heads), static_cast<cuuint64_t>(ps),
                                static_cast<cuuint64_t>(cache.num_pages)};
    const cuuint64_t strides[3] = {fp8 ? kHD : kHD * sizeof(bf16), static_cast<cuuint64_t>(geo.token_bytes),
                                   static_cast<cuuint64_t>(geo.page_bytes)};
    const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(std::min(ps, kBN)), 1};
    char* base = geo.base + geo.layer_offset + (v ? geo.v_offset : 0);
    if (!encode_bf16_tiles(v ? &vmap : &kmap, 4, base, dims, strides, box, !fp8, "prefill attention")) return false;
  }
  Params prm{};
  prm.out = out.as<bf16>();
  prm.query_start = batch.query_start.as<int32_t>();
  prm.context_len = batch.context_len.as<int32_t>();
  prm.page_table = batch.page_table.as<int32_t>();
  prm.num_seqs = batch.num_seqs;
  prm.max_pages = batch.max_pages_per_seq;
  prm.hq = shape.num_q_heads;
  prm.hkv = shape.num_kv_heads;
  prm.page_size = ps;
  prm.page_shift = 0;
  while ((1 << prm.page_shift) < ps) ++prm.page_shift;
  prm.scale_log2 = scale * 1.4426950408889634f;
  // At most num_tokens / BM full tiles plus one partial tile per sequence (blocks past the last
  // return).
  const unsigned tiles = ceil_div(batch.num_tokens, kBM) + static_cast<unsigned>(batch.num_seqs);
  prm.grid_tiles = static_cast<int>(tiles);
  if (fp8) {
    configure_prefill_wgmma_fp8();
    if (ctx.prefill_wgmma_fp8_launches) ++*ctx.prefill_wgmma_fp8_launches;
    launch(ctx, "text_prefill_attention_wgmma", prefill_wgmma_kernel<true>, dim3(tiles, prm.hq), dim3(kThreads),
           static_cast<size_t>(kSmemBytes<true>), qmap, kmap, vmap, prm);
  } else {
    launch(ctx, "text_prefill_attention_wgmma", prefill_wgmma_kernel<false>, dim3(tiles, prm.hq), dim3(kThreads),
           static_cast<size_t>(kSmemBytes<false>), qmap, kmap, vmap, prm);
  }
  return true;
}

}  // namespace qvl::cuda
