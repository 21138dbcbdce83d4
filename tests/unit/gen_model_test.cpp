// gen-model (io/gen_model.h): the official file set, determinism across runs and thread
// counts, the value distributions the header promises, and the block-FP8 checkpoint being
// exactly the 128x128 quantisation of the BF16 checkpoint of the same seed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/tensor_specs.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::string> all_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    files[e.path().filename().string()] = test::slurp(e.path().string());
  return files;
}

TEST(GenModel, WritesTheOfficialFileSet) {
  const std::string& dir = test::shared_preset("tiny");
  ASSERT_FALSE(dir.empty());
  for (const char* f :
       {"config.json", "generation_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
        "model.safetensors.index.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors"})
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->text.hidden_size, 64);
  EXPECT_EQ(config->generation.eos_token_ids, (std::vector<int>{151645, 151643}));  // spec §7
  EXPECT_EQ(config->preprocessor.max_pixels, 16777216);

  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  auto specs = checkpoint_tensor_specs(*preset_config("tiny"));
  EXPECT_EQ(ck->tensors().size(), specs.size());
  for (const auto& s : specs) {
    const CheckpointTensor* t = ck->find(s.name);
    ASSERT_NE(t, nullptr) << s.name;
    EXPECT_EQ(t->dtype(), s.dtype) << s.name;
    EXPECT_EQ(t->shape(), s.shape) << s.name;
  }
  auto index = nlohmann::json::parse(test::slurp(dir + "/model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& s : specs) total += s.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(ck->files()[0]->header().metadata.at("format"), "pt");  // transformers requires it
}

TEST(GenModel, OneShardWhenItFits) {
  std::string dir = test::generate_preset("tiny", 0, false, /*max_shard_bytes=*/1ull << 40);
  ASSERT_FALSE(dir.empty());
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok());
  EXPECT_EQ(ck->files().size(), 1u);
}

TEST(GenModel, CopiesTokenizerFiles) {
  std::string tok = test::temp_dir("fake_tokenizer");
  test::spit(tok + "/tokenizer.json", "{\"fake\": 1}");
  test::spit(tok + "/tokenizer_config.json", "{\"fake\": 2}");
  std::string out = test::temp_dir("gen_tok");
  GenModelOptions o;
  o.tokenizer_dir = tok;
  o.max_shard_bytes = kTinyMaxShardBytes;
  ASSERT_TRUE(generate_model(*preset_config("tiny"), o, out).is_ok());
  EXPECT_EQ(test::slurp(out + "/tokenizer.json"), "{\"fake\": 1}");
  EXPECT_EQ(test::slurp(out + "/tokenizer_config.json"), "{\"fake\": 2}");
  o.tokenizer_dir = test::temp_dir("no_tokenizer");
  Status s = generate_model(*preset_config("tiny"), o, out);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tokenizer.json not found"), std::string::npos) << s.message();
}

TEST(GenModel, DeterministicPerSeedAndThreadCount) {
  std::string a = test::generate_preset("tiny-untied", 7, false, kTinyMaxShardBytes, /*threads=*/1);
  std::string b = test::generate_preset("tiny-untied", 7, false, kTinyMaxShardBytes, /*threads=*/2);
  std::string c = test::generate_preset("tiny-untied", 8);
  ASSERT_FALSE(a.empty());
  auto fa = all_files(a), fb = all_files(b), fc = all_files(c);
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, bytes] : fa) EXPECT_TRUE(bytes == fb[name]) << name << " differs for the same seed";
  EXPECT_EQ(fa["config.json"], fc["config.json"]);
  for (const auto& [name, bytes] : fa) {
    if (name.find(".safetensors") != std::string::npos && name.find("index") == std::string::npos) {
      EXPECT_FALSE(bytes == fc[name]) << name << " is the same for seeds 7 and 8";
    }
  }
}

// Mean and standard deviation of a BF16 tensor.
std::pair<double, double> moments(const CheckpointTensor& t) {
  const auto* p = reinterpret_cast<const bf16_bits*>(t.data);
  const int64_t n = t.entry->numel();
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = bf16_to_float(p[i]);
    sum += v;
    sq += v * v;
  }
  const double mean = sum / n;
  return {mean, std::sqrt(sq / n - mean * mean)};
}

