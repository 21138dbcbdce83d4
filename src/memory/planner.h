// The memory planner: a pure function from (model config, runtime options, device facts) to a
// MemoryPlan that says, in bytes, everything qvl will hold on the GPU — weights as they sit on the
// device, the CUDA context and library workspaces, the activation arena (vision encoder peak for
// the largest admitted image, decoder step for the largest prefill chunk, logits), the step
// inputs, the KV cache in fixed-size pages — and whether that fits the budget. It is the single
// source of truth: `qvl plan` prints it, `qvl serve` allocates exactly what it says (weights
// arena, activation arena, KV pool up to kv_capacity_pages) and fails before loading anything
// when it does not fit, and `qvl bench` measures the difference.
//
// Invariants:
// - Every top-level device allocation is rounded up to kDeviceGranularity (the driver maps whole
//   2 MiB pages), so the plan counts what nvidia-smi shows, not what was asked for.
// - peak_bytes is monotone in the context, the concurrency, the image cap and the prefill chunk,
//   and fits == (peak_bytes + margin_bytes <= budget_bytes); shortfall_bytes says by how much not.
// - Suggestions come cheapest first (FP8 weights, FP8 KV, smaller context, smaller image cap,
//   N decoder layers in host memory, smaller prefill chunk), each with the bytes it saves alone.
//
// Known approximations (tools/bench/plan_vs_measured.py measures them on the GPU machine):
// - The CUDA context and kernel modules come from a per-architecture table; only the sm_90 row is
//   measured (H200), the others are provisional.
// - Weights are counted allocation by allocation as the CUDA backend makes them (one cudaMalloc
//   per tensor, stacked q|k|v and gate|up merged): the driver maps an allocation of at least
//   kPageRoundedAllocation bytes in whole 2 MiB pages of its own (measured: 4B BF16's 95 MiB
//   gate|up and 47.5 MiB down hold 1.5 MiB more per layer, which is why the measured overhead
//   looked 56 MiB larger with 4B than with 2B, whose tensors are whole pages), and packs smaller
//   ones together.
// - KV is counted in whole pages for concurrency × context; the pool commits in chunks (at least
//   one full context, engine/loader), so a workload that is not whole chunks may commit up to one
//   chunk more, never past kv_capacity_pages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "memory/activations.h"
#include "memory/byte_size.h"
#include "model/config.h"

namespace qvl {

inline constexpr int64_t kDeviceGranularity = 2 * kMiB;
// Allocations at least this large get whole kDeviceGranularity pages of their own; smaller ones
// share pages (kWeightAlignment each). The 2B/4B measurements fit any threshold between 16 KiB
// and 2 MiB (no weight lies in between); 1 MiB is the caching allocators' usual split.
inline constexpr int64_t kPageRoundedAllocation = 1 * kMiB;
// Pinned host memory is mapped into the device's address space in host pages, and those page
// tables live in device memory: 8 bytes per 4 KiB page (0.2%). Measured on the H200 with
// offloaded layers: 4235 MiB pinned cost 5-8 MiB of device memory beyond the plan, 10673 MiB
// cost 17-20 MiB.
inline constexpr int64_t kHostPageBytes = 4 * kKiB;
inline constexpr int64_t kHostPageTableEntryBytes = 8;

// What the user (or serve's defaults) asks for. Zero means "the default" where noted.
struct RuntimeOptions {
  int64_t context_tokens = 4096;  // per sequence: prompt (text + image tokens) + generated tokens
  int concurrency = 1;            // sequences that may each hold a full context at the same time
  int64_t max_image_pixels = 0;   // 0: the preprocessor's max_pixels
  int64_t max_image_tokens = 0;   // 0: only the pixel cap (merged tokens = pixels / 1024)
  int64_t prefill_chunk = 2048;   // rows per decoder step, prefill and decode rows together (`qvl run` default)
  int max_running = 0;            // sequences in one step (engine max_running); 0: concurrency
  DType kv_dtype = DType::kBF16;  // kBF16 or kF8E4M3
  int kv_page_tokens = 16;        // tokens per KV page
  int offload_layers = 0;         // decoder layers kept in pinned host memory, streamed in
  bool fp8_weights = false;       // block-FP8 text Linears (quantized at load unless already FP8)
  bool fp8_w8a8 = false;          // CUDA --fp8-gemm w8a8: FP8 prefill GEMMs on quantized activations
  // What this qvl's loader can do (engine/loader): auto-fit applies only these, suggestions offer
  // offloading only when it exists. Flip them where the feature lands.
  bool can_quantize_fp8 = true;        // quantize a BF16 checkpoint's text Linears to FP8 at load (memory/quantize.h)
  bool can_offload = true;             // keep decoder layers in pinned host memory (memory/offload.h)
  int64_t gpu_memory_bytes = 0;        // the budget; 0: the device's free memory minus reserve_bytes
  int64_t reserve_bytes = 256 * kMiB;  // left free for other programs when the budget is "free memory"
  int64_t margin_bytes = 128 * kMiB;   // held back inside the budget for what the plan cannot see
  int64_t cuda_overhead_bytes = -1;    // CUDA context + kernel modules; -1: the arch table
  DType activation_dtype = DType::kBF16;  // the backend's activation dtype (CUDA BF16, CPU F32)
};

// What is known about the device; all zero when no GPU is present (`qvl plan` without a GPU).
struct DeviceFacts {
  bool present = false;
  std::string name;
  int compute_capability = 0;  // 80, 86, 89, 90, 120, ...; 0 = unknown
  int sm_count = 0;            // 0 = unknown
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;             // cudaMemGetInfo, taken after this process created its context
  bool workspaces_allocated = false;  // ...and after the CUDA backend allocated its workspaces
};

// One row of the per-architecture overhead table (planner.cpp holds the values and their sources).
struct ArchOverheads {
  int compute_capability = 0;  // 0: the row used when the architecture is unknown
  const char* label = "";
  int typical_sm_count = 0;    // used when DeviceFacts::sm_count is 0
  int64_t context_base = 0;    // bare primary context, fixed part
  int64_t context_per_sm = 0;  // bare primary context, per SM (stack reservation and friends)
  int64_t modules = 0;         // lazily loaded kernel modules, library handles, CUDA graphs
  bool provisional = true;     // not yet measured on that architecture
};
const ArchOverheads& arch_overheads(int compute_capability);

// Weights as they sit on the device, by part (device_dtype() says which dtype each tensor has
// there). Stacked q|k|v and gate|up are the same bytes as their parts (the block scales too: every
// Qwen3-VL part starts on a 128-row boundary); a tied lm_head is the embedding table and counts
// once, under embeddings.
struct WeightBytes {
  int64_t vision = 0;
  int64_t decoder_layers = 0;  // all layers
  int64_t decoder_other = 0;   // final norm
  int64_t embeddings = 0;
  int64_t lm_head = 0;        // 0 when tied
  int64_t largest_layer = 0;  // the biggest decoder layer, each tensor aligned (offload staging unit)
  int64_t tensor_count = 0;
  int64_t alignment_padding = 0;  // rounding each tensor to kWeightAlignment

