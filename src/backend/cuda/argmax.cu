// Greedy sampling on the device: the index of each logits row's largest entry, so that a greedy
// decode step brings back 4 bytes per sequence instead of the whole [rows, vocab] block.
//
// One kernel: each row is split over `splits` blocks; every block scans its slice (16-byte
// loads, each thread in increasing index order) and folds its best (value, index) into one
// 64-bit key per row with atomicMax; the last block of a row to arrive (a per-row arrival
// counter, as the split decode attention does) writes the index and resets the key and the
// counter to zero for the next launch. The key is (value in an order-preserving unsigned form)
// << 32 | (0xffffffff - index): the largest value wins and, among equal values, the smallest
// index, which is torch.argmax's and std::max_element's choice. NaN entries are skipped; -0 is
// counted as +0 (they compare equal); a row with nothing but NaN gives index 0.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda {
namespace {

constexpr int kArgmaxThreads = 256;
// Elements one block covers at least (two 8-element vectors per thread).
constexpr int64_t kArgmaxMinSlice = kArgmaxThreads * 16;
constexpr int kArgmaxMaxSplits = 64;

__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t index) {
  uint32_t u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0;  // -0 == +0: equal values, so the smaller index decides
  const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | (0xffffffffu - static_cast<uint32_t>(index));
}

__device__ __forceinline__ float load_float(const bf16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load_float(const float* p, int64_t i) {
  return p[i];
}

// Visits one candidate in increasing index order: the first non-NaN value, then strictly larger.
__device__ __forceinline__ void consider(float v, int64_t i, float& best, int64_t& best_i) {
  if (best_i < 0 ? !isnan(v) : v > best) {
    best = v;
    best_i = i;
  }
}

template <typename T>
__global__ void argmax_rows_kernel(int32_t* ids, const T* logits, int64_t vocab, int64_t slice, bool vec,
                                   unsigned long long* keys, uint32_t* counters) {
  grid_dep_wait();
  grid_dep_launch();
  const int row = blockIdx.y;
  const T* x = logits + static_cast<int64_t>(row) * vocab;
  const int64_t begin = blockIdx.x * slice, end = min(vocab, begin + slice);
  float best = 0.0f;
  int64_t best_i = -1;
  if (vec) {  // slice and vocab are multiples of 8, rows 16-byte aligned
    constexpr int kPer = 16 / sizeof(T);
    for (int64_t v = begin / kPer + threadIdx.x; v < end / kPer; v += kArgmaxThreads) {
      const uint4 raw = reinterpret_cast<const uint4*>(x)[v];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kPer; ++k) consider(load_float(e, k), v * kPer + k, best, best_i);
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kArgmaxThreads) consider(load_float(x, i), i, best, best_i);
  }
  unsigned long long key = best_i < 0 ? 0ull : argmax_key(best, best_i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, o));
  __shared__ unsigned long long warp_keys[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_keys[warp] = key;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kArgmaxThreads / 32; ++w) key = max(key, warp_keys[w]);
  if (key != 0) atomicMax(&keys[row], key);
  __threadfence();  // the key is updated before this block counts as arrived
  if (atomicAdd(&counters[row], 1u) != gridDim.x - 1) return;
  // Last block of the row: every other block's atomicMax happened before its arrival, and this
  // fence (pairing with theirs) orders the arrivals before the read of the key.
  __threadfence();
  const unsigned long long final_key = atomicExch(&keys[row], 0ull);
  counters[row] = 0;
  ids[row] = final_key == 0 ? 0 : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(final_key));
}

}  // namespace

void launch_argmax_rows(const LaunchContext& ctx, Tensor ids, const Tensor& logits, void* scratch,
                        size_t scratch_bytes) {
  QVL_CHECK(ids.dtype == DType::kI32 && ids.device == Device::kCuda) << ids.describe();
  QVL_CHECK(logits.ndim == 2 && logits.device == Device::kCuda) << logits.describe();
  QVL_CHECK(logits.dtype == DType::kBF16 || logits.dtype == DType::kF32) << "argmax over " << logits.describe();
  QVL_CHECK_EQ(ids.numel(), logits.dim(0)) << ids.describe() << " for " << logits.describe();
  QVL_CHECK_GE(scratch_bytes, kArgmaxMaxRows * kArgmaxRowScratchBytes);
  QVL_CHECK_EQ(reinterpret_cast<uintptr_t>(scratch) % alignof(unsigned long long), uintptr_t{0}) << "argmax keys";
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  QVL_CHECK(vocab > 0 && vocab <= INT32_MAX) << "argmax ids are int32: " << logits.describe();
  if (rows == 0) return;
  auto* keys = static_cast<unsigned long long*>(scratch);
  auto* counters = reinterpret_cast<uint32_t*>(keys + kArgmaxMaxRows);
  const int splits =
      static_cast<int>(std::clamp<int64_t>((vocab + kArgmaxMinSlice - 1) / kArgmaxMinSlice, 1, kArgmaxMaxSplits));
  const int64_t slice = ((vocab + splits - 1) / splits + 7) / 8 * 8;
  const size_t esize = dtype_size(logits.dtype);
  const bool vec = vocab % 8 == 0 && reinterpret_cast<uintptr_t>(logits.data) % 16 == 0 && (vocab * esize) % 16 == 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kArgmaxMaxRows) {
    const int64_t n = std::min<int64_t>(kArgmaxMaxRows, rows - r0);
    const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(n));
    int32_t* out = ids.as<int32_t>() + r0;
    if (logits.dtype == DType::kBF16) {
      launch(ctx, "argmax_rows", argmax_rows_kernel<bf16>, grid, dim3(kArgmaxThreads), 0, out,
             logits.as<const bf16>() + r0 * vocab, vocab, slice, vec, keys, counters);
    } else {
      launch(ctx, "argmax_rows", argmax_rows_kernel<float>, grid, dim3(kArgmaxThreads), 0, out,
             logits.as<const float>() + r0 * vocab, vocab, slice, vec, keys, counters);
    }
  }
}

}  // namespace qvl::cuda
