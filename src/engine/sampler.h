// Sampler: turns one row of logits into the next token for one request, with the request's own
// state (seen tokens for the penalties, a seeded RNG). The processing order is Hugging Face's
// (generation/utils.py _get_logits_processor, logits_process.py):
//
//   repetition penalty (HF: prompt + generated tokens, each distinct token once)
//   → presence / frequency penalties (OpenAI: generated tokens only, by count)
//   → temperature (scores / T; T = 0 means greedy: argmax after the penalties)
//   → top-k (keeps every score >= the k-th largest, so ties at the edge survive)
//   → top-p (keeps the most probable tokens whose preceding mass is < top_p; at least one)
//   → min-p (keeps tokens with p >= min_p · p_max)
//   → one draw u ∈ [0, 1) from the request's RNG, inverse CDF over the survivors.
//
// Invariants: every sample() consumes exactly one RNG draw (none for greedy), so the token stream
// depends only on (seed, logits of this request), never on which other requests share the batch.
// The survivors are visited in token-id order, so the draw maps to the same token whatever order
// a selection leaves them in.
//
// Cost on a 151,936 vocabulary: the row is never rewritten. Temperature is folded into the
// exponent (p ∝ exp((l - l_max) / T), which is HF's softmax(l / T)); top-k is one pass with a
// small heap (nth_element for large k); top-p sorts only the tokens that can be in the nucleus
// (a token below (1 - top_p) · Z / n can never be: all of them together weigh less than the
// mass top-p removes); each token's weight is computed once. About 0.2 ms per row with Qwen's
// defaults (top-k 20), about 1 ms over the whole vocabulary; the engine samples the rows of a
// step in parallel. From a row's 64 largest logits (sample_candidates, what a device sends
// instead of the row) the same steps run over those 64 alone, after a check that no token left
// out could have survived top-k.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/top_k.h"
#include "core/status.h"
#include "engine/engine.h"

namespace qvl {

// Rejects parameter values the sampler cannot honour, naming the field and the value.
Status validate_sampling_params(const SamplingParams& p);

// The greedy pick: the index of the largest entry, the first one on ties (torch.argmax's and
// std::max_element's choice), -0 equal to +0, NaN entries skipped (a row of NaN gives 0).
// Backend::argmax_rows follows the same rule, so that a greedy step may take its argmax where
// the logits are (ModelRunner::forward_greedy) and pick the same tokens.
int32_t greedy_argmax(std::span<const float> row);

// One surviving token and its final probability.
struct TokenProb {
  int32_t id = 0;
  double prob = 0;
};

class Sampler {
 public:
  // `seed` is the request's seed (SamplingParams::seed, or one drawn by the engine when unset).
  Sampler(const SamplingParams& params, int vocab_size, uint64_t seed);

  // Records prompt tokens: the repetition penalty (HF) counts them as seen.
  void observe_prompt(std::span<const int32_t> ids);
  // Records a generated token (repetition, presence and frequency penalties).
  void accept(int32_t token);

  // Picks the next token. `logits` has vocab_size entries and is used as scratch (modified).
  int32_t sample(std::span<float> logits);

  // Sampling from a row's largest logits instead of the whole row (a device brings back
  // kSampleCandidates keys per row: ModelRunner::forward_top_k, backend/top_k.h).
  // can_sample_candidates: these parameters may draw from the candidates (greedy or top-k below
  // kSampleCandidates, penalties that only lower scores; any parameters when the vocabulary is
  // no larger than the candidates). candidates_decide: the candidates hold every token that
  // sample() on the whole row could pick (false for kTopKFallback); it consumes no randomness.
  // sample_candidates: sample() on the whole row, given keys the candidates decide: the same
  // token and the same draw from the RNG (it reuses what candidates_decide found for the same
  // keys, or decides first).
  bool can_sample_candidates() const;
  bool candidates_decide(std::span<const uint64_t> keys);
  int32_t sample_candidates(std::span<const uint64_t> keys);

  // The distribution sample() draws from, in draw order (token id ascending), with the
  // probabilities summing to 1. Greedy gives the argmax alone with probability 1. Modifies
  // `logits` like sample(); consumes no randomness.
  std::vector<TokenProb> distribution(std::span<float> logits);

  // Picks from a distribution with a uniform u ∈ [0, 1): the first token whose cumulative
  // probability exceeds u (the last one if rounding leaves u above the total).
  static int32_t pick(const std::vector<TokenProb>& dist, double u);

  bool greedy() const { return params_.temperature == 0.0f; }
  // Greedy with no penalty: sample() is then greedy_argmax of the raw logits, which a device can
  // take without sending the logits (ModelRunner::forward_greedy).
  bool plain_greedy() const { return greedy() && !track_seen_ && !track_counts_; }
  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float score;   // the logit after penalties
    float weight;  // exp((score - max) / T): the unnormalised probability
  };
  void apply_penalties(std::span<float> logits) const;
  // `score` of token `id` after the penalties (apply_penalties for one token).
  float penalized(int32_t id, float score) const;
  // Finds the tokens that survive temperature, top-k, top-p and min-p and returns the sum of
  // their weights. Survivors are every token with its weight in scratch().full_weights when
  // all_survive_, else scratch().cand (id order).
  double filter(std::span<const float> logits);
  void keep_top_k(std::span<const float> logits, int k);
  // scratch().cand's weights at temperature, and their sum (top-k survivors, id order).
  double weigh_candidates();
  // Top-p and min-p over scratch().cand, given the weights' total; the survivors' sum.
  double filter_survivors(double total);
  // One draw from the RNG over the survivors that weigh `sum`.
  int32_t draw(double sum);
  // keyed_ = the keys' (index, logit) pairs, descending; returns how many.
  int decode_candidates(std::span<const uint64_t> keys);
  double uniform();

  SamplingParams params_;
  int vocab_size_;
  std::mt19937_64 rng_;
  bool track_seen_ = false;
  bool track_counts_ = false;
  std::vector<uint64_t> seen_bits_;  // vocab_size bits: token seen in prompt or output
  std::vector<int32_t> seen_list_;   // the distinct seen tokens, for O(seen) penalties
  std::unordered_map<int32_t, int32_t> generated_counts_;
  bool all_survive_ = false;
  // What candidates_decide found, kept for sample_candidates on these keys (the engine decides on
  // its own thread and draws on a sampling thread): the decoded keys, penalised, and their k-th
  // best score (top-k).
  std::vector<Candidate> keyed_;
  float keyed_kth_ = 0;
  const uint64_t* decided_keys_ = nullptr;  // the keys candidates_decide last said yes to
  // Scratch of the calling thread (one per thread, reused by every sampler it runs, so the
  // engine's sampling threads allocate once rather than once per request).
  struct Scratch {
    std::vector<Candidate> cand;
    std::vector<float> full_weights;
    std::vector<float> kth;
  };
  static Scratch& scratch();
  Scratch* sc_ = nullptr;
};

}  // namespace qvl
