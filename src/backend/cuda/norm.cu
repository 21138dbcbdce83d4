// RMSNorm and LayerNorm over the last dimension. Rows up to 4096 wide (multiples of 8): one warp
// per row, the row held in registers as packed BF16 between the statistics (warp shuffles, no
// barrier) and the output pass, 4 or 8 rows per block. Rows up to 8192 wide: one block per row, the
// same in registers across 128 threads. Other widths take a two-pass scalar path. Numerics follow
// the reference:
//   RMSNorm   out = bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))   (normalise, round, then weight)
//   LayerNorm out = bf16((x - mean) * rsqrt(var + eps) * w + b)    (fp32 throughout, biased var)
#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda {
namespace {

constexpr int kNormThreads = 128;
constexpr int kMaxVecPerThread = 8;  // 128 threads x 8 vectors x 8 = 8192 elements

__device__ float block_sum(float v, float* shared) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // `shared` may still be read from a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  const int warps = blockDim.x >> 5;
  for (int i = 0; i < warps; ++i) total += shared[i];
  return total;
}

template <typename W>
__device__ __forceinline__ float load_w(const W* w, int64_t i) {
  return static_cast<float>(w[i]);
}
// 8 consecutive weights from index i (i % 8 == 0) as floats: two float4 or one 16-byte BF16 load.
__device__ __forceinline__ void load_w8(const float* w, int64_t i, float (&f)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(w + i)), b = __ldg(reinterpret_cast<const float4*>(w + i + 4));
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load_w8(const bf16* w, int64_t i, float (&f)[8]) {
  unpack8(__ldg(reinterpret_cast<const uint4*>(w + i)), f);
}

template <typename W, bool kLayer>
__global__ void __launch_bounds__(kNormThreads)
    norm_vec_kernel(bf16* out, const bf16* x, const W* weight, const W* bias, int64_t dim, float eps) {
  __shared__ float shared[kNormThreads / 32];
  grid_dep_wait();
  grid_dep_launch();
  const int64_t row = blockIdx.x;
  const uint4* x4 = reinterpret_cast<const uint4*>(x + row * dim);
  const int nvec = static_cast<int>(dim / 8);
  float v[kMaxVecPerThread][8];
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int vi = threadIdx.x + i * kNormThreads;
    if (vi < nvec) unpack8(x4[vi], v[i]);
  }
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int vi = threadIdx.x + i * kNormThreads;
    if (vi < nvec) {
#pragma unroll
      for (int e = 0; e < 8; ++e) s += kLayer ? v[i][e] : v[i][e] * v[i][e];
    }
  }
  const float total = block_sum(s, shared);
  float mean = 0.0f, rstd;
  if (kLayer) {
    mean = total / static_cast<float>(dim);
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxVecPerThread; ++i) {
      const int vi = threadIdx.x + i * kNormThreads;
      if (vi < nvec) {
#pragma unroll
        for (int e = 0; e < 8; ++e) q += (v[i][e] - mean) * (v[i][e] - mean);
      }
    }
    rstd = rsqrtf(block_sum(q, shared) / static_cast<float>(dim) + eps);
  } else {
    rstd = rsqrtf(total / static_cast<float>(dim) + eps);
  }
  uint4* o4 = reinterpret_cast<uint4*>(out + row * dim);
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int vi = threadIdx.x + i * kNormThreads;
    if (vi < nvec) {
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t c = static_cast<int64_t>(vi) * 8 + e;
        if (kLayer) {
          o[e] = (v[i][e] - mean) * rstd * load_w(weight, c) + load_w(bias, c);
        } else {
          o[e] = load_w(weight, c) * bf16_round(v[i][e] * rstd);
        }
      }
      o4[vi] = pack8(o);
    }
  }
}

