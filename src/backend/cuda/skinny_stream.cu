// The decode Linear's persistent streaming kernel (see skinny_common.cuh for the shared layout
// and numerics). The default for tall matrices (lm_head) over more than 16 rows; other shapes
// use skinny.cu's one-tile blocks (choose_skinny there).
#include <algorithm>
#include <map>
#include <mutex>

#include "backend/cuda/skinny_common.cuh"

namespace qvl::cuda::skinny {
namespace {

// Streaming variant, persistent: the grid is at most what fits on the device at once, and each
// block walks "tile groups" blockIdx.x, blockIdx.x + gridDim.x, ... A group is 8 / split row
// tiles; warp w works on tile w / split of the group and K slice w % split: chunks slice,
// slice + split, ... (every warp takes ceil(nchunks / split) steps per tile, past-the-end ones
// empty, so tile boundaries line up across the block). A ring of DEPTH chunks in flight per
// warp runs on across tile boundaries: the next tile's weights stream in while the current
// one is reduced and stored, and a prologue (RMSNorm, SiLU·mul) is computed once per block.
// With split = 1 a warp owns whole rows and stores its outputs without a block reduction.
template <bool kFp8, int NT, int PRO, int DEPTH>
__global__ void __launch_bounds__(kWarps * 32, NT <= 2 && DEPTH * Chunk<kFp8>::kSteps <= 8 ? 2 : 1)
    skinny_stream_kernel(const SkinnyParams p, int split) {
  using C = Chunk<kFp8>;
  constexpr int S = C::kSteps;
  __shared__ float red[kWarps][kRows][NT * 8 + 1];
  __shared__ PrologueSmem pro_smem;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tiles_per_group = kWarps / split;
  const int groups = ((p.N + kRows - 1) / kRows + tiles_per_group - 1) / tiles_per_group;
  const int nchunks = (p.K + kChunk - 1) / kChunk;
  const int per_tile = (nchunks + split - 1) / split;
  const int wt = warp / split, slice = warp % split;
  const int my_groups = static_cast<int>(blockIdx.x) < groups ? (groups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const int total = my_groups * per_tile;  // steps of every warp of this block

  // Step q of this warp: tile and chunk; false for an empty step (chunk or rows out of range).
  auto step = [&](int q, int& row0, int& c) {
    const int gi = q / per_tile;
    row0 = ((blockIdx.x + gi * gridDim.x) * tiles_per_group + wt) * kRows;
    c = slice + (q - gi * per_tile) * split;
    return c < nchunks && row0 < p.N;
  };
  auto fetch = [&](int q, uint4(&w)[2 * S]) {
    int row0, c;
    if (q < total && step(q, row0, c))
      load_weights<kFp8>(p, c, min(row0 + g, p.N - 1), min(row0 + g + 8, p.N - 1), t, w);
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  uint4 ring[DEPTH][2 * S];
#pragma unroll
  for (int d = 0; d < DEPTH; ++d) fetch(d, ring[d]);  // weights: safe before the wait
  PrologueWeights pw;
  prefetch_prologue<PRO>(p, pw);
  grid_dep_wait();
  grid_dep_launch();
  run_prologue<PRO>(p, pro_smem, pw);

  for (int q0 = 0; q0 < total; q0 += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int q = q0 + d;
      if (q >= total) break;  // uniform across the block
      int row0, c;
      const bool live = step(q, row0, c);
      const int ra = min(row0 + g, p.N - 1), rb = min(row0 + g + 8, p.N - 1);
      if (live) {
        float part[NT][4];
        chunk_mma<kFp8, NT, PRO>(p, c, t, g, ring[d], pro_smem, part);
        accumulate_scaled(acc, part, kFp8 ? block_scale(p, ra, c) : 1.0f, kFp8 ? block_scale(p, rb, c) : 1.0f);
      }
      fetch(q + DEPTH, ring[d]);
      if ((q + 1) % per_tile != 0) continue;
      // The group's tiles are complete: reduce the K slices and store.
      if (split == 1) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + g + (e >> 1) * 8, tok = j * 8 + 2 * t + (e & 1);
            if (row < p.N && tok < p.n) store_out(p, row, tok, acc[j][e]);
          }
        }
      } else {
        write_partials<NT>(red, acc);
        __syncthreads();
        const int first_row = (row0 / kRows - wt) * kRows;  // the group's first row
        for (int idx = threadIdx.x; idx < tiles_per_group * kRows * p.n; idx += kWarps * 32) {
          const int tl = idx / (kRows * p.n), rem = idx % (kRows * p.n);
          const int tok = rem / kRows, r = rem % kRows;
          const int row = first_row + tl * kRows + r;
          if (row >= p.N) continue;
          float v = 0.0f;
          for (int w = tl * split; w < (tl + 1) * split; ++w) v += red[w][r][tok];
          store_out(p, row, tok, v);
        }
        __syncthreads();  // red is rewritten by the next group
      }
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    }
  }
}

