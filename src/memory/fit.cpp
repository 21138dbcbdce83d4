// What to change when a plan does not fit: suggestions (each change alone, with the bytes it
// saves) and auto_fit() (the cheapest set of changes that fits). Every candidate is judged by
// re-planning, never by a separate estimate, so a suggestion that says "fits" does fit.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "core/check.h"
#include "memory/plan_internal.h"
#include "memory/planner.h"

namespace qvl {

const char* fit_change_name(FitChange change) {
  switch (change) {
    case FitChange::kFp8Weights:
      return "fp8_weights";
    case FitChange::kFp8Kv:
      return "fp8_kv";
    case FitChange::kSmallerContext:
      return "context";
    case FitChange::kSmallerImageCap:
      return "image_cap";
    case FitChange::kOffloadLayers:
      return "offload_layers";
    case FitChange::kSmallerPrefillChunk:
      return "prefill_chunk";
  }
  return "?";
}

namespace {

// Cheapest first: what each change costs the user. FP8 weights cost a little accuracy and gain
// speed; FP8 KV a little accuracy; a shorter context or a smaller image cap limit what can be
// asked; offloaded layers cost decode speed on every token; a smaller prefill chunk only
// saves the chunk's activations and costs prefill speed, so it comes last.
constexpr FitChange kCostOrder[] = {
    FitChange::kFp8Weights,      FitChange::kFp8Kv,         FitChange::kSmallerContext,
    FitChange::kSmallerImageCap, FitChange::kOffloadLayers, FitChange::kSmallerPrefillChunk,
};

struct Eval {
  bool valid = false;
  bool fits = false;
  int64_t peak = 0;
};

Eval evaluate(const ModelConfig& config, const RuntimeOptions& o, const DeviceFacts& device) {
  Result<MemoryPlan> r = detail::compute_plan(config, o, device);
  if (!r.is_ok()) return {};
  return {true, r->fits, r->peak_bytes};
}

bool fits(const ModelConfig& config, const RuntimeOptions& o, const DeviceFacts& device) {
  return evaluate(config, o, device).fits;
}

// The largest v in [lo, hi] with pred(v), for pred true up to some point and false after; lo - 1
// when pred(lo) is false.
int64_t largest_true(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& pred) {
  if (lo > hi || !pred(lo)) return lo - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (pred(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The value of a numeric change as `o` has it (the image cap as the plan resolved it).
int64_t value_of(FitChange c, const RuntimeOptions& o, const MemoryPlan& resolved) {
  switch (c) {
    case FitChange::kFp8Weights:
      return resolved.config.quant.fp8 ? 1 : 0;
    case FitChange::kFp8Kv:
      return o.kv_dtype == DType::kF8E4M3 ? 1 : 0;
    case FitChange::kSmallerContext:
      return o.context_tokens;
    case FitChange::kSmallerImageCap:
      return resolved.image_tokens;
    case FitChange::kOffloadLayers:
      return o.offload_layers;
    case FitChange::kSmallerPrefillChunk:
      return o.prefill_chunk;
  }
  return 0;
}

void set_value(FitChange c, RuntimeOptions& o, int64_t v) {
  switch (c) {
    case FitChange::kFp8Weights:
      o.fp8_weights = v != 0;
      break;
    case FitChange::kFp8Kv:
      o.kv_dtype = v ? DType::kF8E4M3 : DType::kBF16;
      break;
    case FitChange::kSmallerContext:
      o.context_tokens = v;
      break;
    case FitChange::kSmallerImageCap:
      o.max_image_tokens = v;
      break;
    case FitChange::kOffloadLayers:
      o.offload_layers = static_cast<int>(v);
      break;
    case FitChange::kSmallerPrefillChunk:
      o.prefill_chunk = v;
      break;
  }
}

// Whether `o` differs from `user` in the option a change sets.
bool option_changed(FitChange c, const RuntimeOptions& o, const RuntimeOptions& user) {
  switch (c) {
    case FitChange::kFp8Weights:
      return o.fp8_weights != user.fp8_weights;
    case FitChange::kFp8Kv:
      return o.kv_dtype != user.kv_dtype;
    case FitChange::kSmallerContext:
      return o.context_tokens != user.context_tokens;
    case FitChange::kSmallerImageCap:
      return o.max_image_tokens != user.max_image_tokens;
    case FitChange::kOffloadLayers:
      return o.offload_layers != user.offload_layers;
    case FitChange::kSmallerPrefillChunk:
      return o.prefill_chunk != user.prefill_chunk;
  }
  return false;
}

// Copies the option a change sets from `from` into `o`.
void restore_option(FitChange c, RuntimeOptions& o, const RuntimeOptions& from) {
  switch (c) {
    case FitChange::kFp8Weights:
      o.fp8_weights = from.fp8_weights;
      break;
    case FitChange::kFp8Kv:
      o.kv_dtype = from.kv_dtype;
      break;
    case FitChange::kSmallerContext:
      o.context_tokens = from.context_tokens;
      break;
    case FitChange::kSmallerImageCap:
      o.max_image_tokens = from.max_image_tokens;
      break;
    case FitChange::kOffloadLayers:
      o.offload_layers = from.offload_layers;
      break;
    case FitChange::kSmallerPrefillChunk:
      o.prefill_chunk = from.prefill_chunk;
      break;
  }
}

// The strongest value of a change from the current state, or nullopt when it can do nothing more.
std::optional<int64_t> strongest(FitChange c, const RuntimeOptions& o, const MemoryPlan& resolved) {
  const int64_t v = value_of(c, o, resolved);
  switch (c) {
    case FitChange::kFp8Weights:
    case FitChange::kFp8Kv:
      return v ? std::nullopt : std::optional<int64_t>(1);
    case FitChange::kSmallerContext:
      return v > kMinFitContext ? std::optional<int64_t>(kMinFitContext) : std::nullopt;
    case FitChange::kSmallerImageCap:
      return v > kMinFitImageTokens ? std::optional<int64_t>(kMinFitImageTokens) : std::nullopt;
    case FitChange::kOffloadLayers: {
      const int64_t layers = resolved.config.text.num_hidden_layers;
      return v < layers ? std::optional<int64_t>(layers) : std::nullopt;
    }
    case FitChange::kSmallerPrefillChunk:
      return v > kMinFitPrefillChunk ? std::optional<int64_t>(kMinFitPrefillChunk) : std::nullopt;
  }
  return std::nullopt;
}

// Round a numeric value for people (context to 256, image tokens to 64, chunk to 128), never past
// `limit` (the strongest value, which is known to be acceptable).
int64_t tidy(FitChange c, int64_t v, int64_t limit) {
  int64_t step = c == FitChange::kSmallerContext        ? 256
                 : c == FitChange::kSmallerImageCap     ? 64
                 : c == FitChange::kSmallerPrefillChunk ? 128
                                                        : 1;
  return std::max(limit, v / step * step);
}

// The mildest value between `from` (the value before the change) and `strong` (its strongest)
// that fits with everything else in `o`; nullopt if even `strong` does not fit.
std::optional<int64_t> mildest_fitting(FitChange c, const ModelConfig& config, RuntimeOptions o,
                                       const DeviceFacts& device, int64_t from, int64_t strong) {
  auto fits_at = [&](int64_t v) {
    set_value(c, o, v);
    return fits(config, o, device);
  };
  switch (c) {
    case FitChange::kFp8Weights:
    case FitChange::kFp8Kv:
      if (fits_at(from)) return from;
      return fits_at(strong) ? std::optional<int64_t>(strong) : std::nullopt;
    case FitChange::kOffloadLayers:
      for (int64_t n = from; n <= strong; ++n)
        if (fits_at(n)) return n;
      return std::nullopt;
    case FitChange::kSmallerContext:
    case FitChange::kSmallerImageCap:
    case FitChange::kSmallerPrefillChunk: {
      // Fits is monotone: true from `strong` up to some value, false above it.
      int64_t v = largest_true(strong, from, fits_at);
      if (v < strong) return std::nullopt;
      return v == from ? v : tidy(c, v, strong);
    }
  }
  return std::nullopt;
}

Suggestion describe(FitChange c, int64_t value, const MemoryPlan& base) {
  Suggestion s;
  s.change = c;
  s.value = value;
  char buf[256];
  switch (c) {
    case FitChange::kFp8Weights:
      s.flag = "--fp8";
      s.description = base.options.can_quantize_fp8
                          ? "FP8 weights: block-FP8 text Linears, quantized at load (or the official -FP8 checkpoint)"
                          : "FP8 weights: the official -FP8 checkpoint of this model (block-FP8 text Linears)";
      break;
    case FitChange::kFp8Kv:
      s.flag = "--kv-dtype fp8";
      std::snprintf(buf, sizeof buf, "FP8 KV cache: %lld bytes per token instead of %lld",
                    static_cast<long long>(base.kv_bytes_per_token / 2),
                    static_cast<long long>(base.kv_bytes_per_token));
      s.description = buf;
      break;
    case FitChange::kSmallerContext:
      s.flag = "--context " + std::to_string(value);
      s.description =
          "a context of " + std::to_string(value) + " tokens instead of " + std::to_string(base.options.context_tokens);
      break;
    case FitChange::kSmallerImageCap:
      s.flag = "--max-image-tokens " + std::to_string(value);
      std::snprintf(buf, sizeof buf, "images up to %lld tokens (%.2f MP) instead of %lld",
                    static_cast<long long>(value), static_cast<double>(value) * 1024 / 1e6,
                    static_cast<long long>(base.image_tokens));
      s.description = buf;
      break;
    case FitChange::kOffloadLayers:
      s.flag = "--offload-layers " + std::to_string(value);
      s.description = std::to_string(value) + " of " + std::to_string(base.config.text.num_hidden_layers) +
                      " decoder layers in pinned host memory, streamed in every step (slower decode)";
      break;
    case FitChange::kSmallerPrefillChunk:
      s.flag = "--prefill-chunk " + std::to_string(value);
      s.description = "prefill in chunks of " + std::to_string(value) + " tokens instead of " +
                      std::to_string(base.options.prefill_chunk) + " (slower prefill)";
      break;
  }
  return s;
}

}  // namespace

namespace detail {

int64_t max_context(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device) {
  RuntimeOptions o = options;
  int64_t best = largest_true(1, config.text.max_position_embeddings, [&](int64_t c) {
    o.context_tokens = c;
    return fits(config, o, device);
  });
  return std::max<int64_t>(best, 0);
}

std::vector<Suggestion> suggestions(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device,
                                    const MemoryPlan& base) {
  std::vector<Suggestion> out;
  for (FitChange c : kCostOrder) {
    if (c == FitChange::kOffloadLayers && !options.can_offload) continue;  // not offered: qvl cannot
    std::optional<int64_t> strong = strongest(c, options, base);
    if (!strong) continue;
    const int64_t from = value_of(c, options, base);
    std::optional<int64_t> mild = mildest_fitting(c, config, options, device, from, *strong);
    const int64_t value = mild ? *mild : *strong;
    RuntimeOptions o = options;
    set_value(c, o, value);
    Eval e = evaluate(config, o, device);
    if (!e.valid || e.peak >= base.peak_bytes) continue;  // saves nothing
    Suggestion s = describe(c, value, base);
    s.saves_bytes = base.peak_bytes - e.peak;
    s.fits_alone = e.fits;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace detail

Result<AutoFit> auto_fit(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device) {
  QVL_ASSIGN_OR_RETURN(MemoryPlan base, plan(config, options, device));
  if (!base.has_budget) return failed_precondition("auto-fit needs a budget: " + base.budget_source);
  AutoFit result;
  result.options = options;
  if (base.fits) {
    result.plan = std::move(base);
    return result;
  }

  // 1. Apply changes at full strength, cheapest first, until the plan fits.
  RuntimeOptions o = options;
  std::vector<std::pair<FitChange, int64_t>> used;  // change, value before it
  bool fitted = false;
  for (FitChange c : kCostOrder) {
    // Another checkpoint is the user's call; auto-fit only quantizes when the loader can.
    if (c == FitChange::kFp8Weights && !options.can_quantize_fp8) continue;
    if (c == FitChange::kOffloadLayers && !options.can_offload) continue;
    QVL_ASSIGN_OR_RETURN(MemoryPlan now, detail::compute_plan(config, o, device));
    std::optional<int64_t> strong = strongest(c, o, now);
    if (!strong) continue;
    used.emplace_back(c, value_of(c, o, now));
    set_value(c, o, *strong);
    if (fits(config, o, device)) {
      fitted = true;
      break;
    }
  }
  if (!fitted) {
    QVL_ASSIGN_OR_RETURN(MemoryPlan all, detail::compute_plan(config, o, device));
    std::string applied = std::string(o.fp8_weights || config.quant.fp8 ? "FP8 weights, " : "") + "FP8 KV, context " +
                          std::to_string(o.context_tokens) + ", images up to " + std::to_string(all.image_tokens) +
                          " tokens, " +
                          (options.can_offload ? std::to_string(o.offload_layers) + " layers offloaded, " : "") +
                          "prefill chunk " + std::to_string(o.prefill_chunk);
    std::string missing;
    if (!config.quant.fp8 && !options.can_quantize_fp8) missing += "; FP8 weights need the -FP8 checkpoint";
    if (!options.can_offload) missing += "; this qvl cannot offload layers to host memory";
    return resource_exhausted("does not fit even with every change applied (" + applied + "): short by " +
                              format_mib(all.shortfall_bytes) + " MiB of a " + format_mib(all.budget_bytes) +
                              " MiB budget" + missing);
  }

  // 2. Relax, costliest first: each change goes back to the mildest value that still fits with
  //    the others as they are (the costliest one first, so it is as mild as the cheaper ones allow).
  for (auto it = used.rbegin(); it != used.rend(); ++it) {
    auto [c, from] = *it;
    QVL_ASSIGN_OR_RETURN(MemoryPlan now, detail::compute_plan(config, o, device));
    const int64_t current = value_of(c, o, now);
    std::optional<int64_t> mild = mildest_fitting(c, config, o, device, from, current);
    QVL_CHECK(mild.has_value()) << fit_change_name(c) << " at " << current << " fitted a moment ago";
    if (*mild == from) {
      restore_option(c, o, options);  // fully relaxed: the option exactly as the user gave it
    } else {
      set_value(c, o, *mild);
    }
  }

  // 3. Report what changed (options that differ from the user's), cheapest first, each with the
  //    bytes it saves on top of the others.
  QVL_ASSIGN_OR_RETURN(MemoryPlan final_plan, plan(config, o, device));
  QVL_CHECK(final_plan.fits);
  for (FitChange c : kCostOrder) {
    if (!option_changed(c, o, options)) continue;
    RuntimeOptions without = o;
    restore_option(c, without, options);
    RuntimeOptions alone = options;
    restore_option(c, alone, o);
    Suggestion s = describe(c, value_of(c, o, final_plan), base);
    s.saves_bytes = evaluate(config, without, device).peak - final_plan.peak_bytes;
    s.fits_alone = fits(config, alone, device);
    result.applied.push_back(std::move(s));
  }
  result.options = o;
  result.plan = std::move(final_plan);
  return result;
}

}  // namespace qvl
