// SequenceRunner: drives one sequence through Qwen3VLModel — vision encoding, prompt
// positions, chunked prefill, then decode one token at a time — on a KV cache with an identity
// page table and one arena, both owned by the runner and sized with memory/activations.h. It is
// the simplest complete client of the model API: `qvl forward`, the golden tests and
// single-sequence reference checks use it. Serving goes through the engine instead.
//
// Chunking is invisible in the results: a prompt prefilled in chunks of any size gives the same
// logits as one whole prefill (the image rows and deepstack features of each chunk are sliced
// out of the one vision pass).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/status.h"
#include "model/model.h"

namespace qvl {

class SequenceRunner {
 public:
  struct Options {
    int max_tokens = 4096;  // KV capacity of the sequence (prompt + generated)
    int page_size = 16;
    int prefill_chunk = 0;  // rows per prefill step; 0 = the whole prompt in one step
  };

  static Result<std::unique_ptr<SequenceRunner>> create(const Qwen3VLModel& model, const Options& options);

  // Prefills `ids` (image pad runs expanded) with `images` in prompt order and returns the
  // logits of the last `logits_last` prompt tokens, [logits_last, vocab] row-major. Errors:
  // prompt/image mismatches (prompt_positions, encode_images), a prompt longer than
  // max_tokens, a second prefill.
  Result<std::vector<float>> prefill(std::span<const int32_t> ids, std::span<const ImageInput> images,
                                     int logits_last = 1);
  // Appends `token` at the next position and returns its logits [vocab].
  Result<std::vector<float>> decode(int32_t token);

  int64_t length() const { return length_; }
  int64_t rope_delta() const { return positions_.rope_delta; }
  const PromptPositions& prompt_positions() const { return positions_; }
  size_t arena_capacity() const { return arena_.capacity(); }
  size_t arena_high_water() const { return arena_.high_water(); }

 private:
  SequenceRunner(const Qwen3VLModel& model, const Options& options) : model_(model), options_(options) {}
  // One forward step over ids[begin, end) of the sequence at absolute index `start`, with
  // `positions` [m, 3]; logits of batch rows `logit_rows` are appended to `logits_out`.
  void step(std::span<const int32_t> ids, std::span<const int32_t> positions, int64_t start,
            const std::vector<VisualRows>& visual, const std::vector<int32_t>& logit_rows,
            std::vector<float>* logits_out);

  const Qwen3VLModel& model_;
  Options options_;
  DeviceBuffer kv_buffer_;
  KvCacheView cache_;
  std::vector<int32_t> page_table_;
  DeviceBuffer arena_buffer_;
  DeviceBuffer staging_buffer_;  // host memory for the vision uploads (Backend::allocate_host)
  Arena arena_;
  PromptPositions positions_;
  int64_t length_ = 0;
  bool prefilled_ = false;
};

}  // namespace qvl
