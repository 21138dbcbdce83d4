#include "tokenizer/bpe.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "core/check.h"

namespace qvl::tok {

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Entry> old = std::move(slots_);
  slots_.assign(cap, Entry{});
  mask_ = cap - 1;
  size_ = 0;
  for (const Entry& e : old) {
    if (e.key == kEmpty) continue;
    insert(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFFu), e.rank, e.id);
  }
}

void MergeTable::grow() {
  reserve(std::max<size_t>(16, size_ + 1));
}

void MergeTable::insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = make_key(a, b);
  size_t i = hash(key) & mask_;
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].key == kEmpty) ++size_;
  slots_[i] = Entry{key, rank, id};
}

namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
// Words up to this many bytes use the linear scan; the scan is O(n²) but cache-friendly.
constexpr size_t kScanMaxSymbols = 48;

void merge_by_scan(const BpeModel& model, std::string_view word, std::vector<int32_t>& out) {
  int32_t sym[kScanMaxSymbols];
  int32_t rank[kScanMaxSymbols];  // rank[i]: merge rank of (sym[i], sym[i+1])
  int32_t merged[kScanMaxSymbols];
  size_t n = word.size();
  for (size_t i = 0; i < n; ++i) sym[i] = model.byte_ids[static_cast<uint8_t>(word[i])];
  auto pair_rank = [&](size_t i) {
    const MergeTable::Entry* e = model.merges.find(sym[i], sym[i + 1]);
    if (!e) return kNoRank;
    merged[i] = e->id;
    return e->rank;
  };
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = pair_rank(i);
  while (n > 1) {
    size_t best = 0;
    int32_t best_rank = rank[0];
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    }
    if (best_rank == kNoRank) break;
    sym[best] = merged[best];
    // Close the gap left by the right symbol.
    for (size_t i = best + 1; i + 1 < n; ++i) {
      sym[i] = sym[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) rank[best - 1] = pair_rank(best - 1);
    if (best + 1 < n) rank[best] = pair_rank(best);
  }
  out.insert(out.end(), sym, sym + n);
}

// The heap version, as `tokenizers` does it: a min-heap of (rank, position) over a linked list
// of symbols; stale entries are recognised by re-checking the pair's merge.
void merge_by_heap(const BpeModel& model, std::string_view word, std::vector<int32_t>& out) {
  const size_t n = word.size();
  std::vector<int32_t> sym(n), prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = model.byte_ids[static_cast<uint8_t>(word[i])];
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Item {
    int32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Item& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  auto push_pair = [&](int32_t left) {
    const int32_t right = next[left];
    if (right < 0) return;
    if (const MergeTable::Entry* e = model.merges.find(sym[left], sym[right])) heap.push({e->rank, left, e->id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Item top = heap.top();
    heap.pop();
    if (!alive[top.pos]) continue;
    const int32_t right = next[top.pos];
    if (right < 0) continue;
    const MergeTable::Entry* e = model.merges.find(sym[top.pos], sym[right]);
    if (!e || e->id != top.id) continue;  // stale: the pair changed since it was queued
    sym[top.pos] = top.id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) push_pair(prev[top.pos]);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

}  // namespace

void bpe_encode_word(const BpeModel& model, std::string_view word, std::vector<int32_t>& out, bool force_heap) {
  QVL_CHECK(!word.empty());
  if (model.ignore_merges) {
    auto it = model.bytes_to_id.find(std::string(word));
    if (it != model.bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    out.push_back(model.byte_ids[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (!force_heap && word.size() <= kScanMaxSymbols) {
    merge_by_scan(model, word, out);
  } else {
    merge_by_heap(model, word, out);
  }
}

bool WordCache::lookup(std::string_view word, std::vector<int32_t>& out) const {
  const size_t h = StringHash{}(word);
  Shard& shard = shards_[h % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(word);
  if (it == shard.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::insert(std::string_view word, const int32_t* ids, size_t n) const {
  const size_t h = StringHash{}(word);
  Shard& shard = shards_[h % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  // Bounded memory: a full shard starts over (cheap, and the hot words come back at once).
  if (shard.map.size() >= max_per_shard_) shard.map.clear();
  shard.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
}

}  // namespace qvl::tok
