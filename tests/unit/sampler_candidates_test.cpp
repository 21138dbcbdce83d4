// Sampling from a row's largest logits (backend/top_k.h keys, Sampler::sample_candidates)
// against sample() on the whole row:
// - the keys: order by value then index, -0 as +0, NaN -> kTopKFallback, short rows, and the
//   value and index coming back exactly;
// - two samplers with the same seed, one fed whole rows, the other the rows' 64 largest keys
//   (and the whole row where the keys do not decide), over random parameters, rows with ties
//   and penalties on tokens among the largest: the same tokens, step after step (a draw taken
//   or skipped by one path alone would shift every later token);
// - rows the keys cannot decide (penalties that push the candidates under the keys' last
//   value, greedy as well), and parameters that rule the keys out.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/top_k.h"
#include "core/dtype.h"
#include "engine/sampler.h"

namespace qvl {
namespace {

std::vector<uint64_t> keys_of(const std::vector<float>& row, int k = kSampleCandidates) {
  std::vector<uint64_t> keys(static_cast<size_t>(k));
  top_k_keys(row, keys);
  return keys;
}

TEST(TopKKeys, OrderByValueThenIndex) {
  const std::vector<float> row{1.0f, 3.0f, -2.0f, 3.0f, -0.0f, 0.0f, -INFINITY, 2.5f};
  const std::vector<uint64_t> keys = keys_of(row, 8);
  // 3 (index 1), 3 (index 3), 2.5, 1, then +0 and -0 tied (index 4 first), -2, -inf.
  const std::vector<int32_t> want_ids{1, 3, 7, 0, 4, 5, 2, 6};
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(logit_key_index(keys[i]), want_ids[i]) << "position " << i;
    EXPECT_EQ(logit_key_value(keys[i]), row[static_cast<size_t>(want_ids[i])]) << "position " << i;
    if (i > 0) {
      EXPECT_GT(keys[i - 1], keys[i]);
    }
  }
  EXPECT_FALSE(std::signbit(logit_key_value(keys[4]))) << "-0 (index 4) comes back as +0";
}

TEST(TopKKeys, ShortRowsPadWithZeroAndNaNFallsBack) {
  const std::vector<uint64_t> short_keys = keys_of({0.5f, -1.0f, 4.0f}, 5);
  EXPECT_EQ(logit_key_index(short_keys[0]), 2);
  EXPECT_EQ(logit_key_index(short_keys[2]), 1);
  EXPECT_EQ(short_keys[3], 0u);
  EXPECT_EQ(short_keys[4], 0u);
  const std::vector<uint64_t> nan_keys = keys_of({0.5f, std::nanf(""), 4.0f}, 2);
  EXPECT_EQ(nan_keys[0], kTopKFallback);
  EXPECT_EQ(nan_keys[1], 0u);
  // Values round-trip exactly, including subnormals and extremes.
  for (float v : {1e-42f, -1e-42f, 3.4e38f, -3.4e38f, INFINITY, 0.1f, -7.25f}) {
    EXPECT_EQ(logit_key_value(logit_key(v, 123)), v);
    EXPECT_EQ(logit_key_index(logit_key(v, 151935)), 151935);
  }
}

SamplingParams params(float t, int k, float p, float min_p, float rep, float presence, float freq) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = min_p;
  s.repetition_penalty = rep;
  s.presence_penalty = presence;
  s.frequency_penalty = freq;
  return s;
}

// A row of BF16-rounded logits; `coarse` rounds to quarters, so that ties are common.
std::vector<float> random_row(std::mt19937& gen, int vocab, bool coarse) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& v : row) v = coarse ? std::round(normal(gen) * 4.0f) / 4.0f : round_to_bf16(normal(gen));
  return row;
}

// The indices of the row's n largest entries (the tokens penalties should hit to matter).
std::vector<int32_t> largest(const std::vector<float>& row, int n) {
  std::vector<uint64_t> keys(static_cast<size_t>(n));
  top_k_keys(row, keys);
  std::vector<int32_t> ids;
  for (uint64_t k : keys) ids.push_back(logit_key_index(k));
  return ids;
}

