// The decode Linear (kernels.h launch_skinny_linear): the one-tile kernel, the choice of kernel
// per shape, and the launcher. The math both kernels share is in skinny_common.cuh; the
// persistent streaming kernel in skinny_stream.cu.
#include "backend/cuda/skinny_common.cuh"

namespace qvl::cuda {
namespace skinny {
namespace {

// A warp's chunk group c: chunks c, c + W, ..., c + W (G - 1) (W warps over the tile's K), with
// their FP8 block scales of rows ra and rb (loaded with the weights, so that no scale load waits
// after the math).
template <bool kFp8, int G>
struct Group {
  uint4 w[G][2 * Chunk<kFp8>::kSteps];
  float sa[G], sb[G];
};

// Loads group c: chunks past the end are zeros and cost no load.
template <bool kFp8, int G, int W>
__device__ __forceinline__ void load_group(const SkinnyParams& p, int c, int nchunks, int ra, int rb, int t,
                                           Group<kFp8, G>& grp) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const int ci = c + i * W;
    load_weights<kFp8>(p, ci, ra, rb, t, grp.w[i]);
    if (kFp8 && ci < nchunks) {
      grp.sa[i] = block_scale(p, ra, ci);
      grp.sb[i] = block_scale(p, rb, ci);
    }
  }
}

// acc += the group's partial sums, each chunk times its block scale (FP8), in chunk order.
template <bool kFp8, int G, int NT, int PRO, int W>
__device__ __forceinline__ void consume_group(const SkinnyParams& p, int c, int nchunks, int t, int g,
                                              const Group<kFp8, G>& grp, const PrologueSmem& pro_smem,
                                              float (&acc)[NT][4]) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const int ci = c + i * W;
    if (ci >= nchunks) break;
    float part[NT][4];
    chunk_mma<kFp8, NT, PRO>(p, ci, t, g, grp.w[i], pro_smem, part);
    accumulate_scaled(acc, part, kFp8 ? grp.sa[i] : 1.0f, kFp8 ? grp.sb[i] : 1.0f);
  }
}

