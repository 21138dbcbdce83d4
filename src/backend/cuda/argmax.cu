// Sampling on the device: a decode step brings back a few bytes per sequence instead of the whole
// [rows, vocab] block of logits.
//
// Greedy (argmax_rows): the index of each logits row's largest entry. One kernel: each row is
// split over `splits` blocks; every block scans its slice (16-byte loads, each thread in
// increasing index order) and folds its best (value, index) into one 64-bit key per row with
// atomicMax; the last block of a row to arrive (a per-row arrival counter, as the split decode
// attention does) writes the index and resets the key and the counter to zero for the next
// launch. The key is that of backend/top_k.h: (value in an order-preserving unsigned form) <<
// 32 | (0xffffffff - index), so the largest value wins and, among equal values, the smallest
// index, which is torch.argmax's and std::max_element's choice. NaN entries are skipped; -0 is
// counted as +0 (they compare equal); a row with nothing but NaN gives index 0.
//
// Candidates (top_k_rows): the k largest keys of each row, one block of 1024 threads per row.
// Pass 1: each thread's largest key over its entries (and whether any is NaN: the row then
// falls back). The k-th largest of these 1024 maxima is a lower bound of the row's k-th largest
// key, since k threads hold an entry at least that large. Pass 2 gathers every key at or above
// it into shared memory (for rows of random-like logits a few more than k), and a bitonic sort
// of them gives the answer. Keys are distinct, so the result does not depend on the order the
// gathering found them in. More than kTopKCapacity candidates (a row built against the
// threads' stride) fall back.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/top_k.h"

