#include "model/bind.h"

#include <map>
#include <set>

#include "model/tensor_specs.h"

namespace qvl {
namespace {

// Collects every problem instead of stopping at the first, so one run lists them all.
class Binder {
 public:
  Binder(const Checkpoint& ck, const ModelConfig& config) : ck_(ck), config_(config) {
    specs_ = checkpoint_tensor_specs(config);
    for (const auto& s : specs_) spec_[s.name] = &s;
  }

  // A non-Linear tensor: exactly the spec's dtype and shape, viewed as `view_dims` (default:
  // its own shape).
  Tensor tensor(const std::string& name, std::vector<int64_t> view_dims = {}) {
    const TensorSpec& spec = expect(name);
    used_.insert(name);
    const CheckpointTensor* t = ck_.find(name);
    if (!t) return missing(name, spec), Tensor{};
    if (t->dtype() != spec.dtype || t->shape() != spec.shape) return mismatch(*t, describe(spec)), Tensor{};
    return t->view_as(view_dims.empty() ? spec.shape : view_dims);
  }

  // One checkpoint Linear `module`: BF16, or F8_E4M3 + weight_scale_inv (see bind.h).
  LinearPart part(const std::string& module) {
    const std::string wname = module + ".weight", sname = module + ".weight_scale_inv";
    const TensorSpec& spec = expect(wname);
    used_.insert(wname);
    const CheckpointTensor* w = ck_.find(wname);
    if (!w) return missing(wname, spec), LinearPart{};
    if (w->shape() != spec.shape) return mismatch(*w, describe(spec)), LinearPart{};
    if (w->dtype() == DType::kBF16) {
      ++report_.bf16_linears;
      return {w->view(), {}};
    }
    if (w->dtype() != DType::kF8E4M3) {
      problems_.push_back(wname + ": " + w->entry->describe() + " in " + w->file_path() + ", expected BF16 " +
                          shape_of(spec) + " or F8_E4M3 " + shape_of(spec) + " with " + sname);
      return {};
    }
    used_.insert(sname);
    if (!config_.quant.fp8) {
      problems_.push_back(wname + ": F8_E4M3 in " + w->file_path() +
                          " but config.json has no quantization_config (block size unknown)");
      return {};
    }
    const int b = config_.quant.weight_block_size[0];
    const std::vector<int64_t> grid{fp8_scale_blocks(spec.shape[0], b), fp8_scale_blocks(spec.shape[1], b)};
    const CheckpointTensor* s = ck_.find(sname);
    if (!s) {
      problems_.push_back(sname + ": missing (expected F32, BF16 or F16 " + shape_string(grid) + " for the F8_E4M3 " +
                          wname + ")");
      return {};
    }
    if ((s->dtype() != DType::kF32 && s->dtype() != DType::kBF16 && s->dtype() != DType::kF16) || s->shape() != grid)
      return mismatch(*s, "F32, BF16 or F16 " + shape_string(grid)), LinearPart{};
    ++report_.fp8_linears;
    return {w->view(), s->view()};
  }

  // A Linear made of `modules` stacked along the output dimension, plus an optional bias.
  LinearWeight linear(const std::vector<std::string>& modules, const std::string& bias_name = "") {
    LinearWeight lw;
    lw.block_size = config_.quant.weight_block_size[0];
    for (const auto& m : modules) {
      const TensorSpec& spec = expect(m + ".weight");
      lw.out_features += spec.shape[0];
      lw.in_features = spec.shape[1];
      lw.parts.push_back(part(m));
    }
    // A backend may merge the parts into one buffer, so they must share a format.
    for (size_t i = 1; i < lw.parts.size(); ++i) {
      const Tensor &a = lw.parts[0].weight, &b = lw.parts[i].weight;
      if (!a.empty() && !b.empty() && a.dtype != b.dtype)
        problems_.push_back(modules[i] + ".weight: " + std::string(dtype_name(b.dtype)) + " while " + modules[0] +
                            ".weight is " + std::string(dtype_name(a.dtype)) +
                            " (Linears computed together must share a format)");
    }
    if (!bias_name.empty()) lw.bias = tensor(bias_name);
    return lw;
  }
  LinearWeight linear(const std::string& module, bool bias) {
    return linear(std::vector<std::string>{module}, bias ? module + ".bias" : "");
  }

  void layer_norm(const std::string& module, Tensor* w, Tensor* b) {
    *w = tensor(module + ".weight");
    *b = tensor(module + ".bias");
  }

  MergerWeights merger(const std::string& p, bool postshuffle_norm) {
    MergerWeights m;
    m.postshuffle_norm = postshuffle_norm;
    layer_norm(p + "norm", &m.norm_w, &m.norm_b);
    m.fc1 = linear(p + "linear_fc1", true);
    m.fc2 = linear(p + "linear_fc2", true);
    return m;
  }

