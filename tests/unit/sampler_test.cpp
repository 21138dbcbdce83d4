// Sampler tests: every expected distribution is computed in the test from the logits by the
// arithmetic of the HF processors (softmax, thresholds), so a wrong order or threshold fails.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

namespace qvl {
namespace {

SamplingParams plain() {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  p.top_k = 0;
  p.min_p = 0.0f;
  return p;
}

std::vector<float> log_probs(std::initializer_list<double> probs) {
  std::vector<float> v;
  for (double p : probs) v.push_back(static_cast<float>(std::log(p)));
  return v;
}

// softmax(v) restricted to `ids`, renormalised.
std::map<int32_t, double> renormalised(const std::vector<float>& v, std::initializer_list<int32_t> ids) {
  double sum = 0;
  for (int32_t i : ids) sum += std::exp(static_cast<double>(v[i]));
  std::map<int32_t, double> out;
  for (int32_t i : ids) out[i] = std::exp(static_cast<double>(v[i])) / sum;
  return out;
}

void expect_dist(const std::vector<TokenProb>& got, const std::map<int32_t, double>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t i = 0;
  for (const auto& [id, p] : want) {  // std::map iterates ids ascending = draw order
    EXPECT_EQ(got[i].id, id) << "position " << i;
    EXPECT_NEAR(got[i].prob, p, 1e-6) << "token " << id;
    ++i;
  }
}

TEST(Sampler, GreedyTakesFirstMaximum) {
  SamplingParams p = plain();
  p.temperature = 0;
  Sampler s(p, 5, 1);
  std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(s.sample(logits), 1);  // tie between 1 and 3: torch.argmax returns the first
}

TEST(Sampler, GreedySkipsNaNAndCountsMinusZeroAsZero) {
  // The rule Backend::argmax_rows follows (greedy_argmax): NaN entries never win, a NaN first
  // entry included (std::max_element would return it); -0 == +0, so the first zero wins.
  SamplingParams p = plain();
  p.temperature = 0;
  Sampler s(p, 5, 1);
  const float nan = std::nanf("");
  std::vector<float> a{nan, -3.0f, nan, -1.0f, -2.0f};
  EXPECT_EQ(s.sample(a), 3);  // -1 is the largest number
  std::vector<float> b{-1.0f, -0.0f, 0.0f, nan, -0.0f};
  EXPECT_EQ(s.sample(b), 1);  // the zeros at 1, 2 and 4 are equal
  std::vector<float> c(5, nan);
  EXPECT_EQ(s.sample(c), 0);  // nothing to pick: 0
  std::vector<float> d{-INFINITY, nan, -INFINITY, INFINITY, INFINITY};
  EXPECT_EQ(s.sample(d), 3);  // the first +inf
  EXPECT_EQ(greedy_argmax(d), 3);
  EXPECT_EQ(greedy_argmax(std::vector<float>{}), 0);
}

TEST(Sampler, PlainGreedyMeansNoPenalty) {
  // Only temperature 0 without penalties may skip the host sampler (the engine's device greedy).
  SamplingParams p = plain();
  EXPECT_FALSE(Sampler(p, 5, 1).plain_greedy());
  p.temperature = 0;
  EXPECT_TRUE(Sampler(p, 5, 1).plain_greedy());
  SamplingParams rep = p, pres = p, freq = p;
  rep.repetition_penalty = 1.1f;
  pres.presence_penalty = 0.5f;
  freq.frequency_penalty = -0.5f;
  for (const SamplingParams& q : {rep, pres, freq}) EXPECT_FALSE(Sampler(q, 5, 1).plain_greedy());
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p = plain();
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 4, 1);
  std::vector<int32_t> prompt{0, 1, 0};
  s.observe_prompt(prompt);
  // 0: 3.0 / 2 = 1.5 (seen, positive), 1: -0.5 * 2 = -1.0 (seen, negative), 2: 2.0 unchanged.
  std::vector<float> logits{3.0f, -0.5f, 2.0f, 1.0f};
  EXPECT_EQ(s.sample(logits), 2);
  EXPECT_FLOAT_EQ(logits[0], 1.5f);
  EXPECT_FLOAT_EQ(logits[1], -1.0f);
  EXPECT_FLOAT_EQ(logits[2], 2.0f);  // the penalty is applied once per distinct token
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  SamplingParams p = plain();
  p.presence_penalty = 0.25f;
  p.frequency_penalty = 0.5f;
  Sampler s(p, 4, 1);
  std::vector<int32_t> prompt{3, 3, 3};
  s.observe_prompt(prompt);  // OpenAI penalties ignore the prompt
  s.accept(1);
  s.accept(1);
  s.accept(2);
  std::vector<float> logits(4, 0.0f);
  auto dist = s.distribution(logits);
  // token 1: -(2·0.5 + 0.25) = -1.25; token 2: -(1·0.5 + 0.25) = -0.75; 0 and 3 untouched.
  std::vector<float> expected_logits{0.0f, -1.25f, -0.75f, 0.0f};
  expect_dist(dist, renormalised(expected_logits, {0, 1, 2, 3}));
}

TEST(Sampler, TemperatureScalesLogits) {
  SamplingParams p = plain();
  p.temperature = 0.5f;
  Sampler s(p, 3, 1);
  std::vector<float> logits{1.0f, 2.0f, 3.0f};
  std::vector<float> scaled{2.0f, 4.0f, 6.0f};
  expect_dist(s.distribution(logits), renormalised(scaled, {0, 1, 2}));
}

TEST(Sampler, TopKKeepsTiesAtTheEdge) {
  SamplingParams p = plain();
  p.top_k = 2;
  Sampler s(p, 4, 1);
  std::vector<float> logits{1.0f, 3.0f, 3.0f, 2.0f};
  std::vector<float> copy = logits;
  expect_dist(s.distribution(logits), renormalised(copy, {1, 2}));

  p.top_k = 3;
  Sampler s3(p, 4, 1);
  logits = copy;
  // The 3rd largest is 2.0 (token 3): tokens 1, 2, 3 survive.
  expect_dist(s3.distribution(logits), renormalised(copy, {1, 2, 3}));
}

TEST(Sampler, TopPKeepsSmallestSetReachingTheMass) {
  // probabilities 0.5, 0.3, 0.15, 0.05. HF: ascending cumsum 0.05, 0.2, 0.5, 1.0; remove <= 1 - top_p.
  const auto logits0 = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain();
  p.top_p = 0.75f;  // removes cumsum <= 0.25: 0.05 and 0.15
  {
    Sampler s(p, 4, 1);
    auto l = logits0;
    expect_dist(s.distribution(l), renormalised(logits0, {0, 1}));
  }
  p.top_p = 0.85f;  // removes cumsum <= 0.15: only 0.05
  {
    Sampler s(p, 4, 1);
    auto l = logits0;
    expect_dist(s.distribution(l), renormalised(logits0, {0, 1, 2}));
  }
  p.top_p = 0.01f;  // removes everything but the most probable (min_tokens_to_keep = 1)
  {
    Sampler s(p, 4, 1);
    auto l = logits0;
    expect_dist(s.distribution(l), renormalised(logits0, {0}));
  }
}

TEST(Sampler, TopPWidensItsWindowOnAFlatFullVocabulary) {
  // 151,936 equal logits, top_p 0.5: rank r survives while r/V < 0.5, i.e. the first V/2 =
  // 75,968 tokens; equal scores are ranked by id. Far beyond the first sorted window (256).
  const int V = 151936;
  SamplingParams p = plain();
  p.top_p = 0.5f;
  Sampler s(p, V, 1);
  std::vector<float> logits(V, 0.25f);
  auto dist = s.distribution(logits);
  ASSERT_EQ(dist.size(), size_t{V / 2});
  EXPECT_EQ(dist.front().id, 0);
  EXPECT_EQ(dist.back().id, V / 2 - 1);
  EXPECT_NEAR(dist[100].prob, 1.0 / (V / 2), 1e-12);
}

TEST(Sampler, MinPScalesWithTheTopProbability) {
  const auto logits0 = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain();
  p.min_p = 0.2f;  // threshold 0.2 · 0.5 = 0.1: drops 0.05 only
  Sampler s(p, 4, 1);
  auto l = logits0;
  expect_dist(s.distribution(l), renormalised(logits0, {0, 1, 2}));
}

TEST(Sampler, TopKRunsBeforeTopP) {
  const auto logits0 = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain();
  p.top_p = 0.82f;
  {
    // Without top-k: mass before rank 2 is 0.8 < 0.82, so 3 tokens survive.
    Sampler s(p, 4, 1);
    auto l = logits0;
    expect_dist(s.distribution(l), renormalised(logits0, {0, 1, 2}));
  }
  p.top_k = 3;
  {
    // With top-k 3 first, top-p sees 0.5/0.95 = 0.526, 0.3/0.95 = 0.316, 0.15/0.95 = 0.158:
    // the mass before rank 2 is 0.842 >= 0.82, so only 2 survive.
    Sampler s(p, 4, 1);
    auto l = logits0;
    expect_dist(s.distribution(l), renormalised(logits0, {0, 1}));
  }
}

TEST(Sampler, TemperatureRunsBeforeTopP) {
  const auto logits0 = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain();
  p.temperature = 2.0f;
  p.top_p = 0.75f;
  // At T = 2 the probabilities become sqrt(p) / Σ sqrt(p): sqrt = 0.7071, 0.5477, 0.3873, 0.2236
  // (Σ 1.8657) → 0.379, 0.2936, 0.2076, 0.1198. Mass before rank 2 = 0.6726 < 0.75 (kept),
  // before rank 3 = 0.8802 (dropped). Without temperature first, only 2 tokens would survive.
  Sampler s(p, 4, 1);
  auto l = logits0;
  std::vector<float> scaled;
  for (float v : logits0) scaled.push_back(v / 2.0f);
  expect_dist(s.distribution(l), renormalised(scaled, {0, 1, 2}));
}

TEST(Sampler, PickUsesTheCumulativeDistribution) {
  std::vector<TokenProb> dist{{3, 0.25}, {7, 0.75}};
  EXPECT_EQ(Sampler::pick(dist, 0.0), 3);
  EXPECT_EQ(Sampler::pick(dist, 0.2499), 3);
  EXPECT_EQ(Sampler::pick(dist, 0.25), 7);
  EXPECT_EQ(Sampler::pick(dist, 0.99999), 7);
}

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(g);
  return v;
}

