// The memory planner: exact weight bytes (arithmetic from spec §1–2 written out below), KV bytes
// per token, the budget and the verdict, monotonicity, the image-size bound, offloading.
// Suggestions and auto-fit: memory_fit_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "image/image.h"
#include "memory/planner.h"
#include "model/presets.h"

namespace qvl {
namespace {

ModelConfig preset(const char* name, bool fp8 = false) {
  return preset_config(name, fp8).value();
}

// A GPU that is there, with its free memory measured.
DeviceFacts present_gpu(int compute_capability, int sm_count, int64_t free_bytes) {
  DeviceFacts d;
  d.present = true;
  d.name = "GPU 0 test";
  d.compute_capability = compute_capability;
  d.sm_count = sm_count;
  d.free_bytes = free_bytes;
  return d;
}

MemoryPlan plan_ok(const ModelConfig& c, const RuntimeOptions& o, const DeviceFacts& d = {}) {
  Result<MemoryPlan> p = plan(c, o, d);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? std::move(p).value() : MemoryPlan{};
}

// ---- weights: spec §1.1 shapes, §2 tensors. On the CUDA device norm weights and LayerNorm
// biases are F32, Linear biases BF16, BF16 weights 2 bytes, FP8 weights 1 byte + an F32 scale
// per 128×128 block (BF16 in the checkpoint; the CUDA backend keeps them F32). ----

struct Shapes {
  int64_t H, L, Hq, I;     // text
  int64_t D, F, O, depth;  // vision
  bool tied;
};
constexpr int64_t kV = 151936, kKv = 8 * 128, kDeepstack = 3;
constexpr Shapes k2B{2048, 28, 16, 6144, 1024, 4096, 2048, 24, true};
constexpr Shapes k4B{2560, 36, 32, 9728, 1024, 4096, 2560, 24, true};
constexpr Shapes k8B{4096, 36, 32, 12288, 1152, 4304, 4096, 27, false};

int64_t blocks(int64_t n) {
  return (n + 127) / 128;
}

int64_t vision_bytes(const Shapes& s) {
  const int64_t D = s.D, F = s.F, O = s.O, M = 4 * D;
  // Linear weights BF16 (2 bytes) with BF16 biases; LayerNorm weight and bias F32 (4 bytes).
  int64_t patch = D * 3 * 2 * 16 * 16 * 2 + D * 2;  // Conv3d weight + bias
  int64_t pos = 2304 * D * 2;
  int64_t block = 4 * D * 4                                               // norm1, norm2 weight + bias
                  + 3 * D * D * 2 + 3 * D * 2                             // qkv
                  + D * D * 2 + D * 2                                     // proj
                  + F * D * 2 + F * 2                                     // fc1
                  + D * F * 2 + D * 2;                                    // fc2
  int64_t merger = 2 * D * 4 + M * M * 2 + M * 2 + O * M * 2 + O * 2;     // LN over D
  int64_t deepstack = 2 * M * 4 + M * M * 2 + M * 2 + O * M * 2 + O * 2;  // LN over 4D
  return patch + pos + s.depth * block + merger + kDeepstack * deepstack;
}

int64_t layer_bytes(const Shapes& s, bool fp8) {
  const int64_t H = s.H, q = s.Hq * 128, I = s.I;
  const int64_t norms = 2 * H * 4 + 2 * 128 * 4;  // input/post norms, q_norm, k_norm
  const int64_t elems = q * H + 2 * kKv * H + H * q + 2 * I * H + H * I;
  if (!fp8) return norms + elems * 2;
  const int64_t scales = blocks(q) * blocks(H) + 2 * blocks(kKv) * blocks(H) + blocks(H) * blocks(q) +
                         2 * blocks(I) * blocks(H) + blocks(H) * blocks(I);
  return norms + elems + scales * 4;
}

void expect_weights(const char* name, const Shapes& s, bool fp8) {
  SCOPED_TRACE(std::string(name) + (fp8 ? " fp8" : " bf16"));
  WeightBytes w = weight_bytes(preset(name, fp8));
  EXPECT_EQ(w.vision, vision_bytes(s));
  EXPECT_EQ(w.decoder_layers, s.L * layer_bytes(s, fp8));
  EXPECT_EQ(w.decoder_other, s.H * 4);  // final norm
  EXPECT_EQ(w.embeddings, kV * s.H * 2);
  EXPECT_EQ(w.lm_head, s.tied ? 0 : kV * s.H * 2);  // tied: counted once, under embeddings
}

TEST(PlannerWeights, ExactBytesBf16AndFp8) {
  for (bool fp8 : {false, true}) {
    expect_weights("2b", k2B, fp8);
    expect_weights("4b", k4B, fp8);
    expect_weights("8b", k8B, fp8);
  }
}

TEST(PlannerWeights, TotalsAsEvaluated) {
  // The sums above evaluated (python, same formulas): a second guard against a formula slip.
  EXPECT_EQ(weight_bytes(preset("2b")).total(), 4255561728);  // 3.96 GiB
  // 4B FP8: 36 layers × 6160 scale blocks (q 32×20, k/v 8×20, o 20×32, gate/up 76×20, down 20×76)
  // × 4 bytes on the device.
  EXPECT_EQ(weight_bytes(preset("4b", true)).total(), 5243844864);  // 4.88 GiB
  EXPECT_EQ(weight_bytes(preset("8b")).total(), 17535172576);       // 16.33 GiB
  // 8B FP8 at 9.86 GiB matches the 9.87 GiB measured for an FP8 8B with a BF16 vision tower
  // (reference/anchors-serving.md §4).
  EXPECT_EQ(weight_bytes(preset("8b", true)).total(), 10591100896);
}

TEST(PlannerWeights, Fp8OptionQuantizesLikeTheFp8Checkpoint) {
  RuntimeOptions o;
  o.fp8_weights = true;
  ModelConfig c = effective_config(preset("4b"), o);
  EXPECT_TRUE(c.quant.fp8);
  EXPECT_EQ(weight_bytes(c).total(), weight_bytes(preset("4b", true)).total());
  // The vision tower and the embeddings stay BF16.
  EXPECT_EQ(weight_bytes(c).vision, weight_bytes(preset("4b")).vision);
}

TEST(PlannerWeights, LargestLayerIsOneAlignedLayer) {
  // Every 4B BF16 layer tensor is a multiple of 256 bytes, so the aligned layer equals the layer.
  EXPECT_EQ(weight_bytes(preset("4b")).largest_layer, layer_bytes(k4B, false));
}

TEST(PlannerWeights, AllocationsRoundLargeTensorsToWholePages) {
  // As the CUDA backend allocates a 4B BF16 layer: q|k|v [6144, 2560] 30 MiB, o [2560, 4096] 20 MiB,
  // gate|up [19456, 2560] 95 MiB -> 96, down [2560, 9728] 47.5 MiB -> 48: 194 MiB of pages (1.5 MiB
  // more than the tensors, 54 MiB over 36 layers: the 56 MiB by which the 4B runs' measured
  // overhead exceeded 2B's); the F32 norms [2560] x 2 and [128] x 2 share pages: 21504 bytes.
  const WeightBytes w4 = weight_bytes(preset("4b"));
  ASSERT_EQ(w4.layer_allocations.size(), 36u);
  EXPECT_EQ(w4.layer_allocations[0].large, (30 + 20 + 96 + 48) * kMiB);
  EXPECT_EQ(w4.layer_allocations[0].small, 2 * 2560 * 4 + 2 * 128 * 4);
  // 2B BF16: q|k|v [4096, 2048] 16 MiB, o 8, gate|up 48, down 24 MiB: whole pages already.
  const WeightBytes w2 = weight_bytes(preset("2b"));
  EXPECT_EQ(w2.layer_allocations[0].large, (16 + 8 + 48 + 24) * kMiB);
  // 4B FP8: the weights at 1 byte (15 -> 16, 10, 47.5 -> 48, 23.75 -> 24 MiB: 1.75 MiB of rounding
  // per layer, 63 MiB in all, as the 64 MiB by which 4B FP8's measured overhead exceeded 2B's) and
  // the stacked block scales, F32 and small: q|k|v 48 x 20, o 20 x 32, gate|up 152 x 20, down
  // 20 x 76 blocks.
  const WeightBytes w4f = weight_bytes(preset("4b", true));
  EXPECT_EQ(w4f.layer_allocations[0].large, (16 + 10 + 48 + 24) * kMiB);
  EXPECT_EQ(w4f.layer_allocations[0].small, 2 * 2560 * 4 + 2 * 128 * 4 + round_up(48 * 20 * 4, 256) +
                                                round_up(20 * 32 * 4, 256) + round_up(152 * 20 * 4, 256) +
                                                round_up(20 * 76 * 4, 256));
  // Everything: the large allocations plus the small ones in whole pages.
  int64_t large = w4.other_allocations.large, small = w4.other_allocations.small;
  for (const auto& a : w4.layer_allocations) {
    large += a.large;
    small += a.small;
  }
  EXPECT_EQ(w4.allocated(0), large + round_up(small, kDeviceGranularity));
  EXPECT_GE(w4.allocated(0), w4.total());
}

TEST(PlannerRuntime, Sm90IsMeasured) {
  // H200 measurement: context + modules 525-531 MiB (planner.cpp); the row says 532 MiB in all.
  const ArchOverheads& a = arch_overheads(90);
  EXPECT_FALSE(a.provisional);
  EXPECT_EQ(a.context_base + 132 * a.context_per_sm + a.modules, 532 * kMiB);
  RuntimeOptions o;
  DeviceFacts h200;
  h200.compute_capability = 90;
  h200.sm_count = 132;
  MemoryPlan p = plan_ok(preset("2b"), o, h200);
  EXPECT_EQ(p.cuda_context + p.cuda_modules, 532 * kMiB);
  for (const std::string& n : p.notes) EXPECT_EQ(n.find("provisional"), std::string::npos) << n;
}

// The decode prefetch's rule (CudaBackendOptions::decode_l2_prefetch_bytes) reads the peak DRAM
// bandwidth from the memory clock and bus width the driver reports, double data rate:
// H200 (3201000 kHz and 6016 bits, as its driver reported them in RESULTS run 42):
// 2 x 3.201e9 x 6016 / 8 = 4814.304e9 B/s; H100 SXM (2619000 kHz, 5120 bits): 2 x 2.619e9 x 640
// = 3352.32e9 (its published memory clock and bus width; no H100 was lent in run 42). The rule's
// 4 TB/s lies between them; unknown attributes give 0.
TEST(CudaDeviceFacts, PeakDramBandwidth) {
  CudaDeviceInfo h200;
  h200.memory_clock_khz = 3201000;
  h200.memory_bus_bits = 6016;
  EXPECT_NEAR(cuda_peak_dram_gbps(h200), 4814.304, 1e-6);
  CudaDeviceInfo h100;
  h100.memory_clock_khz = 2619000;
  h100.memory_bus_bits = 5120;
  EXPECT_NEAR(cuda_peak_dram_gbps(h100), 3352.32, 1e-6);
  EXPECT_EQ(cuda_peak_dram_gbps(CudaDeviceInfo{}), 0.0);
}

// The CUDA backend's W8A8 activation scratch (FP8 prefill GEMMs through block-scaled cuBLASLt,
// which exists on compute capability 9.x only) is planned where the backend allocates it: with
// --fp8-gemm w8a8, 16 MiB (CudaBackendOptions::fp8_act_workspace_bytes, already whole 2 MiB
// pages) on sm_90 and when the architecture is unknown, nothing on sm_89; with the default
// (dequant), nothing anywhere.
TEST(PlannerRuntime, Fp8ActivationWorkspaceWhereW8A8Runs) {
  RuntimeOptions o;
  DeviceFacts d;
  d.compute_capability = 90;
  d.sm_count = 132;
  const MemoryPlan dequant = plan_ok(preset("4b", true), o, d);
  EXPECT_EQ(dequant.fp8_act_workspace, 0);
  o.fp8_w8a8 = true;
  const MemoryPlan hopper = plan_ok(preset("4b", true), o, d);
  d.compute_capability = 89;
  d.sm_count = 24;
  const MemoryPlan ada = plan_ok(preset("4b", true), o, d);
  const MemoryPlan unknown = plan_ok(preset("4b", true), o);
  EXPECT_EQ(hopper.fp8_act_workspace, 16 * kMiB);
  EXPECT_EQ(ada.fp8_act_workspace, 0);
  EXPECT_EQ(unknown.fp8_act_workspace, 16 * kMiB);
  EXPECT_EQ(hopper.backend_workspace - ada.backend_workspace, 16 * kMiB);
  EXPECT_EQ(unknown.backend_workspace, hopper.backend_workspace);
  EXPECT_EQ(hopper.backend_workspace - dequant.backend_workspace, 16 * kMiB);
}

// The FP8 dequant workspace (48 MiB, CudaBackendOptions::dequant_workspace_bytes, whole 2 MiB
// pages) is planned for FP8 models only, checkpoints or quantised at load, since the backend
// allocates it with the first FP8 Linear. That happens after the free memory was measured, so
// unlike the other workspaces it is not added back to a measured budget.
TEST(PlannerRuntime, DequantWorkspaceForFp8ModelsOnly) {
  RuntimeOptions o;
  DeviceFacts d = present_gpu(90, 132, 60 * kGiB);
  d.workspaces_allocated = true;
  const int64_t ws = static_cast<int64_t>(CudaBackendOptions().dequant_workspace_bytes);
  EXPECT_EQ(ws, 48 * kMiB);
  const MemoryPlan bf16 = plan_ok(preset("4b"), o, d);
  const MemoryPlan fp8 = plan_ok(preset("4b", true), o, d);
  EXPECT_EQ(bf16.dequant_workspace, 0);
  EXPECT_EQ(fp8.dequant_workspace, ws);
  EXPECT_EQ(fp8.backend_workspace - bf16.backend_workspace, ws);
  EXPECT_EQ(bf16.budget_bytes, 60 * kGiB - o.reserve_bytes + bf16.cuda_context + bf16.backend_workspace);
  EXPECT_EQ(fp8.budget_bytes, bf16.budget_bytes);
  o.fp8_weights = true;  // --fp8: a BF16 checkpoint quantised at load
  const MemoryPlan at_load = plan_ok(preset("4b"), o, d);
  EXPECT_TRUE(at_load.quantized_at_load);
  EXPECT_EQ(at_load.dequant_workspace, ws);
}

// ---- KV cache ----

TEST(PlannerKv, BytesPerToken) {
  RuntimeOptions o;
  // 2 (K, V) × layers × 8 kv heads × 128 × 2 bytes.
  EXPECT_EQ(plan_ok(preset("2b"), o).kv_bytes_per_token, 2 * 28 * 8 * 128 * 2);
  EXPECT_EQ(plan_ok(preset("2b"), o).kv_bytes_per_token, 114688);
  EXPECT_EQ(plan_ok(preset("4b"), o).kv_bytes_per_token, 147456);
  o.kv_dtype = DType::kF8E4M3;
  EXPECT_EQ(plan_ok(preset("4b"), o).kv_bytes_per_token, 147456 / 2);
}

TEST(PlannerKv, PagesAndRounding) {
  RuntimeOptions o;
  o.context_tokens = 4000;  // 250 pages of 16
  o.concurrency = 3;
  MemoryPlan p = plan_ok(preset("4b"), o);
  EXPECT_EQ(p.kv_page_bytes, 147456 * 16);
  EXPECT_EQ(p.kv_pages_per_seq, 250);
  EXPECT_EQ(p.kv_required_pages, 750);
  // 750 × 2,359,296 = 1,769,472,000 = 1687.5 MiB -> 1688 MiB in 2 MiB pages.
  EXPECT_EQ(p.kv_required_bytes, 1688 * kMiB);
}

// ---- budget and verdict ----

TEST(PlannerVerdict, FitsExactlyAtPeakPlusMargin) {
  RuntimeOptions o;
  MemoryPlan need = plan_ok(preset("2b"), o);
  o.gpu_memory_bytes = need.peak_bytes + need.margin_bytes;
  MemoryPlan p = plan_ok(preset("2b"), o);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.shortfall_bytes, 0);
  EXPECT_GE(p.kv_capacity_pages, p.kv_required_pages);
  EXPECT_TRUE(p.suggestions.empty());

