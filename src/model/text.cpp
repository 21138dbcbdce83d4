// The text decoder (spec §6): token embeddings with image rows merged in, Qwen3 decoder layers
// (RMSNorm, q/k-norm, interleaved M-RoPE, causal GQA over the paged KV cache, SwiGLU MLP),
// deepstack features added after layers 0..k−1 at the image rows of this step, the final norm
// and the lm_head for the requested rows only. Arena layout (memory/activations.h): x for the
// whole step, then one stage at a time above it.
#include <cmath>
#include <vector>

#include "memory/activations.h"
#include "model/model.h"

namespace qvl {

void Qwen3VLModel::forward(const TextBatch& batch, const TextStepInputs& in, const KvCacheView& cache, Tensor logits,
                           Arena& arena) const {
  const TextConfig& tc = config_.text;
  const TextWeights& w = weights_.text;
  const int64_t n = batch.num_tokens, H = tc.hidden_size;
  const int64_t r = in.logits_rows.numel();
  const DType act = backend_.activation_dtype();
  QVL_CHECK_EQ(in.token_ids.numel(), n);
  QVL_CHECK(logits.dim(0) == r && logits.row_numel() == tc.vocab_size) << "logits " << logits.describe();
  const size_t mark = arena.used();

  // Embeddings; image-pad rows take the vision tower's rows instead.
  Tensor x = arena.alloc(act, {n, H});  // [n, H]
  backend_.embedding(x, w.embed_tokens, in.token_ids);
  for (const VisualRows& v : in.visual) {
    const int64_t m = v.embeds.dim(0);
    QVL_CHECK(v.batch_row >= 0 && v.batch_row + m <= n) << "visual rows [" << v.batch_row << ", +" << m << ")";
    QVL_CHECK_EQ(static_cast<int>(v.deepstack.size()), num_deepstack()) << "deepstack features per visual run";
    backend_.copy(x.rows(v.batch_row, v.batch_row + m), v.embeds);
  }
  dump(kStageEmbeds, -1, x);
  const size_t stage = arena.used();

  // The row indices of this step's visual rows, run after run (for the deepstack adds).
  std::vector<int32_t> visual_rows;
  for (const VisualRows& v : in.visual)
    for (int64_t i = 0; i < v.embeds.dim(0); ++i) visual_rows.push_back(static_cast<int32_t>(v.batch_row + i));

  const LayerStream* stream = weights_.layer_stream.get();
  if (stream) stream->begin_step();
  // Decode steps may run the whole stack as one unit (no per-layer hooks, streams or deepstack).
  const bool fused = !stream && !hook_ && in.visual.empty() && fused_layers(x, batch, cache, arena);
  for (int l = 0; l < tc.num_hidden_layers && !fused; ++l) {
    if (stream) stream->before_layer(l);
    decoder_layer(l, x, batch, cache, arena);
    if (stream) stream->after_layer(l);
    dump(kStageLayer, l, x);
    // Deepstack: x[visual rows] += feature of tap l, after the whole layer (prefill only).
    if (l < num_deepstack() && !visual_rows.empty()) {
      Tensor rows = upload(arena, DType::kI32, {static_cast<int64_t>(visual_rows.size())}, visual_rows.data());
      int64_t offset = 0;
      for (const VisualRows& v : in.visual) {
        const int64_t m = v.embeds.dim(0);
        backend_.scatter_rows(x, rows.rows(offset, offset + m), v.deepstack[l], /*accumulate=*/true);
        offset += m;
      }
      arena.reset(stage);
    }
  }

  // Final norm and lm_head on the rows whose logits are wanted (norm is per row, so gathering
  // first gives the same numbers).
  Tensor last = arena.alloc(act, {r, H});
  backend_.gather_rows(last, x, in.logits_rows);
  Tensor normed = arena.alloc(act, {r, H});
  backend_.rms_norm(normed, last, w.final_norm, static_cast<float>(tc.rms_norm_eps));
  dump(kStageNorm, -1, normed);
  backend_.linear(logits, normed, w.lm_head, {});
  dump(kStageLogits, -1, logits);
  arena.reset(mark);
}

bool Qwen3VLModel::fused_layers(Tensor x, const TextBatch& batch, const KvCacheView& cache, Arena& arena) const {
  const TextConfig& tc = config_.text;
  const int64_t n = x.dim(0);
  if (n != batch.num_seqs) return false;  // decode steps only: one new row per sequence
  const DType act = backend_.activation_dtype();
  const int64_t qkv_cols = tc.q_dim() + 2LL * tc.kv_dim(), attn_cols = tc.q_dim(), gu_cols = 2LL * tc.intermediate_size;
  // The step's scratch comes from the arena when it has room (a decode step uses a small part
  // of an arena planned for prefill chunks); otherwise the layers run op by op.
  const int64_t need = arena_bytes(n * qkv_cols, act) + arena_bytes(n * attn_cols, act) + arena_bytes(n * gu_cols, act);
  if (arena.capacity() - arena.used() < static_cast<size_t>(need) + Arena::kAlignment) return false;
  const size_t mark = arena.used();
  DecoderStackBuffers buffers{arena.alloc(act, {n, qkv_cols}), arena.alloc(act, {n, attn_cols}),
                              arena.alloc(act, {n, gu_cols})};
  const bool done = backend_.decoder_stack(x, stack_, batch, cache, buffers);
  arena.reset(mark);
  return done;
}

// x += o(attention(mrope(qk_norm(qkv(rms(x)))))); x += down(silu(gate(rms(x))) · up(rms(x))).
void Qwen3VLModel::decoder_layer(int layer, Tensor x, const TextBatch& batch, const KvCacheView& cache,
                                 Arena& arena) const {
  const TextConfig& tc = config_.text;
  const DecoderLayerWeights& w = weights_.text.layers[layer];
  const int64_t n = x.dim(0), H = tc.hidden_size, I = tc.intermediate_size;
  const float eps = static_cast<float>(tc.rms_norm_eps);
  const DType act = backend_.activation_dtype();
  const size_t mark = arena.used();

  // Attention: K/V of this step go into the cache first, then every row attends causally
  // over its sequence's cached tokens.
  Tensor h = arena.alloc(act, {n, H});
  backend_.rms_norm(h, x, w.input_norm, eps);
  Tensor qkv = arena.alloc(act, {n, static_cast<int64_t>(tc.q_dim()) + 2 * tc.kv_dim()});  // [n, (Hq+2Hkv)·dh]
  backend_.linear(qkv, h, w.qkv, {});
  backend_.text_qkv_prepare(qkv, w.q_norm, w.k_norm, eps, mrope_, batch, cache, layer, attn_shape_);
  Tensor attn = arena.alloc(act, {n, static_cast<int64_t>(tc.q_dim())});  // [n, Hq·dh]
  backend_.text_attention(attn, qkv, batch, cache, layer, attn_shape_,
                          1.0f / std::sqrt(static_cast<float>(tc.head_dim)));
  backend_.linear(x, attn, w.o, {Activation::kNone, x});
  arena.reset(mark);

  // SwiGLU MLP.
  h = arena.alloc(act, {n, H});
  backend_.rms_norm(h, x, w.post_attention_norm, eps);
  Tensor gate_up = arena.alloc(act, {n, 2 * I});  // [n, gate | up]
  backend_.linear(gate_up, h, w.gate_up, {});
  Tensor a = arena.alloc(act, {n, I});
  backend_.silu_mul(a, gate_up);
  backend_.linear(x, a, w.down, {Activation::kNone, x});
  arena.reset(mark);
}

}  // namespace qvl
