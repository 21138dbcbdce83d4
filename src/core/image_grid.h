// ImageGrid: an image's patch grid (temporal, height, width in patches), the one fact about an
// image that the tokenizer (pad-run length), the model (positions, attention segments) and the
// memory planner all need. It lives in core so that those modules share one definition.
#pragma once

#include <cstdint>

namespace qvl {

struct ImageGrid {
  int t = 1, h = 0, w = 0;

  int64_t num_patches() const { return static_cast<int64_t>(t) * h * w; }
  // Merged tokens in the prompt: t·h·w / merge².
  int64_t num_tokens(int merge) const { return num_patches() / (merge * merge); }
};

}  // namespace qvl
