// Test doubles for the engine: a fake model whose next-token logits are a pure function of the
// context it reads back from the paged KV cache (so any page-table, slot or chunking mistake
// changes the output), a gate to step the engine one forward at a time, and a text stream that
// spells token t as "<t>" and finds stop strings.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "engine/factory.h"

namespace qvl::test {

inline constexpr int kFakeVocab = 64;
inline constexpr int32_t kFakeImageToken = 60;
inline constexpr int32_t kFakeEos = 63;

// What the fake writes for one cache token: K[0] = value, K[1] = position T (as int32 bits).
// value is the token id, or for image rows 1000·tag + feature row.
inline uint64_t fake_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

// The fake model: logits over kFakeVocab from the (value, position) history of the context.
inline std::vector<float> fake_logits(const std::vector<std::pair<int32_t, int32_t>>& context) {
  uint64_t h = 1469598103934665603ull;
  for (auto [value, pos] : context) h = fake_mix(fake_mix(h, static_cast<uint32_t>(value)), static_cast<uint32_t>(pos));
  std::vector<float> logits(kFakeVocab);
  for (int j = 0; j < kFakeVocab; ++j) {
    uint64_t x = fake_mix(h, static_cast<uint64_t>(j) + 17);
    logits[j] = static_cast<float>((x >> 11) % 6000) / 1000.0f - 3.0f;  // [-3, 3)
  }
  return logits;
}

class FakeFeatures final : public ImageFeatures {
 public:
  FakeFeatures(int64_t tokens, int32_t tag, std::atomic<int>* live) : tokens_(tokens), tag_(tag), live_(live) {
    ++*live_;
  }
  ~FakeFeatures() override { --*live_; }
  int64_t num_tokens() const override { return tokens_; }
  int32_t tag() const { return tag_; }

 private:
  int64_t tokens_;
  int32_t tag_;
  std::atomic<int>* live_;
};

// A prepared image the fake encodes: `tokens` merged tokens (4 patches each), tagged by the
// first pixel value.
inline PreparedImage fake_image(int grid_h, int grid_w, float tag) {
  PreparedImage img;
  img.grid_t = 1;
  img.grid_h = grid_h;
  img.grid_w = grid_w;
  img.pixel_values.assign(1, tag);
  return img;
}

struct StepRecord {
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (first token id fed, tokens fed) per sequence
  int num_tokens = 0;
};

class FakeRunner final : public ModelRunner {
 public:
  FakeRunner() {
    info_.vocab_size = kFakeVocab;
    info_.image_token_id = kFakeImageToken;
    info_.merge_unit = 4;
    info_.max_positions = 1 << 20;
    info_.kv_layout = KvLayout{DType::kF32, 1, 1, 1};  // 8 bytes per token: K[0], V[0]
  }
  const ModelInfo& info() const override { return info_; }

  std::vector<int32_t> prompt_positions(std::span<const int32_t> prompt, const std::vector<PreparedImage>&,
                                        int64_t* rope_delta) const override {
    // 1-D positions offset by 5 on every axis; decode continues with the same delta.
    std::vector<int32_t> pos;
    for (size_t i = 0; i < prompt.size(); ++i)
      for (int a = 0; a < 3; ++a) pos.push_back(static_cast<int32_t>(i) + 5);
    *rope_delta = 5;
    return pos;
  }

  Result<std::unique_ptr<ImageFeatures>> encode_image(const PreparedImage& image) override {
    if (image.pixel_values.empty() || image.pixel_values[0] < 0) return data_loss("fake: unreadable image");
    auto f = std::make_unique<FakeFeatures>(image.num_patches() / 4, static_cast<int32_t>(image.pixel_values[0]),
                                            &live_features_);
    max_live_features_ = std::max(max_live_features_.load(), live_features_.load());
    return std::unique_ptr<ImageFeatures>(std::move(f));
  }