// G = 128-column chunks a warp loads at once (FP8 2: a BF16 chunk's bytes per load round).
// Two groups are in flight per warp (buffers A and B in turn: no register copy that would wait
// on a load). With prewait = 2 both are issued before the PDL wait, so a block whose warps hold
// at most two groups (K <= 2048 BF16, 4096 FP8) has its weights on the way while the previous
// kernel finishes. FP8 groups of 3-5 chunks (one block per multiprocessor) put a long K's whole
// share on the way before the wait, for grids that leave no second block per multiprocessor
// anyway; G does not change the order of any sum. MB > 0: at least MB blocks per
// multiprocessor (3: FP8 groups of one chunk, whose registers then leave room for a third
// block's loads; a block's time is mostly the latency of its round of loads, and an FP8 block
// carries half a BF16 block's bytes). W = 16 warps per block (up to 8 rows; by default where the
// grid is about one block per multiprocessor): each warp's share of K halves, and the math after
// the wait runs at four warps per scheduler instead of two. KS = 2 (sm_90+): a tile's K is split over a cluster of
// two blocks (block h's warps are the tile's warps h W .. h W + W - 1), so that grids of a few
// more tiles than multiprocessors (4B o_proj and down: 160) run as one wave of half tiles at
// three blocks per multiprocessor; block 1 sends its sums to block 0 (st.async, counted on block
// 0's mbarrier), which adds them to its own and stores.
template <bool kFp8, int G, int NT, int PRO, int MB = 0, int W = kWarps, int KS = 1>
__global__ void __launch_bounds__(W * 32, MB > 0                             ? MB
                                          : W == kWarps && NT <= 2 && G <= 2 ? 2
                                                                             : 1)
    skinny_kernel(const SkinnyParams p, int prewait) {
  static_assert(KS == 1 || (KS == 2 && NT == 1), "a cluster pair takes up to 8 rows");
  constexpr int WT = W * KS;       // warps over the tile's K
  constexpr int kStride = WT * G;  // chunks per round of the WT warps
  __shared__ float red[W][kRows][NT * 8 + 1];
  __shared__ PrologueSmem pro_smem;
  __shared__ float s_peer[KS == 2 ? kRows * 8 : 1];  // KS = 2, block 0: block 1's sums
  __shared__ uint64_t s_bar;                         // counts their bytes

  const int half = KS == 2 ? static_cast<int>(blockIdx.x) % 2 : 0;
  if constexpr (KS == 2) {
    // Block 0's barrier is initialised before its cluster arrival; block 1 waits on that phase
    // before its first remote store.
    if (half == 0 && threadIdx.x == 0) mbar_init_cluster(&s_bar);
    cluster_arrive_relaxed();
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int ti = static_cast<int>(blockIdx.x) / KS, row0 = ti * kRows;
  // Rows past N re-read row N-1 (in bounds); their results are never stored.
  const int ra = tile_row(p, ti, g), rb = tile_row(p, ti, g + 8);
  const int nchunks = (p.K + kChunk - 1) / kChunk;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  Group<kFp8, G> wa, wb;
  int c = half * W + warp;
  // Weights are never written by a kernel: safe before the wait.
  load_group<kFp8, G, WT>(p, c, nchunks, ra, rb, t, wa);
  if (prewait > 1) load_group<kFp8, G, WT>(p, c + kStride, nchunks, ra, rb, t, wb);
  PrologueWeights pw;
  prefetch_prologue<PRO, W>(p, pw);
  if (p.early_launch) grid_dep_launch();
  grid_dep_wait();
  if (!p.early_launch) grid_dep_launch();
  run_prologue<PRO, W>(p, pro_smem, pw);
  if (prewait <= 1) load_group<kFp8, G, WT>(p, c + kStride, nchunks, ra, rb, t, wb);

  while (c < nchunks) {
    consume_group<kFp8, G, NT, PRO, WT>(p, c, nchunks, t, g, wa, pro_smem, acc);
    if (c + 2 * kStride < nchunks) load_group<kFp8, G, WT>(p, c + 2 * kStride, nchunks, ra, rb, t, wa);
    c += kStride;
    if (c >= nchunks) break;
    consume_group<kFp8, G, NT, PRO, WT>(p, c, nchunks, t, g, wb, pro_smem, acc);
    if (c + 2 * kStride < nchunks) load_group<kFp8, G, WT>(p, c + 2 * kStride, nchunks, ra, rb, t, wb);
    c += kStride;
  }

  if constexpr (KS == 1) {
    reduce_tile_and_store<NT, W>(p, red, acc, ti);
  } else {
    // The pair's sum per output, in a fixed order: block 0's warps, then block 1's.
    write_partials<NT, W>(red, acc);
    __syncthreads();
    const int idx = threadIdx.x;  // kRows * n <= 128 outputs: one per thread
    const int tok = idx / kRows, r = idx % kRows;
    const bool mine = idx < kRows * p.n;
    float v = 0.0f;
    if (mine) {
#pragma unroll
      for (int w = 0; w < W; ++w) v += red[w][r][tok];
    }
    if (half == 1) {
      cluster_wait();  // block 0 has started: its barrier is initialised
      if (mine) st_async_f32(cluster_peer_smem(smem_u32(&s_peer[idx]), 0), v, cluster_peer_smem(smem_u32(&s_bar), 0));
      return;
    }
    if (threadIdx.x == 0) mbar_arrive_expect_tx(&s_bar, static_cast<uint32_t>(kRows * p.n * sizeof(float)));
    mbar_wait_cluster(&s_bar);
    if (mine && row0 + r < p.N) store_out(p, row0 + r, tok, v + s_peer[idx]);
  }
}

template <bool kFp8, int G, int MB = 0, int W = kWarps, int KS = 1>
void launch_nt(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro, int prewait) {
  const dim3 grid(ceil_div(p.N, kRows) * KS), block(W * 32);
  auto go = [&](const char* name, auto kernel, size_t smem) {
    launch_clustered(ctx, name, KS, kernel, grid, block, smem, p, prewait);
  };
  if (pro != SkinnyPrologue::kNone) {
    QVL_CHECK_LE(p.n, kFusedPrologueMaxRows);
    if (pro == SkinnyPrologue::kRmsNorm)
      go("skinny_linear+rms_norm", skinny_kernel<kFp8, G, 1, SkinnyPrologue::kRmsNorm, MB, W, KS>, prologue_bytes(p));
    else
      go("skinny_linear+silu_mul", skinny_kernel<kFp8, G, 1, SkinnyPrologue::kSiluMul, MB, W, KS>, prologue_bytes(p));
    return;
  }
  constexpr int kN = SkinnyPrologue::kNone;
  if constexpr (G > 2 || MB > 0 || W != kWarps || KS > 1) {
    QVL_CHECK_LE(p.n, 8) << "skinny_linear: groups of " << G << ", " << MB << " blocks per multiprocessor, " << W
                         << " warps, " << KS << " blocks per tile take at most 8 rows";
    go("skinny_linear", skinny_kernel<kFp8, G, 1, kN, MB, W, KS>, 0);
  } else {
    switch ((p.n + 7) / 8) {
      case 1:
        return go("skinny_linear", skinny_kernel<kFp8, G, 1, kN>, 0);
      case 2:
        return go("skinny_linear", skinny_kernel<kFp8, G, 2, kN>, 0);
      case 3:
        return go("skinny_linear", skinny_kernel<kFp8, G, 3, kN>, 0);
      case 4:
        return go("skinny_linear", skinny_kernel<kFp8, G, 4, kN>, 0);
      default:
        QVL_CHECK(false) << "skinny_linear: " << p.n << " rows (at most " << kSkinnyMaxRows << ")";
    }
  }
}

// SiLU·mul's gate and up are staged in shared memory at one row (SkinnyTuning::stage 2) by the
// one-tile and ring kernels; more rows are unmeasured and load them per vector.
bool stages_silu(SkinnyPrologue::Kind pro, int stage, int n) {
  return pro == SkinnyPrologue::kSiluMul && stage == 2 && n == 1;
}

// The prologue's shared memory in a ring launch of p.
size_t ring_prologue_bytes(SkinnyParams p, SkinnyPrologue::Kind pro, int stage) {
  if (pro == SkinnyPrologue::kNone) return 0;
  p.silu_staged = stages_silu(pro, stage, p.n);
  return prologue_bytes(p);
}

// The largest BF16 tile the ring streams whole at one or two rows (choose_skinny).
constexpr int kBf16RingWideTileMax = 80 * 1024;
// The largest FP8 tile (16 rows x K bytes) that gate_up at one row streams through the ring
// (choose_skinny): 4B's K = 2560 measured faster, 8B's 4096 slower.
constexpr int64_t kFp8GluRingTileMax = 40 * 1024;

// Whether an FP8 Linear of n rows takes the wide kernel by default: on sm_90, where it measured
// faster than the one-tile kernel in the decode step (qvl bench A/B, 2B / 4B / 8B FP8 on an H100,
// bench/RESULTS.md run 19). Tall Linears (two 128-row tiles per multiprocessor: gate_up) from 16
// rows, one block per tile; from 25 rows (four token tiles, where the one-tile kernel holds one
// block per multiprocessor) also Linears over K > 2048 that need more than a wave of one-tile
// blocks (4B / 8B qkv, o_proj, down_proj). 2B's smaller Linears and fewer rows stay one-tile.
// Over 32 rows launch_skinny_linear also asks for a grid of one wave.
bool wide_by_default(const LaunchContext& ctx, int64_t n, int64_t N, int64_t K, bool fp8) {
  if (!fp8 || !ctx.wide_fp8 || !wide_available(ctx, n)) return false;
  return (wide_tall(ctx, N) && n >= 16) || (n > 24 && K > 2048 && int64_t{ceil_div(N, kRows)} > ctx.num_sms);
}

// The benchmark override (ctx.skinny) where it applies to a Linear of N outputs, else the defaults.
SkinnyTuning requested_tuning(const LaunchContext& ctx, int64_t N) {
  return ctx.skinny.only_n > 0 && ctx.skinny.only_n != N ? SkinnyTuning{} : ctx.skinny;
}

// The kernel for one shape: ctx.skinny's fields where set (benchmarks), else the defaults from
// the decode-shape sweep on an H200 (tools/bench/gemv_sweep.cu): the one-tile blocks, which
// issue their whole share of weights at once and are replaced block after block, beat the
// persistent streaming kernel on every shape (lm_head: 140 against 174 us) except tall ones
// (>= 4096 row tiles, lm_head) over more than 16 rows, where their 4 token tiles need too many
// registers: there the streaming warps with whole rows win (227 against 292 us at 32 rows).
// One-tile blocks of one row load two groups before the PDL wait, FP8 two chunks per group;
// with more rows both cost time (qvl bench A/B on an H100, 2B / 2B FP8 / 4B FP8 decode step:
// batch 1 -3% / -12% / -8%, batch 8 +2% / +4% / +3%; bench/RESULTS.md).
SkinnyTuning choose_skinny(const LaunchContext& ctx, const SkinnyParams& p, bool fp8, SkinnyPrologue::Kind pro,
                           bool glu) {
  SkinnyTuning t = requested_tuning(ctx, p.N);
  if (t.stage == 0) t.stage = 2;
  QVL_CHECK(t.stage == 1 || t.stage == 2) << "skinny stage " << t.stage;
  // The bulk-copy ring takes at most 8 rows on sm_90+, FP8 with 128-row scale blocks, where two
  // of its stages fit; elsewhere its override gives way to the defaults.
  if (t.variant == 3 && (p.n > 8 || (fp8 && p.scale_row_shift != kChunkShift) ||
                         !ring_fits(ctx, p, fp8, ring_prologue_bytes(p, pro, t.stage), t.blocks > 0 ? t.blocks : 1)))
    t = SkinnyTuning{.stage = t.stage};
  // The wide kernel takes FP8 Linears without a prologue where it can launch (skinny_wide.cu).
  if (t.variant == 4 && (!fp8 || !wide_available(ctx, p.n) || pro != SkinnyPrologue::kNone))
    t = SkinnyTuning{.stage = t.stage};
  if (t.variant == 0 && pro == SkinnyPrologue::kNone && wide_by_default(ctx, p.n, p.N, p.K, fp8)) t.variant = 4;
  // Over kSkinnyMaxRows rows only the wide kernel runs (launch_skinny_linear checked that it may).
  if (p.n > kSkinnyMaxRows) t = SkinnyTuning{.variant = 4, .split = t.variant == 4 ? t.split : 0};
  if (t.variant == 4) return t;
  const int64_t tiles = ceil_div(p.N, kRows);
  // The bulk-copy ring of whole 16-row tiles, at least four per multiprocessor, for:
  // - BF16 up to 4 rows, tiles of at most 64 KB (2B gate_up and lm_head). qvl bench A/B on an
  //   H100: 2B decode -2.4% at batch 1, -5.8% at 8 (bench/RESULTS.md). Since the one-tile
  //   kernel's loads fill whole L2 lines (load16_stream), it is faster for 2B's gate_up at 6 and
  //   8 rows (step -2.2 / -2.4%, H200, RESULTS run 40) and lm_head no slower; the ring still
  //   wins at 1-4 rows (-6.5% at one row, -4.0% at four). At one or two rows also tiles of up
  //   to 80 KB, streamed whole (RingTuning::mode 1; 4B gate_up and lm_head): 4B BF16 step -1.1 /
  //   -5.0% at 1 / 2 rows, +5.4% at four (H200, RESULTS run 40). Elsewhere it measured
  //   slower or no faster: smaller grids (qkv, o_proj: o_proj's ring, one block per
  //   multiprocessor, no longer shares them with the attention before it, +5%), longer tiles (4B,
  //   8B), and FP8 Linears without the SwiGLU epilogue, whose dequantising consumers, 8 warps per
  //   multiprocessor, fall behind the stream.
  // - FP8 gate_up at one row with its SwiGLU epilogue (and RMSNorm prologue where fused), two
  //   stages and two blocks per multiprocessor. qvl bench A/B on an H100 against the one-tile
  //   kernel (bench/RESULTS.md run 37): decode at batch 1 4B FP8 -3.0%, 2B FP8 -1.1% (the ring's
  //   default depth: +6.3%). 8B FP8 (64 KB tiles: two blocks of two stages no longer fit a
  //   multiprocessor) +1.0%, hence tiles of at most 40 KB. Forced at 8 rows +3.4 / +4.5% (2B /
  //   4B): one row only. Compute capability 9.x only (LaunchContext::fp8_glu_ring): elsewhere a
  //   multiprocessor may hold one such block, as 8B's did.
  // Only where its layout would be whole tiles (the measured one: not on devices with ~100 KB of
  // shared memory per block, where the ring would fall back to row segments).
  const bool bf16_ring = !fp8 && p.n <= 4;
  const int whole_tile_max = !fp8 && p.n <= 2 ? kBf16RingWideTileMax : kRingWholeTileMax;
  const bool fp8_glu_ring = fp8 && glu && p.n == 1 && ctx.fp8_glu_ring && p.scale_row_shift == kChunkShift &&
                            int64_t{kRows} * p.K <= kFp8GluRingTileMax;
  if (t.variant == 0 && (bf16_ring || fp8_glu_ring) && ctx.ring_smem > 0 && tiles >= 4LL * ctx.num_sms &&
      ring_whole_tiles(ctx, p, fp8, ring_prologue_bytes(p, pro, t.stage), whole_tile_max)) {
    t.variant = 3;
    t.split = 1;  // whole tiles (mode 1), which ring_whole_tiles found to fit, past 64 KB too
    if (fp8_glu_ring) {
      t.depth = 2;
      t.blocks = 2;
    }
  }
  if (t.variant == 0) t.variant = p.n > 16 && tiles >= 4096 ? 2 : 1;
  if (t.variant == 1) {
    // FP8 up to 8 rows, where a warp takes at most three chunks (K <= 3072) and the grid has
    // more than two blocks per multiprocessor (at one row: more than one): three blocks of
    // group 1 (80 registers). Measured (qvl bench A/B, H100): 2B FP8 decode -6% at batch 1 and
    // -5% at 8, 4B FP8 -3% / -6%; 2B's qkv at 8 rows, o_proj and the K = 4096 / 9728 Linears
    // were slower with it. FP8 at one row where one-tile blocks leave no second block per
    // multiprocessor: groups that put the whole K on the way before the wait (2B down). Forced
    // groups over 2 and 3 blocks apply to FP8 Linears of at most 8 rows; other Linears keep
    // group 1 (BF16) or at most 2.
    const int nchunks = static_cast<int>(ceil_div(p.K, kChunk));
    const bool fp8_few = fp8 && p.n <= 8;
    // split 2: a tile's K over a cluster pair of blocks, FP8 up to 8 rows on sm_90+, three blocks
    // of group 1 per multiprocessor (other splits do not apply to this kernel). By default at 2..8
    // rows for grids of more tiles than multiprocessors whose half tiles fit one wave at three
    // per multiprocessor (4B o_proj and down: 160 tiles). qvl bench A/B on an H100 (bench/
    // RESULTS.md runs 27-28), 4B FP8 step at batch 2 / 4 / 8: -1.1 / -1.5 / -0.8%; at batch 1
    // +4.3% (there the default groups of two chunks, both before the wait, stay).
    if (t.split == 0 && t.group == 0 && t.blocks == 0 && t.warps == 0 && fp8_few && p.n >= 2 && tiles > ctx.num_sms &&
        2 * tiles <= 3 * int64_t{ctx.num_sms})
      t.split = 2;
    if (t.split != 2 || !fp8_few || !ctx.clusters) t.split = 0;
    if (t.split == 2) {
      t.blocks = 3;
      t.group = 1;
      t.warps = 0;
    }
    if (t.blocks == 0 && t.group == 0 && fp8_few && nchunks <= 3 * kWarps &&
        (tiles > 2 * ctx.num_sms || (p.n == 1 && tiles > ctx.num_sms)))
      t.blocks = 3;
    if (!fp8_few) t.blocks = 0;
    if (t.blocks == 3) t.group = 1;
    // 16 warps per block: up to 8 rows, groups of one chunk (BF16) or of one or two (FP8: two
    // where the warps' first chunks do not cover K). By default up to 4 rows (FP8: 8) where the
    // grid holds one block per multiprocessor and fills over half of them (2B o_proj and down: 128
    // tiles). There a block's K share after the PDL wait runs at two warps per scheduler with 8
    // warps; qvl bench A/B on an H100 (bench/RESULTS.md runs 26, 31), step at batch 1 / 4 / 6 / 8:
    // 2B BF16 -2.1 / -0.4 / +0.1 / +0.4%, 2B FP8 -1.5 / -0.6 / -1.2 / -0.8%. 4B's 160-tile o_proj
    // and down, whose 16-warp blocks no longer fit two per multiprocessor, measured +4.5 / +6.8%.
    if (t.warps == 0 && t.group == 0 && t.blocks == 0 && p.n <= (fp8 ? 8 : 4) && tiles <= ctx.num_sms &&
        2 * tiles > ctx.num_sms)
      t.warps = 16;
    if (p.n > 8 || t.blocks == 3) t.warps = 0;
    if (t.warps == 16) t.group = !fp8 || t.group == 1 || nchunks <= 16 ? 1 : 2;
    if (t.group == 0) {
      const int whole_k = std::clamp(static_cast<int>(ceil_div(nchunks, 2 * kWarps)), 2, 5);
      t.group = !fp8 || p.n > 1 ? 1 : tiles <= ctx.num_sms ? whole_k : 2;
    }
    if (!fp8_few) t.group = std::min(t.group, fp8 ? 2 : 1);
    if (t.prewait == 0) t.prewait = p.n == 1 ? 2 : 1;
    QVL_CHECK(t.group >= 1 && t.group <= 5 && (t.group == 1 || fp8) && (t.prewait == 1 || t.prewait == 2))
        << "skinny group " << t.group << ", prewait " << t.prewait;
    QVL_CHECK(t.blocks == 0 || t.blocks == 3) << "skinny blocks " << t.blocks;
    QVL_CHECK(t.warps == 0 || t.warps == kWarps || (t.warps == 16 && t.group <= (fp8 ? 2 : 1)))
        << "skinny warps " << t.warps;
    return t;
  }
  if (t.variant == 3) {
    // split = the ring's mode (RingTuning); 0 fields: launch_ring's defaults.
    if (t.blocks == 0) t.blocks = 1;
    return t;
  }
  if (t.split == 0) t.split = tiles >= 4096 ? 1 : kWarps;
  if (t.depth == 0) t.depth = fp8 ? 4 : 2;
  QVL_CHECK(t.split == 1 || t.split == 2 || t.split == 4 || t.split == 8) << "skinny split " << t.split;
  return t;
}

template <bool kFp8, int G, int MB = 0, int W = kWarps, int KS = 1>
void allow_staged_silu() {
  constexpr int bytes = static_cast<int>(2 * kFusedPrologueMaxBytes);
  QVL_CUDA_CHECK(cudaFuncSetAttribute(skinny_kernel<kFp8, G, 1, SkinnyPrologue::kSiluMul, MB, W, KS>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace
}  // namespace skinny

using namespace skinny;  // this file's own helpers

void configure_skinny(int ring_smem) {
  configure_ring(ring_smem);
  configure_wide(ring_smem);
  allow_staged_silu<false, 1>();
  allow_staged_silu<true, 1>();
  allow_staged_silu<true, 2>();
  allow_staged_silu<true, 3>();
  allow_staged_silu<true, 4>();
  allow_staged_silu<true, 5>();
  allow_staged_silu<true, 1, 3>();
  allow_staged_silu<true, 1, 3, kWarps, 2>();
  allow_staged_silu<false, 1, 0, 16>();
  allow_staged_silu<true, 1, 0, 16>();
  allow_staged_silu<true, 2, 0, 16>();
}

void launch_skinny_linear(const LaunchContext& ctx, Tensor out, const Tensor& x, const LinearWeight& w,
                          const Epilogue& ep, const SkinnyPrologue& pro, const Tensor& glu_out,
                          bool follows_attention) {
  QVL_CHECK_EQ(w.parts.size(), 1u) << "skinny_linear needs a merged (device) weight";
  const Tensor& weight = w.parts[0].weight;
  const bool fp8 = weight.dtype == DType::kF8E4M3;
  QVL_CHECK(x.dtype == DType::kBF16 && out.dtype == DType::kBF16) << x.describe() << " -> " << out.describe();
  QVL_CHECK(fp8 || weight.dtype == DType::kBF16) << "skinny_linear weight " << weight.describe();
  const int64_t n = x.dim(0), K = x.row_numel(), N = out.row_numel();
  QVL_CHECK_LE(n, kSkinnyWideMaxRows);
  if (n > kSkinnyMaxRows) {
    // One wide launch where it is forced, or by default where the shape takes it and its grid
    // fits one wave at the one block per multiprocessor that 5..8 token tiles leave (2B gate_up;
    // 4B's and 8B's grids of 152..256 blocks measured slower than two passes: 4B FP8 at 64
    // sequences 9.13 -> 9.56 ms); else passes of kSkinnyMaxRows rows.
    const bool forced = requested_tuning(ctx, N).variant == 4;
    const bool wide = pro.kind == SkinnyPrologue::kNone &&
                      (forced ? fp8 && wide_available(ctx, n)
                              : wide_by_default(ctx, n, N, K, fp8) &&
                                    static_cast<int64_t>(ceil_div(N, 128)) * wide_splits(ctx, N, K, 0) <= ctx.num_sms);
    if (!wide) {
      QVL_CHECK(pro.kind == SkinnyPrologue::kNone) << "skinny_linear: a prologue over " << n << " rows";
      for (int64_t r = 0; r < n; r += kSkinnyMaxRows) {
        const int64_t e = std::min(n, r + kSkinnyMaxRows);
        const Epilogue part{ep.act, ep.residual.empty() ? Tensor() : ep.residual.rows(r, e)};
        launch_skinny_linear(ctx, out.rows(r, e), x.rows(r, e), w, part);
      }
      return;
    }
  }
  QVL_CHECK_EQ(out.dim(0), n);
  QVL_CHECK_EQ(weight.dim(0), N);
  QVL_CHECK_EQ(weight.dim(1), K);
  QVL_CHECK_EQ(K % (fp8 ? 16 : 8), 0) << "skinny_linear: K " << K;
  QVL_CHECK(x.data != out.data) << "skinny_linear: x aliases out";
  SkinnyParams p{};
  p.w = weight.data;
  p.x = x.as<bf16>();
  p.out = out.as<bf16>();
  p.n = static_cast<int>(n);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.act = static_cast<int>(ep.act);
  if (!w.bias.empty()) {
    QVL_CHECK(w.bias.dtype == DType::kBF16 && w.bias.numel() == N) << "bias " << w.bias.describe();
    p.bias = w.bias.as<bf16>();
  }
  if (!ep.residual.empty()) {
    QVL_CHECK(ep.residual.dtype == DType::kBF16 && ep.residual.same_shape(out))
        << "residual " << ep.residual.describe() << " vs out " << out.describe();
    p.residual = ep.residual.as<bf16>();
  }
  if (pro.kind != SkinnyPrologue::kNone) {
    QVL_CHECK(pro.src.dtype == DType::kBF16 && pro.src.dim(0) == n) << "prologue source " << pro.src.describe();
    QVL_CHECK_EQ(K % 8, 0);
    QVL_CHECK(pro.src.data != out.data && (ep.residual.empty() || ep.residual.data != x.data))
        << "prologue source or x aliases the output";
    p.src = pro.src.as<bf16>();
    p.x_out = x.as<bf16>();
    if (pro.kind == SkinnyPrologue::kRmsNorm) {
      QVL_CHECK_EQ(pro.src.row_numel(), K);
      QVL_CHECK(pro.weight.numel() == K && (pro.weight.dtype == DType::kF32 || pro.weight.dtype == DType::kBF16))
          << "rms_norm weight " << pro.weight.describe();
      p.norm_w = pro.weight.data;
      p.norm_w_f32 = pro.weight.dtype == DType::kF32;
      p.eps = pro.eps;
    } else {
      QVL_CHECK_EQ(pro.src.row_numel(), 2 * K);
    }
  }
  if (fp8) {
    const Tensor& scale = w.parts[0].scale_inv;
    QVL_CHECK_EQ(w.block_size, kChunk) << "skinny_linear handles 128x128 FP8 blocks";
    QVL_CHECK(scale.dtype == DType::kF32) << scale.describe();
    QVL_CHECK_EQ(scale.dim(1), (K + kChunk - 1) / kChunk);
    p.scale = scale.as<float>();
    p.scale_cols = static_cast<int>(scale.dim(1));
    const bool block_rows = scale.dim(0) == (N + kChunk - 1) / kChunk;
    QVL_CHECK(block_rows || scale.dim(0) == N) << "scale " << scale.describe() << " for N " << N;
    p.scale_row_shift = block_rows ? kChunkShift : 0;
  }
  const SkinnyTuning tune = choose_skinny(ctx, p, fp8, pro.kind, !glu_out.empty());
  if (tune.variant == 1 && pro.kind == SkinnyPrologue::kNone && !follows_attention && ctx.early_launch != 0) {
    const int64_t blocks = skinny_tiles(p.N) * (tune.split == 2 ? 2 : 1);
    p.early_launch = ctx.early_launch == 1 ||
                     (p.n == 1 && blocks > ctx.num_sms && !over_one_and_a_half_blocks_per_sm(blocks, ctx.num_sms));
    if (p.early_launch && ctx.early_launches != nullptr) ++*ctx.early_launches;
  }
  if (!glu_out.empty()) {
    QVL_CHECK(n <= kSkinnyMaxRows && N % 16 == 0 && p.bias == nullptr && p.residual == nullptr &&
              ep.act == Activation::kNone)
        << "skinny_linear: a SwiGLU epilogue for " << n << " x " << N << " outputs with a bias, activation or residual";
    QVL_CHECK(glu_out.dtype == DType::kBF16 && glu_out.dim(0) == n && glu_out.row_numel() == N / 2 &&
              glu_out.data != out.data && glu_out.data != x.data)
        << "skinny_linear: SwiGLU output " << glu_out.describe() << " for " << out.describe();
    // The one-tile kernel without cluster pairs and the ring take it; other kernels write out,
    // and SiLU·mul follows as its own launch (silu_after).
    if ((tune.variant == 1 && tune.split != 2) || tune.variant == 3) {
      p.glu_out = glu_out.as<bf16>();
      if (ctx.glu_launches != nullptr) ++*ctx.glu_launches;
    }
  }
  const bool silu_after = !glu_out.empty() && p.glu_out == nullptr;
  if (pro.kind != SkinnyPrologue::kNone && ctx.prologue_launches != nullptr) ++*ctx.prologue_launches;
  // configure_skinny lets the kernels take the doubled bytes.
  p.silu_staged = (tune.variant == 1 || tune.variant == 3) && stages_silu(pro.kind, tune.stage, p.n);
  if (tune.variant == 4) {
    if (ctx.wide_launches != nullptr) ++*ctx.wide_launches;
    launch_wide(ctx, p, wide_splits(ctx, p.N, p.K, tune.split));
  } else if (tune.variant == 3) {
    const RingTuning rt{.depth = tune.depth, .group = tune.group, .blocks = tune.blocks, .mode = tune.split};
    fp8 ? launch_ring<true>(ctx, p, pro.kind, rt) : launch_ring<false>(ctx, p, pro.kind, rt);
  } else if (tune.variant == 1) {
    if (tune.warps == 16 && ctx.warps16_launches != nullptr) ++*ctx.warps16_launches;
    if (tune.split == 2 && ctx.pair_launches != nullptr) ++*ctx.pair_launches;
    if (!fp8 && tune.warps == 16)
      launch_nt<false, 1, 0, 16>(ctx, p, pro.kind, tune.prewait);
    else if (!fp8)
      launch_nt<false, 1>(ctx, p, pro.kind, tune.prewait);
    else if (tune.blocks == 3 && tune.split == 2)
      launch_nt<true, 1, 3, kWarps, 2>(ctx, p, pro.kind, tune.prewait);
    else if (tune.blocks == 3)
      launch_nt<true, 1, 3>(ctx, p, pro.kind, tune.prewait);
    else if (tune.warps == 16 && tune.group == 2)
      launch_nt<true, 2, 0, 16>(ctx, p, pro.kind, tune.prewait);
    else if (tune.warps == 16)
      launch_nt<true, 1, 0, 16>(ctx, p, pro.kind, tune.prewait);
    else if (tune.group == 5)
      launch_nt<true, 5>(ctx, p, pro.kind, tune.prewait);
    else if (tune.group == 4)
      launch_nt<true, 4>(ctx, p, pro.kind, tune.prewait);
    else if (tune.group == 3)
      launch_nt<true, 3>(ctx, p, pro.kind, tune.prewait);
    else if (tune.group == 2)
      launch_nt<true, 2>(ctx, p, pro.kind, tune.prewait);
    else
      launch_nt<true, 1>(ctx, p, pro.kind, tune.prewait);
  } else {
    fp8 ? launch_stream<true>(ctx, p, pro.kind, tune.depth, tune.split)
        : launch_stream<false>(ctx, p, pro.kind, tune.depth, tune.split);
  }
  if (silu_after) launch_silu_mul(ctx, glu_out, out);
}

}  // namespace qvl::cuda
