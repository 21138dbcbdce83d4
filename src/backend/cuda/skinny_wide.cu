// The decode Linear's wide kernel for FP8 weights and several rows (batched decode and short
// prompts: up to kSkinnyWideMaxRows tokens; skinny_common.cuh for the shared numerics), sm_90+
// (thread-block clusters). Where skinny.cu chooses it: wide_by_default there.
//
// Why another layout. The one-tile kernel gives each block 16 weight rows and all of K: at 32
// rows its 8 warps carry 4 token tiles each (154 registers, one block per multiprocessor), every
// block reads the whole of x from L1 / L2 for 32 KB of weights, and blocks run one after another
// with nothing in flight between them. ncu, 2B FP8 at 32 rows (H100): 0.5-0.9 TB/s, 2 warps per
// scheduler, 0.26-0.30 instructions issued per cycle.
//
// Here a block owns 128 weight rows (one FP8 scale block; warp w takes rows 16w..16w+15) and a
// K slice of whole 128-column chunks. Chunks stream through a ring of kWideStages stages of
// shared memory by cp.async, each stage holding the chunk's weights (16 KiB), its x columns
// (n x 128 BF16, read by all 8 warps: the block reads x once per 128 rows, not per 16) and its
// block scales; the weights of the first stages are issued before the PDL wait. The splits of
// one 128-row tile are one cluster (at most 8 blocks): each block leaves its fp32 partial tile in
// shared memory, and block r adds rows [r * 128 / splits, ...) of every split in split order
// through distributed shared memory and stores them (fixed order: deterministic).
//
// Each warp's math is the one-tile kernel's (K permuted inside each 64-column step so that a
// lane's 16 consecutive bytes of weights and 16 consecutive x values make its mma fragments),
// with both operands read from shared memory. Weight rows are stored with their 16-byte pieces
// rotated by 4 on odd rows, and x rows with pieces swapped in pairs on odd rows: the 8 lanes of
// a 16-byte load phase (rows g, g + 1) then hit 8 different bank groups.
#include "backend/cuda/skinny_common.cuh"