  Status forward(const StepInput& in, const KvCacheView& cache, std::span<float> logits) override {
    const size_t index = started_++;
    if (on_forward_) on_forward_(index);
    wait_for_permit();
    if (fail_next_) {
      fail_next_ = false;
      return internal_error("fake: injected failure");
    }
    const int ps = cache.page_size;
    auto* kv = static_cast<int32_t*>(cache.base);  // one int32 K and one int32 V per token (1 layer)
    auto k_at = [&](int32_t slot) -> int32_t& { return kv[(slot / ps) * 2 * ps + slot % ps]; };
    // Image rows: each in at most one ImageRows and carrying the pad token (a pad token the
    // model generated itself is an ordinary row; missing prompt rows change the tokens).
    std::vector<int32_t> value(in.token_ids.begin(), in.token_ids.end());
    std::vector<int> covered(in.token_ids.size(), 0);
    for (const ImageRows& r : in.images) {
      auto* f = static_cast<const FakeFeatures*>(r.features);
      if (r.feature_row < 0 || r.feature_row + r.count > f->num_tokens())
        return internal_error("fake: image rows outside the features");
      for (int64_t i = 0; i < r.count; ++i) {
        value[r.step_row + i] = 1000 * f->tag() + static_cast<int32_t>(r.feature_row + i);
        ++covered[r.step_row + i];
      }
    }
    for (size_t i = 0; i < value.size(); ++i)
      if (covered[i] > 1 || (covered[i] == 1 && in.token_ids[i] != kFakeImageToken))
        return internal_error("fake: row " + std::to_string(i) + " image coverage " + std::to_string(covered[i]));
    StepRecord rec;
    rec.num_tokens = in.num_tokens();
    size_t logit_row = 0;
    for (int b = 0; b < in.num_seqs(); ++b) {
      const int32_t q0 = in.query_start[b], q1 = in.query_start[b + 1], ctx = in.context_len[b];
      rec.seqs.push_back({in.token_ids[q0], q1 - q0});
      for (int32_t r = q0; r < q1; ++r) {
        const int32_t index = ctx - (q1 - q0) + (r - q0);
        const int32_t page = in.page_table[b * in.max_pages_per_seq + index / ps];
        if (in.slots[r] != page * ps + index % ps) return internal_error("fake: slot does not match the page table");
        k_at(in.slots[r]) = value[r];
        kv[(in.slots[r] / ps) * 2 * ps + ps + in.slots[r] % ps] = in.positions[r * 3];  // V = position
      }
      if (logit_row < in.logits_rows.size() && in.logits_rows[logit_row] == q1 - 1) {
        std::vector<std::pair<int32_t, int32_t>> context;
        for (int32_t i = 0; i < ctx; ++i) {
          const int32_t page = in.page_table[b * in.max_pages_per_seq + i / ps];
          context.push_back({kv[page * 2 * ps + i % ps], kv[page * 2 * ps + ps + i % ps]});
        }
        auto l = next_logits_ ? next_logits_(context) : fake_logits(context);
        std::copy(l.begin(), l.end(), logits.begin() + static_cast<std::ptrdiff_t>(logit_row * kFakeVocab));
        ++logit_row;
      }
    }
    if (logit_row != in.logits_rows.size()) return internal_error("fake: logits rows are not sequence ends");
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps_.push_back(std::move(rec));
    }
    return Status::ok();
  }

  // ---- test controls ----
  // Replaces the logits function (it still receives the context read back from the cache).
  std::function<std::vector<float>(const std::vector<std::pair<int32_t, int32_t>>&)> next_logits_;
  std::atomic<bool> fail_next_{false};
  // Called on the engine thread at the start of forward number `index` (0-based).
  std::function<void(size_t index)> on_forward_;
  std::atomic<size_t> started_{0};
  std::atomic<int> live_features_{0}, max_live_features_{0};

  // With the gate closed, each forward waits for a permit from allow().
  void close_gate() {
    std::lock_guard<std::mutex> lock(mu_);
    gated_ = true;
  }
  void open_gate() {
    std::lock_guard<std::mutex> lock(mu_);
    gated_ = false;
    cv_.notify_all();
  }
  void allow(int steps) {
    std::lock_guard<std::mutex> lock(mu_);
    permits_ += steps;
    cv_.notify_all();
  }
  // Blocks until forward number `n` (1-based) has started.
  void wait_started(size_t n) {
    for (int i = 0; i < 5000 && started_.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (started_.load() < n) ADD_FAILURE() << "timed out waiting for forward " << n << " to start";
  }
  // Blocks until `n` forwards have completed.
  void wait_steps(size_t n) {
    for (int i = 0; i < 5000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (steps_.size() >= n) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "timed out waiting for step " << n;
  }
  std::vector<StepRecord> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  std::chrono::milliseconds step_delay{0};

 private:
  void wait_for_permit() {
    if (step_delay.count() > 0) std::this_thread::sleep_for(step_delay);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !gated_ || permits_ > 0; });
    if (gated_) --permits_;
  }

  ModelInfo info_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool gated_ = false;
  int permits_ = 0;
  std::vector<StepRecord> steps_;
};

// Spells token t as "<t>"; holds back any suffix that may still become a stop string.
class FakeTextStream final : public TokenTextStream {
 public:
  explicit FakeTextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {}
  Piece push(int32_t token) override {
    if (token == kFakeEos) return {};
    pending_ += '<';  // appended piece by piece: "<" + std::string trips GCC 12's -Wrestrict
    pending_ += std::to_string(token);
    pending_ += '>';
    for (const auto& s : stop_) {
      if (auto at = pending_.find(s); at != std::string::npos) {
        Piece p{pending_.substr(0, at), true};
        pending_.clear();
        return p;
      }
    }
    size_t keep = 0;  // longest suffix of pending_ that is a proper prefix of a stop string
    for (const auto& s : stop_)
      for (size_t n = std::min(s.size() - 1, pending_.size()); n > keep; --n)
        if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
    Piece p{pending_.substr(0, pending_.size() - keep), false};
    pending_.erase(0, pending_.size() - keep);
    return p;
  }
  std::string finish() override { return std::exchange(pending_, {}); }

 private:
  std::vector<std::string> stop_;
  std::string pending_;
};

inline TextStreamFactory fake_text_streams() {
  return [](const std::vector<std::string>& stop) { return std::make_unique<FakeTextStream>(stop); };
}

}  // namespace qvl::test
