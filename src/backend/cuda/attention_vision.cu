// Vision attention: non-causal softmax(q·kᵀ·scale)·v inside each segment (one per image or
// temporal slice) of packed qkv [N, 3·nh·dh], through the flash core (flash.cuh) with 128
// query rows per block. Head dims 64 and 72 (Qwen3-VL 2B/4B and 8B) have fast kernels; other
// head dims use the generic kernel (attention_generic.cu). Blocks find their segment by
// walking cu_seqlens on the device; the grid is sized from the host copy of it.
//
// On sm_90+ each query tile's keys are split over a cluster of kVisionSplit blocks (flash.cuh):
// 2B's 3072-patch image is 24 tiles x 16 heads = 384 blocks, two waves on an H100's 132 x 2
// slots with the second 45% full; split in two, 768 half-length blocks fill ~2.9 waves.
#include "backend/cuda/flash.cuh"

namespace qvl::cuda {
namespace {

// 128 query rows per block, as 4 warps of two 16-row m-tiles (every K/V fragment read from
// shared memory feeds two mmas; the default) or 8 warps of one (LaunchContext::vision_mt = 1,
// for A/B: CUDA_PERF_NOTES.md).
constexpr int kBM = 128;
template <int MT>
constexpr int kVisionWarps = kBM / (16 * MT);
constexpr int kVisionSplit = 2;

template <int HD>
struct SegmentPolicy {
  struct Params {
    const bf16* qkv;
    bf16* out;
    const int32_t* cu;
    int num_segments;
    int heads;
  };
  __device__ static bool locate(const Params& p, int idx, flash::Tile& t) {
    for (int s = 0; s < p.num_segments; ++s) {
      const int begin = p.cu[s], len = p.cu[s + 1] - begin;
      const int tiles = (len + kBM - 1) / kBM;
      if (idx < tiles) {
        t.head = blockIdx.y;
        t.qn = min(kBM, len - idx * kBM);
        t.kn = len;
        t.a = begin + idx * kBM;  // first query row
        t.b = begin;              // first key row
        return true;
      }
      idx -= tiles;
    }
    return false;
  }
  __device__ static int64_t ld(const Params& p) { return 3LL * p.heads * HD; }
  __device__ static const bf16* q_row(const Params& p, const flash::Tile& t, int i) {
    return p.qkv + (t.a + i) * ld(p) + t.head * HD;
  }
  __device__ static const bf16* k_row(const Params& p, const flash::Tile& t, int j) {
    return p.qkv + (t.b + j) * ld(p) + static_cast<int64_t>(p.heads + t.head) * HD;
  }
  // V of key j sits nh·dh columns after its K.
  __device__ static int64_t kv_delta(const Params& p, const flash::Tile&) { return static_cast<int64_t>(p.heads) * HD; }
  __device__ static bf16* o_row(const Params& p, const flash::Tile& t, int i) {
    return p.out + (t.a + i) * static_cast<int64_t>(p.heads) * HD + t.head * HD;
  }
};

// QK: Q through the two K stages (flash.cuh), a third less shared memory: 37.9 KB (the cluster
// split's partial; the tiles take 36.9) where 55.3 were at head dim 64, 45.1 where 67.6 were at 72.
template <int HD, int SPLIT, int MT, bool QK>
constexpr auto kernel() {
  return flash::flash_kernel<HD, kVisionWarps<MT>, SegmentPolicy<HD>, 2, SPLIT, MT, false, QK>;
}
template <int HD, int MT, bool QK>
constexpr size_t smem_bytes() {
  return flash::smem_bytes<HD, kVisionWarps<MT>, MT, false, false, QK>();
}

template <int HD, int MT, bool QK>
void run_mt(const LaunchContext& ctx, const typename SegmentPolicy<HD>::Params& prm, unsigned tiles, float scale) {
  constexpr size_t smem = smem_bytes<HD, MT, QK>();
  const float scale_log2 = scale * 1.4426950408889634f;
  if (ctx.clusters) {
    launch_clustered(ctx, "vision_attention", kVisionSplit, kernel<HD, kVisionSplit, MT, QK>(),
                     dim3(tiles * kVisionSplit, prm.heads), dim3(kVisionWarps<MT> * 32), smem, prm, scale_log2);
  } else {
    launch(ctx, "vision_attention", kernel<HD, 1, MT, QK>(), dim3(tiles, prm.heads), dim3(kVisionWarps<MT> * 32), smem,
           prm, scale_log2);
  }
}

template <int HD>
void run(const LaunchContext& ctx, const typename SegmentPolicy<HD>::Params& prm, unsigned tiles, float scale) {
  // By default Q takes the K stages where a multiprocessor's shared memory holds one block of the
  // other layout but two of this one (100 KB: sm_86 / 89 / 120), so 8 warps share it, not 4.
  const bool qk = take_compact_layout(ctx.vision_q_through_k, ctx.smem_per_sm, smem_bytes<HD, 2, false>(),
                                      smem_bytes<HD, 2, true>());
  if (ctx.vision_mt == 1)
    qk ? run_mt<HD, 1, true>(ctx, prm, tiles, scale) : run_mt<HD, 1, false>(ctx, prm, tiles, scale);
  else
    qk ? run_mt<HD, 2, true>(ctx, prm, tiles, scale) : run_mt<HD, 2, false>(ctx, prm, tiles, scale);
}

template <int HD, int MT, bool QK>
void configure_mt() {
  constexpr int smem = static_cast<int>(smem_bytes<HD, MT, QK>());
  QVL_CUDA_CHECK(cudaFuncSetAttribute(kernel<HD, 1, MT, QK>(), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(kernel<HD, kVisionSplit, MT, QK>(), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

template <int HD>
void configure() {
  configure_mt<HD, 1, false>();
  configure_mt<HD, 2, false>();
  configure_mt<HD, 1, true>();
  configure_mt<HD, 2, true>();
}

}  // namespace

void launch_vision_attention_generic(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                                     int num_heads, int head_dim, float scale);

void configure_vision_attention() {
  configure<64>();
  configure<72>();
}

void launch_vision_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                             int num_heads, int head_dim, float scale) {
  QVL_CHECK(out.dtype == DType::kBF16 && qkv.dtype == DType::kBF16) << out.describe() << ", " << qkv.describe();
  QVL_CHECK_EQ(qkv.row_numel(), 3LL * num_heads * head_dim);
  QVL_CHECK_EQ(out.row_numel(), 1LL * num_heads * head_dim);
  QVL_CHECK_EQ(out.dim(0), qkv.dim(0));
  QVL_CHECK(seg.cu_seqlens.dtype == DType::kI32 &&
            seg.cu_seqlens.numel() == static_cast<int64_t>(seg.host_cu_seqlens.size()))
      << "cu_seqlens " << seg.cu_seqlens.describe() << " vs " << seg.host_cu_seqlens.size() << " host values";
  QVL_CHECK_GE(seg.host_cu_seqlens.size(), 1u);
  QVL_CHECK_EQ(seg.host_cu_seqlens.front(), 0);
  QVL_CHECK_EQ(seg.host_cu_seqlens.back(), qkv.dim(0));
  unsigned tiles = 0;
  for (size_t s = 0; s + 1 < seg.host_cu_seqlens.size(); ++s) {
    const int len = seg.host_cu_seqlens[s + 1] - seg.host_cu_seqlens[s];
    QVL_CHECK_GE(len, 0) << "segment " << s;
    tiles += ceil_div(len, kBM);
  }
  if (launch_vision_attention_wgmma(ctx, out, qkv, seg, num_heads, head_dim, scale)) return;
  if (head_dim != 64 && head_dim != 72) {
    launch_vision_attention_generic(ctx, out, qkv, seg, num_heads, head_dim, scale);
    return;
  }
  const int nseg = static_cast<int>(seg.host_cu_seqlens.size()) - 1;
  if (head_dim == 64) {
    run<64>(ctx, {qkv.as<bf16>(), out.as<bf16>(), seg.cu_seqlens.as<int32_t>(), nseg, num_heads}, tiles, scale);
  } else {
    run<72>(ctx, {qkv.as<bf16>(), out.as<bf16>(), seg.cu_seqlens.as<int32_t>(), nseg, num_heads}, tiles, scale);
  }
}

}  // namespace qvl::cuda
