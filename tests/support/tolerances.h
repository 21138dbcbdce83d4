// The project's one table of numeric tolerances. Every comparison against a reference uses a
// named entry from here, so a loosened tolerance is visible in one diff.
#pragma once

namespace qvl::test::tol {

// CPU backend (fp32 activations, fp32 accumulation) vs transformers in float32.
inline constexpr double kFp32StageRel = 1e-4;   // relative L2 per stage (issue: "within 1e-4 relative")
inline constexpr double kFp32LogitsRel = 1e-4;  // last-position logits, relative L2

// Block-FP8 tiny model (CPU backend) vs transformers' FineGrainedFP8Config(dequantize=True) path
// in float32. Both sides multiply with the same weights, float(w8) * scale_inv rounded once to
// fp32 (the fixture script sets them exactly), and unquantised fp32 activations, so the only
// difference is fp32 summation order, as for BF16: the same 1e-4. (The checkpoint's native
// W8A8-dynamic path would differ from this by ~1e-2 relative per Linear; qvl does not follow it.)
inline constexpr double kFp8DequantStageRel = 1e-4;

// CPU backend ops vs naive double-precision formulas (tests/unit/cpu_*_test.cpp): fp32
// accumulation over at most ~10^3 terms of magnitude <= 1 stays well inside 1e-5.
inline constexpr double kCpuOpAbs = 1e-5;
inline constexpr double kCpuOpRel = 1e-5;

// CUDA backend ops (BF16 activations, fp32 accumulation) vs the CPU backend (fp32) on the
// same BF16-representable inputs (tests/gpu). Two numbers per op: the relative L2 error over
// the whole output, and the largest absolute error as a fraction of max|reference| (catches a
// single wrong row or head that the L2 norm would average away). One BF16 rounding is a
// relative error <= 2^-9 = 0.00195 per element (RMS ~ 2^-9/sqrt(3) = 1.1e-3).
struct GpuTol {
  double rel_l2;
  double max_abs_rel;
};
// Row copies (embedding, gather, scatter): bit-exact.
inline constexpr GpuTol kGpuCopy{0.0, 0.0};
// One or two BF16 roundings per element (the reference's op boundaries: norms, SiLU·mul,
// RoPE, interpolated position embedding, scatter-accumulate): <= 2 ulps of the largest value.
// Two roundings are a relative error <= (1 + 2^-9)^2 - 1 = 3.91e-3 per element, which bounds
// rel_l2 as well; a typical draw is ~1.6e-3, but where a few large products dominate the norm (a
// SiLU·mul row of 1536 values measured 3.1e-3) it comes close to the bound, so rel_l2 takes it.
inline constexpr GpuTol kGpuElementwise{4e-3, 8e-3};
// Linear: fp32 accumulation in another order, BF16 output rounding, plus epilogue roundings
// (bias, GELU, residual) and, on the FP8 many-row path, weights rounded to BF16 after
// dequantisation (transformers' dequantize=True) where the CPU keeps float(w8)*scale exact.
inline constexpr GpuTol kGpuLinear{4e-3, 1.5e-2};
// FP8 Linear on the W8A8 path (sm_90: activations quantised per row and 128 columns, block-scaled
// cuBLASLt) vs the host doing the same quantisation and exact dot products (double): the output's
// one BF16 rounding (<= 2^-9 relative, RMS ~ 1e-3) plus the FP8 tensor cores' reduced-precision
// accumulation inside each 128-wide group (about 14 bits kept, promoted to fp32 between groups:
// ~1e-3 of a group's sum at worst). Not quantising the activations (the dequantised path)
// differs by ~3% (e4m3 keeps 3 mantissa bits), far outside this.
inline constexpr GpuTol kGpuFp8W8A8{3e-3, 1e-2};
// Attention: P rounded to BF16 before P·V (as FlashAttention and SDPA do), output rounding.
inline constexpr GpuTol kGpuAttention{5e-3, 2e-2};
// q/k-norm + M-RoPE: two norm roundings, cos/sin rounded to BF16 (the reference's table),
// three rounded RoPE ops (x·cos, rot·sin, their sum).
inline constexpr GpuTol kGpuRope{6e-3, 2.5e-2};
// FP8 E4M3 KV cache rows written by text_qkv_prepare vs the CPU's BF16 rows: e4m3 keeps 3
// mantissa bits, a rounding error <= 2^-4 relative (RMS ~ 2^-4/sqrt(3) = 0.036).
inline constexpr GpuTol kGpuFp8Kv{0.045, 0.07};

// Whole-model greedy decoding in BF16 (CUDA) against the float32 reference: tokens must agree
// while the reference's top-1/top-2 logit margin is at least this. The tiny presets' logits
// spread over a few units and a BF16 forward moves them by a few hundredths; a call closer than
// a quarter of a unit may flip, and everything after a flip legitimately differs.
inline constexpr double kBf16GreedyMargin = 0.25;
// Whole tiny models, CUDA (BF16 activations) vs CPU (fp32) logits: every op's BF16 rounding
// (~40 ops deep for the tiny presets) compounds; a wrong kernel gives O(1) relative error.
inline constexpr GpuTol kGpuModelLogits{0.05, 0.15};

// Image pipeline: pixel_values after normalisation, one uint8 level.
inline constexpr double kPixelAbs = 1.0 / 127.5 + 1e-6;

}  // namespace qvl::test::tol
