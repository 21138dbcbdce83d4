// Internal to src/memory: the pieces plan() and auto_fit() share. compute_plan() is plan()
// without max_context and suggestions (which re-plan many times themselves).
#pragma once

#include <vector>

#include "memory/planner.h"

namespace qvl::detail {

Result<MemoryPlan> compute_plan(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device);
// The longest context `options.concurrency` sequences can each hold within the budget (0 if none).
int64_t max_context(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device);
// Suggestions for a plan that does not fit, cheapest first.
std::vector<Suggestion> suggestions(const ModelConfig& config, const RuntimeOptions& options, const DeviceFacts& device,
                                    const MemoryPlan& base);

}  // namespace qvl::detail
