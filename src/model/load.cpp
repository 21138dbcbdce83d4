#include "model/load.h"

#include <memory>
#include <vector>

namespace qvl {
namespace {

class Loader {
 public:
  Loader(Backend& backend, std::vector<std::shared_ptr<void>>* keep_alive) : backend_(backend), keep_(keep_alive) {}

  // Norm weights and LayerNorm biases: F32 on the device.
  Status f32(const Tensor& host, const std::string& what, Tensor* dst) { return load(host, DType::kF32, what, dst); }
  // Embedding tables: their own dtype.
  Status same(const Tensor& host, const std::string& what, Tensor* dst) { return load(host, host.dtype, what, dst); }

  Status linear(const LinearWeight& host, const std::string& what, LinearWeight* dst) {
    Tensor bias;
    if (!host.bias.empty()) bias = host_f32(host.bias);
    Result<LinearWeight> r = backend_.load_linear(host.parts, bias, host.block_size);
    if (!r.is_ok()) return r.status().with_context("loading " + what + " on " + backend_.name());
    *dst = std::move(r).value();
    dst->out_features = host.out_features;
    dst->in_features = host.in_features;
    dst->block_size = host.block_size;
    return Status::ok();
  }

 private:
  Status load(const Tensor& host, DType as, const std::string& what, Tensor* dst) {
    Result<Tensor> r = backend_.load_tensor(host, as);
    if (!r.is_ok()) return r.status().with_context("loading " + what + " on " + backend_.name());
    *dst = *r;
    return Status::ok();
  }
  // Biases are tiny; converting them on the host gives every backend the same F32 input.
  Tensor host_f32(const Tensor& t) {
    if (t.dtype == DType::kF32) return t;
    auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      switch (t.dtype) {
        case DType::kBF16:
          (*buf)[i] = bf16_to_float(t.as<const bf16_bits>()[i]);
          break;
        case DType::kF16:
          (*buf)[i] = f16_to_float(t.as<const uint16_t>()[i]);
          break;
        default:
          QVL_CHECK(false) << "bias of dtype " << dtype_name(t.dtype);
      }
    }
    Tensor f = t;
    f.data = buf->data();
    f.dtype = DType::kF32;
    keep_->push_back(buf);  // the CPU backend may keep this view as is
    return f;
  }

  Backend& backend_;
  std::vector<std::shared_ptr<void>>* keep_;
};

std::string idx(const char* prefix, size_t i, const char* suffix) {
  return std::string(prefix) + std::to_string(i) + suffix;
}

Status load_layer(Loader& L, const DecoderLayerWeights& h, size_t l, DecoderLayerWeights* d) {
  QVL_RETURN_IF_ERROR(L.f32(h.input_norm, idx("text.layers.", l, ".input_norm"), &d->input_norm));
  QVL_RETURN_IF_ERROR(
      L.f32(h.post_attention_norm, idx("text.layers.", l, ".post_attention_norm"), &d->post_attention_norm));
  QVL_RETURN_IF_ERROR(L.f32(h.q_norm, idx("text.layers.", l, ".q_norm"), &d->q_norm));
  QVL_RETURN_IF_ERROR(L.f32(h.k_norm, idx("text.layers.", l, ".k_norm"), &d->k_norm));
  QVL_RETURN_IF_ERROR(L.linear(h.qkv, idx("text.layers.", l, ".qkv"), &d->qkv));
  QVL_RETURN_IF_ERROR(L.linear(h.o, idx("text.layers.", l, ".o_proj"), &d->o));
  QVL_RETURN_IF_ERROR(L.linear(h.gate_up, idx("text.layers.", l, ".gate_up"), &d->gate_up));
  return L.linear(h.down, idx("text.layers.", l, ".down_proj"), &d->down);
}

}  // namespace

Result<DecoderLayerWeights> load_decoder_layer(Backend& backend, const ModelWeights& host, int layer,
                                               std::vector<std::shared_ptr<void>>* keep_alive) {
  QVL_CHECK(layer >= 0 && layer < static_cast<int>(host.text.layers.size())) << "decoder layer " << layer;
  QVL_CHECK(keep_alive != nullptr);
  Loader L(backend, keep_alive);
  DecoderLayerWeights d;
  QVL_RETURN_IF_ERROR(load_layer(L, host.text.layers[layer], static_cast<size_t>(layer), &d));
  return d;
}