  Result<ModelWeights> bind(BindReport* report) {
    ModelWeights mw;
    bind_vision(&mw.vision);
    bind_text(&mw.text);
    for (const auto& [name, t] : ck_.tensors())
      if (!used_.count(name)) report_.unexpected.push_back(name);
    if (report) *report = report_;
    if (!problems_.empty()) {
      std::string msg = std::to_string(problems_.size()) + " problem" + (problems_.size() == 1 ? "" : "s") +
                        " binding the checkpoint in " + ck_.dir() + " to its config.json:";
      for (const auto& p : problems_) msg += "\n  " + p;
      return invalid_argument(msg);
    }
    mw.keep_alive = ck_.keep_alive();
    return mw;
  }

 private:
  void bind_vision(VisionWeights* v) {
    const VisionConfig& c = config_.vision;
    // Conv3d with kernel == stride is a Linear over the flattened (c, t, py, px) patch.
    v->patch_embed.parts = {{tensor("model.visual.patch_embed.proj.weight", {c.hidden_size, c.patch_dim()}), {}}};
    v->patch_embed.bias = tensor("model.visual.patch_embed.proj.bias");
    v->patch_embed.out_features = c.hidden_size;
    v->patch_embed.in_features = c.patch_dim();
    v->patch_embed.block_size = config_.quant.weight_block_size[0];
    v->pos_embed = tensor("model.visual.pos_embed.weight");
    for (int i = 0; i < c.depth; ++i) {
      const std::string p = "model.visual.blocks." + std::to_string(i) + ".";
      VisionBlockWeights b;
      layer_norm(p + "norm1", &b.norm1_w, &b.norm1_b);
      layer_norm(p + "norm2", &b.norm2_w, &b.norm2_b);
      b.qkv = linear(p + "attn.qkv", true);
      b.proj = linear(p + "attn.proj", true);
      b.fc1 = linear(p + "mlp.linear_fc1", true);
      b.fc2 = linear(p + "mlp.linear_fc2", true);
      v->blocks.push_back(std::move(b));
    }
    v->merger = merger("model.visual.merger.", /*postshuffle_norm=*/false);
    for (size_t k = 0; k < c.deepstack_visual_indexes.size(); ++k)
      v->deepstack_mergers.push_back(
          merger("model.visual.deepstack_merger_list." + std::to_string(k) + ".", /*postshuffle_norm=*/true));
  }

  void bind_text(TextWeights* t) {
    const TextConfig& c = config_.text;
    t->embed_tokens = tensor("model.language_model.embed_tokens.weight");
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.language_model.layers." + std::to_string(l) + ".";
      DecoderLayerWeights d;
      d.input_norm = tensor(p + "input_layernorm.weight");
      d.post_attention_norm = tensor(p + "post_attention_layernorm.weight");
      d.q_norm = tensor(p + "self_attn.q_norm.weight");
      d.k_norm = tensor(p + "self_attn.k_norm.weight");
      d.qkv = linear({p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"});
      d.o = linear(p + "self_attn.o_proj", false);
      d.gate_up = linear({p + "mlp.gate_proj", p + "mlp.up_proj"});
      d.down = linear(p + "mlp.down_proj", false);
      t->layers.push_back(std::move(d));
    }
    t->final_norm = tensor("model.language_model.norm.weight");
    t->lm_head_tied = config_.tie_word_embeddings;
    if (t->lm_head_tied) {
      // transformers ties lm_head to the embedding and ignores a stored lm_head.weight.
      if (ck_.find("lm_head.weight")) {
        report_.lm_head_ignored = true;
        used_.insert("lm_head.weight");
      }
      t->lm_head.parts = {{t->embed_tokens, {}}};
      t->lm_head.out_features = c.vocab_size;
      t->lm_head.in_features = c.hidden_size;
      t->lm_head.block_size = config_.quant.weight_block_size[0];
    } else {
      t->lm_head = linear("lm_head", false);
    }
  }

  const TensorSpec& expect(const std::string& name) const {
    auto it = spec_.find(name);
    QVL_CHECK(it != spec_.end()) << "binding asks for " << name << ", which tensor_specs does not list";
    return *it->second;
  }
  static std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = describe_dtype_shape(DType::kU8, shape);
    return s.substr(s.find('['));
  }
  static std::string shape_of(const TensorSpec& s) { return shape_string(s.shape); }
  static std::string describe(const TensorSpec& s) { return describe_dtype_shape(s.dtype, s.shape); }
  void missing(const std::string& name, const TensorSpec& spec) {
    problems_.push_back(name + ": missing (expected " + describe(spec) + ")");
  }
  void mismatch(const CheckpointTensor& t, const std::string& expected) {
    problems_.push_back(t.name() + ": " + t.entry->describe() + " in " + t.file_path() + ", expected " + expected);
  }

  const Checkpoint& ck_;
  const ModelConfig& config_;
  std::vector<TensorSpec> specs_;
  std::map<std::string, const TensorSpec*> spec_;
  std::set<std::string> used_;
  std::vector<std::string> problems_;
  BindReport report_;
};

}  // namespace

Result<ModelWeights> bind_host_weights(const Checkpoint& checkpoint, const ModelConfig& config, BindReport* report) {
  return Binder(checkpoint, config).bind(report);
}

}  // namespace qvl