  o.gpu_memory_bytes -= 1;
  p = plan_ok(preset("2b"), o);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.shortfall_bytes, 1);
  EXPECT_LT(p.kv_capacity_pages, p.kv_required_pages);
  EXPECT_FALSE(p.suggestions.empty());
}

TEST(PlannerVerdict, PeakIsTheSumOfItsParts) {
  RuntimeOptions o;
  o.gpu_memory_bytes = 8 * kGiB;
  o.max_image_tokens = 1024;
  MemoryPlan p = plan_ok(preset("4b", true), o);
  EXPECT_EQ(p.fixed_bytes, p.weights_device + p.offload_staging + p.offload_page_tables + p.cuda_context +
                               p.cuda_modules + p.backend_workspace + p.activation_arena + p.step_inputs +
                               p.logits_buffer + p.upload_staging_page_tables);
  // The image upload staging (pinned host memory) costs the device its page tables: 8 bytes
  // per 4 KiB page, in whole 2 MiB pages.
  EXPECT_EQ(p.upload_staging, p.vision.upload_staging);
  EXPECT_GT(p.upload_staging, 0);
  EXPECT_EQ(p.upload_staging_page_tables, round_up((p.upload_staging + 4095) / 4096 * 8, kDeviceGranularity));
  EXPECT_EQ(p.peak_bytes, p.fixed_bytes + p.kv_required_bytes);
  EXPECT_EQ(p.activation_arena,
            round_up(p.vision.features() + std::max(p.vision.scratch(), p.decoder.peak()), kDeviceGranularity));
  // Every top-level allocation is whole 2 MiB pages.
  for (int64_t a : {p.weights_device, p.activation_arena, p.step_inputs, p.logits_buffer, p.kv_required_bytes,
                    p.backend_workspace, p.upload_staging_page_tables})
    EXPECT_EQ(a % kDeviceGranularity, 0) << a;
  // KV capacity is what the budget leaves, in whole pages.
  int64_t room = round_down(p.budget_bytes - p.margin_bytes - p.fixed_bytes, kDeviceGranularity);
  EXPECT_EQ(p.kv_capacity_pages, room / p.kv_page_bytes);
  EXPECT_EQ(p.kv_capacity_tokens, p.kv_capacity_pages * 16);
}

