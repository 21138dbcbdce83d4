// plan(): the arithmetic of planner.h. Suggestions and auto_fit() live in fit.cpp.
#include "memory/planner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "backend/backend.h"            // kPrefetchSlots
#include "backend/cuda/cuda_backend.h"  // plain C++: the backend's workspace sizes
#include "image/image.h"
#include "memory/plan_internal.h"
#include "model/presets.h"
#include "model/tensor_specs.h"

namespace qvl {

namespace {

// Per-architecture CUDA overheads. Only the sm_90 row is measured; the others are PROVISIONAL.
// - sm_90, measured on an H200 (132 SMs, driver 580, CUDA 13; tools/bench/plan_vs_measured.py,
//   2026-11-22, 24 runs of 2B/4B × BF16/FP8 × 2k/8k contexts × 0.5/1/2 MP): device memory of
//   the `qvl run` process minus everything else the plan counts (weights as allocated, see
//   weight_bytes) = 525–531 MiB, the same for every model once the weights' page rounding is
//   planned. The row keeps the formula's 520.1 MiB context and puts the rest, rounded up to
//   532 MiB in all, under modules (the split between the two is not observable).
// - Bare primary context = base + per SM. The driver reserves local memory for
//   stack (1 KiB default) × SMs × resident threads per SM, plus per-SM buffers. Public
//   measurements (reference/performance.md §7): 107 MiB on an RTX 4060 Ti (sm_89, 34 SMs),
//   555 MiB on an RTX PRO 6000 Blackwell (sm_120, 188 SMs), 256 MiB on an RTX 3090 (sm_86,
//   82 SMs). A line through the first two: 8 MiB + 2.91 MiB per SM (the 3090 lands at 246 MiB).
//   SMs with 2048 resident threads (sm_80, sm_90) get the per-SM part scaled by 2048/1536.
// - Modules: with lazy loading (CUDA >= 12.2 default) only kernels that run are loaded; qvl has
//   a few dozen kernels plus the cuBLASLt kernels its GEMM shapes pick, and one CUDA graph per
//   decode batch bucket. 48 MiB (64 MiB on datacenter parts, which get more GEMM variants) is a
//   guess with room, well under PyTorch's whole lazy context (~290 MB, pytorch PR #86509).
// The backend's own workspaces (cuBLASLt, FP8 dequantisation, decode partials) are not here:
// they are exact, from cuda_backend_workspace_bytes().
constexpr int64_t kPerSm1536 = 2980 * kKiB;  // 2.91 MiB
constexpr int64_t kPerSm2048 = 3973 * kKiB;  // 2.91 MiB × 2048 / 1536
constexpr ArchOverheads kArchTable[] = {
    // cc, label, typical SMs, context base, per SM, modules
    {0, "unknown arch, a desktop card assumed", 36, 8 * kMiB, kPerSm1536, 48 * kMiB, true},
    {80, "sm_80 (A100)", 108, 8 * kMiB, kPerSm2048, 64 * kMiB, true},
    {86, "sm_86 (RTX 30)", 38, 8 * kMiB, kPerSm1536, 48 * kMiB, true},
    {89, "sm_89 (RTX 40, L4, L40)", 34, 8 * kMiB, kPerSm1536, 48 * kMiB, true},
    {90, "sm_90 (H100, H200)", 132, 8 * kMiB, kPerSm2048, 532 * kMiB - (8 * kMiB + 132 * kPerSm2048), false},
    {120, "sm_120 (RTX 50)", 36, 8 * kMiB, kPerSm1536, 48 * kMiB, true},
};

// Offloaded layers stream through this many device-resident layer buffers (double buffering:
// one being computed, the next being copied in).
constexpr int64_t kOffloadStagingLayers = 2;

// The decoder layer a tensor belongs to, or -1 (the checkpoint names, spec §2).
int layer_of(const std::string& name) {
  static const std::string kLayers = "model.language_model.layers.";
  if (name.rfind(kLayers, 0) != 0) return -1;
  return std::stoi(name.substr(kLayers.size()));
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The image module's options for the model's preprocessor and qvl's caps.
image::PreprocessOptions preprocess_options(const PreprocessorConfig& pre, int64_t max_image_pixels,
                                            int64_t max_image_tokens) {
  image::PreprocessOptions o;
  o.min_pixels = pre.min_pixels;
  o.max_pixels = pre.max_pixels;
  o.max_image_pixels = max_image_pixels;
  o.max_image_tokens = max_image_tokens;
  o.patch_size = pre.patch_size;
  o.merge_size = pre.merge_size;
  o.temporal_patch_size = pre.temporal_patch_size;
  return o;
}

}  // namespace

const ArchOverheads& arch_overheads(int compute_capability) {
  for (const ArchOverheads& row : kArchTable)
    if (row.compute_capability == compute_capability && compute_capability != 0) return row;
  // Same major version, nearest lower minor (e.g. sm_87 -> sm_86), else the unknown row.
  const ArchOverheads* best = &kArchTable[0];
  for (const ArchOverheads& row : kArchTable)
    if (row.compute_capability != 0 && row.compute_capability / 10 == compute_capability / 10 &&
        row.compute_capability < compute_capability &&
        (best == &kArchTable[0] || row.compute_capability > best->compute_capability))
      best = &row;
  return *best;
}

DType device_dtype(const TensorSpec& spec) {
  auto ends_with = [&](std::string_view suffix) {
    return spec.name.size() >= suffix.size() &&
           spec.name.compare(spec.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (spec.shape.size() == 1) {
    // Norm weights and LayerNorm biases: F32 (model/load). Linear biases: model/load hands them
    // over as F32, the CUDA backend's load_linear stores them BF16 (its epilogues read BF16).
    const bool norm = spec.name.find("norm") != std::string::npos;
    return norm || !ends_with(".bias") ? DType::kF32 : DType::kBF16;
  }
  if (ends_with(".weight_scale_inv")) return DType::kF32;  // the CUDA backend keeps block scales F32
  return spec.dtype;
}

void WeightBytes::Allocations::add(int64_t bytes) {
  if (bytes >= kPageRoundedAllocation)
    large += round_up(bytes, kDeviceGranularity);
  else
    small += round_up(bytes, kWeightAlignment);
}

int64_t WeightBytes::allocated(int offloaded) const {
  Allocations sum = other_allocations;
  const int resident = static_cast<int>(layer_allocations.size()) - offloaded;
  QVL_CHECK(offloaded >= 0 && resident >= 0) << offloaded << " of " << layer_allocations.size() << " layers";
  for (int l = 0; l < resident; ++l) {
    sum.large += layer_allocations[l].large;
    sum.small += layer_allocations[l].small;
  }
  return sum.large + round_up(sum.small, kDeviceGranularity);
}

int64_t WeightBytes::last_layers(int n) const {
  QVL_CHECK(n >= 0 && n <= static_cast<int>(layer_aligned.size())) << n << " of " << layer_aligned.size() << " layers";
  int64_t b = 0;
  for (size_t l = layer_aligned.size() - n; l < layer_aligned.size(); ++l) b += layer_aligned[l];
  return b;
}

namespace {

// The device allocation a checkpoint tensor ends up in: the CUDA backend's load_linear stacks
// q|k|v and gate|up (and their block scales) into one allocation each.
std::string allocation_key(const std::string& name) {
  static const std::pair<const char*, const char*> kMerged[] = {{"self_attn.q_proj.", "self_attn.qkv_proj."},
                                                                {"self_attn.k_proj.", "self_attn.qkv_proj."},
                                                                {"self_attn.v_proj.", "self_attn.qkv_proj."},
                                                                {"mlp.gate_proj.", "mlp.gate_up_proj."},
                                                                {"mlp.up_proj.", "mlp.gate_up_proj."}};
  if (layer_of(name) < 0) return name;
  for (const auto& [part, merged] : kMerged) {
    const size_t at = name.find(part);
    if (at != std::string::npos) return name.substr(0, at) + merged + name.substr(at + std::strlen(part));
  }
  return name;
}

}  // namespace

WeightBytes weight_bytes(const ModelConfig& config) {
  WeightBytes w;
  std::vector<int64_t> layer_bytes(config.text.num_hidden_layers, 0);
  // Allocation sizes in model order, with the layer each belongs to (-1: none).
  std::vector<std::pair<std::string, int64_t>> allocations;
  std::vector<int> allocation_layer;
  std::map<std::string, size_t> allocation_index;
  for (const TensorSpec& spec : checkpoint_tensor_specs(config)) {
    const int64_t bytes = spec.numel() * dtype_size(device_dtype(spec));
    w.alignment_padding += round_up(bytes, kWeightAlignment) - bytes;
    ++w.tensor_count;
    const std::string key = allocation_key(spec.name);
    auto [it, fresh] = allocation_index.emplace(key, allocations.size());
    if (fresh) {
      allocations.emplace_back(key, bytes);
      allocation_layer.push_back(layer_of(spec.name));
    } else {
      allocations[it->second].second += bytes;
    }
    switch (spec.part) {
      case WeightPart::kVision:
        w.vision += bytes;
        break;
      case WeightPart::kEmbedding:
        w.embeddings += bytes;
        break;
      case WeightPart::kLmHead:
        w.lm_head += bytes;
        break;
      case WeightPart::kText: {
        const int layer = layer_of(spec.name);
        if (layer < 0) {
          w.decoder_other += bytes;
          break;
        }
        QVL_CHECK(layer < config.text.num_hidden_layers) << spec.name;
        w.decoder_layers += bytes;
        layer_bytes[layer] += round_up(bytes, kWeightAlignment);
        break;
      }
    }
  }
  for (int64_t b : layer_bytes) w.largest_layer = std::max(w.largest_layer, b);
  w.layer_aligned = layer_bytes;
  w.layer_allocations.resize(layer_bytes.size());
  for (size_t i = 0; i < allocations.size(); ++i) {
    const int l = allocation_layer[i];
    (l < 0 ? w.other_allocations : w.layer_allocations[l]).add(allocations[i].second);
  }
  return w;
}

ModelConfig effective_config(const ModelConfig& config, const RuntimeOptions& options) {
  ModelConfig c = config;
  if (options.fp8_weights && !c.quant.fp8) make_fp8(&c);  // as the official -FP8 checkpoints
  return c;
}

int64_t max_image_tokens(const PreprocessorConfig& pre, int64_t max_image_pixels, int64_t max_image_tokens) {
  const image::PreprocessOptions image = preprocess_options(pre, max_image_pixels, max_image_tokens);
  const double f = image.factor();  // 32
  const double cap = static_cast<double>(image.effective_max_pixels());
  constexpr double kMaxAspect = 200.0;  // smart_resize rejects more extreme images
  // Shrink branch: h <= max(f, H/b), w <= max(f, W/b) with (H/b)(W/b) = cap; an edge clamped up
  // to f leaves the other at most sqrt(cap · aspect), floored to f.
  double bound = std::max(cap, f * std::floor(std::sqrt(cap * kMaxAspect) / f) * f);
  if (image.effective_max_pixels() >= image.max_pixels) {
    // Without a qvl cap, images below min_pixels grow to it with ceil and nothing shrinks them
    // back: h·w <= (H·b + f)(W·b + f) with H·W·b² = min_pixels, largest at the extreme aspect.
    const double min_px = static_cast<double>(image.min_pixels);
    bound = std::max(bound, (std::sqrt(min_px * kMaxAspect) + f) * (std::sqrt(min_px / kMaxAspect) + f));
  }
  return static_cast<int64_t>(std::floor(bound / (f * f)));
}

namespace detail {

Result<MemoryPlan> compute_plan(const ModelConfig& config, const RuntimeOptions& o, const DeviceFacts& device) {
  const TextConfig& tc = config.text;
  const PreprocessorConfig& pre = config.preprocessor;
  if (o.context_tokens < 1 || o.context_tokens > tc.max_position_embeddings)
    return invalid_argument("--context " + std::to_string(o.context_tokens) + ": must be in [1, " +
                            std::to_string(tc.max_position_embeddings) + "] (max_position_embeddings)");
  if (o.concurrency < 1 || o.concurrency > 4096)
    return invalid_argument("--concurrency " + std::to_string(o.concurrency) + ": must be in [1, 4096]");
  if (o.prefill_chunk < 1 || o.prefill_chunk > (int64_t{1} << 20))
    return invalid_argument("--prefill-chunk " + std::to_string(o.prefill_chunk) + ": must be in [1, 1048576]");
  if (o.max_running < 0 || o.max_running > 4096)
    return invalid_argument("--max-running " + std::to_string(o.max_running) + ": must be in [0, 4096]");
  if (o.kv_dtype != DType::kBF16 && o.kv_dtype != DType::kF8E4M3)
    return invalid_argument("--kv-dtype " + std::string(dtype_name(o.kv_dtype)) + ": must be bf16 or fp8");
  if (o.kv_page_tokens < 1 || o.kv_page_tokens > 4096)
    return invalid_argument("KV page size " + std::to_string(o.kv_page_tokens) + ": must be in [1, 4096] tokens");
  if (o.offload_layers < 0 || o.offload_layers > tc.num_hidden_layers)
    return invalid_argument("--offload-layers " + std::to_string(o.offload_layers) + ": the model has " +
                            std::to_string(tc.num_hidden_layers) + " decoder layers");
  QVL_RETURN_IF_ERROR(preprocess_options(pre, o.max_image_pixels, o.max_image_tokens).validate());
  if (o.gpu_memory_bytes < 0 || o.reserve_bytes < 0 || o.margin_bytes < 0)
    return invalid_argument("memory sizes must not be negative (--gpu-memory " + std::to_string(o.gpu_memory_bytes) +
                            ", reserve " + std::to_string(o.reserve_bytes) + ", margin " +
                            std::to_string(o.margin_bytes) + ")");
  if (o.activation_dtype != DType::kBF16 && o.activation_dtype != DType::kF16 && o.activation_dtype != DType::kF32)
    return invalid_argument("activation dtype " + std::string(dtype_name(o.activation_dtype)) + " is not a float type");

  MemoryPlan p;
  p.config = effective_config(config, o);
  p.options = o;
  p.quantized_at_load = o.fp8_weights && !config.quant.fp8;
  const int64_t gran = kDeviceGranularity;

  // ---- the largest admitted image ----
  const image::PreprocessOptions image = preprocess_options(pre, o.max_image_pixels, o.max_image_tokens);
  p.image_pixels = image.effective_max_pixels();
  int64_t tokens = max_image_tokens(pre, o.max_image_pixels, o.max_image_tokens);
  // Every image grows to at least the effective min_pixels.
  const int64_t min_image_tokens = ceil_div(image.effective_min_pixels(), int64_t{image.factor()} * image.factor());
  if (tokens > o.context_tokens) {
    tokens = o.context_tokens;
    p.notes.push_back("images are capped at the context (" + std::to_string(o.context_tokens) +
                      " tokens): a larger image could never be admitted");
  }
  if (tokens < min_image_tokens) {
    p.notes.push_back("no image can be admitted: the smallest image has " + std::to_string(min_image_tokens) +
                      " tokens, the cap allows " + std::to_string(tokens));
    tokens = 0;
  }
  p.image_tokens = tokens;
  p.image_patches = tokens * p.config.vision.merge_unit();

  // ---- weights ----
  p.weights = weight_bytes(p.config);
  const int64_t layer = p.weights.largest_layer;  // aligned bytes of one decoder layer
  // memory/offload.h: the last N layers go to host memory and stream through one allocation of
  // min(N, kPrefetchSlots) staging buffers of the largest layer.
  static_assert(kOffloadStagingLayers == kPrefetchSlots);
  p.weights_offloaded = p.weights.last_layers(o.offload_layers);
  p.offload_staging =
      o.offload_layers > 0 ? round_up(std::min<int64_t>(o.offload_layers, kOffloadStagingLayers) * layer, gran) : 0;
  p.weights_device = p.weights.allocated(o.offload_layers);
  p.offload_page_tables = o.offload_layers > 0
                              ? round_up(ceil_div(p.weights_offloaded, kHostPageBytes) * kHostPageTableEntryBytes, gran)
                              : 0;
  if (o.offload_layers > 0 && !o.can_offload)
    p.notes.push_back("this backend cannot keep layers in host memory: --offload-layers is planned, not served");
  if (o.offload_layers > 0 && o.offload_layers <= kOffloadStagingLayers)
    p.notes.push_back("offloading " + std::to_string(o.offload_layers) +
                      " layer(s) saves nothing: they stream through " + std::to_string(kOffloadStagingLayers) +
                      " device buffers of one layer each");

  // ---- CUDA runtime ----
  p.arch = &arch_overheads(device.compute_capability);
  p.sm_count = device.sm_count > 0 ? device.sm_count : p.arch->typical_sm_count;
  if (o.cuda_overhead_bytes >= 0) {
    p.runtime_overridden = true;
    p.cuda_context = o.cuda_overhead_bytes;
  } else {
    p.cuda_context = p.arch->context_base + p.sm_count * p.arch->context_per_sm;
    p.cuda_modules = p.arch->modules;
    if (p.arch->provisional)
      p.notes.push_back(std::string("the CUDA context and module sizes (") + p.arch->label +
                        ") are provisional estimates, not yet measured; override with --cuda-overhead");
  }
  // Each workspace is its own allocation when the backend is made.
  CudaBackendOptions backend_options;
  backend_options.fp8_gemm = o.fp8_w8a8 ? CudaFp8Gemm::kW8A8 : CudaFp8Gemm::kDequant;
  // The W8A8 activation scratch only where the backend allocates it (W8A8 asked for, compute
  // capability 9.x or unknown).
  p.fp8_act_workspace =
      round_up(static_cast<int64_t>(cuda_fp8_act_workspace_bytes(backend_options, device.compute_capability)), gran);
  // The FP8 dequant workspace comes with the first FP8 Linear the model loads.
  p.dequant_workspace =
      p.config.quant.fp8 ? round_up(static_cast<int64_t>(backend_options.dequant_workspace_bytes), gran) : 0;
  // What make_cuda_backend allocates (the dequant workspace comes later, with the weights).
  const int64_t made_with_backend = round_up(static_cast<int64_t>(backend_options.gemm_workspace_bytes), gran) +
                                    p.fp8_act_workspace +
                                    round_up(static_cast<int64_t>(cuda_decode_scratch_bytes(backend_options)), gran);
  QVL_CHECK_GE(made_with_backend,
               static_cast<int64_t>(cuda_backend_workspace_bytes(backend_options, device.compute_capability)));
  p.backend_workspace = made_with_backend + p.dequant_workspace;

  // ---- KV cache ----
  p.kv_bytes_per_token =
      2 * int64_t{tc.num_hidden_layers} * tc.num_key_value_heads * tc.head_dim * dtype_size(o.kv_dtype);
  p.kv_page_bytes = p.kv_bytes_per_token * o.kv_page_tokens;
  p.kv_pages_per_seq = ceil_div(o.context_tokens, o.kv_page_tokens);
  p.kv_required_pages = int64_t{o.concurrency} * p.kv_pages_per_seq;
  p.kv_required_bytes = round_up(p.kv_required_pages * p.kv_page_bytes, gran);

  // ---- the runner's buffers: activation arena, step inputs, logits ----
  // As engine/loader builds the runner: max_running sequences (default: concurrency) per step,
  // steps of at least prefill_chunk rows and one row per sequence.
  p.max_seqs = o.max_running > 0 ? o.max_running : o.concurrency;
  const RunnerShape shape{std::max<int64_t>(o.prefill_chunk, p.max_seqs), p.max_seqs, p.kv_pages_per_seq,
                          p.image_patches};
  const RunnerBuffers buffers = runner_buffers(p.config, shape, o.activation_dtype);
  p.vision = buffers.vision;
  p.decoder = buffers.decoder;
  p.activation_arena = round_up(buffers.arena, gran);
  p.step_inputs = round_up(buffers.step_inputs, gran);
  p.logits_buffer = round_up(buffers.logits, gran);
  p.upload_staging = buffers.upload_staging;
  p.upload_staging_page_tables =
      p.upload_staging > 0 ? round_up(ceil_div(p.upload_staging, kHostPageBytes) * kHostPageTableEntryBytes, gran) : 0;

  // ---- totals ----
  p.fixed_bytes = p.weights_device + p.offload_staging + p.offload_page_tables + p.runtime_total() +
                  p.activation_arena + p.step_inputs + p.logits_buffer + p.upload_staging_page_tables;
  p.peak_bytes = p.fixed_bytes + p.kv_required_bytes;
  p.margin_bytes = o.margin_bytes;

  // ---- budget and verdict ----
  if (o.gpu_memory_bytes > 0) {
    p.has_budget = true;
    p.budget_bytes = o.gpu_memory_bytes;
    p.budget_source = "--gpu-memory";
  } else if (device.present) {
    // The free memory was measured after this process created its CUDA context (and maybe after
    // the backend allocated its workspaces): add the planned sizes of what is already spent back
    // instead of counting it twice.
    const int64_t held = p.cuda_context + (device.workspaces_allocated ? made_with_backend : 0);
    p.has_budget = true;
    p.budget_bytes = std::max<int64_t>(0, device.free_bytes - o.reserve_bytes + held);
    p.budget_source = "free memory of " + device.name + " (" + format_bytes(device.free_bytes) + ") minus reserve (" +
                      format_bytes(o.reserve_bytes) + ")";
  } else {
    p.budget_source = "none: no GPU found; pass --gpu-memory";
  }
  if (p.has_budget) {
    int64_t room = p.budget_bytes - p.margin_bytes - p.fixed_bytes;
    p.kv_capacity_pages = room > 0 ? round_down(room, gran) / p.kv_page_bytes : 0;
    p.kv_capacity_tokens = p.kv_capacity_pages * o.kv_page_tokens;
    p.fits = p.peak_bytes + p.margin_bytes <= p.budget_bytes;
    p.shortfall_bytes = p.fits ? 0 : p.peak_bytes + p.margin_bytes - p.budget_bytes;
  }
  return p;
}

}  // namespace detail

Result<MemoryPlan> plan(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device) {
  QVL_ASSIGN_OR_RETURN(MemoryPlan p, detail::compute_plan(config, options, device));
  if (p.has_budget) {
    p.max_context = detail::max_context(config, options, device);
    if (!p.fits) p.suggestions = detail::suggestions(config, options, device, p);
  }
  return p;
}

}  // namespace qvl
