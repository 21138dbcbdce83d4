// Qwen3-VL forward pass, written once against the backend op interface (backend/backend.h).
// Two entry points, mirroring the paper's two towers:
//   encode_images: pixels → vision transformer → merged image embeddings + deepstack features;
//   forward:       one step of the text decoder over a batch of sequences (prefill chunks and
//                  decode tokens mixed) on the paged KV cache → logits for selected rows.
// The engine glues them: it encodes a request's images once, then feeds the embedding rows
// that fall into each prefill chunk (VisualRows) to forward. Deepstack features ride along
// with those rows and are added after decoder layers 0..k−1, so any chunk split of a prompt
// gives the same result as one whole prefill.
//
// Invariants: the model holds no per-request state (deepstack features, positions, the KV
// cache and the arena are arguments); all activations come from the caller's Arena, buffer by
// buffer in the layout memory/activations.h names and sizes (vision_activation_terms,
// decoder_activation_terms), so nothing is allocated while generating;
// shapes and batch tables are the caller's responsibility and are checked with QVL_CHECK.
// Numerics follow transformers 5.17 (spec §5–6); the FP8 path is the backend's (Linear ops).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/status.h"
#include "model/config.h"
#include "model/positions.h"
#include "model/weights.h"

namespace qvl {

// One preprocessed image on the host, in one of two forms (engine.h PreparedImage holds either):
// pixel_values [t·h·w, patch_dim] float32, rows in the processor's merge order; or (t = 1) the
// resized RGB8 image rgb [h·patch, w·patch, 3], which goes up as bytes and is patchified on the
// backend (Backend::patchify_rgb: the same values, 8x fewer bytes to copy and transfer). The
// images of one encode_images call all use the same form.
struct ImageInput {
  const float* pixel_values = nullptr;
  ImageGrid grid;
  const uint8_t* rgb = nullptr;
};

// Host memory through which encode_images sends what it uploads (the F32 pixel values, then
// the rotary, segment and position-interpolation tables), laid out as memory/activations.h
// VisionActivationTerms::upload_staging counts it. From Backend::allocate_host (pinned on
// CUDA), so the copies run asynchronously and at full speed. Empty: the uploads go from the
// caller's (pageable) memory, each copy waiting for itself.
struct HostStaging {
  void* data = nullptr;
  size_t bytes = 0;
};
// Pixels go through the staging buffer in chunks of about this size: the host copies chunk
// i + 1 into it while the device fetches chunk i.
inline constexpr int64_t kStagingChunkBytes = 2 << 20;

// encode_images output: one row per merged token, images concatenated in input order.
struct VisionOutput {
  Tensor embeds;                       // [M, out_hidden] activation dtype
  std::vector<Tensor> deepstack;       // one [M, out_hidden] per deepstack_visual_indexes entry
  std::vector<int64_t> token_offsets;  // image i owns rows [token_offsets[i], token_offsets[i+1])

