// load_weights (model/load.h): the host tree of a generated checkpoint on the CPU backend —
// norms and biases become F32, embeddings keep BF16, FP8 Linears keep FP8, a tied lm_head is
// the loaded embedding — and a backend failure names the tensor it was loading.
#include "model/load.h"

#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/bind.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

struct Bound {
  ModelConfig config;
  ModelWeights host;
};

Bound bind(const std::string& dir) {
  Bound b;
  b.config = *load_model_config(dir);
  auto ck = Checkpoint::open(dir);
  b.host = *bind_host_weights(*ck, b.config);
  return b;  // the tree keeps the maps alive without the Checkpoint
}

TEST(Load, TinyOnCpuConvertsNormsAndBiases) {
  Bound b = bind(test::shared_preset("tiny"));
  auto cpu = make_cpu_backend(1);
  auto w = load_weights(*cpu, b.host);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const DecoderLayerWeights& hl = b.host.text.layers[2];
  const DecoderLayerWeights& l = w->text.layers[2];
  ASSERT_EQ(l.input_norm.dtype, DType::kF32);
  for (int64_t i = 0; i < 64; ++i)
    ASSERT_EQ(l.input_norm.as<float>()[i], bf16_to_float(hl.input_norm.as<bf16_bits>()[i])) << i;
  EXPECT_EQ(l.q_norm.dtype, DType::kF32);
  EXPECT_EQ(w->vision.blocks[1].norm2_b.dtype, DType::kF32);
  const LinearWeight& qkv = w->vision.blocks[1].qkv;
  ASSERT_EQ(qkv.bias.dtype, DType::kF32);
  const Tensor& hb = b.host.vision.blocks[1].qkv.bias;
  for (int64_t i = 0; i < hb.numel(); ++i) ASSERT_EQ(qkv.bias.as<float>()[i], bf16_to_float(hb.as<bf16_bits>()[i]));
  EXPECT_EQ(qkv.out_features, 192);
  EXPECT_EQ(qkv.in_features, 64);
  EXPECT_EQ(w->text.embed_tokens.dtype, DType::kBF16);
  EXPECT_EQ(w->vision.pos_embed.dtype, DType::kBF16);
  EXPECT_EQ(l.qkv.parts.size(), 3u);
  EXPECT_EQ(l.qkv.out_features, 256);
  // Tied: the loaded embedding table itself, not a second copy.
  EXPECT_TRUE(w->text.lm_head_tied);
  EXPECT_EQ(w->text.lm_head.parts[0].weight.data, w->text.embed_tokens.data);
  EXPECT_EQ(w->text.lm_head.out_features, 151936);
  EXPECT_EQ(w->vision.deepstack_mergers.size(), 2u);
  EXPECT_TRUE(w->vision.deepstack_mergers[0].postshuffle_norm);
}

TEST(Load, Fp8StaysFp8) {
  Bound b = bind(test::shared_preset("tiny-fp8"));
  auto cpu = make_cpu_backend(1);
  auto w = load_weights(*cpu, b.host);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const LinearWeight& gu = w->text.layers[0].gate_up;
  EXPECT_TRUE(gu.is_fp8());
  EXPECT_EQ(gu.block_size, 128);
  EXPECT_EQ(gu.out_features, 768);
  EXPECT_FALSE(gu.parts[0].scale_inv.empty());
  EXPECT_FALSE(w->vision.merger.fc1.is_fp8());
}

TEST(Load, UntiedLoadsItsOwnLmHead) {
  Bound b = bind(test::shared_preset("tiny-untied"));
  auto cpu = make_cpu_backend(1);
  auto w = load_weights(*cpu, b.host);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_FALSE(w->text.lm_head_tied);
  EXPECT_NE(w->text.lm_head.parts[0].weight.data, w->text.embed_tokens.data);
  EXPECT_EQ(w->text.lm_head.out_features, 151936);
}

// The CPU backend, except that the n-th load_linear fails as a device out of memory would.
class FailingBackend : public Backend {
 public:
  explicit FailingBackend(int fail_at) : cpu_(make_cpu_backend(1)), fail_at_(fail_at) {}
  Device device() const override { return cpu_->device(); }
  std::string name() const override { return "failing"; }
  DType activation_dtype() const override { return cpu_->activation_dtype(); }
  Result<DeviceBuffer> allocate(size_t b, const std::string& t) override { return cpu_->allocate(b, t); }
  void copy_to_device(Tensor d, const void* s) override { cpu_->copy_to_device(d, s); }
  void copy_to_host(void* d, const Tensor& s) override { cpu_->copy_to_host(d, s); }
  void copy(Tensor d, const Tensor& s) override { cpu_->copy(d, s); }
  void synchronize() override {}
  Result<Tensor> load_tensor(const Tensor& h, DType as) override { return cpu_->load_tensor(h, as); }
  Result<LinearWeight> load_linear(std::span<const LinearPart> p, const Tensor& b, int bs) override {
    if (++calls_ == fail_at_) return resource_exhausted("out of device memory (12 MiB asked, 3 MiB free)");
    return cpu_->load_linear(p, b, bs);
  }
  void embedding(Tensor, const Tensor&, const Tensor&) override {}
  void scatter_rows(Tensor, const Tensor&, const Tensor&, bool) override {}
  void rms_norm(Tensor, const Tensor&, const Tensor&, float) override {}
  void layer_norm(Tensor, const Tensor&, const Tensor&, const Tensor&, float) override {}
  void linear(Tensor, const Tensor&, const LinearWeight&, const Epilogue&) override {}
  void silu_mul(Tensor, const Tensor&) override {}
  void add_interpolated(Tensor, const Tensor&, const Tensor&, const Tensor&) override {}
  void vision_rope(Tensor, const Tensor&, int, int) override {}
  void vision_attention(Tensor, const Tensor&, const VisionSegments&, int, int, float) override {}
  void text_qkv_prepare(Tensor, const Tensor&, const Tensor&, float, const MropeSpec&, const TextBatch&,
                        const KvCacheView&, int, const TextAttentionShape&) override {}
  void text_attention(Tensor, const Tensor&, const TextBatch&, const KvCacheView&, int, const TextAttentionShape&,
                      float) override {}
  void gather_rows(Tensor, const Tensor&, const Tensor&) override {}

 private:
  std::unique_ptr<Backend> cpu_;
  int fail_at_;
  int calls_ = 0;
};

TEST(Load, BackendErrorsNameTheTensor) {
  Bound b = bind(test::shared_preset("tiny"));
  // Linears load in order: patch_embed, then block 0's qkv, proj, fc1, fc2, then block 1's qkv.
  FailingBackend failing(6);
  auto w = load_weights(failing, b.host);
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(w.status().message(),
            "loading vision.blocks.1.attn.qkv on failing: out of device memory (12 MiB asked, 3 MiB free)");
}

}  // namespace
}  // namespace qvl