  // Device memory as allocated (see the header comment): page-rounded large allocations and the
  // 256-aligned small ones, for everything but the decoder layers and for each layer.
  struct Allocations {
    int64_t large = 0;  // whole pages
    int64_t small = 0;  // kWeightAlignment each, sharing pages
    void add(int64_t bytes);
  };
  Allocations other_allocations;
  std::vector<Allocations> layer_allocations;  // one per decoder layer

  int64_t total() const { return vision + decoder_layers + decoder_other + embeddings + lm_head; }
  // Device bytes of the weights with the last `offloaded` decoder layers elsewhere: the large
  // allocations plus the small ones rounded up to whole pages.
  int64_t allocated(int offloaded = 0) const;
  // Bytes of the last `n` decoder layers as one staging buffer holds them (tensors aligned).
  int64_t last_layers(int n) const;
  std::vector<int64_t> layer_aligned;  // per decoder layer, each tensor aligned
};
inline constexpr int64_t kWeightAlignment = 256;
struct TensorSpec;
// The dtype a checkpoint tensor has on the CUDA device: norm weights and LayerNorm biases F32
// (model/load); Linear biases BF16 and FP8 block scales (weight_scale_inv) F32 (the CUDA
// backend's load_linear); every other tensor keeps its checkpoint dtype (BF16, or FP8 E4M3:
// never dequantized).
DType device_dtype(const TensorSpec& spec);
// The device bytes of every checkpoint tensor of `config` (model/tensor_specs.h).
WeightBytes weight_bytes(const ModelConfig& config);

// The config the weights will have on the device: `config`, with block-FP8 text Linears when
// options.fp8_weights is set (as the official -FP8 checkpoints: vision tower, embeddings and
// lm_head stay BF16).
ModelConfig effective_config(const ModelConfig& config, const RuntimeOptions& options);

// Merged tokens of the largest image the preprocessor (image/image.h target_size) can produce
// under the model's max_pixels and qvl's caps (0 = none): h·w stays within the effective cap
// except where an edge is clamped up to the factor (aspect ratios near 200:1, caps below about
// 205k pixels) or, without a qvl cap, a small image grows to min_pixels; this bounds all cases.
int64_t max_image_tokens(const PreprocessorConfig& pre, int64_t max_image_pixels, int64_t max_image_tokens);

enum class FitChange : uint8_t {
  kFp8Weights,
  kFp8Kv,
  kSmallerContext,
  kSmallerImageCap,
  kOffloadLayers,
  kSmallerPrefillChunk,
};
const char* fit_change_name(FitChange change);  // "fp8_weights", "fp8_kv", "context", ...

struct Suggestion {
  FitChange change = FitChange::kFp8Weights;
  std::string flag;         // what to pass: "--fp8", "--kv-dtype fp8", "--context 2816", ...
  std::string description;  // one line for people
  int64_t value = 0;        // the new value of a numeric option (context, image tokens, layers, chunk)
  int64_t saves_bytes = 0;  // peak_bytes reduction of this change alone
  bool fits_alone = false;  // the plan fits with this change alone
};

struct MemoryPlan {
  ModelConfig config;              // effective_config()
  RuntimeOptions options;          // as given
  bool quantized_at_load = false;  // options.fp8_weights on a BF16 checkpoint
  // The largest admitted image (0 when no image fits the context).
  int64_t image_tokens = 0;
  int64_t image_patches = 0;
  int64_t image_pixels = 0;  // the effective pixel cap (the model's max_pixels and qvl's caps)

