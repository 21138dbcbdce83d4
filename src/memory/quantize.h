// FP8 weights from a BF16 checkpoint, made at load (`--fp8` on a BF16 model, or auto-fit's first
// change): the text decoder's Linears that the official -FP8 checkpoints store block-FP8
// (is_fp8_linear under effective_config's quantization_config: every q/k/v/o/gate/up/down
// projection; the vision tower, the embeddings and lm_head stay BF16) are quantized per 128 × 128
// block exactly as `qvl gen-model --fp8` and the FineGrainedFP8 checkpoints are: scale =
// bf16(amax / 448) (1 for an all-zero block), w8 = e4m3(w / scale) rounded to nearest even and
// saturating at ±448. So a BF16 checkpoint quantized here holds byte for byte what its -FP8
// sibling holds, and runs through the same FP8 kernels.
//
// The quantized weights live in host memory owned by the returned tree (keep_alive); every other
// tensor stays a view of the checkpoint, which must outlive it.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

namespace qvl {

struct QuantizedWeights {
  ModelConfig config;  // effective_config with fp8_weights: the quantization_config of -FP8
  ModelWeights host;   // the host tree with the text Linears in F8_E4M3 + BF16 block scales
  int64_t quantized_linears = 0;
};

// Quantizes `host` (bound with `config`, BF16) as described above, on `num_threads` OpenMP
// threads (0: the default). InvalidArgument when the checkpoint is already FP8 or a weight is not
// a float type.
Result<QuantizedWeights> quantize_fp8_at_load(const ModelConfig& config, const ModelWeights& host, int num_threads = 0);

// e4m3fn of `f`, rounded to nearest even, saturating at ±448 (NaN stays NaN): the same byte as
// fp8_e4m3_from_float (core/dtype.h) for every input, by bit arithmetic (this runs on billions of
// weights).
uint8_t fp8_e4m3_from_float_fast(float f);

}  // namespace qvl