TEST(SamplerCandidates, SameTokensAsTheWholeRow) {
  std::mt19937 gen(2024);
  const int vocab = 20000;
  const std::vector<SamplingParams> settings = {
      params(0.7f, 20, 0.8f, 0.0f, 1.0f, 0.0f, 0.0f),    // Qwen3-VL's generation_config
      params(1.0f, 1, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f),     // top-1
      params(1.5f, 63, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f),  // the widest top-k the keys take
      params(0.3f, 40, 0.5f, 0.2f, 1.3f, 0.0f, 0.0f),
      params(1.0f, 10, 1.0f, 0.0f, 3.0f, 1.0f, 0.5f),  // heavy penalties: some rows fall back
      params(0.8f, 30, 0.9f, 0.0f, 1.05f, 2.0f, 0.0f),
      params(0.0f, 0, 1.0f, 0.0f, 1.5f, 0.0f, 0.0f),  // greedy with a penalty
      params(0.0f, 0, 1.0f, 0.0f, 10.0f, 0.5f, 0.3f),
  };
  int decided = 0, whole = 0;
  for (size_t s = 0; s < settings.size(); ++s) {
    SCOPED_TRACE("setting " + std::to_string(s));
    const SamplingParams& sp = settings[s];
    ASSERT_TRUE(validate_sampling_params(sp).is_ok());
    Sampler full(sp, vocab, 77 + s), cand(sp, vocab, 77 + s);
    ASSERT_TRUE(cand.can_sample_candidates());
    // The prompt holds some of the first row's largest tokens, so penalties reach the candidates.
    std::vector<float> row = random_row(gen, vocab, s % 2 == 1);
    std::vector<int32_t> prompt = largest(row, 12);
    prompt.resize(6);
    full.observe_prompt(prompt);
    cand.observe_prompt(prompt);
    for (int step = 0; step < 40; ++step) {
      if (step > 0) {
        row = random_row(gen, vocab, (s + step) % 2 == 1);
        // Raise a few tokens seen before to the top, where the penalties decide.
        for (int32_t id : prompt) row[static_cast<size_t>(id)] += 9.0f;
      }
      const std::vector<uint64_t> keys = keys_of(row);
      std::vector<float> a = row, b = row;
      const int32_t want = full.sample(a);
      int32_t got;
      if (cand.candidates_decide(keys)) {
        ++decided;
        got = cand.sample_candidates(keys);
      } else {
        ++whole;
        got = cand.sample(b);
      }
      ASSERT_EQ(got, want) << "step " << step;
      full.accept(want);
      cand.accept(got);
      prompt.push_back(want);
    }
  }
  EXPECT_GT(decided, 250);  // of 320 rows
  EXPECT_GT(whole, 0);
}

TEST(SamplerCandidates, TheWholeVocabularyIsAlwaysDecided) {
  // 50 tokens: the keys are the whole row, so no top-k, a raising penalty and top-p over
  // everything all sample as over the row.
  std::mt19937 gen(5);
  const SamplingParams sp = params(0.9f, 0, 0.9f, 0.0f, 0.8f, -1.0f, 0.0f);
  Sampler full(sp, 50, 3), cand(sp, 50, 3);
  ASSERT_TRUE(cand.can_sample_candidates());
  for (int step = 0; step < 30; ++step) {
    std::vector<float> row = random_row(gen, 50, step % 2 == 0);
    const std::vector<uint64_t> keys = keys_of(row);
    ASSERT_TRUE(cand.candidates_decide(keys));
    const int32_t want = full.sample(row);
    ASSERT_EQ(cand.sample_candidates(keys), want) << "step " << step;
    full.accept(want);
    cand.accept(want);
  }
}

