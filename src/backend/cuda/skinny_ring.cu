// The decode Linear's bulk-copy ring kernel (sm_90+; see skinny_common.cuh for the shared layout
// and numerics). A persistent grid (RingTuning::blocks per multiprocessor) walks row tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... and streams each tile's weights into a ring of
// shared-memory stages with cp.async.bulk (completion counted on one mbarrier per stage), so that
// the bytes in flight are bounded by shared memory rather than by registers and block turnover.
// The first `depth` stages are issued before the PDL wait, while the previous kernel runs. With a
// prologue (LaunchContext::ring_prologue_first), only the first one is: the prologue's row, read
// after the wait, would otherwise queue behind every block's whole ring of weights; the others
// follow once the prologue is done. qvl bench A/B on two H100s (bench/RESULTS.md run 39), decode
// step at batch 1: 2B FP8 -3.7 / -1.0%, 4B FP8 -3.0 / -0.4%, 2B BF16 -0.2 / -1.8%.
//
// A stage is a whole 16-row tile or 16 rows x 8 * group chunks of 128 columns (RingLayout); warp
// w takes chunks w, w + 8, ... of it, so every warp sees its chunks (c = w mod 8) in increasing
// order, as in the one-tile kernel, and the block reduces the 8 warps' partials in warp order:
// the same bits. The warp that finishes a stage last (a counter per stage in shared memory)
// refills it with the stage `depth` ahead; no warp waits for another except at the end of a tile,
// where the partials meet (double-buffered, one barrier per tile).
#include "backend/cuda/skinny_common.cuh"

namespace qvl::cuda::skinny {
namespace {

constexpr int kRingBudget = 104 * 1024;

// Where a block's stages lie: `seg_bytes` of each of the 16 rows per stage, at `row_stride` in
// shared memory. Whole tiles (seg_bytes = a row): one copy of the 16 contiguous rows per stage,
// rows at their global stride (two rows of a quarter-warp share banks: a 2-way conflict, cheap
// next to the stream). Otherwise 16 copies per stage, one per row, padded by 64 bytes so that
// rows g and g + 1 fall in different banks. Copies must be large: in gemv_sweep (H100), stages of
// 1 KB (FP8) and 2 KB (BF16) rows both moved about 11 copies per microsecond per multiprocessor
// whatever the depth or blocks, which at 1 KB is under half of a multiprocessor's share of the
// bandwidth; whole tiles (32-64 KB per copy) reach it.
struct RingLayout {
  int depth;
  int seg_bytes;   // bytes of each row per stage (whole tiles: the row)
  int row_stride;  // bytes between rows in a stage
  int stage_bytes;
  int ring_offset;  // from the start of dynamic shared memory (after the prologue's x)
  bool whole_tiles;
  int early;  // stages issued before the PDL wait (the others once the prologue is done)
};

template <bool kFp8, int PRO>
__global__ void __launch_bounds__(kWarps * 32, 2) skinny_ring_kernel(const SkinnyParams p, const RingLayout L) {
  using C = Chunk<kFp8>;
  constexpr int S = C::kSteps;
  constexpr int E = C::kElems;
  constexpr int kEsize = kFp8 ? 1 : 2;
  __shared__ float red[2][kWarps][kRows][9];
  __shared__ PrologueSmem pro_smem;
  char* ring = reinterpret_cast<char*>(prologue_x) + L.ring_offset;
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + static_cast<size_t>(L.depth) * L.stage_bytes);
  unsigned* done = reinterpret_cast<unsigned*>(full + L.depth);
  float* tile_scale = reinterpret_cast<float*>(done + L.depth);  // FP8: [my tiles][chunks][rows 0-7, 8-15]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = (p.N + kRows - 1) / kRows;
  const int nchunks = (p.K + kChunk - 1) / kChunk;
  const int64_t row_bytes = static_cast<int64_t>(p.K) * kEsize;
  const int seg_chunks = L.whole_tiles ? nchunks : L.seg_bytes / (kChunk * kEsize);
  const int segs = (nchunks + seg_chunks - 1) / seg_chunks;
  const int my_tiles = static_cast<int>(blockIdx.x) < tiles ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const int total = my_tiles * segs;
  const int depth = L.depth;

