// Host-side Linear weights for the GPU op tests: random BF16 or block-FP8 parts (FP8 quantised
// per 128x128 block the way checkpoints are) and their LinearPart views, for loading the same
// weights into the CPU oracle and the CUDA backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "gpu/gpu_util.h"

namespace qvl::test::gpu {

struct HostPart {
  std::vector<uint16_t> bf16;  // BF16 weights
  std::vector<uint8_t> fp8;    // or FP8 weights
  std::vector<float> scale;    // and their block scales
  int64_t rows = 0;
};

// Random weights for one part; FP8 quantised per 128x128 block the way checkpoints are
// (scale = amax / 448, w8 = e4m3(w / scale)).
inline HostPart make_part(int64_t rows, int64_t cols, bool fp8, float wscale) {
  HostPart p;
  p.rows = rows;
  std::vector<float> w = random_values(rows * cols, wscale);
  if (!fp8) {
    p.bf16 = to_bf16_bits(w);
    return p;
  }
  const int64_t B = 128, rb = (rows + B - 1) / B, cb = (cols + B - 1) / B;
  // Vary the blocks' ranges so that a wrong scale index shows.
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) w[i * cols + j] *= 1.0f + static_cast<float>((i / B + 2 * (j / B)) % 5);
  p.scale.assign(static_cast<size_t>(rb * cb), 0.0f);
  p.fp8.resize(static_cast<size_t>(rows * cols));
  for (int64_t bi = 0; bi < rb; ++bi) {
    for (int64_t bj = 0; bj < cb; ++bj) {
      float amax = 0.0f;
      for (int64_t i = bi * B; i < std::min(rows, (bi + 1) * B); ++i)
        for (int64_t j = bj * B; j < std::min(cols, (bj + 1) * B); ++j)
          amax = std::max(amax, std::fabs(w[i * cols + j]));
      const float s = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
      p.scale[bi * cb + bj] = s;
      for (int64_t i = bi * B; i < std::min(rows, (bi + 1) * B); ++i)
        for (int64_t j = bj * B; j < std::min(cols, (bj + 1) * B); ++j)
          p.fp8[i * cols + j] = fp8_e4m3_from_float(w[i * cols + j] / s);
    }
  }
  return p;
}

// Views of a host part as one LinearPart of rows x cols (FP8: with its 128x128 block scales).
inline LinearPart part_view(HostPart& h, int64_t cols, bool fp8) {
  LinearPart lp;
  if (fp8) {
    lp.weight = Tensor(h.fp8.data(), DType::kF8E4M3, {h.rows, cols});
    lp.scale_inv = Tensor(h.scale.data(), DType::kF32, {(h.rows + 127) / 128, (cols + 127) / 128});
  } else {
    lp.weight = Tensor(h.bf16.data(), DType::kBF16, {h.rows, cols});
  }
  return lp;
}

}  // namespace qvl::test::gpu
