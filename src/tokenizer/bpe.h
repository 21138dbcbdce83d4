// Byte-level BPE (internal). Works on raw bytes: the vocabulary's byte-level symbol strings are
// mapped back to the bytes they stand for at load time, so no text is ever mapped to symbols at
// run time. A word starts as one symbol per byte and merges the adjacent pair of lowest merge
// rank, leftmost first, until no pair has a merge — the order `tokenizers`' Word::merge_all
// follows with its (rank, position) min-heap. Short words use a linear scan over the pair
// ranks (cheaper than a heap for a handful of symbols), long ones a heap; both give the same
// result (tested). Results of whole words are cached (sharded, mutex-protected, bounded).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qvl::tok {

// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t id = 0;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  void reserve(size_t n);
  // Inserts or overwrites (a later duplicate merge wins, as in `tokenizers`).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id);
  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t key = make_key(a, b);
    size_t i = hash(key) & mask_;
    while (true) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static uint64_t make_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20); }
  void grow();

  std::vector<Entry> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

struct BpeModel {
  std::array<int32_t, 256> byte_ids{};  // id of the single-byte token of each byte
  MergeTable merges;
  // With ignore_merges, a word that is itself in the vocabulary is taken whole.
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> bytes_to_id;  // raw bytes -> id (ignore_merges only)
};

// Appends the BPE ids of one pre-token (raw bytes, non-empty) to `out`.
// `force_heap` selects the heap algorithm whatever the length (for tests).
void bpe_encode_word(const BpeModel& model, std::string_view word, std::vector<int32_t>& out, bool force_heap = false);

// Bounded cache of word -> ids, safe for concurrent use.
class WordCache {
 public:
  explicit WordCache(size_t max_entries_per_shard = 8192) : max_per_shard_(max_entries_per_shard) {}
  // Appends the cached ids of `word` to `out` and returns true, or returns false.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const;
  void insert(std::string_view word, const int32_t* ids, size_t n) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  static constexpr size_t kShards = 16;
  size_t max_per_shard_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace qvl::tok