namespace qvl::cuda::skinny {
namespace {

constexpr int kWideWarps = 8;
constexpr int kWideThreads = kWideWarps * 32;
constexpr int kWideRows = kWideWarps * kRows;  // 128 weight rows per block
constexpr int kWideStages = 4;
constexpr int kMaxSplits = 8;  // the portable cluster size
static_assert(kWideRows == 1 << kChunkShift, "a block's rows are one 128-row scale block");

constexpr int kMaxTokenTiles = kSkinnyWideMaxRows / 8;

// Dynamic shared memory of a launch with nt 8-token tiles (WideLayout<nt>::kBytes), and over n rows.
constexpr int wide_bytes_nt(int nt) {
  return kWideStages * (kWideRows * kChunk + nt * 8 * kChunk * 2 + kWideRows * 4);
}
constexpr int wide_bytes(int64_t n) {
  return wide_bytes_nt(static_cast<int>((n + 7) / 8));
}

template <int NT>
struct WideLayout {
  static constexpr int kTokens = NT * 8;
  static constexpr int kW = kWideRows * kChunk;    // a chunk's FP8 weights
  static constexpr int kX = kTokens * kChunk * 2;  // its x columns, BF16
  static constexpr int kScales = kWideRows * 4;    // its scales (one per row at most)
  static constexpr int kStage = kW + kX + kScales;
  static constexpr int kBytes = kWideStages * kStage;  // dynamic shared memory
  static constexpr int kRedPitch = kWideRows + 4;      // floats per token of the partial tile
  static_assert(kTokens * kRedPitch * 4 <= kBytes, "the partial tile fits over the stages");
  static_assert(kBytes == wide_bytes_nt(NT));
};

// A 16-byte shared-memory load the compiler may schedule (an ordinary load, not volatile asm: the
// next step's operands are fetched while this step's mmas run).
__device__ __forceinline__ uint4 lds128(const char* base, uint32_t offset) {
  return *reinterpret_cast<const uint4*>(base + offset);
}
// Byte offset of 16-byte piece pc of weight row r (128 bytes) / of x row j (256 bytes) in a stage.
__device__ __forceinline__ uint32_t w_piece(int r, int pc) {
  return static_cast<uint32_t>(r * kChunk + ((pc ^ ((r & 1) << 2)) << 4));
}
__device__ __forceinline__ uint32_t x_piece(int j, int pc) {
  return static_cast<uint32_t>(j * kChunk * 2 + ((pc ^ (j & 1)) << 4));
}

// Block (tile, split) = blockIdx.x / splits, % splits; the cluster is the tile's `splits` blocks,
// rank = split. Split s takes chunks [s * per_split, (s + 1) * per_split) of K (possibly none).
template <int NT>
__global__ void __launch_bounds__(kWideThreads, NT <= 4 ? 2 : 1)
    wide_fp8_kernel(const SkinnyParams p, int splits, int per_split) {
  if constexpr (kDeviceHasClusters) {
    using L = WideLayout<NT>;
    extern __shared__ __align__(128) char wide_smem[];
    const int tid = static_cast<int>(threadIdx.x);
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int tile = static_cast<int>(blockIdx.x) / splits, split = static_cast<int>(blockIdx.x) % splits;
    const int row0 = tile * kWideRows;
    const int nchunks = (p.K + kChunk - 1) / kChunk;
    const int c0 = split * per_split;
    const int nc = max(0, min(nchunks, c0 + per_split) - c0);
    const bool row_scales = p.scale_row_shift == 0;
    const char* wbase = static_cast<const char*>(p.w);

    // This thread's copies, the same for every chunk but for the chunk's columns: four 16-byte
    // pieces of weight rows (row q / 8, piece q % 8) and up to four of x (token q / 16, piece q % 16),
    // q = tid + m · kWideThreads. Since kWideThreads is a multiple of 16, the piece (so the
    // column offset inside a chunk) is the thread's own for every m: wk and xk.
    static_assert(kWideThreads % 16 == 0, "a thread copies the same piece of every row");
    constexpr int kWPieces = kWideRows * 8 / kWideThreads;
    const int wk = (tid & 7) * 16, xk = (tid & 15) * 8;  // column of the piece in the chunk
    const char* wsrc[kWPieces];
    uint32_t wdst[kWPieces];
#pragma unroll
    for (int m = 0; m < kWPieces; ++m) {
      const int r = (tid + m * kWideThreads) >> 3;
      wsrc[m] = wbase + static_cast<int64_t>(min(row0 + r, p.N - 1)) * p.K + wk;
      wdst[m] = w_piece(r, tid & 7);
    }
    constexpr int kXPieces = (L::kTokens * 16 + kWideThreads - 1) / kWideThreads;
    const bf16* xsrc[kXPieces];
    uint32_t xdst[kXPieces];
#pragma unroll
    for (int m = 0; m < kXPieces; ++m) {
      const int q = tid + m * kWideThreads, j = q >> 4;
      xsrc[m] = q < p.n * 16 ? p.x + static_cast<int64_t>(j) * p.K + xk : nullptr;
      xdst[m] = L::kW + x_piece(j, tid & 15);
    }
    const float* ssrc = p.scale + (static_cast<int64_t>(min(row0 + tid, p.N - 1)) >> p.scale_row_shift) * p.scale_cols;
    const bool copies_scale = tid < (row_scales ? kWideRows : 1);

    // Chunk i of this split: weights and scales (never written by a kernel: before the wait) ...
    auto issue_w = [&](int i) {
      char* st = wide_smem + (i % kWideStages) * L::kStage;
      const int c = c0 + i, k0 = c * kChunk;
#pragma unroll
      for (int m = 0; m < kWPieces; ++m) {
        const bool ok = k0 + wk < p.K;  // only a short last chunk has pieces past K
        cp_async16(st + wdst[m], ok ? wsrc[m] + k0 : wsrc[m], ok);
      }
      if (copies_scale) cp_async4(st + L::kW + L::kX + tid * 4, ssrc + c);
    };
    // ... and its x columns (after the wait).
    auto issue_x = [&](int i) {
      char* st = wide_smem + (i % kWideStages) * L::kStage;
      const int k0 = (c0 + i) * kChunk;
#pragma unroll
      for (int m = 0; m < kXPieces; ++m) {
        if (xsrc[m] == nullptr) continue;
        const bool ok = k0 + xk < p.K;
        cp_async16(st + xdst[m], ok ? xsrc[m] + k0 : xsrc[m], ok);
      }
    };

    // Group i of the cp.async groups holds chunk i's x (and, for the first stages, every
    // pre-wait weight copy); exactly kWideStages groups before the loop, one per iteration.
#pragma unroll
    for (int i = 0; i < kWideStages; ++i)
      if (i < nc) issue_w(i);
    grid_dep_wait();
    grid_dep_launch();
#pragma unroll
    for (int i = 0; i < kWideStages; ++i) {
      if (i < nc) issue_x(i);
      cp_async_commit();
    }

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    const int ra = warp * kRows + g, rb = ra + 8;
    // The lane's shared-memory offsets within a stage: weights of rows ra, rb and x of token g
    // (token tile j adds j * 8 rows of x: the same parity) for steps s = 0, 1.
    uint32_t wa_off[2], wb_off[2], x_off[2][2];
#pragma unroll
    for (int s2 = 0; s2 < 2; ++s2) {
      wa_off[s2] = w_piece(ra, s2 * 4 + t);
      wb_off[s2] = w_piece(rb, s2 * 4 + t);
      x_off[s2][0] = L::kW + x_piece(g, s2 * 8 + 2 * t);
      x_off[s2][1] = L::kW + x_piece(g, s2 * 8 + 2 * t + 1);
    }
    for (int i = 0; i < nc; ++i) {
      cp_async_wait<kWideStages - 1>();
      __syncthreads();
      const char* st = wide_smem + (i % kWideStages) * L::kStage;
      float part[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[j][e] = 0.0f;
#pragma unroll
      for (int s = 0; s < 2; ++s) {  // 64-column steps: a lane's 16 bytes of rows ra, rb
        const uint4 w0 = lds128(st, wa_off[s]), w1 = lds128(st, wb_off[s]);
        uint32_t wa[8], wb[8];
        widen_fp8_rows(w0, w1, wa, wb);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint32_t jo = static_cast<uint32_t>(j * 8 * kChunk * 2);
          const uint4 x0 = lds128(st, x_off[s][0] + jo), x1 = lds128(st, x_off[s][1] + jo);
          // mma h covers physical columns 4h..4h+3 of the lane's 16 (chunk_mma's order).
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            const uint4& xq = h < 2 ? x0 : x1;
            mma_bf16(part[j], wa[2 * h], wb[2 * h], wa[2 * h + 1], wb[2 * h + 1], word(xq, (h & 1) * 2),
                     word(xq, (h & 1) * 2 + 1));
          }
        }
      }
      const float* sc = reinterpret_cast<const float*>(st + L::kW + L::kX);
      accumulate_scaled(acc, part, sc[row_scales ? ra : 0], sc[row_scales ? rb : 0]);
      __syncthreads();  // every warp is done with the stage before it is refilled
      if (i + kWideStages < nc) {
        issue_w(i + kWideStages);
        issue_x(i + kWideStages);
      }
      cp_async_commit();
    }

    if (splits == 1) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row0 + ra + (e >> 1) * 8, tok = j * 8 + 2 * t + (e & 1);
          if (row < p.N && tok < p.n) store_out(p, row, tok, acc[j][e]);
        }
      return;
    }
    // The split's partial tile over the idle stages ([token][row]), then the cluster's sum.
    cp_async_wait<0>();  // only empty groups can be pending; no copy may land after this
    float* red = reinterpret_cast<float*>(wide_smem);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(j * 8 + 2 * t + (e & 1)) * L::kRedPitch + ra + (e >> 1) * 8] = acc[j][e];
    cluster_barrier();
    const int per_rank = kWideRows / splits;
    for (int q = tid; q < per_rank * p.n; q += kWideThreads) {
      const int tok = q / per_rank, r = split * per_rank + q % per_rank;
      const float* mine = red + tok * L::kRedPitch + r;
      float v = 0.0f;
      for (int k = 0; k < splits; ++k) v += *cluster_peer(mine, static_cast<unsigned>(k));
      if (row0 + r < p.N) store_out(p, row0 + r, tok, v);
    }
    cluster_barrier();  // peers read this block's tile until here
  }
}

