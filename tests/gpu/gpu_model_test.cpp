// The whole model on CUDA vs the whole model on the CPU oracle, through the production path
// (gen-model checkpoint -> bind -> load_weights -> Qwen3VLModel -> SequenceRunner): tiny
// presets with an image, prefill logits of the last prompt tokens and four decode steps, the
// prompt prefilled whole (cuBLASLt, flash prefill) and one row at a time (skinny GEMVs, fused
// prologues, split-K decode). Catches integration mistakes (dtypes the model hands the ops,
// weight merging, cache layout) before the full-size checks on the GPU machine.
#include <filesystem>

#include "gpu/gpu_util.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/gen_model.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/runner.h"
#include "support/test_support.h"

namespace qvl::test::gpu {
namespace {

struct Loaded {
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<Qwen3VLModel> model;
};

Loaded load(Backend& be, const std::string& dir, const ModelConfig& cfg) {
  Loaded l;
  auto ck = Checkpoint::open(dir);
  EXPECT_TRUE(ck.is_ok()) << ck.status().to_string();
  l.ckpt = std::make_unique<Checkpoint>(std::move(ck).value());
  auto host = bind_host_weights(*l.ckpt, cfg);
  EXPECT_TRUE(host.is_ok()) << host.status().to_string();
  auto w = load_weights(be, *host);
  EXPECT_TRUE(w.is_ok()) << w.status().to_string();
  auto m = Qwen3VLModel::create(be, cfg, std::move(w).value());
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  l.model = std::move(m).value();
  return l;
}

// Last-3-token prefill logits, then 4 decode steps, concatenated.
std::vector<float> run(const Qwen3VLModel& model, int chunk, const std::vector<int32_t>& ids,
                       const std::vector<ImageInput>& images) {
  SequenceRunner::Options opt;
  opt.max_tokens = 96;
  opt.prefill_chunk = chunk;
  auto r = SequenceRunner::create(model, opt);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  auto logits = (*r)->prefill(ids, images, 3);
  EXPECT_TRUE(logits.is_ok()) << logits.status().to_string();
  std::vector<float> out = *logits;
  for (int32_t tok : {17, 151645, 198, 5000}) {
    auto d = (*r)->decode(tok);
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    out.insert(out.end(), d->begin(), d->end());
  }
  return out;
}

TEST(GpuModel, TinyPresetsMatchTheCpuOracle) {
  QVL_REQUIRE_CUDA();
  for (const std::string preset : {"tiny", "tiny-fp8"}) {
    const ModelConfig cfg = preset_config(preset).value();
    const std::string dir = scratch_dir("gpu_model_" + preset);
    GenModelOptions gen;
    gen.seed = 3;
    gen.max_shard_bytes = kTinyMaxShardBytes;
    ASSERT_TRUE(generate_model(cfg, gen, dir).is_ok());
    {
      Loaded c = load(cpu(), dir, cfg), g = load(*cuda(), dir, cfg);
      ASSERT_TRUE(c.model && g.model);
      const int img = cfg.tokens.image_token_id;
      std::vector<int32_t> ids = {151644, 872, 198, 151652};
      ids.insert(ids.end(), 6, img);  // grid 1x4x6 -> 6 tokens
      ids.insert(ids.end(), {151653, 42, 9000, 311, 151645, 198, 151644, 77091, 198});
      std::vector<float> px = random_values(24 * cfg.vision.patch_dim());
      std::vector<ImageInput> images = {{px.data(), ImageGrid{1, 4, 6}}};
      const std::vector<float> ref = run(*c.model, 0, ids, images);
      for (int chunk : {0, 5, 1}) {
        const std::vector<float> got = run(*g.model, chunk, ids, images);
        EXPECT_TRUE(compare("model logits (3 prefill + 4 decode)",
                            preset + (chunk ? " chunk " + std::to_string(chunk) : " whole prompt"), got, ref,
                            tol::kGpuModelLogits));
      }
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace qvl::test::gpu
