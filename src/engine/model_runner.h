// ModelRunner: what the engine needs from a model, and nothing more. The engine decides what runs
// (which sequences, how many tokens each, which pages they write) and describes one step as plain
// host arrays (StepInput); the runner copies them into its fixed device buffers, runs the decoder
// over the paged KV cache and returns the logits rows the engine asked for. The real runner wraps
// the Qwen3-VL model and a backend (engine/qwen3vl_runner.h); tests use fakes that check the page
// tables and slots they are given.
//
// Invariants the engine guarantees for every forward():
// - rows of one sequence are consecutive and in token order; query_start delimits them;
// - slots[i] = page · page_size + offset for the token at absolute index context_len - n + i of
//   its sequence, and the page is that sequence's page_table entry for the index;
// - at most one image's features are alive at a time (the memory plan holds one image), and a
//   step feeds rows of at most that image;
// - the shapes stay within the limits the runner was built for (RunnerLimits).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/top_k.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "memory/kv_pool.h"

namespace qvl {

// Model facts the engine uses to validate and schedule requests.
struct ModelInfo {
  int vocab_size = 0;
  int image_token_id = -1;    // the pad token each image's features replace
  int merge_unit = 4;         // patches per image token (spatial_merge_size²)
  int64_t max_positions = 0;  // max_position_embeddings: the model's own context limit
  KvLayout kv_layout;         // one cache token of every layer
};

// The largest step the runner must handle; it sizes its buffers from these once.
struct RunnerLimits {
  int max_step_tokens = 0;        // rows of one step, all sequences together
  int max_seqs = 0;               // sequences in one step (= logits rows at most)
  int max_pages_per_seq = 0;      // page table columns
  int64_t max_image_patches = 0;  // largest image the vision encoder must take
};

// One encoded image: the merged features [T, O] and the deepstack features, on the device,
// owned by the runner's memory for as long as this object lives.
class ImageFeatures {
 public:
  virtual ~ImageFeatures() = default;
  virtual int64_t num_tokens() const = 0;  // T = rows of the merged features
};

// Rows [feature_row, feature_row + count) of an image's features replace the embeddings of
// step rows [step_row, step_row + count) (those rows carry the image pad token).
struct ImageRows {
  const ImageFeatures* features = nullptr;
  int64_t feature_row = 0;
  int64_t step_row = 0;
  int64_t count = 0;
};

// One decoder step over B sequences and S rows, as host arrays matching TextBatch.
struct StepInput {
  std::vector<int32_t> token_ids;    // [S]
  std::vector<int32_t> positions;    // [S, 3] M-RoPE (T, H, W)
  std::vector<int32_t> slots;        // [S]
  std::vector<int32_t> query_start;  // [B + 1]
  std::vector<int32_t> context_len;  // [B]: cached tokens after this step's writes
  std::vector<int32_t> page_table;   // [B, max_pages_per_seq], unused entries 0
  int max_pages_per_seq = 0;
  int max_context = 0;               // max of context_len
  std::vector<int32_t> logits_rows;  // step rows whose logits the engine samples, ascending
  std::vector<ImageRows> images;

  int num_seqs() const { return static_cast<int>(context_len.size()); }
  int num_tokens() const { return static_cast<int>(token_ids.size()); }
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelInfo& info() const = 0;

  // M-RoPE positions [L, 3] of a prompt and the rope delta that decode positions add to the
  // token index (position of token n >= L is n + rope_delta on all three axes).
  virtual std::vector<int32_t> prompt_positions(std::span<const int32_t> prompt_ids,
                                                const std::vector<PreparedImage>& images,
                                                int64_t* rope_delta) const = 0;

  // Runs the vision encoder over one image.
  virtual Result<std::unique_ptr<ImageFeatures>> encode_image(const PreparedImage& image) = 0;

  // Runs one decoder step, writing K/V into `cache` at the slots and the logits rows, in
  // order, into `logits` ([logits_rows.size(), vocab_size] f32 on the host).
  virtual Status forward(const StepInput& step, const KvCacheView& cache, std::span<float> logits) = 0;

  // forward() for a step whose every logits row is sampled greedily (temperature 0, no
  // penalties): tokens[i] = greedy_argmax of logits row i, the token the sampler would pick from
  // forward()'s logits. A runner on a device takes the argmax there and brings back only the
  // ids. The default runs forward() and takes it on the host.
  virtual Status forward_greedy(const StepInput& step, const KvCacheView& cache, std::span<int32_t> tokens) {
    const size_t vocab = static_cast<size_t>(info().vocab_size);
    std::vector<float> logits(tokens.size() * vocab);
    Status st = forward(step, cache, logits);
    if (!st.is_ok()) return st;
    for (size_t r = 0; r < tokens.size(); ++r) tokens[r] = greedy_argmax(std::span(logits).subspan(r * vocab, vocab));
    return Status::ok();
  }

  // forward() for a step whose sampled rows draw from their largest logits
  // (Sampler::can_sample_candidates): keys [R, kSampleCandidates] = each logits row's largest
  // entries as backend/top_k.h keys (Backend::top_k_rows). A runner on a device computes them
  // there and brings back 512 bytes per row instead of the row. The step's logits stay
  // available to logits_row() until the next forward, for a row whose keys do not decide its
  // token. The defaults run forward() and keep its logits on the host.
  virtual Status forward_top_k(const StepInput& step, const KvCacheView& cache, std::span<uint64_t> keys) {
    const size_t vocab = static_cast<size_t>(info().vocab_size), rows = step.logits_rows.size();
    QVL_CHECK_EQ(keys.size(), rows * kSampleCandidates);
    last_logits_.resize(rows * vocab);
    Status st = forward(step, cache, last_logits_);
    if (!st.is_ok()) return st;
    for (size_t r = 0; r < rows; ++r)
      top_k_keys(std::span<const float>(last_logits_).subspan(r * vocab, vocab),
                 keys.subspan(r * kSampleCandidates, kSampleCandidates));
    return Status::ok();
  }
  // Logits row r of the last forward_top_k(), as forward() gives it.
  virtual Status logits_row(int64_t r, std::span<float> out) {
    const size_t vocab = static_cast<size_t>(info().vocab_size);
    QVL_CHECK(r >= 0 && static_cast<size_t>(r + 1) * vocab <= last_logits_.size() && out.size() == vocab)
        << "logits row " << r;
    std::copy_n(last_logits_.begin() + static_cast<std::ptrdiff_t>(r * vocab), vocab, out.begin());
    return Status::ok();
  }

 private:
  std::vector<float> last_logits_;  // the defaults' logits of the last forward_top_k()
};

}  // namespace qvl
