// The KV page pool: the paged KV cache's memory and its bookkeeping. The cache is one contiguous
// region of fixed-size pages (a page holds `page_size` tokens of every layer, laid out as
// KvCacheView in backend.h says). Sequences own pages through a PageTable; the pool keeps a free
// list and commits memory in chunks of `grow_pages` as sequences need it, up to `max_pages` (the
// memory plan's KV budget) and never past it.
//
// Invariants: a page is either on the free list or in exactly one PageTable; committed pages
// never move (the region grows in place, see DeviceRegion); used + free_committed ==
// committed <= max. When the device refuses to grow (someone else took the memory), the pool
// caps itself at what it has and says so in the log; requests then wait or are refused by the
// scheduler with the numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace qvl {

// What one cache token costs: K and V of every layer.
struct KvLayout {
  DType dtype = DType::kBF16;
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;

  size_t token_bytes() const { return size_t{2} * num_layers * num_kv_heads * head_dim * dtype_size(dtype); }
};

struct KvPoolOptions {
  int page_size = 16;         // tokens per page
  int64_t max_pages = 0;      // the budget (from the memory plan); the pool never exceeds it
  int64_t grow_pages = 64;    // pages committed per growth step
  int64_t initial_pages = 0;  // committed at creation
};

// Host memory for the CPU backend: reserves address space with mmap(PROT_NONE) and commits
// chunks with mprotect, so pages keep their addresses as the pool grows.
Result<std::unique_ptr<DeviceRegion>> make_host_region(size_t max_bytes);
// Memory able to hold `max_bytes` for `backend`'s KV cache: a host region for the CPU backend,
// Backend::reserve_region otherwise (a growing virtual range on CUDA).
Result<std::unique_ptr<DeviceRegion>> make_kv_storage(Backend& backend, size_t max_bytes);

// The pages of one sequence, in token order: token t lives in page pages()[t / page_size] at
// offset t % page_size. Filled and emptied only by KvPagePool.
class PageTable {
 public:
  const std::vector<int32_t>& pages() const { return pages_; }
  int64_t num_pages() const { return static_cast<int64_t>(pages_.size()); }
  bool empty() const { return pages_.empty(); }

 private:
  friend class KvPagePool;
  std::vector<int32_t> pages_;
};

class KvPagePool {
 public:
  // Validates the options against the storage (max_pages · page bytes must fit reserved_bytes()).
  static Result<std::unique_ptr<KvPagePool>> create(std::unique_ptr<DeviceRegion> storage, KvLayout layout,
                                                    KvPoolOptions options);
  ~KvPagePool();
  KvPagePool(const KvPagePool&) = delete;
  KvPagePool& operator=(const KvPagePool&) = delete;

  int page_size() const { return options_.page_size; }
  // Pages needed to hold `tokens` tokens.
  int64_t pages_for(int64_t tokens) const { return (tokens + options_.page_size - 1) / options_.page_size; }

  // Makes `table` hold at least `tokens` tokens, committing more memory when the free list is
  // short. Returns false, leaving `table` unchanged, when the budget (or the device) cannot.
  bool reserve(PageTable& table, int64_t tokens);
  // Returns every page of `table` to the free list.
  void release(PageTable& table);

  int64_t max_pages() const { return max_pages_; }  // the budget (may drop if growth fails)
  int64_t committed_pages() const { return committed_pages_; }
  int64_t used_pages() const { return committed_pages_ - static_cast<int64_t>(free_.size()); }
  // Pages a reserve() could still obtain: free committed pages plus room left to grow into.
  int64_t available_pages() const { return max_pages_ - used_pages(); }

  // The cache as the backend ops see it (num_pages = committed pages; base never changes).
  KvCacheView view() const;
  const KvLayout& layout() const { return layout_; }
  size_t page_bytes() const { return layout_.token_bytes() * options_.page_size; }

 private:
  KvPagePool(std::unique_ptr<DeviceRegion> storage, KvLayout layout, KvPoolOptions options);
  // Commits pages until `free_` holds `need` pages; false when the budget or device refuses.
  bool grow_for(int64_t need);

  std::unique_ptr<DeviceRegion> storage_;
  KvLayout layout_;
  KvPoolOptions options_;
  int64_t max_pages_ = 0;
  int64_t committed_pages_ = 0;
  std::vector<int32_t> free_;  // LIFO: the most recently freed page is reused first
};

}  // namespace qvl