std::vector<int32_t> draw(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    out.push_back(s.sample(l));
    s.accept(out.back());
  }
  return out;
}

TEST(Sampler, SameSeedSameTokensInterleavedOrNot) {
  const auto logits = random_logits(1000, 7);
  SamplingParams p = plain();
  p.temperature = 1.5f;
  p.top_k = 50;
  p.frequency_penalty = 0.3f;
  Sampler a(p, 1000, 42), b(p, 1000, 42), c(p, 1000, 43);
  auto ta = draw(a, logits, 64);
  // b runs interleaved with an unrelated sampler, as in a busy batch.
  Sampler other(p, 1000, 42);
  std::vector<int32_t> tb;
  for (int i = 0; i < 64; ++i) {
    draw(other, logits, 3);
    auto l = logits;
    tb.push_back(b.sample(l));
    b.accept(tb.back());
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, draw(c, logits, 64));
}

TEST(Sampler, DrawFrequenciesMatchTheDistribution) {
  const auto logits0 = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain();
  p.top_p = 0.85f;  // survivors 0, 1, 2 with 0.5/0.95, 0.3/0.95, 0.15/0.95
  Sampler s(p, 4, 123);
  const int n = 40000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    auto l = logits0;
    ++counts[s.sample(l)];
  }
  const double want[3] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95};
  EXPECT_EQ(counts.count(3), 0u);
  for (int id = 0; id < 3; ++id) {
    double sigma = std::sqrt(want[id] * (1 - want[id]) / n);
    EXPECT_NEAR(counts[id] / static_cast<double>(n), want[id], 5 * sigma) << "token " << id;
  }
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p = plain();
  EXPECT_TRUE(validate_sampling_params(p).is_ok());
  p.top_p = 0;
  Status st = validate_sampling_params(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("top_p 0"), std::string::npos) << st.message();
  p = plain();
  p.temperature = -1;
  EXPECT_NE(validate_sampling_params(p).message().find("temperature -1"), std::string::npos);
  p = plain();
  p.max_tokens = 0;
  EXPECT_NE(validate_sampling_params(p).message().find("max_tokens 0"), std::string::npos);
}

}  // namespace
}  // namespace qvl