template <int NT>
void launch_wide_nt(const LaunchContext& ctx, const SkinnyParams& p, int splits, int per_split) {
  const unsigned tiles = static_cast<unsigned>(ceil_div(p.N, kWideRows));
  launch_clustered(ctx, "skinny_wide", static_cast<unsigned>(splits), wide_fp8_kernel<NT>,
                   dim3(tiles * static_cast<unsigned>(splits)), dim3(kWideThreads),
                   static_cast<size_t>(WideLayout<NT>::kBytes), p, splits, per_split);
}

// The kernels of NT.. token tiles take their shared memory while it fits ring_smem (it grows with NT).
template <int NT = 1>
void allow_wide_smem(int ring_smem) {
  if (WideLayout<NT>::kBytes > ring_smem) return;
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(wide_fp8_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, WideLayout<NT>::kBytes));
  if constexpr (NT < kMaxTokenTiles) allow_wide_smem<NT + 1>(ring_smem);
}

// The launch for p.n rows: the kernel of the fewest token tiles that hold them.
template <int NT = 1>
void launch_wide_tiles(const LaunchContext& ctx, const SkinnyParams& p, int splits, int per_split) {
  if constexpr (NT < kMaxTokenTiles) {
    if (p.n > NT * 8) return launch_wide_tiles<NT + 1>(ctx, p, splits, per_split);
  }
  launch_wide_nt<NT>(ctx, p, splits, per_split);
}

}  // namespace