  // Stage q of this block into its slot, by one whole warp.
  auto issue = [&](int q) {
    const int slot = q % depth;
    const int ti = q / segs, seg = q - ti * segs;
    const int tile = blockIdx.x + ti * gridDim.x, row0 = tile * kRows;
    char* dst = ring + slot * L.stage_bytes;
    const char* src = static_cast<const char*>(p.w) + static_cast<int64_t>(row0) * row_bytes;
    if (L.whole_tiles && p.glu_out != nullptr) {
      // SwiGLU tiles: 8 gate rows and their 8 up rows, two copies (tile_row).
      const uint32_t bytes = static_cast<uint32_t>(8 * row_bytes);
      if (lane == 0) {
        mbar_expect_tx(&full[slot], 2 * bytes);
        for (int h = 0; h < 2; ++h)
          bulk_load_evict_first(
              dst + h * 8 * row_bytes,
              static_cast<const char*>(p.w) + static_cast<int64_t>(tile_row(p, tile, 8 * h)) * row_bytes, bytes,
              &full[slot]);
      }
      return;
    }
    if (L.whole_tiles) {
      // Rows past N are not copied: their (stale) shared memory only feeds outputs never stored.
      const uint32_t bytes = static_cast<uint32_t>(min(kRows, p.N - row0) * row_bytes);
      if (lane == 0) {
        mbar_expect_tx(&full[slot], bytes);
        bulk_load_evict_first(dst, src, bytes, &full[slot]);
      }
      return;
    }
    const int64_t off = static_cast<int64_t>(seg) * L.seg_bytes;
    const uint32_t bytes = static_cast<uint32_t>(min(static_cast<int64_t>(L.seg_bytes), row_bytes - off));
    if (lane == 0) mbar_expect_tx(&full[slot], bytes * kRows);
    __syncwarp();
    if (lane < kRows) {
      const int row = tile_row(p, tile, lane);  // rows past N re-read row N - 1, never stored
      bulk_load_evict_first(dst + lane * L.row_stride,
                            static_cast<const char*>(p.w) + static_cast<int64_t>(row) * row_bytes + off, bytes,
                            &full[slot]);
    }
  };

  if (threadIdx.x == 0) {
    for (int d = 0; d < depth; ++d) {
      mbar_init(&full[d], 1);
      done[d] = 0;
    }
    mbar_init_fence();
  }
  __syncwarp();
  if (warp == 0)
    for (int q = 0; q < min(L.early, total); ++q) issue(q);  // weights: safe before the wait
  if constexpr (kFp8) {
    // Every block scale this block uses, once: a tile's rows 0-7 and 8-15 each lie in one
    // 128-row scale block (with the SwiGLU epilogue, gate rows and up rows: two blocks).
    for (int i = threadIdx.x; i < 2 * my_tiles * nchunks; i += kWarps * 32) {
      const int h = i & 1, ti = (i >> 1) / nchunks, c = (i >> 1) - ti * nchunks;
      tile_scale[i] = block_scale(p, tile_row(p, blockIdx.x + ti * gridDim.x, 8 * h), c);
    }
  }
  PrologueWeights pw;
  prefetch_prologue<PRO>(p, pw);
  __syncthreads();  // the barriers' initialisation
  grid_dep_wait();
  grid_dep_launch();
  run_prologue<PRO>(p, pro_smem, pw);
  if (warp == 0)
    for (int q = L.early; q < min(depth, total); ++q) issue(q);