TEST(PlannerVerdict, NoBudgetWithoutGpuOrOption) {
  MemoryPlan p = plan_ok(preset("2b"), RuntimeOptions{});
  EXPECT_FALSE(p.has_budget);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.kv_capacity_tokens, 0);
  EXPECT_GT(p.peak_bytes, 0);
}

TEST(PlannerVerdict, BudgetFromFreeMemoryMinusReserve) {
  DeviceFacts d = present_gpu(89, 24, 7 * kGiB);
  RuntimeOptions o;
  MemoryPlan p = plan_ok(preset("2b"), o, d);
  ASSERT_TRUE(p.has_budget);
  // The free memory was measured with this process's context already made: the planned context
  // (8 MiB + 24 SMs × 2980 KiB for sm_89) is added back so it is not counted twice.
  EXPECT_EQ(p.cuda_context, 8 * kMiB + 24 * 2980 * kKiB);
  EXPECT_EQ(p.budget_bytes, 7 * kGiB - 256 * kMiB + p.cuda_context);
  // Measured after the backend allocated its workspaces too: those are added back as well.
  d.workspaces_allocated = true;
  EXPECT_EQ(plan_ok(preset("2b"), o, d).budget_bytes, 7 * kGiB - 256 * kMiB + p.cuda_context + p.backend_workspace);
  // --gpu-memory wins over the device.
  o.gpu_memory_bytes = 3 * kGiB;
  EXPECT_EQ(plan_ok(preset("2b"), o, d).budget_bytes, 3 * kGiB);
}

