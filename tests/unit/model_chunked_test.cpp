// Chunked prefill: a prompt with two images prefilled in chunks of 1 row, 7 rows (image runs
// split across chunk boundaries) and all at once must give the same logits for its last
// tokens and the same decode logits afterwards. On the CPU backend every row's arithmetic is
// independent of which other rows share its step (per-row norms, a Linear whose accumulation
// order per output element does not depend on the row count, attention per row), so the
// results are compared for exact equality; any difference means state leaked between chunks
// (KV slots, positions, visual row slicing or deepstack injection).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "model/model.h"
#include "model/presets.h"
#include "model/runner.h"
#include "random_model.h"

namespace qvl {
namespace {

struct RunResult {
  std::vector<float> prefill;              // logits of the last 3 prompt tokens
  std::vector<std::vector<float>> decode;  // logits of 4 decode steps
  size_t high_water = 0, capacity = 0;
};

RunResult run(const Qwen3VLModel& model, int chunk, const std::vector<int32_t>& ids,
              const std::vector<ImageInput>& images) {
  SequenceRunner::Options opt;
  opt.max_tokens = 64;
  opt.page_size = 4;
  opt.prefill_chunk = chunk;
  auto r = SequenceRunner::create(model, opt);
  QVL_CHECK(r.is_ok()) << r.status().to_string();
  RunResult out;
  auto logits = (*r)->prefill(ids, images, 3);
  QVL_CHECK(logits.is_ok()) << logits.status().to_string();
  out.prefill = *logits;
  for (int32_t tok : {17, 151645, 198, 5000}) out.decode.push_back((*r)->decode(tok).value());
  out.high_water = (*r)->arena_high_water();
  out.capacity = (*r)->arena_capacity();
  return out;
}

TEST(ChunkedPrefill, AnyChunkSizeGivesTheSameLogits) {
  ModelConfig cfg = preset_config("tiny").value();
  auto be = make_cpu_backend(2);
  test::RandomModel rm(cfg, *be, 11);
  auto model = Qwen3VLModel::create(*be, cfg, rm.weights).value();

  const int img = cfg.tokens.image_token_id;
  std::vector<int32_t> ids = {151644, 872, 198, 151652};
  ids.insert(ids.end(), 6, img);  // grid 1x4x6 -> 6 tokens at rows 4..9 (split by chunk 7)
  ids.insert(ids.end(), {151653, 42, 151652});
  ids.insert(ids.end(), 4, img);  // grid 1x4x4 -> 4 tokens
  ids.insert(ids.end(), {151653, 7, 8, 151645, 198, 151644, 77091, 198});
  std::vector<ImageGrid> grids = {{1, 4, 6}, {1, 4, 4}};
  std::vector<std::vector<float>> px;
  std::vector<ImageInput> images;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> d(-1, 1);
  for (const ImageGrid& g : grids) {
    px.emplace_back(g.num_patches() * cfg.vision.patch_dim());
    for (float& v : px.back()) v = d(gen);
  }
  for (size_t i = 0; i < grids.size(); ++i) images.push_back({px[i].data(), grids[i]});

  const RunResult whole = run(*model, 0, ids, images);
  for (int chunk : {1, 7}) {
    SCOPED_TRACE(testing::Message() << "chunk " << chunk);
    const RunResult r = run(*model, chunk, ids, images);
    ASSERT_EQ(r.prefill.size(), whole.prefill.size());
    EXPECT_TRUE(r.prefill == whole.prefill) << "prefill logits differ";
    for (size_t s = 0; s < whole.decode.size(); ++s) EXPECT_TRUE(r.decode[s] == whole.decode[s]) << "decode " << s;
    EXPECT_LE(r.high_water, r.capacity);
  }
}

}  // namespace
}  // namespace qvl