  float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  for (int q = 0; q < total; ++q) {
    const int slot = q % depth;
    const int ti = q / segs, seg = q - ti * segs;
    mbar_wait(&full[slot], (q / depth) & 1);
    const char* stage = ring + slot * L.stage_bytes;
    // Two chunks of the warp at a time (c and c + 8: independent until they join acc, in order),
    // so that one chunk's loads and conversions overlap the other's.
    for (int cl = warp; cl < seg_chunks; cl += 2 * kWarps) {  // chunk within the stage
      const int c0 = seg * seg_chunks + cl;
      if (c0 >= nchunks) break;
      const bool has1 = cl + kWarps < seg_chunks && c0 + kWarps < nchunks;
      uint4 w[2][2 * S];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = c0 + h * kWarps;
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const int kl = s * 4 * E + t * E;  // column within the chunk
          const bool ok = (h == 0 || has1) && c * kChunk + kl < p.K;
          const char* at = stage + ((cl + h * kWarps) * kChunk + kl) * kEsize;
          w[h][2 * s] = ok ? *reinterpret_cast<const uint4*>(at + g * L.row_stride) : make_uint4(0, 0, 0, 0);
          w[h][2 * s + 1] = ok ? *reinterpret_cast<const uint4*>(at + (g + 8) * L.row_stride) : make_uint4(0, 0, 0, 0);
        }
      }
      // A chunk past the stage or K multiplies zeros (and loads no x): its part is never added.
      float part[2][1][4];
      chunk_mma<kFp8, 1, PRO>(p, c0, t, g, w[0], pro_smem, part[0]);
      chunk_mma<kFp8, 1, PRO>(p, has1 ? c0 + kWarps : nchunks, t, g, w[1], pro_smem, part[1]);
      const float* s0 = tile_scale + 2 * (ti * nchunks + c0);
      accumulate_scaled(acc, part[0], kFp8 ? s0[0] : 1.0f, kFp8 ? s0[1] : 1.0f);
      if (has1) {
        const float* s1 = s0 + 2 * kWarps;
        accumulate_scaled(acc, part[1], kFp8 ? s1[0] : 1.0f, kFp8 ? s1[1] : 1.0f);
      }
    }
    // Release the stage; the last warp out refills it.
    __syncwarp();
    unsigned last = 0;
    if (lane == 0) {
      __threadfence_block();
      last = atomicAdd(&done[slot], 1u) % kWarps == kWarps - 1;
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    if (last && q + depth < total) {
      QVL_SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));
      issue(q + depth);
    }
    if (seg != segs - 1) continue;
    // The tile is complete (red is double-buffered: one barrier per tile).
    reduce_tile_and_store<1>(p, red[ti & 1], acc, blockIdx.x + ti * gridDim.x);
    acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.0f;
  }
}

// What a ring launch holds besides its stages: the grid, the prologue's x (the ring starts at
// the next 128 bytes) and every block scale of a block's tiles (FP8).
struct RingFixed {
  int64_t tiles, grid;
  int ring_offset, scale_bytes;
};
RingFixed ring_fixed(const LaunchContext& ctx, const SkinnyParams& p, bool fp8, size_t pro_bytes, int blocks) {
  RingFixed f;
  f.tiles = ceil_div(p.N, kRows);
  f.grid = std::min<int64_t>(f.tiles, static_cast<int64_t>(blocks) * ctx.num_sms);
  f.ring_offset = static_cast<int>((pro_bytes + 127) / 128 * 128);
  f.scale_bytes = fp8 ? static_cast<int>(2 * ceil_div(f.tiles, f.grid) * ceil_div(p.K, kChunk) * sizeof(float)) : 0;
  return f;
}
// Two stages of row segments of 8 * group chunks of esize-byte weights, as launch_ring_kernel
// budgets them (a row's 64 bytes of padding and 16 for its barrier and counter, generously).
constexpr int64_t two_segment_stages(int group, int esize) {
  return int64_t{2} * kRows * (group * kWarps * kChunk * esize + 64 + 16);
}
// Whether two whole-tile stages (and their barriers) fit beside f.
bool two_whole_tiles_fit(const LaunchContext& ctx, const SkinnyParams& p, bool fp8, const RingFixed& f) {
  const int64_t tile_bytes = static_cast<int64_t>(kRows) * p.K * (fp8 ? 1 : 2);
  return f.ring_offset + 2 * (tile_bytes + 16) + f.scale_bytes <= ctx.ring_smem;
}