TEST(PlannerVerdict, CudaOverheadOverride) {
  RuntimeOptions o;
  o.cuda_overhead_bytes = 300 * kMiB;
  MemoryPlan p = plan_ok(preset("2b"), o);
  EXPECT_TRUE(p.runtime_overridden);
  EXPECT_EQ(p.cuda_context, 300 * kMiB);
  EXPECT_EQ(p.cuda_modules, 0);
  EXPECT_GT(p.backend_workspace, 32 * kMiB);  // cuBLASLt (32 MiB) + decode splits; a BF16 model has no FP8 dequant
  EXPECT_EQ(p.dequant_workspace, 0);
}

TEST(PlannerVerdict, ArchTable) {
  EXPECT_EQ(arch_overheads(90).compute_capability, 90);
  EXPECT_EQ(arch_overheads(87).compute_capability, 86);  // nearest lower of the same major
  EXPECT_EQ(arch_overheads(75).compute_capability, 0);   // unknown
  EXPECT_EQ(arch_overheads(0).compute_capability, 0);
}

// ---- monotonicity ----

TEST(PlannerMonotone, PeakGrowsWithEveryKnob) {
  const ModelConfig c = preset("4b", true);
  auto peak = [&](auto&& set, int64_t v) {
    RuntimeOptions o;
    o.max_image_tokens = 1024;
    set(o, v);
    return plan_ok(c, o).peak_bytes;
  };
  auto context = [](RuntimeOptions& o, int64_t v) { o.context_tokens = v; };
  auto concurrency = [](RuntimeOptions& o, int64_t v) { o.concurrency = static_cast<int>(v); };
  auto image = [](RuntimeOptions& o, int64_t v) { o.max_image_tokens = v; };
  auto chunk = [](RuntimeOptions& o, int64_t v) { o.prefill_chunk = v; };
  for (int64_t v = 1024; v < 65536; v *= 2) EXPECT_LT(peak(context, v), peak(context, 2 * v)) << v;
  for (int64_t v = 1; v < 64; v *= 2) EXPECT_LT(peak(concurrency, v), peak(concurrency, 2 * v)) << v;
  for (int64_t v = 64; v < 4096; v *= 2) EXPECT_LE(peak(image, v), peak(image, 2 * v)) << v;
  EXPECT_LT(peak(image, 256), peak(image, 4096));
  // Small chunks hide under the vision encoder's scratch in the shared arena: never less, though.
  for (int64_t v = 128; v < 4096; v *= 2) EXPECT_LE(peak(chunk, v), peak(chunk, 2 * v)) << v;
  EXPECT_LT(peak(chunk, 256), peak(chunk, 4096));
}