Result<ModelWeights> load_weights(Backend& backend, const ModelWeights& host,
                                  const std::function<bool(int layer)>& resident) {
  ModelWeights out;
  // A backend may hand back views of the host memory (the CPU backend does when no conversion
  // is needed), so the maps stay alive with the loaded tree.
  out.keep_alive = host.keep_alive;
  Loader L(backend, &out.keep_alive);

  const VisionWeights& hv = host.vision;
  VisionWeights& v = out.vision;
  QVL_RETURN_IF_ERROR(L.linear(hv.patch_embed, "vision.patch_embed", &v.patch_embed));
  QVL_RETURN_IF_ERROR(L.same(hv.pos_embed, "vision.pos_embed", &v.pos_embed));
  v.blocks.resize(hv.blocks.size());
  for (size_t i = 0; i < hv.blocks.size(); ++i) {
    const VisionBlockWeights& h = hv.blocks[i];
    VisionBlockWeights& b = v.blocks[i];
    QVL_RETURN_IF_ERROR(L.f32(h.norm1_w, idx("vision.blocks.", i, ".norm1.weight"), &b.norm1_w));
    QVL_RETURN_IF_ERROR(L.f32(h.norm1_b, idx("vision.blocks.", i, ".norm1.bias"), &b.norm1_b));
    QVL_RETURN_IF_ERROR(L.f32(h.norm2_w, idx("vision.blocks.", i, ".norm2.weight"), &b.norm2_w));
    QVL_RETURN_IF_ERROR(L.f32(h.norm2_b, idx("vision.blocks.", i, ".norm2.bias"), &b.norm2_b));
    QVL_RETURN_IF_ERROR(L.linear(h.qkv, idx("vision.blocks.", i, ".attn.qkv"), &b.qkv));
    QVL_RETURN_IF_ERROR(L.linear(h.proj, idx("vision.blocks.", i, ".attn.proj"), &b.proj));
    QVL_RETURN_IF_ERROR(L.linear(h.fc1, idx("vision.blocks.", i, ".mlp.fc1"), &b.fc1));
    QVL_RETURN_IF_ERROR(L.linear(h.fc2, idx("vision.blocks.", i, ".mlp.fc2"), &b.fc2));
  }
  auto merger = [&](const MergerWeights& h, const std::string& name, MergerWeights* m) -> Status {
    m->postshuffle_norm = h.postshuffle_norm;
    QVL_RETURN_IF_ERROR(L.f32(h.norm_w, name + ".norm.weight", &m->norm_w));
    QVL_RETURN_IF_ERROR(L.f32(h.norm_b, name + ".norm.bias", &m->norm_b));
    QVL_RETURN_IF_ERROR(L.linear(h.fc1, name + ".fc1", &m->fc1));
    return L.linear(h.fc2, name + ".fc2", &m->fc2);
  };
  QVL_RETURN_IF_ERROR(merger(hv.merger, "vision.merger", &v.merger));
  v.deepstack_mergers.resize(hv.deepstack_mergers.size());
  for (size_t k = 0; k < hv.deepstack_mergers.size(); ++k)
    QVL_RETURN_IF_ERROR(
        merger(hv.deepstack_mergers[k], idx("vision.deepstack_merger.", k, ""), &v.deepstack_mergers[k]));

  const TextWeights& ht = host.text;
  TextWeights& t = out.text;
  QVL_RETURN_IF_ERROR(L.same(ht.embed_tokens, "text.embed_tokens", &t.embed_tokens));
  t.layers.resize(ht.layers.size());
  for (size_t l = 0; l < ht.layers.size(); ++l) {
    if (resident && !resident(static_cast<int>(l))) continue;
    QVL_RETURN_IF_ERROR(load_layer(L, ht.layers[l], l, &t.layers[l]));
  }
  QVL_RETURN_IF_ERROR(L.f32(ht.final_norm, "text.final_norm", &t.final_norm));
  t.lm_head_tied = ht.lm_head_tied;
  if (ht.lm_head_tied) {
    // The loaded embedding table itself: one copy on the device.
    t.lm_head = ht.lm_head;
    t.lm_head.parts = {{t.embed_tokens, {}}};
  } else {
    QVL_RETURN_IF_ERROR(L.linear(ht.lm_head, "lm_head", &t.lm_head));
  }
  return out;
}

}  // namespace qvl