template <bool kFp8>
void launch_ring_kernel(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro,
                        const RingTuning& rt) {
  constexpr int kEsize = kFp8 ? 1 : 2;
  QVL_CHECK(ctx.ring_smem > 0) << "skinny ring kernel: needs sm_90 or newer";
  QVL_CHECK(!kFp8 || p.scale_row_shift == kChunkShift) << "skinny ring kernel: FP8 needs 128-row scale blocks";
  QVL_CHECK_LE(p.n, 8) << "skinny ring kernel: at most 8 rows";
  const RingFixed f = ring_fixed(ctx, p, kFp8, pro == SkinnyPrologue::kNone ? 0 : prologue_bytes(p), rt.blocks);
  const dim3 grid(static_cast<unsigned>(f.grid));
  const dim3 block(kWarps * 32);
  const int row_bytes = p.K * kEsize;
  const int scale_bytes = f.scale_bytes;
  RingLayout L{};
  L.ring_offset = f.ring_offset;
  // Whole tiles where asked for (or, by default, up to kRingWholeTileMax) and two of them fit.
  L.whole_tiles = two_whole_tiles_fit(ctx, p, kFp8, f) &&
                  (rt.mode == 1 || (rt.mode == 0 && kRows * row_bytes <= kRingWholeTileMax));
  if (L.whole_tiles) {
    L.seg_bytes = L.row_stride = row_bytes;
  } else {
    // Rows of at least 4 KB per copy (FP8: 32 chunks, BF16: 16) unless the override says otherwise.
    int group = rt.group > 0 ? rt.group : kFp8 ? 4 : 2;
    // Fewer chunks per stage where two stages of `group` would not fit.
    while (group > 1 && L.ring_offset + two_segment_stages(group, kEsize) + scale_bytes > ctx.ring_smem) group /= 2;
    L.seg_bytes = group * kWarps * kChunk * kEsize;
    L.row_stride = L.seg_bytes + 64;
  }
  L.stage_bytes = kRows * L.row_stride;
  // Default depth: the stages that fit kRingBudget beside the prologue, so that the next
  // kernel's block fits on the multiprocessor too; at least two. Forced or default, no more than
  // fit ctx.ring_smem (on ~100 KB devices kRingBudget alone would not).
  constexpr int kStageExtra = sizeof(uint64_t) + sizeof(unsigned);  // its mbarrier and counter
  const int fit = (ctx.ring_smem - L.ring_offset - scale_bytes) / (L.stage_bytes + kStageExtra);
  L.depth = rt.depth > 0 ? rt.depth : std::max(2, (kRingBudget - L.ring_offset - scale_bytes) / L.stage_bytes);
  L.depth = std::max(2, std::min(L.depth, fit));
  const size_t smem =
      static_cast<size_t>(L.ring_offset) + static_cast<size_t>(L.depth) * (L.stage_bytes + kStageExtra) + scale_bytes;
  QVL_CHECK_LE(smem, static_cast<size_t>(ctx.ring_smem))
      << "skinny ring: " << L.depth << " stages of " << L.stage_bytes << " bytes";
  L.early = L.depth;
  if (pro != SkinnyPrologue::kNone && ctx.ring_prologue_first && L.depth > 1) {
    L.early = 1;
    if (ctx.ring_prologue_first_launches != nullptr) ++*ctx.ring_prologue_first_launches;
  }
  auto go = [&](const char* name, auto kernel) { launch(ctx, name, kernel, grid, block, smem, p, L); };
  if (pro == SkinnyPrologue::kRmsNorm)
    return go("skinny_ring+rms_norm", skinny_ring_kernel<kFp8, SkinnyPrologue::kRmsNorm>);
  if (pro == SkinnyPrologue::kSiluMul)
    return go("skinny_ring+silu_mul", skinny_ring_kernel<kFp8, SkinnyPrologue::kSiluMul>);
  go("skinny_ring", skinny_ring_kernel<kFp8, SkinnyPrologue::kNone>);
}

