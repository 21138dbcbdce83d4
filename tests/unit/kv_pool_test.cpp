// KV page pool tests: chunked growth up to the budget and never past it, page ownership (a page
// is in exactly one table or free), stable addresses, and a device that refuses to grow.
#include "memory/kv_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

namespace qvl {
namespace {

// 2 layers × 2 kv heads × head_dim 8 × bf16: K and V → 2·2·2·8·2 = 128 bytes per token.
KvLayout small_layout() {
  return KvLayout{DType::kBF16, 2, 2, 8};
}

std::unique_ptr<KvPagePool> make_pool(int64_t max_pages, int64_t grow_pages, int page_size = 16) {
  KvLayout layout = small_layout();
  auto storage = make_host_region(layout.token_bytes() * page_size * max_pages);
  EXPECT_TRUE(storage.is_ok()) << storage.status().to_string();
  auto pool = KvPagePool::create(std::move(storage).value(), layout, {page_size, max_pages, grow_pages, 0});
  EXPECT_TRUE(pool.is_ok()) << pool.status().to_string();
  return std::move(pool).value();
}

TEST(KvPool, LayoutMatchesTheBackendView) {
  auto pool = make_pool(8, 4);
  EXPECT_EQ(small_layout().token_bytes(), 128u);
  EXPECT_EQ(pool->page_bytes(), 128u * 16);
  PageTable t;
  ASSERT_TRUE(pool->reserve(t, 1));
  KvCacheView v = pool->view();
  EXPECT_EQ(v.num_pages, 4);  // one growth chunk
  EXPECT_EQ(v.page_size, 16);
  EXPECT_EQ(v.page_bytes(), pool->page_bytes());  // backend.h's arithmetic agrees with the pool's
  EXPECT_EQ(v.layer_bytes(), 2u * 2 * 8 * 2 * 16);
}

TEST(KvPool, GrowsInChunksAndNeverPastTheBudget) {
  auto pool = make_pool(10, 4);
  EXPECT_EQ(pool->committed_pages(), 0);
  EXPECT_EQ(pool->available_pages(), 10);
  PageTable a, b, c;
  ASSERT_TRUE(pool->reserve(a, 17));  // ceil(17 / 16) = 2 pages
  EXPECT_EQ(a.num_pages(), 2);
  EXPECT_EQ(pool->committed_pages(), 4);
  ASSERT_TRUE(pool->reserve(b, 48));  // 3 pages: 2 left free, grows by one chunk to 8
  EXPECT_EQ(pool->committed_pages(), 8);
  EXPECT_EQ(pool->used_pages(), 5);
  EXPECT_EQ(pool->available_pages(), 5);
  ASSERT_TRUE(pool->reserve(a, 32));  // still 2 pages: nothing new
  EXPECT_EQ(a.num_pages(), 2);
  ASSERT_TRUE(pool->reserve(c, 16 * 5));  // 5 pages: grows to 10 (the last chunk is clipped)
  EXPECT_EQ(pool->committed_pages(), 10);
  EXPECT_EQ(pool->available_pages(), 0);
  PageTable d;
  EXPECT_FALSE(pool->reserve(d, 1));
  EXPECT_TRUE(d.empty());
  EXPECT_FALSE(pool->reserve(a, 33));  // a third page for a: no room; a keeps its two
  EXPECT_EQ(a.num_pages(), 2);
  EXPECT_EQ(pool->committed_pages(), 10);
}

TEST(KvPool, ReleaseReturnsPagesForReuse) {
  auto pool = make_pool(4, 4);
  PageTable a, b;
  ASSERT_TRUE(pool->reserve(a, 64));
  EXPECT_FALSE(pool->reserve(b, 1));
  auto pages_a = a.pages();
  pool->release(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(pool->used_pages(), 0);
  ASSERT_TRUE(pool->reserve(b, 64));
  std::set<int32_t> got(b.pages().begin(), b.pages().end()), had(pages_a.begin(), pages_a.end());
  EXPECT_EQ(got, had);
  EXPECT_EQ(b.pages().front(), pages_a.front());  // LIFO: the first page freed last comes back first
}

TEST(KvPool, CommittedPagesAreWritableAndNeverMove) {
  auto pool = make_pool(64, 8);
  PageTable t;
  ASSERT_TRUE(pool->reserve(t, 16 * 8));
  void* base = pool->view().base;
  std::memset(base, 0x5a, pool->page_bytes() * pool->committed_pages());
  ASSERT_TRUE(pool->reserve(t, 16 * 64));
  EXPECT_EQ(pool->view().base, base);
  auto* bytes = static_cast<unsigned char*>(base);
  EXPECT_EQ(bytes[0], 0x5a);
  EXPECT_EQ(bytes[pool->page_bytes() * 8 - 1], 0x5a);  // data written before the growth survived
  std::memset(base, 0, pool->page_bytes() * 64);       // and the grown range is writable
}

TEST(KvPool, PagesBelongToExactlyOneTable) {
  auto pool = make_pool(100, 7, 4);
  std::vector<PageTable> tables(12);
  std::vector<int64_t> tokens(12, 0);
  std::mt19937 rng(3);
  for (int step = 0; step < 4000; ++step) {
    size_t i = rng() % tables.size();
    if (rng() % 5 == 0) {
      pool->release(tables[i]);
      tokens[i] = 0;
    } else {
      int64_t want = tokens[i] + 1 + rng() % 9;
      if (pool->reserve(tables[i], want)) tokens[i] = want;
    }
    std::set<int32_t> seen;
    int64_t used = 0;
    for (size_t k = 0; k < tables.size(); ++k) {
      EXPECT_EQ(tables[k].num_pages(), pool->pages_for(tokens[k]));
      for (int32_t p : tables[k].pages()) {
        ASSERT_TRUE(seen.insert(p).second) << "page " << p << " in two tables at step " << step;
        ASSERT_LT(p, pool->committed_pages());
      }
      used += tables[k].num_pages();
    }
    ASSERT_EQ(used, pool->used_pages());
    ASSERT_LE(pool->committed_pages(), 100);
  }
}

// Commits up to `limit` bytes, then refuses, like a GPU whose memory another process took.
class RefusingBuffer final : public DeviceRegion {
 public:
  RefusingBuffer(size_t reserved, size_t limit) : mem_(reserved), limit_(limit) {}
  void* base() const override { return const_cast<char*>(mem_.data()); }
  size_t reserved_bytes() const override { return mem_.size(); }
  size_t committed_bytes() const override { return committed_; }
  Status grow_to(size_t bytes) override {
    if (bytes > limit_) return resource_exhausted("out of device memory");
    committed_ = std::max(committed_, bytes);
    return Status::ok();
  }

 private:
  std::vector<char> mem_;
  size_t limit_;
  size_t committed_ = 0;
};

TEST(KvPool, DeviceRefusalCapsTheBudget) {
  KvLayout layout = small_layout();
  const size_t page = layout.token_bytes() * 16;
  auto pool = KvPagePool::create(std::make_unique<RefusingBuffer>(page * 20, page * 8), layout, {16, 20, 4, 0});
  ASSERT_TRUE(pool.is_ok());
  PageTable a, b;
  ASSERT_TRUE((*pool)->reserve(a, 16 * 6));   // grows to 8 pages
  EXPECT_FALSE((*pool)->reserve(b, 16 * 3));  // needs 12: refused by the device
  EXPECT_TRUE(b.empty());
  EXPECT_EQ((*pool)->max_pages(), 8);  // the pool now knows its real size
  EXPECT_EQ((*pool)->available_pages(), 2);
  ASSERT_TRUE((*pool)->reserve(b, 16 * 2));
}

TEST(KvPool, CreateRejectsImpossibleBudgetsWithNumbers) {
  KvLayout layout = small_layout();
  auto zero = KvPagePool::create(make_host_region(4096).value(), layout, {16, 0, 4, 0});
  ASSERT_FALSE(zero.is_ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(zero.status().message().find("0 pages"), std::string::npos) << zero.status().message();

  auto small = KvPagePool::create(std::make_unique<RefusingBuffer>(2048, 2048), layout, {16, 4, 4, 0});
  ASSERT_FALSE(small.is_ok());
  EXPECT_EQ(small.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(small.status().message().find("4 pages"), std::string::npos) << small.status().message();
}

}  // namespace
}  // namespace qvl
