// Vision attention at head dim 64 (Qwen3-VL 2B / 4B) on sm_90 with warpgroup MMA, in the scheme
// of FlashAttention-3: one thread of a producer warpgroup moves Q, K and V tiles into shared
// memory with the tensor memory accelerator (TMA), and three consumer warpgroups of 64 query rows
// each run S = Q·Kᵀ and O += P·V as asynchronous wgmma, the softmax of one key tile overlapping
// the tensor cores' P·V of the previous one.
//
// Per block: one head, BM = 192 query rows of one segment, key tiles of BN = 128 rows through a
// ring of kStages (K, V) stages with full / empty mbarriers. A TMA box is 128 rows x 64 columns
// (128 bytes) of the packed qkv [N, 3·nh·64], written in the 128-byte swizzle that the wgmma
// descriptors read (K-major for Q and K; V as the transposed, N-major B operand). Rows past N come
// in as zeros; keys past the segment's end are masked, and query rows past it are computed and
// not stored.
//
// The consumer loop (wgmma.cuh consumer_loop), per key tile j ≥ 1 (FA3's intra-warpgroup overlap):
//   issue S = Q·K_jᵀ; issue O += P_{j-1}·V_{j-1}; wait for S; softmax of S in place (new running
//   max m, rescale factor alpha, row sums l); wait for P·V; release the stage of tile j - 1;
//   O *= alpha; P = bf16(S).
// P is the register A operand (the S accumulator layout of two 8-column tiles is the A layout of
// one 16-key step, as in flash.cuh). The softmax is flash.cuh's: log2 domain, p = exp2(s·scale -
// m) by one FFMA and one EX2, P rounded to BF16, O and l in fp32, O / l at the end.
//
// 2B's image of 3072 patches on an H100 (tools/bench/CUDA_PERF_NOTES.md): 92 us per layer against
// 169 for the mma.sync flash kernel. Two consumer warpgroups (BM = 128, 384 blocks) took 98 us;
// two stages instead of three +25%, four the same; FA3's ping-pong between two warpgroups, S
// double-buffered, a tree of partial maxima and sums, and a cubic exp2 on the FMA pipe for some of
// the elements were each no better or within the run-to-run spread.
//
// Head dim 72 (Qwen3-VL 8B) runs the same kernel on the first 64 columns of every head and adds
// the last 8 beside them: a second, unswizzled tensor map brings columns 64..71 of Q, K and V in
// boxes of 128 rows x 16 bytes. S takes them as a fifth k16 step of its wgmma, in the unswizzled
// K-major layout (8-row core matrices 128 bytes apart), whose second 8 columns are a zeroed 2 KB
// region (the descriptor's leading offset points there). O[:, 64:72] accumulates P·V[:, 64:72]
// by mma.sync on each consumer warp's own 16 rows while the wgmmas run: 8 m16n8k16 per tile with
// P's registers as the A operand (the register A layout of the wgmma is mma.m16n8k16's) and V's
// columns through ldmatrix.trans; the accumulator is then rescaled with O. 8B's image on an H200:
// 111 us per layer against 178 for the mma.sync flash kernel (bench/RESULTS.md run 43); the same
// tail by 16 mma.sync m16n8k8 per warp between S and the softmax took 126 us.
//
// Needs sm_90a (wgmma, setmaxnreg): this file is built on its own with 90a in place of 90; the
// host asks vision_wgmma_available() first. The tensor map comes from the driver
// (cuTensorMapEncodeTiled through cudaGetDriverEntryPoint: qvl still starts without libcuda).
#include <cuda.h>

#include "backend/cuda/wgmma.cuh"

