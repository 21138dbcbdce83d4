// FP8 quantization at load (memory/quantize.h): the fast e4m3 encoder agrees with core's on every
// kind of float; a BF16 checkpoint quantized at load holds byte for byte what gen-model's FP8
// checkpoint of the same seed holds (gen-model documents its FP8 checkpoint as exactly the 128x128
// block quantization of the BF16 one), and so gives bit-identical logits; the loader path
// (`--fp8` on a BF16 model) plans and loads FP8.
#include "memory/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/gen_model.h"
#include "memory/planner.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/runner.h"
#include "support/test_support.h"

namespace qvl {
namespace {

TEST(Quantize, FastE4m3EncoderAgreesWithCore) {
  auto check = [](float f) { ASSERT_EQ(fp8_e4m3_from_float_fast(f), fp8_e4m3_from_float(f)) << f; };
  // Every representable e4m3 value, the midpoints between neighbours (ties to even) and their
  // float neighbours, both signs.
  for (int v = 0; v < 0x7f; ++v) {
    const float a = fp8_e4m3_to_float(static_cast<uint8_t>(v)), b = fp8_e4m3_to_float(static_cast<uint8_t>(v + 1));
    for (float x : {a, (a + b) / 2, std::nextafter((a + b) / 2, 0.0f), std::nextafter((a + b) / 2, 1e9f)}) {
      check(x);
      check(-x);
    }
  }
  // Beyond the range, zero, infinities and NaN.
  for (float x : {448.0f, 460.0f, 464.0f, 500.0f, 1e30f, INFINITY, 0.0f, 1e-30f, NAN}) {
    check(x);
    check(-x);
  }
  // A sweep over the float bit patterns (every 997th), which covers each exponent many times.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 997) {
    float f;
    const uint32_t b = static_cast<uint32_t>(u);
    std::memcpy(&f, &b, sizeof f);
    if (fp8_e4m3_from_float_fast(f) != fp8_e4m3_from_float(f)) {
      ADD_FAILURE() << "bits 0x" << std::hex << b << ": fast " << int(fp8_e4m3_from_float_fast(f)) << " core "
                    << int(fp8_e4m3_from_float(f));
      break;
    }
  }
}

struct Generated {
  ModelConfig config;
  std::string dir;
  std::unique_ptr<Checkpoint> ckpt;
  ModelWeights host;
};

Generated generate(const ModelConfig& cfg, const std::string& name) {
  Generated g;
  g.config = cfg;
  g.dir = test::scratch_dir(name);
  GenModelOptions gen;
  gen.seed = 21;
  gen.max_shard_bytes = kTinyMaxShardBytes;
  Status st = generate_model(cfg, gen, g.dir);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  g.ckpt = std::make_unique<Checkpoint>(Checkpoint::open(g.dir).value());
  g.host = bind_host_weights(*g.ckpt, cfg).value();
  return g;
}

// tiny-fp8's shapes; `odd` makes the intermediate size 320 (2.5 blocks) so partial blocks occur.
ModelConfig tiny(bool fp8, bool odd) {
  ModelConfig c = preset_config("tiny-fp8").value();
  if (odd) c.text.intermediate_size = 320;
  if (!fp8)
    c.quant = QuantConfig{};
  else
    make_fp8(&c);
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.same_shape(b) && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

std::vector<float> logits(const ModelConfig& cfg, const ModelWeights& host) {
  auto be = make_cpu_backend(2);
  auto model = Qwen3VLModel::create(*be, cfg, load_weights(*be, host).value()).value();
  SequenceRunner::Options opt;
  opt.max_tokens = 32;
  auto r = SequenceRunner::create(*model, opt).value();
  std::vector<int32_t> ids = {151644, 872, 198, 42, 9000, 311, 151645, 198, 151644, 77091, 198};
  std::vector<float> out = r->prefill(ids, {}, 2).value();
  for (int32_t tok : {17, 5000}) {
    std::vector<float> d = r->decode(tok).value();
    out.insert(out.end(), d.begin(), d.end());
  }
  return out;
}

TEST(Quantize, BF16CheckpointQuantizedAtLoadIsTheFp8Checkpoint) {
  for (bool odd : {false, true}) {
    SCOPED_TRACE(odd ? "intermediate 320 (partial blocks)" : "tiny-fp8 shapes");
    Generated bf16 = generate(tiny(false, odd), "quantize_bf16");
    Generated fp8 = generate(tiny(true, odd), "quantize_fp8");
    Result<QuantizedWeights> q = quantize_fp8_at_load(bf16.config, bf16.host, 2);
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    EXPECT_TRUE(q->config.quant.fp8);
    EXPECT_EQ(q->config.quant.modules_to_not_convert, fp8.config.quant.modules_to_not_convert);
    const int L = bf16.config.text.num_hidden_layers;
    EXPECT_EQ(q->quantized_linears, 7 * L);  // q, k, v, o, gate, up, down
    for (int l = 0; l < L; ++l) {
      const DecoderLayerWeights &got = q->host.text.layers[l], &want = fp8.host.text.layers[l];
      for (auto [g, w] : {std::pair{&got.qkv, &want.qkv},
                          {&got.o, &want.o},
                          {&got.gate_up, &want.gate_up},
                          {&got.down, &want.down}}) {
        ASSERT_EQ(g->parts.size(), w->parts.size());
        EXPECT_EQ(g->block_size, w->block_size);
        for (size_t i = 0; i < g->parts.size(); ++i) {
          EXPECT_TRUE(same_bytes(g->parts[i].weight, w->parts[i].weight)) << "layer " << l << " weight part " << i;
          EXPECT_TRUE(same_bytes(g->parts[i].scale_inv, w->parts[i].scale_inv)) << "layer " << l << " scale part " << i;
        }
      }
    }
    // The vision tower and lm_head/embeddings are untouched views of the BF16 checkpoint.
    EXPECT_EQ(q->host.vision.blocks[0].qkv.parts[0].weight.data, bf16.host.vision.blocks[0].qkv.parts[0].weight.data);
    EXPECT_EQ(q->host.text.embed_tokens.data, bf16.host.text.embed_tokens.data);
    // Same weights, same logits.
    const std::vector<float> a = logits(q->config, q->host), b = logits(fp8.config, fp8.host);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    // The plan of the quantized model is the plan of the FP8 checkpoint.
    RuntimeOptions o;
    o.fp8_weights = true;
    EXPECT_EQ(weight_bytes(effective_config(bf16.config, o)).total(), weight_bytes(fp8.config).total());
    std::filesystem::remove_all(bf16.dir);
    std::filesystem::remove_all(fp8.dir);
  }
}

TEST(Quantize, RefusesAnFp8Checkpoint) {
  Generated fp8 = generate(tiny(true, false), "quantize_refuse");
  Result<QuantizedWeights> q = quantize_fp8_at_load(fp8.config, fp8.host, 1);
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("already FP8"), std::string::npos) << q.status().message();
  std::filesystem::remove_all(fp8.dir);
}

}  // namespace
}  // namespace qvl