TEST(PlannerMonotone, CapacityGrowsWithBudgetAndShrinksWithWeights) {
  RuntimeOptions o;
  int64_t last = -1;
  for (int64_t gib = 6; gib <= 12; ++gib) {
    o.gpu_memory_bytes = gib * kGiB;
    int64_t cap = plan_ok(preset("4b", true), o).kv_capacity_tokens;
    EXPECT_GT(cap, last) << gib;
    last = cap;
  }
  o.gpu_memory_bytes = 12 * kGiB;
  EXPECT_GT(plan_ok(preset("4b", true), o).kv_capacity_tokens, plan_ok(preset("4b"), o).kv_capacity_tokens);
}

TEST(PlannerMonotone, MaxContextFitsAndOneMorePageDoesNot) {
  RuntimeOptions o;
  o.gpu_memory_bytes = 7 * kGiB;
  o.max_image_tokens = 1024;
  MemoryPlan p = plan_ok(preset("4b", true), o);
  ASSERT_GT(p.max_context, 4096);
  o.context_tokens = p.max_context;
  EXPECT_TRUE(plan_ok(preset("4b", true), o).fits);
  o.context_tokens = p.max_context + 1;
  EXPECT_FALSE(plan_ok(preset("4b", true), o).fits);
}

// ---- images ----