namespace qvl::cuda {
namespace {

using namespace wgmma;  // the warpgroup-MMA helpers (wgmma.cuh)

constexpr int kHD = 64;                     // the columns of a head in the wgmma tiles
constexpr int kCWG = 3;                     // consumer warpgroups of 64 query rows
constexpr int kBM = 64 * kCWG;              // query rows per block
constexpr int kBN = 128;                    // keys per tile
constexpr int kStages = 3;                  // (K, V) stages
constexpr int kThreads = 128 * (1 + kCWG);  // warpgroup 0: producer
constexpr int kTileBytes = kBN * kHD * 2;   // 16 KiB: one TMA box, 128 rows of 128 bytes
constexpr int kQBoxes = (kBM + kBN - 1) / kBN;
using Smem = RingSmem<kQBoxes, kStages, kTileBytes>;
// Head dim 72: columns 64..71 of each tile in boxes of kBN rows x 16 bytes (no swizzle), Q's
// then (K, V) per stage, 1024 bytes past the barriers; then kTailBytes of zeros (S's columns
// 72..79 of Q and K).
constexpr int kTailBytes = kBN * 16;
constexpr int kTailOffset = (kQBoxes + 2 * kStages) * kTileBytes + 1024;
constexpr int kZeroOffset = kTailOffset + (kQBoxes + 2 * kStages) * kTailBytes;
template <int HD>
constexpr int smem_bytes() {  // Q, K/V stages, alignment, barriers (and the tails, the zeros)
  return HD == 64 ? Smem::kBytes : kZeroOffset + kTailBytes + 1024;
}
// Registers per thread after setmaxnreg: 4 x 128 threads at launch get 128 each; the producer
// gives up 104 of them and the consumers take 32 more (65,536 in all).
constexpr int kProducerRegs = 24, kConsumerRegs = 160;
static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kCWG <= 65536, "register file");

struct Params {
  bf16* out;
  const int32_t* cu;
  int num_segments;
  int heads;
  float scale_log2;
};

// The device code exists for sm_90a only (the kernel's body is empty in every other pass).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// S[64 x 128] (+)= Q[64 x 16] · K[128 x 16]ᵀ, both K-major in shared memory.
__device__ __forceinline__ void wgmma_s(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Shared-memory matrix descriptor of an unswizzled K-major tile whose rows are 16 bytes (8
// columns): core matrices of 8 rows x 16 bytes, 128 bytes apart down the rows (stride offset);
// the next 8 columns `lead` bytes from `addr` (leading offset), layout type 0.
__device__ __forceinline__ uint64_t plain_desc(uint32_t addr, uint32_t lead) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lead & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>(128 >> 4) << 32);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// tail: head dim 72's second tensor map (columns 64..71 of every head; unused at 64).
template <int HD>
__global__ void __launch_bounds__(kThreads, 1)
    vision_wgmma_kernel(const __grid_constant__ CUtensorMap map, const __grid_constant__ CUtensorMap tail,
                        const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(HD == 64 || HD == 72, "head dim");
  constexpr bool kTail = HD == 72;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const Smem ring(smem_raw);
  // The tails (kTail): Q's kQBoxes boxes (q_tail), then stage s's K at 2 s and V at 2 s + 1.
  uint8_t* const q_tail = ring.base + kTailOffset;
  if constexpr (kTail) {  // the zeros, visible to the wgmmas (async proxy) once init_ring's barrier passes
    if (threadIdx.x < kTailBytes / 16) {
      *reinterpret_cast<uint4*>(ring.base + kZeroOffset + threadIdx.x * 16) = make_uint4(0, 0, 0, 0);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
  }
  auto k_tail = [&](int st) { return q_tail + (kQBoxes + 2 * st) * kTailBytes; };
  auto v_tail = [&](int st) { return q_tail + (kQBoxes + 2 * st + 1) * kTailBytes; };
  constexpr uint32_t kBoxBytes = kTileBytes + (kTail ? kTailBytes : 0);  // a (main, tail) box pair

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  init_ring(ring.bars(), kStages, 4 * kCWG);

  // This block's segment and query tile (as attention_vision.cu's SegmentPolicy).
  int idx = static_cast<int>(blockIdx.x), q0 = -1, qn = 0, kb = 0, kn = 0;
  for (int s = 0; s < p.num_segments; ++s) {
    const int begin = __ldg(p.cu + s), len = __ldg(p.cu + s + 1) - begin;
    const int tiles = (len + kBM - 1) / kBM;
    if (idx < tiles) {
      q0 = begin + idx * kBM;
      qn = min(kBM, len - idx * kBM);
      kb = begin;
      kn = len;
      break;
    }
    idx -= tiles;
  }
  grid_dep_wait();
  grid_dep_launch();
  if (q0 < 0) return;  // the whole block: no barrier is used past this point by anyone
  const int head = static_cast<int>(blockIdx.y);
  const int tiles = (kn + kBN - 1) / kBN;

  if (warp < 4) {  // producer warpgroup: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (tid == 0) {
      mbar_expect_tx(ring.q_full(), kQBoxes * kBoxBytes);
      for (int b = 0; b < kQBoxes; ++b) {
        tma_load_2d(ring.q() + b * kTileBytes, &map, head * HD, q0 + b * kBN, ring.q_full());
        if constexpr (kTail) tma_load_2d(q_tail + b * kTailBytes, &tail, head * HD + 64, q0 + b * kBN, ring.q_full());
      }
      for (int j = 0; j < tiles; ++j) {
        const int s = j % kStages;
        if (j >= kStages) mbar_wait(&ring.empty()[s], ((j / kStages) - 1) & 1);
        mbar_expect_tx(&ring.full()[s], 2 * kBoxBytes);
        tma_load_2d(ring.k(s), &map, (p.heads + head) * HD, kb + j * kBN, &ring.full()[s]);
        tma_load_2d(ring.v(s), &map, (2 * p.heads + head) * HD, kb + j * kBN, &ring.full()[s]);
        if constexpr (kTail) {
          tma_load_2d(k_tail(s), &tail, (p.heads + head) * HD + 64, kb + j * kBN, &ring.full()[s]);
          tma_load_2d(v_tail(s), &tail, (2 * p.heads + head) * HD + 64, kb + j * kBN, &ring.full()[s]);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));

  const int wg = (warp >> 2) - 1;  // consumer warpgroup: query rows [64 wg, 64 wg + 64)
  const int g = lane >> 2, t = lane & 3;
  const int row0 = wg * 64 + (warp & 3) * 16 + g;  // this thread's rows: row0, row0 + 8
  const float sl = p.scale_log2;
  const uint32_t q_addr = smem_u32(ring.q()) + wg * 64 * 128;

  float o[1][32], s[64];
  uint32_t pk[8][4];
  RowSoftmax<64> sm;
  // kTail: O's columns 64..71, the m16n8 accumulator of the warp's rows.
  float ot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Keys past the segment's end in tile j are masked.
  auto softmax = [&](int j, float(&alpha)[2]) {
    const int limit = kn - j * kBN;  // keys of tile j inside the segment
    auto visible = [&](int i) { return (i >> 2) * 8 + 2 * t + (i & 1) < limit; };
    sm.step(s, sl, limit < kBN, visible, alpha);
    if constexpr (kTail) {
#pragma unroll
      for (int i = 0; i < 4; ++i) ot[i] *= alpha[i >> 1];
    }
  };
#pragma unroll
  for (int i = 0; i < 32; ++i) o[0][i] = 0.0f;

  auto issue_s = [&](int stage) {
    const uint32_t k_addr = smem_u32(ring.k(stage));
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_s(s, sw128_desc(q_addr + ks * 32), sw128_desc(k_addr + ks * 32), ks);
    if constexpr (kTail) {  // columns 64..79: the tails, then the zeros
      const uint32_t qt = smem_u32(q_tail) + wg * 64 * 16, kt = smem_u32(k_tail(stage)),
                     zero = smem_u32(ring.base + kZeroOffset);
      wgmma_s(s, plain_desc(qt, zero - qt), plain_desc(kt, zero - kt), 1);
    }
    wgmma_commit();
  };
  auto issue_o = [&](int stage) {
    const uint32_t v_addr = smem_u32(ring.v(stage));
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_o(o[0], pk[kk], sw128_desc(v_addr + kk * 2048));
    wgmma_commit();
    if constexpr (kTail) {  // O[:, 64:72] += P·V[:, 64:72] while the wgmmas run; rows of keys 16 kk + (lane & 15)
      const uint8_t* vt = v_tail(stage) + (lane & 15) * 16;
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        uint32_t b[2];
        ldmatrix_x2_trans(b, vt + kk * 256);
        mma_m16n8k16(ot, pk[kk], b[0], b[1]);
      }
    }
  };
  mbar_wait(ring.q_full(), 0);
  consumer_loop<kStages>(tiles, ring.full(), ring.empty(), s, o, pk, issue_s, issue_o, softmax);
  consumer_last<kStages>(tiles, ring.empty(), o, pk, issue_o);

  float inv[2];
  sm.finish(inv);
  const int64_t ld = static_cast<int64_t>(p.heads) * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row0 + r * 8 >= qn) continue;
    bf16* out = p.out + (q0 + row0 + r * 8) * ld + head * HD;
    store_o_row(out, o[0], r, inv[r]);
    if constexpr (kTail)
      *reinterpret_cast<bf162*>(out + 64 + 2 * t) = __floats2bfloat162_rn(ot[2 * r] * inv[r], ot[2 * r + 1] * inv[r]);
  }
#endif
}

}  // namespace

