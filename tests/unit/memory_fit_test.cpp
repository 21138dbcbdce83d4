// Suggestions and auto-fit, and the two 8 GB stories of issue 8: Qwen3-VL-4B-FP8 with a 1-MP
// image and a 4096-token context on an 8 GiB card with 1 GiB held by a desktop; 8B BF16 on
// 8 GiB refused with the shortfall and what to change.
#include <gtest/gtest.h>

#include <cstdio>

#include "memory/plan_report.h"
#include "memory/planner.h"
#include "model/presets.h"

namespace qvl {
namespace {

ModelConfig preset(const char* name, bool fp8 = false) {
  return preset_config(name, fp8).value();
}

MemoryPlan plan_ok(const ModelConfig& c, const RuntimeOptions& o, const DeviceFacts& d = {}) {
  Result<MemoryPlan> p = plan(c, o, d);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? std::move(p).value() : MemoryPlan{};
}

DeviceFacts desktop_card(int cc) {
  DeviceFacts d;
  d.compute_capability = cc;  // SM count: the table's typical 8 GB card
  return d;
}

// The options a suggestion stands for, applied to `o`.
RuntimeOptions with(RuntimeOptions o, const Suggestion& s) {
  switch (s.change) {
    case FitChange::kFp8Weights:
      o.fp8_weights = true;
      break;
    case FitChange::kFp8Kv:
      o.kv_dtype = DType::kF8E4M3;
      break;
    case FitChange::kSmallerContext:
      o.context_tokens = s.value;
      break;
    case FitChange::kSmallerImageCap:
      o.max_image_tokens = s.value;
      break;
    case FitChange::kOffloadLayers:
      o.offload_layers = static_cast<int>(s.value);
      break;
    case FitChange::kSmallerPrefillChunk:
      o.prefill_chunk = s.value;
      break;
  }
  return o;
}

TEST(Fit, FourBFp8OneMegapixelOn8GiBWithADesktop) {
  // 8 GiB card, 1 GiB held by the desktop: a 7 GiB budget.
  RuntimeOptions o;
  o.gpu_memory_bytes = 7 * kGiB;
  o.max_image_pixels = 1 << 20;
  o.context_tokens = 4096;
  for (int cc : {0, 89, 120}) {
    MemoryPlan p = plan_ok(preset("4b", true), o, desktop_card(cc));
    EXPECT_TRUE(p.fits) << "cc " << cc << ": short by " << p.shortfall_bytes;
    EXPECT_EQ(p.image_tokens, 1024);
    const int64_t spare = p.budget_bytes - p.margin_bytes - p.peak_bytes;
    std::printf(
        "4B-FP8, 1 MP, 4096 ctx, 7 GiB (cc %d): peak %s MiB, spare %s MiB beyond the margin, "
        "max context %lld\n",
        cc, format_mib(p.peak_bytes).c_str(), format_mib(spare).c_str(), static_cast<long long>(p.max_context));
    // Weights alone are 4.88 GiB (memory_planner_test); the rest must leave room for > 8k tokens.
    EXPECT_GT(p.max_context, 8192);
    EXPECT_GT(spare, 512 * kMiB);
  }
}

TEST(Fit, EightBBf16On8GiBIsRefusedWithSuggestions) {
  RuntimeOptions o;
  o.gpu_memory_bytes = 8 * kGiB;
  MemoryPlan p = plan_ok(preset("8b"), o, desktop_card(120));
  EXPECT_FALSE(p.fits);
  // The weights alone (16.33 GiB) exceed the budget by 8.33 GiB.
  EXPECT_GT(p.shortfall_bytes, weight_bytes(preset("8b")).total() - 8 * kGiB);
  EXPECT_EQ(p.shortfall_bytes, p.peak_bytes + p.margin_bytes - 8 * kGiB);
  ASSERT_FALSE(p.suggestions.empty());
  EXPECT_EQ(p.suggestions.front().change, FitChange::kFp8Weights);
  EXPECT_EQ(p.suggestions.front().flag, "--fp8");

  std::string refusal = plan_refusal(p);
  EXPECT_NE(refusal.find("short by " + format_mib(p.shortfall_bytes) + " MiB"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("--fp8"), std::string::npos);
}

TEST(Fit, SuggestionsComeCheapestFirstAndSaveWhatTheySay) {
  const ModelConfig c = preset("8b");
  RuntimeOptions o;
  o.gpu_memory_bytes = 8 * kGiB;
  o.context_tokens = 8192;
  o.prefill_chunk = 4096;     // the decoder step (335 MB) outweighs the vision scratch...
  o.max_image_tokens = 2048;  // ...of a 2048-token image, so every change saves something
  o.can_offload = true;
  MemoryPlan p = plan_ok(c, o, desktop_card(120));
  ASSERT_EQ(p.suggestions.size(), 6u);  // every change helps here
  for (size_t i = 1; i < p.suggestions.size(); ++i)
    EXPECT_LT(static_cast<int>(p.suggestions[i - 1].change), static_cast<int>(p.suggestions[i].change))
        << p.suggestions[i - 1].flag << " before " << p.suggestions[i].flag;
  for (const Suggestion& s : p.suggestions) {
    SCOPED_TRACE(s.flag);
    MemoryPlan alone = plan_ok(c, with(o, s), desktop_card(120));
    EXPECT_GT(s.saves_bytes, 0);
    EXPECT_EQ(s.saves_bytes, p.peak_bytes - alone.peak_bytes);
    EXPECT_EQ(s.fits_alone, alone.fits);
  }
}

TEST(Fit, NumericSuggestionIsTheMildestThatFits) {
  // 4B FP8 with 64k context on 7 GiB: a shorter context fits alone; one step longer does not.
  const ModelConfig c = preset("4b", true);
  RuntimeOptions o;
  o.gpu_memory_bytes = 7 * kGiB;
  o.max_image_tokens = 1024;
  o.context_tokens = 65536;
  MemoryPlan p = plan_ok(c, o);
  ASSERT_FALSE(p.fits);
  const Suggestion* ctx = nullptr;
  for (const Suggestion& s : p.suggestions)
    if (s.change == FitChange::kSmallerContext) ctx = &s;
  ASSERT_NE(ctx, nullptr);
  EXPECT_TRUE(ctx->fits_alone);
  EXPECT_EQ(ctx->value % 256, 0);  // tidied to a multiple of 256
  RuntimeOptions longer = o;
  longer.context_tokens = ctx->value + 256;
  EXPECT_FALSE(plan_ok(c, longer).fits);
  // The FP8 KV suggestion halves the KV bytes: 64k × 72 KiB saved, to the 2 MiB page.
  for (const Suggestion& s : p.suggestions) {
    if (s.change == FitChange::kFp8Kv) {
      EXPECT_EQ(s.saves_bytes, 65536LL * 147456 / 2);
    }
  }
}

void check_auto_fit_8b_on_8gib(bool can_quantize) {
  SCOPED_TRACE(can_quantize ? "the loader can quantize to FP8" : "BF16 weights stay BF16");
  const ModelConfig c = preset("8b");
  RuntimeOptions o;
  o.gpu_memory_bytes = 8 * kGiB;
  o.can_quantize_fp8 = can_quantize;
  o.can_offload = true;  // 8B weights alone exceed 8 GiB even in FP8 (9.86 GiB)
  Result<AutoFit> fit = auto_fit(c, o, desktop_card(120));
  ASSERT_TRUE(fit.is_ok()) << fit.status().to_string();
  EXPECT_TRUE(fit->plan.fits);
  ASSERT_FALSE(fit->applied.empty());
  // plan() on the chosen options confirms it, independently of auto_fit's own bookkeeping.
  MemoryPlan again = plan_ok(c, fit->options, desktop_card(120));
  EXPECT_TRUE(again.fits);
  EXPECT_EQ(again.peak_bytes, fit->plan.peak_bytes);
  // FP8 weights come first when the loader can make them (8B BF16 weights alone are twice the
  // budget); otherwise they are never applied (another checkpoint is the user's call).
  EXPECT_EQ(fit->applied.front().change == FitChange::kFp8Weights, can_quantize);
  EXPECT_EQ(fit->options.fp8_weights, can_quantize);
  for (size_t i = 1; i < fit->applied.size(); ++i)
    EXPECT_LT(static_cast<int>(fit->applied[i - 1].change), static_cast<int>(fit->applied[i].change));
  // The costliest change is as mild as possible: one step milder does not fit.
  const Suggestion& last = fit->applied.back();
  RuntimeOptions milder = fit->options;
  switch (last.change) {
    case FitChange::kOffloadLayers:
      milder.offload_layers -= 1;
      break;
    case FitChange::kSmallerContext:
      milder.context_tokens += 256;
      break;
    case FitChange::kSmallerImageCap:
      milder.max_image_tokens += 64;
      break;
    case FitChange::kSmallerPrefillChunk:
      milder.prefill_chunk += 128;
      break;
    case FitChange::kFp8Kv:
      milder.kv_dtype = DType::kBF16;
      break;
    case FitChange::kFp8Weights:
      milder.fp8_weights = false;
      break;
  }
  EXPECT_FALSE(plan_ok(c, milder, desktop_card(120)).fits) << last.flag;
  std::printf("%s", auto_fit_summary(fit.value()).c_str());
}

TEST(Fit, AutoFitPicksAConfigurationThatPlanConfirms) {
  check_auto_fit_8b_on_8gib(true);
  check_auto_fit_8b_on_8gib(false);
}

TEST(Fit, AutoFitChangesNothingWhenItFits) {
  RuntimeOptions o;
  o.gpu_memory_bytes = 24 * kGiB;
  Result<AutoFit> fit = auto_fit(preset("4b"), o, {});
  ASSERT_TRUE(fit.is_ok());
  EXPECT_TRUE(fit->applied.empty());
  EXPECT_EQ(fit->options.context_tokens, o.context_tokens);
  EXPECT_TRUE(fit->plan.fits);
}

TEST(Fit, AutoFitPrefersTheCheapChange) {
  // 2B BF16 with a 16k context on 6 GiB: FP8 weights alone fit, and so does FP8 KV; only the
  // cheapest one auto-fit may apply is applied.
  RuntimeOptions o;
  o.gpu_memory_bytes = 6 * kGiB;
  o.context_tokens = 16384;
  o.max_image_tokens = 1024;
  MemoryPlan p = plan_ok(preset("2b"), o);
  ASSERT_FALSE(p.fits);
  ASSERT_GE(p.suggestions.size(), 2u);
  ASSERT_EQ(p.suggestions[0].change, FitChange::kFp8Weights);
  ASSERT_EQ(p.suggestions[1].change, FitChange::kFp8Kv);
  EXPECT_TRUE(p.suggestions[0].fits_alone);
  EXPECT_TRUE(p.suggestions[1].fits_alone);
  for (bool can_quantize : {true, false}) {
    o.can_quantize_fp8 = can_quantize;
    Result<AutoFit> fit = auto_fit(preset("2b"), o, {});
    ASSERT_TRUE(fit.is_ok());
    ASSERT_EQ(fit->applied.size(), 1u);
    EXPECT_EQ(fit->applied[0].change, can_quantize ? FitChange::kFp8Weights : FitChange::kFp8Kv);
  }
}

TEST(Fit, OnlyWhatTheLoaderCanDo) {
  // Without layer offload (a backend that cannot stream weights) and load-time FP8, 8B BF16 cannot
  // fit 8 GiB: offload is not suggested, and auto-fit says what is missing.
  RuntimeOptions o;
  o.gpu_memory_bytes = 8 * kGiB;
  o.can_offload = false;
  o.can_quantize_fp8 = false;
  MemoryPlan p = plan_ok(preset("8b"), o);
  for (const Suggestion& s : p.suggestions) EXPECT_NE(s.change, FitChange::kOffloadLayers);
  Result<AutoFit> fit = auto_fit(preset("8b"), o, {});
  ASSERT_FALSE(fit.is_ok());
  EXPECT_EQ(fit.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(fit.status().message().find("cannot offload"), std::string::npos) << fit.status().message();
  EXPECT_NE(fit.status().message().find("-FP8 checkpoint"), std::string::npos) << fit.status().message();
  // The 8B FP8 checkpoint on 11 GiB: auto-fit finds a configuration without offloading.
  o.gpu_memory_bytes = 11 * kGiB;
  fit = auto_fit(preset("8b", true), o, {});
  ASSERT_TRUE(fit.is_ok()) << fit.status().to_string();
  EXPECT_EQ(fit->options.offload_layers, 0);
  EXPECT_TRUE(plan_ok(preset("8b", true), fit->options).fits);
}

TEST(Fit, AutoFitSaysWhenNothingIsEnough) {
  RuntimeOptions o;
  o.gpu_memory_bytes = 1 * kGiB;  // not even the 8B embedding tables fit
  o.can_offload = true;
  o.can_quantize_fp8 = true;
  Result<AutoFit> fit = auto_fit(preset("8b"), o, {});
  ASSERT_FALSE(fit.is_ok());
  EXPECT_EQ(fit.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(fit.status().message().find("short by"), std::string::npos) << fit.status().message();
}

TEST(Fit, AutoFitNeedsABudget) {
  Result<AutoFit> fit = auto_fit(preset("2b"), RuntimeOptions{}, {});
  ASSERT_FALSE(fit.is_ok());
  EXPECT_EQ(fit.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace qvl