// One warp per row: lane l holds vectors l, l + 32, ... (VPL of them, 8 BF16 each), RPB rows
// per block: 8, or 4 where 8 would leave multiprocessors without rows (802 rows of 2B's
// prefill: 101 blocks of 8 left 31 of an H100's 132 idle; 6.3 against 8.3 us with 4). With 4
// rows per block (fewer blocks than the multiprocessors hold) rows up to 2048 wide (VPL <= 8)
// read their weights (and bias) before the PDL wait, since they do not depend on the previous
// kernel; with 8 the registers that takes would cost occupancy (the vision encoder's 3072 rows
// took 8.5-8.7 us that way against 8.0).
template <typename W, bool kLayer, int VPL, int RPB>
__global__ void __launch_bounds__(RPB * 32)
    norm_warp_kernel(bf16* out, const bf16* x, const W* weight, const W* bias, int64_t rows, int64_t dim, float eps) {
  constexpr bool kPre = VPL <= 8 && RPB == 4;
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * static_cast<int64_t>(RPB) + (threadIdx.x >> 5);
  const int nvec = static_cast<int>(dim / 8);
  float w[kPre ? VPL : 1][8], b[kPre && kLayer ? VPL : 1][8];
  if constexpr (kPre) {
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int vi = lane + 32 * i;
      if (vi < nvec) {
        load_w8(weight, vi * 8, w[i]);
        if constexpr (kLayer) load_w8(bias, vi * 8, b[i]);
      }
    }
  }
  grid_dep_wait();
  grid_dep_launch();
  if (row >= rows) return;
  const uint4* x4 = reinterpret_cast<const uint4*>(x + row * dim);
  uint4 raw[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int vi = lane + 32 * i;
    raw[i] = vi < nvec ? x4[vi] : make_uint4(0, 0, 0, 0);
  }
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    float v[8];
    unpack8(raw[i], v);
#pragma unroll
    for (int e = 0; e < 8; ++e) s += kLayer ? v[e] : v[e] * v[e];
  }
  const float total = warp_sum(s);
  float mean = 0.0f, rstd;
  if (kLayer) {
    mean = total / static_cast<float>(dim);
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      if (lane + 32 * i < nvec) {
        float v[8];
        unpack8(raw[i], v);
#pragma unroll
        for (int e = 0; e < 8; ++e) q += (v[e] - mean) * (v[e] - mean);
      }
    }
    rstd = rsqrtf(warp_sum(q) / static_cast<float>(dim) + eps);
  } else {
    rstd = rsqrtf(total / static_cast<float>(dim) + eps);
  }
  uint4* o4 = reinterpret_cast<uint4*>(out + row * dim);
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int vi = lane + 32 * i;
    if (vi < nvec) {
      float v[8], wl[8], bl[8], o[8];
      unpack8(raw[i], v);
      if constexpr (kPre) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          wl[e] = w[i][e];
          bl[e] = kLayer ? b[i][e] : 0.0f;
        }
      } else {
        load_w8(weight, vi * 8, wl);
        if (kLayer) load_w8(bias, vi * 8, bl);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e)
        o[e] = kLayer ? (v[e] - mean) * rstd * wl[e] + bl[e] : wl[e] * bf16_round(v[e] * rstd);
      o4[vi] = pack8(o);
    }
  }
}

template <typename W, bool kLayer>
__global__ void __launch_bounds__(kNormThreads)
    norm_scalar_kernel(bf16* out, const bf16* x, const W* weight, const W* bias, int64_t dim, float eps) {
  __shared__ float shared[kNormThreads / 32];
  grid_dep_wait();
  grid_dep_launch();
  const bf16* xr = x + blockIdx.x * dim;
  bf16* orow = out + blockIdx.x * dim;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) {
    const float v = __bfloat162float(xr[c]);
    s += kLayer ? v : v * v;
  }
  const float total = block_sum(s, shared);
  float mean = 0.0f, rstd;
  if (kLayer) {
    mean = total / static_cast<float>(dim);
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) {
      const float d = __bfloat162float(xr[c]) - mean;
      q += d * d;
    }
    rstd = rsqrtf(block_sum(q, shared) / static_cast<float>(dim) + eps);
  } else {
    rstd = rsqrtf(total / static_cast<float>(dim) + eps);
  }
  // All reads of xr precede this barrier, so out may alias x.
  __syncthreads();
  for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) {
    const float v = __bfloat162float(xr[c]);
    const float o =
        kLayer ? (v - mean) * rstd * load_w(weight, c) + load_w(bias, c) : load_w(weight, c) * bf16_round(v * rstd);
    orow[c] = __float2bfloat16_rn(o);
  }
}

