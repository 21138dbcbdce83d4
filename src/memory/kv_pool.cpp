#include "memory/kv_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "core/log.h"

namespace qvl {

namespace {

size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

class HostRegion final : public DeviceRegion {
 public:
  HostRegion(void* base, size_t reserved) : base_(base), reserved_(reserved) {}
  ~HostRegion() override { ::munmap(base_, reserved_); }
  void* base() const override { return base_; }
  size_t reserved_bytes() const override { return reserved_; }
  size_t committed_bytes() const override { return committed_; }
  Status grow_to(size_t bytes) override {
    if (bytes > reserved_) return out_of_range("KV region: " + mib(bytes) + " asked, " + mib(reserved_) + " reserved");
    if (bytes <= committed_) return Status::ok();
    const size_t end = std::min(reserved_, round_up(bytes, static_cast<size_t>(::sysconf(_SC_PAGESIZE))));
    if (::mprotect(static_cast<char*>(base_) + committed_, end - committed_, PROT_READ | PROT_WRITE) != 0)
      return resource_exhausted("cannot commit " + mib(end - committed_) +
                                " of host memory for the KV cache: " + std::strerror(errno));
    committed_ = end;
    return Status::ok();
  }

 private:
  void* base_;
  size_t reserved_;
  size_t committed_ = 0;
};

}  // namespace

Result<std::unique_ptr<DeviceRegion>> make_host_region(size_t max_bytes) {
  const size_t reserved = round_up(std::max<size_t>(max_bytes, 1), static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  void* p = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return resource_exhausted("cannot reserve " + mib(reserved) +
                              " of address space for the KV cache: " + std::strerror(errno));
  return std::unique_ptr<DeviceRegion>(new HostRegion(p, reserved));
}

Result<std::unique_ptr<DeviceRegion>> make_kv_storage(Backend& backend, size_t max_bytes) {
  if (backend.device() == Device::kCpu) return make_host_region(max_bytes);
  return backend.reserve_region(max_bytes, "kv cache");
}

Result<std::unique_ptr<KvPagePool>> KvPagePool::create(std::unique_ptr<DeviceRegion> storage, KvLayout layout,
                                                       KvPoolOptions options) {
  QVL_CHECK(storage != nullptr);
  if (options.page_size < 1)
    return invalid_argument("KV page size " + std::to_string(options.page_size) + " must be >= 1");
  if (options.max_pages < 1)
    return resource_exhausted("KV cache budget of " + std::to_string(options.max_pages) +
                              " pages leaves no room for a single token");
  if (options.max_pages > INT32_MAX)
    return out_of_range("KV cache of " + std::to_string(options.max_pages) + " pages exceeds the int32 page ids");
  if (layout.token_bytes() == 0) return invalid_argument("KV layout has zero bytes per token");
  options.grow_pages = std::max<int64_t>(1, options.grow_pages);
  options.initial_pages = std::clamp<int64_t>(options.initial_pages, 0, options.max_pages);
  const size_t page_bytes = layout.token_bytes() * options.page_size;
  const size_t need = page_bytes * static_cast<size_t>(options.max_pages);
  if (need > storage->reserved_bytes())
    return out_of_range("KV cache of " + std::to_string(options.max_pages) + " pages × " + mib(page_bytes) + " needs " +
                        mib(need) + " but the storage holds " + mib(storage->reserved_bytes()));
  std::unique_ptr<KvPagePool> pool(new KvPagePool(std::move(storage), layout, options));
  if (options.initial_pages > 0 && !pool->grow_for(options.initial_pages))
    return resource_exhausted("cannot commit the initial " + std::to_string(options.initial_pages) + " KV pages (" +
                              mib(page_bytes * options.initial_pages) + ")");
  return pool;
}

KvPagePool::KvPagePool(std::unique_ptr<DeviceRegion> storage, KvLayout layout, KvPoolOptions options)
    : storage_(std::move(storage)), layout_(layout), options_(options), max_pages_(options.max_pages) {}

KvPagePool::~KvPagePool() = default;

bool KvPagePool::grow_for(int64_t need) {
  while (static_cast<int64_t>(free_.size()) < need) {
    if (committed_pages_ >= max_pages_) return false;
    const int64_t target = std::min(max_pages_, committed_pages_ + options_.grow_pages);
    Status st = storage_->grow_to(static_cast<size_t>(target) * page_bytes());
    if (!st.is_ok()) {
      log_warn("KV cache stays at " + std::to_string(committed_pages_) + " of " + std::to_string(max_pages_) +
               " planned pages: " + st.message());
      max_pages_ = committed_pages_;
      return false;
    }
    // New pages go under the existing free ones, lowest id on top, so reuse stays LIFO.
    free_.insert(free_.begin(), static_cast<size_t>(target - committed_pages_), 0);
    for (int64_t i = 0; i < target - committed_pages_; ++i)
      free_[static_cast<size_t>(i)] = static_cast<int32_t>(target - 1 - i);
    committed_pages_ = target;
  }
  return true;
}

bool KvPagePool::reserve(PageTable& table, int64_t tokens) {
  const int64_t need = pages_for(tokens) - table.num_pages();
  if (need <= 0) return true;
  if (need > available_pages()) return false;
  if (!grow_for(need)) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.pages_.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvPagePool::release(PageTable& table) {
  // Freed in reverse so the sequence's first page is the next one handed out.
  for (auto it = table.pages_.rbegin(); it != table.pages_.rend(); ++it) {
    QVL_CHECK(*it >= 0 && *it < committed_pages_) << "page " << *it << " not in the pool";
    free_.push_back(*it);
  }
  table.pages_.clear();
  QVL_CHECK_LE(static_cast<int64_t>(free_.size()), committed_pages_) << "a page was released twice";
}

KvCacheView KvPagePool::view() const {
  KvCacheView v;
  v.base = storage_->base();
  v.dtype = layout_.dtype;
  v.num_pages = committed_pages_;
  v.page_size = options_.page_size;
  v.num_layers = layout_.num_layers;
  v.num_kv_heads = layout_.num_kv_heads;
  v.head_dim = layout_.head_dim;
  return v;
}

}  // namespace qvl