  // Rows [begin, end) of the embeddings and of every deepstack feature, e.g. the part of an
  // image that falls into one prefill chunk.
  struct Slice {
    Tensor embeds;
    std::vector<Tensor> deepstack;
  };
  Slice rows(int64_t begin, int64_t end) const;
};

// A contiguous run of image-pad rows in one forward step and the vision rows they take.
struct VisualRows {
  int32_t batch_row = 0;          // first row of the run in this step's batch
  Tensor embeds;                  // [m, H] replaces the pad-token embeddings
  std::vector<Tensor> deepstack;  // [m, H] each, one per deepstack layer: added after layer j
};

// Inputs of one decoder step beyond the TextBatch tables.
struct TextStepInputs {
  Tensor token_ids;                // I32 [num_tokens] device; image rows carry the pad id
  std::vector<VisualRows> visual;  // prefill rows that are image tokens (empty for decode)
  Tensor logits_rows;              // I32 [r] device: batch rows whose logits are wanted
};

// Debug hook: called with every named intermediate (see kStage* names) and its layer/block
// index (−1 when not per layer). Tensors are device tensors of the backend; the hook may copy
// them to the host. Unset = no calls and no cost.
using DebugHook = std::function<void(std::string_view name, int index, const Tensor& t)>;

// Stage names passed to the hook; tools/reference/model_fixtures.py uses the same names.
inline constexpr std::string_view kStagePatchEmbed = "vision.patch_embed";  // [N, D] patch embed + pos
inline constexpr std::string_view kStageVisionBlock = "vision.block";       // [N, D] output of block i
inline constexpr std::string_view kStageDeepstack = "vision.deepstack";     // [M, O] deepstack merger j
inline constexpr std::string_view kStageMerger = "vision.merger";           // [M, O] final merger
inline constexpr std::string_view kStageEmbeds = "text.embeds";             // [n, H] after image merge
inline constexpr std::string_view kStageLayer = "text.layer";    // [n, H] layer l output (before deepstack add)
inline constexpr std::string_view kStageNorm = "text.norm";      // [r, H] final norm of the logits rows
inline constexpr std::string_view kStageLogits = "text.logits";  // [r, V]

class Qwen3VLModel {
 public:
  // Checks that the config and the (backend) weights agree: layer counts, deepstack mergers,
  // head shapes, M-RoPE sections; a mismatch is a kInvalidArgument naming both numbers.
  static Result<std::unique_ptr<Qwen3VLModel>> create(Backend& backend, const ModelConfig& config,
                                                      ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  const ModelWeights& weights() const { return weights_; }
  int num_deepstack() const { return static_cast<int>(config_.vision.deepstack_visual_indexes.size()); }
  const MropeSpec& mrope() const { return mrope_; }

  // Vision encoder over `images` (spec §5). The outputs are allocated from `arena` first and
  // stay allocated; all scratch above them is released before returning. With `staging`, the
  // call first waits for the backend's stream (earlier uploads from the staging buffer), and
  // the staging buffer must not be written until the next synchronize(). Errors: a grid that is
  // not valid (validate_grid), a missing pixel buffer.
  Result<VisionOutput> encode_images(std::span<const ImageInput> images, Arena& arena,
                                     const HostStaging& staging = {}) const;

  // One decoder step (spec §6): embeds batch.num_tokens rows, merges the visual rows, runs the
  // layers (writing this step's K/V into `cache` at batch.slots and attending over each
  // sequence's cached tokens), adds deepstack features after layers 0..k−1, and writes the
  // logits of in.logits_rows to `logits` [r, vocab] (activation dtype). Scratch comes from
  // `arena` and is released before returning.
  void forward(const TextBatch& batch, const TextStepInputs& in, const KvCacheView& cache, Tensor logits,
               Arena& arena) const;

  void set_debug_hook(DebugHook hook) { hook_ = std::move(hook); }

  Qwen3VLModel(const Qwen3VLModel&) = delete;  // stack_ points into weights_
  Qwen3VLModel& operator=(const Qwen3VLModel&) = delete;

 private:
  Qwen3VLModel(Backend& backend, const ModelConfig& config, ModelWeights weights);

  void dump(std::string_view name, int index, const Tensor& t) const {
    if (hook_) hook_(name, index, t);
  }
  // Vision stages (vision.cpp).
  void vision_block(const VisionBlockWeights& w, Tensor x, const Tensor& rope, const VisionSegments& seg,
                    Arena& arena) const;
  void patch_merger(const MergerWeights& w, Tensor out, const Tensor& x, Arena& arena) const;
  // Text stages (text.cpp).
  void decoder_layer(int layer, Tensor x, const TextBatch& batch, const KvCacheView& cache, Arena& arena) const;
  // Runs every decoder layer through Backend::decoder_stack when the backend has a fused path
  // for this step; false (nothing done) otherwise.
  bool fused_layers(Tensor x, const TextBatch& batch, const KvCacheView& cache, Arena& arena) const;
  // Uploads host data into an arena tensor of the same dtype and shape.
  Tensor upload(Arena& arena, DType dtype, std::initializer_list<int64_t> dims, const void* host) const;

  Backend& backend_;
  ModelConfig config_;
  ModelWeights weights_;
  MropeSpec mrope_;
  TextAttentionShape attn_shape_;
  DecoderStack stack_;  // the decoder layers by reference, for Backend::decoder_stack
  DebugHook hook_;
};

}  // namespace qvl