void configure_wide(int ring_smem) {
  if (ring_smem >= WideLayout<4>::kBytes) allow_wide_smem(ring_smem);
}

// Up to 32 rows wherever 4 token tiles fit (configure_wide's condition), more where their tiles do.
bool wide_available(const LaunchContext& ctx, int64_t n) {
  return ctx.clusters && n >= 1 && n <= kSkinnyWideMaxRows &&
         ctx.ring_smem >= wide_bytes(std::max<int64_t>(n, kSkinnyMaxRows));
}

bool wide_tall(const LaunchContext& ctx, int64_t N) {
  return int64_t{ceil_div(N, kWideRows)} * 2 >= ctx.num_sms;
}

int wide_splits(const LaunchContext& ctx, int64_t N, int64_t K, int forced) {
  const int64_t tiles = ceil_div(N, kWideRows);
  const int nchunks = static_cast<int>(ceil_div(K, kChunk));
  if (forced > 0) return std::min(forced, kMaxSplits);
  // Tall Linears: one block per 128-row tile (at least two per multiprocessor already; two splits
  // measured slower: 2B gate_up at 32 rows 20.0 against 23.3 us). Else the fewest splits (a power
  // of two, at most 8 and at most the chunks) that give every multiprocessor a block.
  if (wide_tall(ctx, N)) return 1;
  int s = 1;
  while (s < kMaxSplits && 2 * s <= nchunks && tiles * s < ctx.num_sms) s *= 2;
  return s;
}

void launch_wide(const LaunchContext& ctx, const SkinnyParams& p, int splits) {
  QVL_CHECK(wide_available(ctx, p.n)) << "skinny_wide: " << p.n << " rows need thread-block clusters and "
                                      << wide_bytes(p.n) << " bytes of shared memory per block";
  QVL_CHECK(splits >= 1 && splits <= kMaxSplits && (splits & (splits - 1)) == 0) << "skinny_wide splits " << splits;
  QVL_CHECK(p.K % 16 == 0) << "skinny_wide: K " << p.K;
  const int nchunks = static_cast<int>(ceil_div(p.K, kChunk));
  const int per_split = (nchunks + splits - 1) / splits;
  launch_wide_tiles(ctx, p, splits, per_split);
}

}  // namespace qvl::cuda::skinny