  // Weights.
  WeightBytes weights;
  int64_t weights_offloaded = 0;    // bytes of the layers moved to pinned host memory (weights.last_layers)
  int64_t offload_staging = 0;      // device buffers the offloaded layers stream through
  int64_t offload_page_tables = 0;  // the device's page tables for the pinned host memory (below)
  int64_t weights_device = 0;       // resident weights as allocated (weights.allocated)

  // CUDA runtime.
  const ArchOverheads* arch = nullptr;
  int sm_count = 0;
  int64_t cuda_context = 0;         // the arch table, or options.cuda_overhead_bytes
  int64_t cuda_modules = 0;         // the arch table (0 when overridden)
  int64_t backend_workspace = 0;    // the CUDA backend's own workspaces (cuda_backend_workspace_bytes + dequant)
  int64_t fp8_act_workspace = 0;    // of which the W8A8 activation scratch (0 where it is not allocated)
  int64_t dequant_workspace = 0;    // and the FP8 dequant workspace (FP8 models; made at load, not with the backend)
  bool runtime_overridden = false;  // options.cuda_overhead_bytes replaced the table
  int64_t runtime_total() const { return cuda_context + cuda_modules + backend_workspace; }

  // The runner's buffers (memory/activations.h runner_buffers), built for decoder.step_tokens
  // rows and max_seqs sequences per step, kv_pages_per_seq page-table columns, image_patches.
  int64_t max_seqs = 0;  // max_running, or concurrency; also the logits rows per step
  VisionActivationTerms vision;
  DecoderActivationTerms decoder;
  int64_t activation_arena = 0;  // features + max(vision scratch, decoder peak), rounded
  int64_t step_inputs = 0;       // rounded
  int64_t logits_buffer = 0;     // [max_seqs, V] activation dtype, rounded
  // The vision upload staging buffer: pinned host memory (vision.upload_staging, not on the
  // device), and the device page tables that map it (counted like offload_page_tables).
  int64_t upload_staging = 0;
  int64_t upload_staging_page_tables = 0;

  // KV cache.
  int64_t kv_bytes_per_token = 0;  // 2 × layers × Hkv × head_dim × dtype bytes
  int64_t kv_page_bytes = 0;
  int64_t kv_pages_per_seq = 0;   // ceil(context / page)
  int64_t kv_required_pages = 0;  // concurrency × kv_pages_per_seq
  int64_t kv_required_bytes = 0;  // rounded to the device granularity
  int64_t kv_capacity_pages = 0;  // what the budget leaves (0 without a budget)
  int64_t kv_capacity_tokens = 0;
  int64_t max_context = 0;  // the longest context `concurrency` sequences can each hold

  // Totals and verdict.
  int64_t fixed_bytes = 0;  // everything but the KV cache
  int64_t peak_bytes = 0;   // fixed + KV for concurrency × context: this configuration at its worst
  int64_t margin_bytes = 0;
  bool has_budget = false;
  int64_t budget_bytes = 0;
  std::string budget_source;  // "--gpu-memory", "free memory of <gpu> minus reserve", "none"
  bool fits = false;
  int64_t shortfall_bytes = 0;          // peak + margin − budget when it does not fit, else 0
  std::vector<Suggestion> suggestions;  // when it does not fit, cheapest first
  std::vector<std::string> notes;       // provisional constants, clamps applied, ...
};

// Plans `config` with `options` on `device`. InvalidArgument (naming the option and value) for
// options that make no sense; a plan that does not fit is not an error (see fits).
Result<MemoryPlan> plan(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device);

// The cheapest set of changes that fits: changes are tried cheapest first, each numeric one at the
// mildest value that fits; then every change but the costliest is relaxed again where the plan
// still fits. ResourceExhausted with the remaining shortfall when even all of them do not fit,
// FailedPrecondition without a budget.
struct AutoFit {
  RuntimeOptions options;
  MemoryPlan plan;                  // plan(config, options, device): fits
  std::vector<Suggestion> applied;  // what was changed, cheapest first
};
Result<AutoFit> auto_fit(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device);

// Floors below which suggestions and auto-fit do not go (qvl stays useful above them): a context
// that still holds a 1-MP image and an answer, Qwen's recommended minimum of 1024 image tokens for
// grounding (capped by what was asked), and a prefill chunk that keeps GEMMs efficient.
inline constexpr int64_t kMinFitContext = 2048;
inline constexpr int64_t kMinFitImageTokens = 1024;
inline constexpr int64_t kMinFitPrefillChunk = 256;

}  // namespace qvl