void configure_vision_wgmma() {
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(vision_wgmma_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<64>()));
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(vision_wgmma_kernel<72>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<72>()));
}

bool launch_vision_attention_wgmma(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                                   int num_heads, int head_dim, float scale) {
  const int64_t n = qkv.dim(0), width = qkv.row_numel();
  if (!ctx.vision_wgmma || (head_dim != 64 && head_dim != 72) || n <= 0 || n > INT32_MAX ||
      width != 3LL * num_heads * head_dim || reinterpret_cast<uintptr_t>(qkv.data) % 16 != 0)
    return false;
  // The main tiles: 64 columns from each head's first (a head starts 128 or 144 bytes after the
  // last: 16-byte aligned, as TMA needs). Head dim 72: its last 8 columns through `tail`.
  CUtensorMap map, tail;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(width) * sizeof(bf16)};
  const cuuint32_t box[2] = {kHD, kBN};
  if (!encode_sw128(&map, 2, qkv.data, dims, strides, box, "vision attention")) return false;
  tail = map;  // unused at head dim 64
  if (head_dim == 72) {
    const cuuint32_t tail_box[2] = {8, kBN};
    if (!encode_bf16_tiles(&tail, 2, qkv.data, dims, strides, tail_box, false, "vision attention")) return false;
  }
  Params prm{out.as<bf16>(), seg.cu_seqlens.as<int32_t>(), static_cast<int>(seg.host_cu_seqlens.size()) - 1, num_heads,
             scale * 1.4426950408889634f};
  unsigned tiles = 0;
  for (size_t s = 0; s + 1 < seg.host_cu_seqlens.size(); ++s)
    tiles += ceil_div(seg.host_cu_seqlens[s + 1] - seg.host_cu_seqlens[s], kBM);
  const dim3 grid(tiles, static_cast<unsigned>(num_heads));
  if (head_dim == 64)
    launch(ctx, "vision_attention_wgmma", vision_wgmma_kernel<64>, grid, dim3(kThreads),
           static_cast<size_t>(smem_bytes<64>()), map, tail, prm);
  else
    launch(ctx, "vision_attention_wgmma", vision_wgmma_kernel<72>, grid, dim3(kThreads),
           static_cast<size_t>(smem_bytes<72>()), map, tail, prm);
  return true;
}

}  // namespace qvl::cuda