TEST(PlannerImages, OneMegapixel) {
  RuntimeOptions o;
  o.max_image_pixels = 1 << 20;  // 1024 × 1024: 1024 tokens, 4096 patches
  MemoryPlan p = plan_ok(preset("4b"), o);
  EXPECT_EQ(p.image_tokens, 1024);
  EXPECT_EQ(p.image_patches, 4096);
  o.max_image_pixels = 0;
  o.max_image_tokens = 1024;
  EXPECT_EQ(plan_ok(preset("4b"), o).image_tokens, 1024);
}

TEST(PlannerImages, CappedByTheContext) {
  RuntimeOptions o;  // the model's max_pixels: 16384 tokens, more than a 4096 context holds
  MemoryPlan p = plan_ok(preset("4b"), o);
  EXPECT_EQ(p.image_tokens, 4096);
  o.context_tokens = 32;  // below the smallest image (65536 px = 64 tokens)
  p = plan_ok(preset("4b"), o);
  EXPECT_EQ(p.image_tokens, 0);
  EXPECT_EQ(p.vision.peak(), 0);
}

TEST(PlannerImages, BoundHoldsForEveryImageSize) {
  // The bound must cover what image/ really produces, extreme aspect ratios included.
  const PreprocessorConfig pre;
  for (int64_t cap_tokens : {64, 100, 256, 1024, 2500}) {
    image::PreprocessOptions io;
    io.max_image_tokens = cap_tokens;
    const int64_t bound = max_image_tokens(pre, 0, cap_tokens);
    EXPECT_GE(bound, cap_tokens);
    int64_t worst = 0;
    for (int h = 8; h <= 6000; h += (h < 200 ? 7 : 97)) {
      for (int w : {h / 200 + 1, h / 50 + 1, h / 3 + 1, h, 2 * h, 50 * h, 199 * h}) {
        Result<image::ResizeTarget> t = image::target_size(h, w, io);
        if (!t.is_ok()) continue;  // aspect ratio over 200
        worst = std::max<int64_t>(worst, static_cast<int64_t>(t->height) * t->width / 1024);
      }
    }
    EXPECT_LE(worst, bound) << "cap " << cap_tokens;
  }
  // For ordinary caps the bound is the cap itself.
  EXPECT_EQ(max_image_tokens(pre, 1 << 20, 0), 1024);
  EXPECT_EQ(max_image_tokens(pre, 0, 0), 16384);
}