TEST(GenModel, ValueScalesAsDocumented) {
  auto ck = Checkpoint::open(test::shared_preset("tiny"));
  ASSERT_TRUE(ck.is_ok());
  // Linear weights: uniform with std 1/sqrt(in). gate_proj is [128, 64]: 1/8.
  auto [m1, s1] = moments(*ck->find("model.language_model.layers.1.mlp.gate_proj.weight"));
  EXPECT_NEAR(m1, 0.0, 0.01);
  EXPECT_NEAR(s1, 1.0 / 8.0, 0.125 * 0.05);
  // down_proj [64, 128]: 1/sqrt(128).
  auto [m2, s2] = moments(*ck->find("model.language_model.layers.1.mlp.down_proj.weight"));
  EXPECT_NEAR(s2, 1.0 / std::sqrt(128.0), 0.0884 * 0.05);
  // Patch embedding: in = 3*2*16*16 = 1536.
  auto [m3, s3] = moments(*ck->find("model.visual.patch_embed.proj.weight"));
  EXPECT_NEAR(s3, 1.0 / std::sqrt(1536.0), 0.0255 * 0.05);
  // Embeddings (= tied lm_head): std 3/sqrt(H) = 3/8, so logits over a unit-RMS hidden state
  // have std ~3.
  auto [m4, s4] = moments(*ck->find("model.language_model.embed_tokens.weight"));
  EXPECT_NEAR(m4, 0.0, 0.01);
  EXPECT_NEAR(s4, 3.0 / 8.0, 0.375 * 0.02);
  // Norm weights: 1 +- 0.1 (uniform: std 0.1/sqrt(3)).
  auto [m5, s5] = moments(*ck->find("model.visual.blocks.0.norm1.weight"));
  EXPECT_NEAR(m5, 1.0, 0.03);
  EXPECT_LT(s5, 0.1);
  // Every stored element is the documented generator value.
  for (const char* name : {"model.visual.merger.linear_fc1.bias", "model.language_model.norm.weight"}) {
    const CheckpointTensor* t = ck->find(name);
    TensorSpec spec{name, t->dtype(), t->shape(), WeightPart::kText};
    const auto* p = reinterpret_cast<const bf16_bits*>(t->data);
    for (int64_t i = 0; i < t->entry->numel(); ++i)
      ASSERT_EQ(p[i], float_to_bf16(gen_model_value(spec, 0, i))) << name << "[" << i << "]";
  }
}

TEST(GenModel, Fp8IsTheBlockQuantisationOfTheBf16Checkpoint) {
  // The same seed as BF16 (tiny-fp8 without its quantization_config) and as FP8.
  ModelConfig bf16_cfg = *preset_config("tiny-fp8");
  bf16_cfg.quant = QuantConfig{};
  std::string bf16_dir = test::temp_dir("gen_fp8_ref");
  GenModelOptions o;
  o.seed = 3;
  o.max_shard_bytes = kTinyMaxShardBytes;
  ASSERT_TRUE(generate_model(bf16_cfg, o, bf16_dir).is_ok());
  std::string fp8_dir = test::generate_preset("tiny-fp8", 3);
  auto ref = Checkpoint::open(bf16_dir);
  auto q = Checkpoint::open(fp8_dir);
  ASSERT_TRUE(ref.is_ok() && q.is_ok());

  int checked = 0;
  for (const auto& spec : checkpoint_tensor_specs(*preset_config("tiny-fp8"))) {
    if (spec.dtype != DType::kF8E4M3) {
      // Everything else is bit-identical to the BF16 checkpoint.
      if (spec.name.find("weight_scale_inv") != std::string::npos) continue;
      const CheckpointTensor *a = ref->find(spec.name), *b = q->find(spec.name);
      ASSERT_TRUE(a && b) << spec.name;
      ASSERT_EQ(0, std::memcmp(a->data, b->data, a->entry->nbytes())) << spec.name;
      continue;
    }
    const CheckpointTensor* w = ref->find(spec.name);
    const CheckpointTensor* w8 = q->find(spec.name);
    const CheckpointTensor* sc = q->find(spec.name + "_scale_inv");
    ASSERT_TRUE(w && w8 && sc) << spec.name;
    ASSERT_EQ(sc->dtype(), kFp8ScaleDType);
    const int64_t rows = spec.shape[0], cols = spec.shape[1], nb = (cols + 127) / 128;
    const auto* wv = reinterpret_cast<const bf16_bits*>(w->data);
    const auto* qv = w8->data;
    const auto* sv = reinterpret_cast<const bf16_bits*>(sc->data);
    for (int64_t rb = 0; rb * 128 < rows; ++rb)
      for (int64_t cb = 0; cb < nb; ++cb) {
        // scale = bf16(amax / 448) over the block; each byte = e4m3(w / scale) (core/dtype.h).
        float amax = 0;
        for (int64_t r = rb * 128; r < std::min(rows, rb * 128 + 128); ++r)
          for (int64_t c = cb * 128; c < std::min(cols, cb * 128 + 128); ++c)
            amax = std::max(amax, std::fabs(bf16_to_float(wv[r * cols + c])));
        const float scale = round_to_bf16(amax / 448.0f);
        ASSERT_EQ(bf16_to_float(sv[rb * nb + cb]), scale) << spec.name << " block " << rb << "," << cb;
        for (int64_t r = rb * 128; r < std::min(rows, rb * 128 + 128); ++r)
          for (int64_t c = cb * 128; c < std::min(cols, cb * 128 + 128); ++c) {
            const float x = bf16_to_float(wv[r * cols + c]);
            ASSERT_EQ(qv[r * cols + c], fp8_e4m3_from_float(x / scale)) << spec.name << "[" << r << "," << c << "]";
            // Dequantised within half an e4m3 step (relative 2^-4) of the BF16 value.
            ASSERT_LE(std::fabs(fp8_e4m3_to_float(qv[r * cols + c]) * scale - x), std::fabs(x) / 16 + scale / 512)
                << spec.name;
            ++checked;
          }
      }
  }
  // tiny-fp8: 2 layers x (q 256x256 + k, v 128x256 + o 256x256 + gate, up 384x256 + down 256x384).
  EXPECT_EQ(checked, 2 * (256 * 256 + 2 * 128 * 256 + 256 * 256 + 3 * 384 * 256));
}

}  // namespace
}  // namespace qvl