TEST(SamplerCandidates, PenaltiesBelowTheLastKeyLeaveTheRowUndecided) {
  // Tokens 0..63 hold the 64 largest logits (10 down to 3.7); every other token is 3.5. With the
  // first 60 penalised (repetition 10: 1.0 down to 0.41), top-5 may need tokens beyond the keys.
  const int vocab = 1000;
  std::vector<float> row(vocab, 3.5f);
  for (int i = 0; i < 64; ++i) row[static_cast<size_t>(i)] = 10.0f - 0.1f * static_cast<float>(i);
  std::vector<int32_t> seen(60);
  for (int i = 0; i < 60; ++i) seen[static_cast<size_t>(i)] = i;
  const std::vector<uint64_t> keys = keys_of(row);

  Sampler top5(params(1.0f, 5, 1.0f, 0.0f, 10.0f, 0.0f, 0.0f), vocab, 1);
  top5.observe_prompt(seen);
  EXPECT_FALSE(top5.candidates_decide(keys));
  // Top-4's fourth is token 63 itself, the keys' last (3.7): a left-out token could tie it, so
  // the keys do not decide. Top-3's third (token 62, 3.8) is above anything left out.
  Sampler top4(params(1.0f, 4, 1.0f, 0.0f, 10.0f, 0.0f, 0.0f), vocab, 1);
  top4.observe_prompt(seen);
  EXPECT_FALSE(top4.candidates_decide(keys));
  Sampler top3(params(1.0f, 3, 1.0f, 0.0f, 10.0f, 0.0f, 0.0f), vocab, 1);
  top3.observe_prompt(seen);
  EXPECT_TRUE(top3.candidates_decide(keys));

  // Greedy: with all 64 penalised, the best left-out token (3.5) beats them; with 60, token 60.
  Sampler greedy_all(params(0.0f, 0, 1.0f, 0.0f, 10.0f, 0.0f, 0.0f), vocab, 1);
  std::vector<int32_t> all64(64);
  for (int i = 0; i < 64; ++i) all64[static_cast<size_t>(i)] = i;
  greedy_all.observe_prompt(all64);
  EXPECT_FALSE(greedy_all.candidates_decide(keys));
  std::vector<float> whole = row;
  EXPECT_EQ(greedy_all.sample(whole), 64);
  Sampler greedy60(params(0.0f, 0, 1.0f, 0.0f, 10.0f, 0.0f, 0.0f), vocab, 1);
  greedy60.observe_prompt(seen);
  ASSERT_TRUE(greedy60.candidates_decide(keys));
  EXPECT_EQ(greedy60.sample_candidates(keys), 60);

  // A fallback row is never decided.
  std::vector<uint64_t> fallback(kSampleCandidates, 0);
  fallback[0] = kTopKFallback;
  EXPECT_FALSE(top3.candidates_decide(fallback));
}

TEST(SamplerCandidates, ParametersThatRuleTheKeysOut) {
  const int vocab = 151936;
  EXPECT_TRUE(Sampler(params(0.7f, 20, 0.8f, 0.0f, 1.0f, 0.0f, 0.0f), vocab, 1).can_sample_candidates());
  EXPECT_TRUE(Sampler(params(0.0f, 0, 1.0f, 0.0f, 1.2f, 1.0f, 1.0f), vocab, 1).can_sample_candidates());
  EXPECT_TRUE(
      Sampler(params(1.0f, kSampleCandidates - 1, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f), vocab, 1).can_sample_candidates());
  // No top-k, or one as wide as the keys: the draw may reach tokens beyond them.
  EXPECT_FALSE(Sampler(params(0.7f, 0, 0.8f, 0.0f, 1.0f, 0.0f, 0.0f), vocab, 1).can_sample_candidates());
  EXPECT_FALSE(
      Sampler(params(0.7f, kSampleCandidates, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f), vocab, 1).can_sample_candidates());
  // Penalties that raise scores can lift a token from beyond the keys.
  EXPECT_FALSE(Sampler(params(0.7f, 20, 1.0f, 0.0f, 0.9f, 0.0f, 0.0f), vocab, 1).can_sample_candidates());
  EXPECT_FALSE(Sampler(params(0.7f, 20, 1.0f, 0.0f, 1.0f, -0.5f, 0.0f), vocab, 1).can_sample_candidates());
  EXPECT_FALSE(Sampler(params(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, -0.1f), vocab, 1).can_sample_candidates());
}

}  // namespace
}  // namespace qvl