template <bool kFp8>
void allow_ring_smem(int bytes) {
  for (const void* k : {(const void*)skinny_ring_kernel<kFp8, SkinnyPrologue::kNone>,
                        (const void*)skinny_ring_kernel<kFp8, SkinnyPrologue::kRmsNorm>,
                        (const void*)skinny_ring_kernel<kFp8, SkinnyPrologue::kSiluMul>})
    QVL_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace

bool ring_fits(const LaunchContext& ctx, const SkinnyParams& p, bool fp8, size_t pro_bytes, int blocks) {
  if (ctx.ring_smem <= 0) return false;
  const RingFixed f = ring_fixed(ctx, p, fp8, pro_bytes, blocks);
  return two_whole_tiles_fit(ctx, p, fp8, f) ||
         f.ring_offset + two_segment_stages(1, fp8 ? 1 : 2) + f.scale_bytes <= ctx.ring_smem;
}

bool ring_whole_tiles(const LaunchContext& ctx, const SkinnyParams& p, bool fp8, size_t pro_bytes, int max_tile) {
  const RingFixed f = ring_fixed(ctx, p, fp8, pro_bytes, RingTuning{}.blocks);
  return static_cast<int64_t>(kRows) * p.K * (fp8 ? 1 : 2) <= max_tile && two_whole_tiles_fit(ctx, p, fp8, f);
}

void configure_ring(int bytes) {
  if (bytes <= 0) return;
  allow_ring_smem<true>(bytes);
  allow_ring_smem<false>(bytes);
}

template <bool kFp8>
void launch_ring(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro, const RingTuning& rt) {
  QVL_CHECK(rt.depth >= 0 && rt.depth <= 16 && rt.blocks >= 1 && rt.blocks <= 4 && rt.mode >= 0 && rt.mode <= 2 &&
            rt.group >= 0 && rt.group <= 8)
      << "skinny ring: depth " << rt.depth << ", blocks " << rt.blocks << ", mode " << rt.mode << ", group "
      << rt.group;
  launch_ring_kernel<kFp8>(ctx, p, pro, rt);
}

template void launch_ring<true>(const LaunchContext&, const SkinnyParams&, SkinnyPrologue::Kind, const RingTuning&);
template void launch_ring<false>(const LaunchContext&, const SkinnyParams&, SkinnyPrologue::Kind, const RingTuning&);

}  // namespace qvl::cuda::skinny

namespace qvl::cuda {

int ring_smem_budget(int smem_optin) {
  // The kernels' static shared memory is their source's, the same on every device: read once.
  static const int static_bytes = [] {
    int most = 0;
    for (const void* k : {(const void*)skinny::skinny_ring_kernel<true, SkinnyPrologue::kNone>,
                          (const void*)skinny::skinny_ring_kernel<true, SkinnyPrologue::kRmsNorm>,
                          (const void*)skinny::skinny_ring_kernel<true, SkinnyPrologue::kSiluMul>,
                          (const void*)skinny::skinny_ring_kernel<false, SkinnyPrologue::kNone>,
                          (const void*)skinny::skinny_ring_kernel<false, SkinnyPrologue::kRmsNorm>,
                          (const void*)skinny::skinny_ring_kernel<false, SkinnyPrologue::kSiluMul>}) {
      cudaFuncAttributes a{};
      QVL_CUDA_CHECK(cudaFuncGetAttributes(&a, k));
      most = std::max(most, static_cast<int>(a.sharedSizeBytes));
    }
    return most;
  }();
  return std::clamp(smem_optin - static_bytes, 0, skinny::kRingSmemMax);
}

}  // namespace qvl::cuda