namespace qvl::cuda {
namespace {

constexpr int kArgmaxThreads = 256;
// Elements one block covers at least (two 8-element vectors per thread).
constexpr int64_t kArgmaxMinSlice = kArgmaxThreads * 16;
constexpr int kArgmaxMaxSplits = 64;

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

// Calls f(value, index) for this thread's entries of a row of n, in increasing index order: the
// 16-byte vectors threadIdx.x, threadIdx.x + blockDim.x, ... when `vec`, else single entries.
template <typename T, typename F>
__device__ __forceinline__ void for_each_entry(const T* x, int64_t n, bool vec, F&& f) {
  if (vec) {
    constexpr int kPer = 16 / sizeof(T);
    for (int64_t v = threadIdx.x; v < n / kPer; v += blockDim.x) {
      const uint4 raw = reinterpret_cast<const uint4*>(x)[v];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kPer; ++j) f(load_float(e, j), v * kPer + j);
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(load_float(x, i), i);
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
  // With `vec`, slice and vocab are multiples of 8: every slice starts 16-byte aligned.
  for_each_entry(x + begin, end - begin, vec, [&](float v, int64_t i) { consider(v, begin + i, best, best_i); });
  unsigned long long key = best_i < 0 ? 0ull : logit_key(best, best_i);
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
  ids[row] = final_key == 0 ? 0 : logit_key_index(final_key);
}

constexpr int kTopKThreads = 1024;
static_assert(kTopKMaxKeys <= kTopKThreads, "the bound is the k-th of the threads' maxima");
constexpr int kTopKCapacity = 2048;  // candidates one block sorts (16 KB of shared memory)

// Sorts s[0, n) descending; n a power of two <= 2 * kTopKThreads. Every thread of the block calls it.
__device__ void bitonic_sort_desc(unsigned long long* s, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < n / 2; t += blockDim.x) {
        const int i = ((t & ~(stride - 1)) << 1) | (t & (stride - 1));  // bit `stride` of i is clear
        const unsigned long long a = s[i], b = s[i + stride];
        const bool descending = (i & size) == 0;  // the last merge (size == n) is descending everywhere
        if ((a < b) == descending) {
          s[i] = b;
          s[i + stride] = a;
        }
      }
      __syncthreads();
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kTopKThreads)
    top_k_rows_kernel(unsigned long long* keys, const T* logits, int64_t vocab, int k, bool vec) {
  grid_dep_wait();
  grid_dep_launch();
  __shared__ unsigned long long s[kTopKCapacity];
  __shared__ unsigned int count;
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  unsigned long long* out = keys + static_cast<int64_t>(blockIdx.x) * k;
  auto fall_back = [&] {
    for (int j = threadIdx.x; j < k; j += kTopKThreads) out[j] = j == 0 ? kTopKFallback : 0ull;
  };

  // Pass 1: this thread's largest key, and NaN.
  float best = 0.0f;
  int64_t best_i = -1;
  bool nan = false;
  for_each_entry(x, vocab, vec, [&](float v, int64_t i) {
    nan |= isnan(v);
    consider(v, i, best, best_i);
  });
  s[threadIdx.x] = best_i < 0 ? 0ull : logit_key(best, best_i);
  if (threadIdx.x == 0) count = 0;
  if (__syncthreads_or(nan)) return fall_back();
  bitonic_sort_desc(s, kTopKThreads);
  // The bound: keys below it cannot be among the row's k largest. With fewer than k numbers
  // among the maxima (a row shorter than the block), every number is a candidate.
  const unsigned long long bound = max(s[k - 1], 1ull);
  const float bound_value = s[k - 1] == 0 ? -INFINITY : logit_key_value(bound);
  __syncthreads();  // everyone has read the bound before the candidates overwrite s

  // Pass 2: gather the candidates (a float comparison first; the key only for the few that pass).
  for_each_entry(x, vocab, vec, [&](float v, int64_t i) {
    if (v < bound_value) return;
    const unsigned long long key = logit_key(v, i);
    if (key < bound) return;
    const unsigned int at = atomicAdd(&count, 1u);
    if (at < kTopKCapacity) s[at] = key;
  });
  __syncthreads();
  const unsigned int n = count;
  if (n > kTopKCapacity) return fall_back();
  int padded = 2;
  while (padded < static_cast<int>(n)) padded <<= 1;
  for (int j = static_cast<int>(n) + threadIdx.x; j < padded; j += kTopKThreads) s[j] = 0ull;
  __syncthreads();
  bitonic_sort_desc(s, padded);
  for (int j = threadIdx.x; j < k; j += kTopKThreads) out[j] = j < padded ? s[j] : 0ull;
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

void launch_top_k_rows(const LaunchContext& ctx, Tensor keys, const Tensor& logits) {
  QVL_CHECK(keys.dtype == DType::kI64 && keys.ndim == 2 && keys.device == Device::kCuda) << keys.describe();
  QVL_CHECK(logits.ndim == 2 && logits.device == Device::kCuda) << logits.describe();
  QVL_CHECK(logits.dtype == DType::kBF16 || logits.dtype == DType::kF32) << "top_k over " << logits.describe();
  QVL_CHECK_EQ(keys.dim(0), logits.dim(0)) << keys.describe() << " for " << logits.describe();
  const int64_t rows = logits.dim(0), vocab = logits.dim(1), k = keys.dim(1);
  QVL_CHECK(k >= 1 && k <= kTopKMaxKeys) << "top_k_rows: k = " << k << " (1.." << kTopKMaxKeys << ")";
  QVL_CHECK(vocab > 0 && vocab <= INT32_MAX && rows <= INT32_MAX) << "top_k_rows over " << logits.describe();
  if (rows == 0) return;
  const size_t esize = dtype_size(logits.dtype);
  const bool vec = reinterpret_cast<uintptr_t>(logits.data) % 16 == 0 && (vocab * esize) % 16 == 0;
  auto* out = reinterpret_cast<unsigned long long*>(keys.data);
  const dim3 grid(static_cast<unsigned>(rows));  // rows <= the runner's sequences
  if (logits.dtype == DType::kBF16)
    launch(ctx, "top_k_rows", top_k_rows_kernel<bf16>, grid, dim3(kTopKThreads), 0, out, logits.as<const bf16>(), vocab,
           static_cast<int>(k), vec);
  else
    launch(ctx, "top_k_rows", top_k_rows_kernel<float>, grid, dim3(kTopKThreads), 0, out, logits.as<const float>(),
           vocab, static_cast<int>(k), vec);
}

}  // namespace qvl::cuda
