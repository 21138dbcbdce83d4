// The largest logits of a row as 64-bit keys (Backend::top_k_rows): what a sampled decode step
// brings back from the device instead of the whole [rows, vocab] block, and what the sampler
// reads them with (engine/sampler.h, Sampler::sample_candidates).
//
// A key is (the value in an order-preserving unsigned form) << 32 | (0xffffffff - index), so that
// comparing keys as unsigned integers orders entries by value, largest first, and equal values
// by index, smallest first: the order of greedy_argmax and torch.argmax. -0 is keyed as +0 (they
// compare equal); key 0 is no entry. Every key of a row is distinct.
//
// A row's result is its k largest keys, descending, with 0 after the last entry when the row has
// fewer than k. A row holding a NaN gives kTopKFallback instead (its first key, the rest 0), as
// does a device kernel that could not hold the row's candidates: the caller then takes the whole
// row. kTopKFallback cannot be a real key: its value half would be a NaN.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace qvl {

// Keys a sampled step brings back per row (ModelRunner::forward_top_k): requests whose top-k is
// below this sample from them (engine/sampler.h).
inline constexpr int kSampleCandidates = 64;

inline constexpr uint64_t kTopKFallback = ~uint64_t{0};

constexpr uint64_t logit_key(float v, int64_t index) {
  uint32_t u = std::bit_cast<uint32_t>(v);
  if (u == 0x80000000u) u = 0;
  const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t{ordered} << 32) | (0xffffffffu - static_cast<uint32_t>(index));
}
constexpr float logit_key_value(uint64_t key) {
  const uint32_t ordered = static_cast<uint32_t>(key >> 32);
  return std::bit_cast<float>((ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered);
}
constexpr int32_t logit_key_index(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

// The reference of Backend::top_k_rows for one row of n values: out[0, k) as described above
// (the host never runs out of room, so kTopKFallback only for a NaN). One pass with a min-heap
// of the k best keys; an entry is keyed only when its value reaches the heap's smallest.
inline void top_k_keys(std::span<const float> row, std::span<uint64_t> out) {
  std::fill(out.begin(), out.end(), uint64_t{0});
  if (out.empty()) return;
  const size_t k = std::min(out.size(), row.size());
  std::vector<uint64_t> heap;
  heap.reserve(k);
  float floor = -INFINITY;  // the value of heap.front() once the heap is full
  for (size_t i = 0; i < row.size(); ++i) {
    const float v = row[i];
    if (std::isnan(v)) {
      out[0] = kTopKFallback;
      return;
    }
    if (heap.size() == k && v < floor) continue;
    const uint64_t key = logit_key(v, static_cast<int64_t>(i));
    if (heap.size() < k) {
      heap.push_back(key);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    } else if (key > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.back() = key;
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    } else {
      continue;
    }
    if (heap.size() == k) floor = logit_key_value(heap.front());
  }
  std::sort(heap.begin(), heap.end(), std::greater<>());
  std::copy(heap.begin(), heap.end(), out.begin());
}

}  // namespace qvl
