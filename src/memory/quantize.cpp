#include "memory/quantize.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "memory/planner.h"
#include "model/tensor_specs.h"

namespace qvl {

uint8_t fp8_e4m3_from_float_fast(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7f;          // NaN
  if (u >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
  if (u < 0x3c800000u) {                     // below 2^-6: subnormals in steps of 2^-9
    float a;
    std::memcpy(&a, &u, sizeof a);
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // 8 is 2^-6, the first normal
  }
  // Normal: keep 3 mantissa bits, round to nearest even at bit 20 (a carry moves the exponent).
  const uint32_t r = (u + 0x7ffffu + ((u >> 20) & 1u)) & 0xfff00000u;
  const uint32_t exp = (r >> 23) - 127 + 7, mant = (r >> 20) & 7u;
  return sign | static_cast<uint8_t>((exp << 3) | mant);
}

namespace {

float read_float(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kBF16:
      return bf16_to_float(t.as<const bf16_bits>()[i]);
    case DType::kF16:
      return f16_to_float(t.as<const uint16_t>()[i]);
    case DType::kF32:
      return t.as<const float>()[i];
    default:
      return 0.0f;
  }
}

// One [rows, cols] weight -> F8_E4M3 [rows, cols] + BF16 scale_inv [ceil(rows/B), ceil(cols/B)].
LinearPart quantize_part(const Tensor& w, int block, std::vector<std::shared_ptr<void>>* keep, int threads) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  const int64_t rb = fp8_scale_blocks(rows, block), cb = fp8_scale_blocks(cols, block);
  auto q = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols));
  auto s = std::make_shared<std::vector<bf16_bits>>(static_cast<size_t>(rb * cb));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t b = 0; b < rb * cb; ++b) {
    const int64_t r0 = b / cb * block, r1 = std::min(rows, r0 + block);
    const int64_t c0 = b % cb * block, c1 = std::min(cols, c0 + block);
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(read_float(w, r * cols + c)));
    float scale = round_to_bf16(amax / kFp8E4M3Max);
    if (!(scale > 0)) scale = 1.0f;  // an all-zero block dequantises to zero with any scale
    (*s)[b] = float_to_bf16(scale);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        (*q)[r * cols + c] = fp8_e4m3_from_float_fast(read_float(w, r * cols + c) / scale);
  }
  LinearPart p;
  p.weight = Tensor(q->data(), DType::kF8E4M3, {rows, cols});
  p.scale_inv = Tensor(s->data(), DType::kBF16, {rb, cb});
  keep->push_back(q);
  keep->push_back(s);
  return p;
}

}  // namespace

Result<QuantizedWeights> quantize_fp8_at_load(const ModelConfig& config, const ModelWeights& host, int num_threads) {
  if (config.quant.fp8) return invalid_argument("quantize at load: the checkpoint is already FP8");
  RuntimeOptions fp8;
  fp8.fp8_weights = true;
  QuantizedWeights out;
  out.config = effective_config(config, fp8);
  out.host = host;
  const QuantConfig& quant = out.config.quant;
  const int block = quant.weight_block_size[0];
  if (block <= 0 || quant.weight_block_size[1] != block)
    return invalid_argument("quantize at load: weight_block_size must be square, got " +
                            std::to_string(quant.weight_block_size[0]) + " x " +
                            std::to_string(quant.weight_block_size[1]));
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  for (size_t l = 0; l < out.host.text.layers.size(); ++l) {
    DecoderLayerWeights& d = out.host.text.layers[l];
    const std::string p = "model.language_model.layers." + std::to_string(l) + ".";
    const std::pair<LinearWeight*, std::vector<std::string>> linears[] = {
        {&d.qkv, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
        {&d.o, {"self_attn.o_proj"}},
        {&d.gate_up, {"mlp.gate_proj", "mlp.up_proj"}},
        {&d.down, {"mlp.down_proj"}}};
    for (const auto& [lin, modules] : linears) {
      if (lin->parts.size() != modules.size())
        return invalid_argument("quantize at load: layer " + std::to_string(l) + " " + modules[0] + " has " +
                                std::to_string(lin->parts.size()) + " parts");
      bool any = false;
      for (const std::string& m : modules) any |= is_fp8_linear(quant, p + m);
      if (!any) continue;
      for (size_t i = 0; i < modules.size(); ++i) {
        if (!is_fp8_linear(quant, p + modules[i]))
          return invalid_argument("quantize at load: " + p + modules[i] + " stays BF16 but is stacked with FP8 parts");
        const Tensor& w = lin->parts[i].weight;
        if (w.ndim != 2 || (w.dtype != DType::kBF16 && w.dtype != DType::kF16 && w.dtype != DType::kF32))
          return invalid_argument("quantize at load: " + p + modules[i] + ".weight is " + w.describe() +
                                  ", expected a 2-d float tensor");
        lin->parts[i] = quantize_part(w, block, &out.host.keep_alive, threads);
        ++out.quantized_linears;
      }
      lin->block_size = block;
    }
  }
  return out;
}

}  // namespace qvl