// ---- offload ----

TEST(PlannerOffload, MovesLayersToHostThroughTwoStagingBuffers) {
  RuntimeOptions o;
  MemoryPlan base = plan_ok(preset("4b"), o);
  o.offload_layers = 10;
  MemoryPlan p = plan_ok(preset("4b"), o);
  const int64_t layer = base.weights.largest_layer;
  EXPECT_EQ(p.weights_offloaded, 10 * layer);  // every 4B layer has the same shape
  EXPECT_EQ(p.offload_staging, round_up(2 * layer, kDeviceGranularity));
  // The resident weights lose the 10 layers' allocations: 194 MiB of whole pages and 21504 bytes of
  // small ones each (below), the small ones rounded to pages together.
  const WeightBytes& w = base.weights;
  const int64_t small_all = w.other_allocations.small + 36 * 21504;
  EXPECT_EQ(base.weights_device, w.other_allocations.large + 36 * 194 * kMiB + round_up(small_all, kDeviceGranularity));
  EXPECT_EQ(p.weights_device,
            w.other_allocations.large + 26 * 194 * kMiB + round_up(small_all - 10 * 21504, kDeviceGranularity));
  // The pinned host memory's page tables: 8 bytes per 4 KiB page of the 10 layers, in whole pages.
  EXPECT_EQ(base.offload_page_tables, 0);
  EXPECT_EQ(p.offload_page_tables, round_up(10 * layer / 4096 * 8, kDeviceGranularity));
  EXPECT_EQ(p.fixed_bytes - base.fixed_bytes,
            p.weights_device + p.offload_staging + p.offload_page_tables - base.weights_device);
  EXPECT_LT(p.peak_bytes, base.peak_bytes);
  // Two offloaded layers stream through two buffers: nothing saved but the two layers' page
  // rounding (2 × 194 MiB of pages resident vs 2 × 192.5 MiB packed in one staging allocation).
  o.offload_layers = 2;
  EXPECT_LE(base.peak_bytes - plan_ok(preset("4b"), o).peak_bytes, 2 * kDeviceGranularity);
}

// ---- options ----

TEST(PlannerOptions, ErrorsNameTheOption) {
  auto err = [](auto&& set) {
    RuntimeOptions o;
    set(o);
    Result<MemoryPlan> r = plan(preset("2b"), o, {});
    EXPECT_FALSE(r.is_ok());
    return r.is_ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(err([](RuntimeOptions& o) { o.context_tokens = 0; }).find("--context 0"), std::string::npos);
  EXPECT_NE(err([](RuntimeOptions& o) { o.context_tokens = 300000; }).find("262144"), std::string::npos);
  EXPECT_NE(err([](RuntimeOptions& o) { o.concurrency = 0; }).find("--concurrency 0"), std::string::npos);
  EXPECT_NE(err([](RuntimeOptions& o) { o.offload_layers = 29; }).find("28 decoder layers"), std::string::npos);
  EXPECT_NE(err([](RuntimeOptions& o) { o.prefill_chunk = 0; }).find("--prefill-chunk 0"), std::string::npos);
  EXPECT_NE(err([](RuntimeOptions& o) { o.kv_dtype = DType::kF32; }).find("--kv-dtype"), std::string::npos);
  EXPECT_NE(err([](RuntimeOptions& o) { o.max_image_pixels = 100; }).find("--max-image-pixels 100"), std::string::npos);
}

}  // namespace
}  // namespace qvl