// Blocks of `kernel` that fit on the device at once (cached per kernel and shared-memory size).
int resident_blocks(const LaunchContext& ctx, const void* kernel, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({kernel, smem});
  if (it == cache.end()) {
    int per_sm = 0;
    QVL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, smem));
    it = cache.emplace(std::make_pair(kernel, smem), std::max(1, per_sm)).first;
  }
  return it->second * ctx.num_sms;
}

template <bool kFp8, int DEPTH>
void launch_stream_depth(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro, int split) {
  const int64_t groups = ceil_div(ceil_div(p.N, kRows), kWarps / split);
  const dim3 block(kWarps * 32);
  auto go = [&](const char* name, auto kernel, size_t smem) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(groups, resident_blocks(ctx, (const void*)kernel, smem))));
    launch(ctx, name, kernel, grid, block, smem, p, split);
  };
  constexpr int kN = SkinnyPrologue::kNone;
  if (pro == SkinnyPrologue::kRmsNorm)
    return go("skinny_stream+rms_norm", skinny_stream_kernel<kFp8, 1, SkinnyPrologue::kRmsNorm, DEPTH>,
              prologue_bytes(p));
  if (pro == SkinnyPrologue::kSiluMul)
    return go("skinny_stream+silu_mul", skinny_stream_kernel<kFp8, 1, SkinnyPrologue::kSiluMul, DEPTH>,
              prologue_bytes(p));
  switch ((p.n + 7) / 8) {
    case 1:
      return go("skinny_stream", skinny_stream_kernel<kFp8, 1, kN, DEPTH>, 0);
    case 2:
      return go("skinny_stream", skinny_stream_kernel<kFp8, 2, kN, DEPTH>, 0);
    case 3:
      return go("skinny_stream", skinny_stream_kernel<kFp8, 3, kN, DEPTH>, 0);
    default:
      return go("skinny_stream", skinny_stream_kernel<kFp8, 4, kN, DEPTH>, 0);
  }
}

}  // namespace

// Chunks in flight per warp (BF16 chunks are 4 KiB per warp, FP8 chunks 2 KiB): BF16 2 or 3,
// FP8 4 or 6.
template <bool kFp8>
void launch_stream(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro, int depth, int split) {
  if constexpr (kFp8) {
    if (depth <= 4) return launch_stream_depth<true, 4>(ctx, p, pro, split);
    return launch_stream_depth<true, 6>(ctx, p, pro, split);
  } else {
    if (depth <= 2) return launch_stream_depth<false, 2>(ctx, p, pro, split);
    return launch_stream_depth<false, 3>(ctx, p, pro, split);
  }
}

template void launch_stream<true>(const LaunchContext&, const SkinnyParams&, SkinnyPrologue::Kind, int, int);
template void launch_stream<false>(const LaunchContext&, const SkinnyParams&, SkinnyPrologue::Kind, int, int);

}  // namespace qvl::cuda::skinny
