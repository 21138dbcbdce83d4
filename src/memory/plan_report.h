// How a MemoryPlan reads to people and to programs: the table `qvl plan` prints (and `qvl serve`
// prints when it refuses to start) and the JSON `qvl plan --json` prints. Rendering only: every
// number comes from the plan, nothing is recomputed here.
#pragma once

#include <string>

#include "memory/planner.h"

namespace qvl {

// The plan as a table of MiB by part, then the verdict, suggestions and notes. `model_label`
// names the model ("4b preset", a directory).
std::string plan_table(const MemoryPlan& plan, const std::string& model_label);

// What auto_fit changed, one line per change ("auto-fit: --kv-dtype fp8 (saves 288.0 MiB)").
std::string auto_fit_summary(const AutoFit& fit);

// The plan as one JSON object (pretty-printed): at least weights_bytes, kv_bytes_per_token,
// kv_capacity_tokens, peak_bytes, budget_bytes (null without a budget), fits, shortfall_bytes,
// suggestions; `fit` (optional) adds the auto_fit changes under "auto_fit".
std::string plan_json(const MemoryPlan& plan, const std::string& model_label, const AutoFit* fit = nullptr);

// The refusal `qvl serve` prints when the plan does not fit: the shortfall in MiB and the
// suggestions, one paragraph.
std::string plan_refusal(const MemoryPlan& plan);

}  // namespace qvl