template <bool kLayer>
void run_norm(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias,
              float eps) {
  QVL_CHECK(out.dtype == DType::kBF16 && x.dtype == DType::kBF16)
      << "norm: out " << out.describe() << ", x " << x.describe();
  QVL_CHECK(out.same_shape(x)) << out.describe() << " vs " << x.describe();
  const int64_t dim = x.dim(-1);
  QVL_CHECK_EQ(weight.numel(), dim);
  if (kLayer) {
    QVL_CHECK_EQ(bias.numel(), dim);
    QVL_CHECK(bias.dtype == weight.dtype) << "layer_norm weight " << weight.describe() << ", bias " << bias.describe();
  }
  const unsigned rows = static_cast<unsigned>(x.numel() / dim);
  const bool vec = dim % 8 == 0 && dim <= static_cast<int64_t>(kNormThreads) * kMaxVecPerThread * 8;
  auto go = [&](auto tag) {
    using W = decltype(tag);
    const W* w = weight.as<W>();
    const W* b = kLayer ? bias.as<W>() : nullptr;
    const int64_t nvec = dim / 8;
    if (vec && nvec <= 32 * 16) {
      const char* name = kLayer ? "layer_norm" : "rms_norm";
      // 8 rows per block when that still gives every multiprocessor two blocks.
      const bool eight = rows >= 8u * 2u * static_cast<unsigned>(ctx.num_sms);
      auto run = [&](auto kernel, int rpb) {
        launch(ctx, name, kernel, dim3(ceil_div(rows, static_cast<unsigned>(rpb))), dim3(rpb * 32), 0, out.as<bf16>(),
               x.as<bf16>(), w, b, int64_t{rows}, dim, eps);
      };
      if (nvec <= 32 * 4)
        eight ? run(norm_warp_kernel<W, kLayer, 4, 8>, 8) : run(norm_warp_kernel<W, kLayer, 4, 4>, 4);
      else if (nvec <= 32 * 8)
        eight ? run(norm_warp_kernel<W, kLayer, 8, 8>, 8) : run(norm_warp_kernel<W, kLayer, 8, 4>, 4);
      else
        eight ? run(norm_warp_kernel<W, kLayer, 16, 8>, 8) : run(norm_warp_kernel<W, kLayer, 16, 4>, 4);
    } else if (vec) {
      launch(ctx, kLayer ? "layer_norm" : "rms_norm", norm_vec_kernel<W, kLayer>, dim3(rows), dim3(kNormThreads), 0,
             out.as<bf16>(), x.as<bf16>(), w, b, dim, eps);
    } else {
      launch(ctx, kLayer ? "layer_norm" : "rms_norm", norm_scalar_kernel<W, kLayer>, dim3(rows), dim3(kNormThreads), 0,
             out.as<bf16>(), x.as<bf16>(), w, b, dim, eps);
    }
  };
  if (weight.dtype == DType::kBF16) {
    go(bf16{});
  } else {
    QVL_CHECK(weight.dtype == DType::kF32) << "norm weight " << weight.describe();
    go(float{});
  }
}

}  // namespace

void launch_rms_norm(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, float eps) {
  run_norm<false>(ctx, out, x, weight, Tensor(), eps);
}

void launch_layer_norm(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       float eps) {
  run_norm<true>(ctx, out, x, weight, bias, eps);
}

}  // namespace qvl::cuda
