// Dynamic FP8 quantisation of activations for the W8A8 prefill GEMM (gemm.h Fp8Linear): each
// row of x is cut into groups of kFp8ActGroup columns and every group gets its own fp32 scale,
// as transformers' W8A8 block path (finegrained-fp8's act_quant, DeepSeek-V3's act_quant) does:
//   s = amax(|x|) / 448,   q = e4m3(x / max(s, 1e-12))   (round to nearest even, saturating).
// Both divisions are IEEE (__fdiv_rn), so the host quantisation of the tests reproduces every
// byte; an all-zero group gets s = 0 and q = 0 (the reference's NaN there is zeroed later).
//
// Scales are written where cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F expects them for
// the B operand (the activations): "N-major", the scale of row r and group g at [g * rows + r].
// The GEMM runs on row counts that are multiples of kFp8GemmRowMultiple; the last partial
// multiple is computed by a second GEMM over the last kFp8GemmRowMultiple rows, whose scales the
// same launch also writes into a second, small array.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda {
namespace {

constexpr int kThreads = 256;

// One warp per (row, group): each lane holds 4 consecutive columns (8 bytes of BF16, 4 bytes of
// FP8). K % 16 == 0, so a lane's 4 columns are all inside the row or all past its end.
__global__ void quantize_fp8_rows_kernel(uint8_t* q, float* scales, float* tail_scales, const bf16* x, int64_t rows,
                                         int64_t cols, int groups, int64_t main_rows, int64_t tail_first) {
  grid_dep_wait();
  grid_dep_launch();
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t items = rows * groups;
  for (int64_t item = warp; item < items; item += warps) {
    const int64_t r = item / groups;
    const int g = static_cast<int>(item - r * groups);
    const int64_t c = static_cast<int64_t>(g) * kFp8ActGroup + lane * 4;
    const bool live = c < cols;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const uint2 raw = *reinterpret_cast<const uint2*>(x + r * cols + c);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const bf162*>(&raw.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const bf162*>(&raw.y));
      v[0] = a.x;
      v[1] = a.y;
      v[2] = b.x;
      v[3] = b.y;
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    amax = warp_max(amax);
    const float s = __fdiv_rn(amax, 448.0f);
    const float d = fmaxf(s, 1e-12f);
    if (live) {
      uint32_t packed = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(float_to_fp8_e4m3_dev(__fdiv_rn(v[i], d))) << (8 * i);
      *reinterpret_cast<uint32_t*>(q + r * cols + c) = packed;
    }
    if (lane == 0) {
      if (r < main_rows) scales[static_cast<int64_t>(g) * main_rows + r] = s;
      if (tail_scales != nullptr && r >= tail_first) tail_scales[g * kFp8GemmRowMultiple + (r - tail_first)] = s;
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

void launch_quantize_fp8_rows(const LaunchContext& ctx, void* q, float* scales, int64_t main_rows, float* tail_scales,
                              const Tensor& x) {
  QVL_CHECK(x.dtype == DType::kBF16 && x.ndim == 2 && x.device == Device::kCuda)
      << "quantize_fp8_rows: x must be a 2-D BF16 CUDA tensor, is " << x.describe();
  const int64_t rows = x.dim(0), cols = x.dim(1);
  QVL_CHECK(cols > 0 && cols % 16 == 0) << "quantize_fp8_rows: K = " << cols << " is not a multiple of 16";
  QVL_CHECK(main_rows >= 0 && main_rows <= rows) << "quantize_fp8_rows: " << main_rows << " main rows of " << rows;
  QVL_CHECK(tail_scales == nullptr || rows >= kFp8GemmRowMultiple)
      << "quantize_fp8_rows: a tail of " << kFp8GemmRowMultiple << " rows needs that many, have " << rows;
  // 16 bytes: the kernel's vector accesses, and cuBLASLt's rule for operands and scale arrays.
  QVL_CHECK(aligned16(x.data) && aligned16(q) && aligned16(scales) && aligned16(tail_scales))
      << "quantize_fp8_rows: unaligned x " << x.data << ", q " << q << ", scales " << scales << ", tail "
      << tail_scales;
  if (rows == 0) return;
  const int groups = static_cast<int>((cols + kFp8ActGroup - 1) / kFp8ActGroup);
  const int64_t warps_wanted = rows * groups;
  const int64_t blocks = std::min<int64_t>((warps_wanted * 32 + kThreads - 1) / kThreads, int64_t{ctx.num_sms} * 16);
  launch(ctx, "quantize_fp8_rows", quantize_fp8_rows_kernel, dim3(static_cast<unsigned>(std::max<int64_t>(blocks, 1))),
         dim3(kThreads), 0, static_cast<uint8_t*>(q), scales, tail_scales, x.as<const bf16>(), rows, cols, groups,
         main_rows, rows - kFp8GemmRowMultiple);
}

}  // namespace qvl::cuda
