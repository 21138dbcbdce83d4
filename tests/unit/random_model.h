// Test helper: a Qwen3-VL weight tree with random BF16 weights built in memory for any config
// (no checkpoint files), loaded on a backend the way model/load.h does it (norms and biases
// F32, Linears through load_linear, tied lm_head = the embedding table). On the CPU backend
// every tensor of the tree is host memory, so reference code can read the very same numbers.
#pragma once

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/weights.h"

namespace qvl::test {

struct HostMatrix {
  std::vector<uint16_t> bf16;  // the stored weight
  int64_t rows = 0, cols = 0;
  Tensor tensor() { return Tensor(bf16.data(), DType::kBF16, {rows, cols}); }
};

class RandomModel {
 public:
  RandomModel(const ModelConfig& cfg, Backend& be, uint32_t seed) : gen_(seed) {
    const VisionConfig& v = cfg.vision;
    const TextConfig& t = cfg.text;
    const int64_t D = v.hidden_size, F = v.intermediate_size, U = v.merge_unit(), O = v.out_hidden_size;
    VisionWeights& vw = weights.vision;
    vw.patch_embed = linear(be, {D}, v.patch_dim(), true);
    vw.pos_embed = matrix(v.num_position_embeddings, D, 1.0f).tensor();
    for (int b = 0; b < v.depth; ++b) {
      VisionBlockWeights blk;
      blk.norm1_w = norm(D, true);
      blk.norm1_b = norm(D, false);
      blk.norm2_w = norm(D, true);
      blk.norm2_b = norm(D, false);
      blk.qkv = linear(be, {D, D, D}, D, true);
      blk.proj = linear(be, {D}, D, true);
      blk.fc1 = linear(be, {F}, D, true);
      blk.fc2 = linear(be, {D}, F, true);
      vw.blocks.push_back(blk);
    }
    auto merger = [&](bool post) {
      MergerWeights m;
      m.postshuffle_norm = post;
      m.norm_w = norm(post ? U * D : D, true);
      m.norm_b = norm(post ? U * D : D, false);
      m.fc1 = linear(be, {U * D}, U * D, true);
      m.fc2 = linear(be, {O}, U * D, true);
      return m;
    };
    vw.merger = merger(false);
    for (size_t j = 0; j < v.deepstack_visual_indexes.size(); ++j) vw.deepstack_mergers.push_back(merger(true));

    TextWeights& tw = weights.text;
    const int64_t H = t.hidden_size;
    tw.embed_tokens = matrix(t.vocab_size, H, 1.0f).tensor();
    for (int l = 0; l < t.num_hidden_layers; ++l) {
      DecoderLayerWeights w;
      w.input_norm = norm(H, true);
      w.post_attention_norm = norm(H, true);
      w.q_norm = norm(t.head_dim, true);
      w.k_norm = norm(t.head_dim, true);
      w.qkv = linear(be, {t.q_dim(), t.kv_dim(), t.kv_dim()}, H, false);
      w.o = linear(be, {H}, t.q_dim(), false);
      w.gate_up = linear(be, {t.intermediate_size, t.intermediate_size}, H, false);
      w.down = linear(be, {H}, t.intermediate_size, false);
      tw.layers.push_back(w);
    }
    tw.final_norm = norm(H, true);
    tw.lm_head_tied = cfg.tie_word_embeddings;
    if (cfg.tie_word_embeddings) {
      LinearPart p{tw.embed_tokens, {}};
      tw.lm_head = be.load_linear(std::span(&p, 1), Tensor(), 128).value();
    } else {
      tw.lm_head = linear(be, {t.vocab_size}, H, false);
    }
  }

  ModelWeights weights;

 private:
  // Uniform with std 1/sqrt(fan_in)·gain, rounded to BF16.
  HostMatrix& matrix(int64_t rows, int64_t cols, float std) {
    auto m = std::make_unique<HostMatrix>();
    m->rows = rows;
    m->cols = cols;
    m->bf16.resize(rows * cols);
    std::uniform_real_distribution<float> d(-std * 1.7320508f, std * 1.7320508f);
    for (auto& x : m->bf16) x = float_to_bf16(d(gen_));
    matrices_.push_back(std::move(m));
    return *matrices_.back();
  }
  // Norm weight (around 1) or bias (around 0) as an F32 tensor.
  Tensor norm(int64_t n, bool weight) {
    auto v = std::make_unique<std::vector<float>>(n);
    std::uniform_real_distribution<float> d(-0.2f, 0.2f);
    for (float& x : *v) x = (weight ? 1.0f : 0.0f) + d(gen_);
    floats_.push_back(std::move(v));
    return Tensor(floats_.back()->data(), DType::kF32, {n});
  }
  LinearWeight linear(Backend& be, std::vector<int64_t> part_rows, int64_t in, bool bias) {
    std::vector<LinearPart> parts;
    int64_t out = 0;
    for (int64_t r : part_rows) {
      parts.push_back({matrix(r, in, 1.0f / std::sqrt(static_cast<float>(in))).tensor(), {}});
      out += r;
    }
    Tensor b = bias ? norm(out, false) : Tensor();
    return be.load_linear(parts, b, 128).value();
  }

  std::mt19937 gen_;
  std::vector<std::unique_ptr<HostMatrix>> matrices_;
  std::vector<std::unique_ptr<std::vector<float>>> floats_;
};

}  // namespace qvl::test
