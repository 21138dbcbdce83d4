// The vision encoder's 2-D rotary table from its per-position factors. A patch at (row, col) has
// the rotary angles row·inv[e] and col·inv[e] (e < q, head_dim = 4q), laid out over head_dim as
// [row | col | row | col]; cos and sin of p·inv[e] depend on the position p only. So the host
// evaluates them once per position (model/positions.h write_vision_factors: angles [L, 2, q],
// cos then sin) and the [N, 2, head_dim] table is copies of those rows, made where the encoder
// runs (Backend::vision_rope_table). Copies only: every backend gives the same bits as this.
// It lives in core because both the model (the host tables) and the CPU backend use it.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/check.h"
#include "core/tensor.h"

namespace qvl {

// rope [n, 2, 4q] from row_col [n, 2] (each patch's row and column) and angles [angle_rows, 2, q].
inline void expand_vision_rope(float* rope, const int32_t* row_col, const float* angles, int64_t n, int64_t angle_rows,
                               int q) {
  const int dh = 4 * q;
  const size_t run = static_cast<size_t>(q) * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos[2] = {row_col[i * 2], row_col[i * 2 + 1]};
    for (int32_t p : pos)
      QVL_CHECK(p >= 0 && p < angle_rows)
          << "vision rope: patch " << i << " at position " << p << " of " << angle_rows << " angle rows";
    for (int s = 0; s < 2; ++s) {  // cos, sin
      float* out = rope + (i * 2 + s) * dh;
      for (int seg = 0; seg < 4; ++seg)
        std::memcpy(out + seg * q, angles + (static_cast<int64_t>(pos[seg % 2]) * 2 + s) * q, run);
    }
  }
}

// The shapes Backend::vision_rope_table takes: rope F32 [N, 2, 4q], row_col I32 [N, 2], angles
// F32 [L, 2, q].
inline void check_vision_rope_table(const Tensor& rope, const Tensor& row_col, const Tensor& angles) {
  QVL_CHECK(angles.dtype == DType::kF32 && angles.ndim == 3 && angles.dim(1) == 2 && angles.dim(2) > 0)
      << "vision_rope_table angles " << angles.describe();
  const int64_t q = angles.dim(2);
  QVL_CHECK(rope.dtype == DType::kF32 && rope.ndim == 3 && rope.dim(1) == 2 && rope.dim(2) == 4 * q)
      << "vision_rope_table rope " << rope.describe() << " for angles " << angles.describe();
  QVL_CHECK(row_col.dtype == DType::kI32 && row_col.numel() == rope.dim(0) * 2)
      << "vision_rope_table row_col " << row_col.describe() << " for rope " << rope.describe();
}

}  // namespace qvl
