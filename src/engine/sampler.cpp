#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/top_k.h"
#include "core/check.h"

namespace qvl {

namespace {
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
// w[i] = e^((l[i] - max) · inv_t) over a whole row.
void row_weights(float* __restrict w, const float* __restrict l, size_t n, float max, float inv_t) {
  for (size_t i = 0; i < n; ++i) w[i] = std::exp((l[i] - max) * inv_t);
}

}  // namespace

Status validate_sampling_params(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return invalid_argument("temperature " + num(p.temperature) + " must be >= 0 (0 = greedy)");
  if (!(p.top_p > 0 && p.top_p <= 1)) return invalid_argument("top_p " + num(p.top_p) + " must be in (0, 1]");
  if (p.top_k < 0) return invalid_argument("top_k " + std::to_string(p.top_k) + " must be >= 0 (0 = off)");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return invalid_argument("min_p " + num(p.min_p) + " must be in [0, 1]");
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0)
    return invalid_argument("repetition_penalty " + num(p.repetition_penalty) + " must be > 0 (1 = off)");
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    return invalid_argument("presence_penalty " + num(p.presence_penalty) + " must be in [-2, 2]");
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    return invalid_argument("frequency_penalty " + num(p.frequency_penalty) + " must be in [-2, 2]");
  if (p.max_tokens < 1) return invalid_argument("max_tokens " + std::to_string(p.max_tokens) + " must be >= 1");
  for (const auto& s : p.stop)
    if (s.empty()) return invalid_argument("stop strings must not be empty");
  return Status::ok();
}

int32_t greedy_argmax(std::span<const float> row) {
  int64_t best = -1;
  for (size_t i = 0; i < row.size(); ++i) {
    // The first non-NaN entry, then only strictly larger ones (NaN compares false).
    if (best < 0 ? !std::isnan(row[i]) : row[i] > row[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  }
  return static_cast<int32_t>(best < 0 ? 0 : best);
}

Sampler::Sampler(const SamplingParams& params, int vocab_size, uint64_t seed)
    : params_(params), vocab_size_(vocab_size), rng_(seed) {
  QVL_CHECK_GT(vocab_size, 0);
  track_seen_ = params_.repetition_penalty != 1.0f;
  track_counts_ = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (track_seen_) seen_bits_.assign((static_cast<size_t>(vocab_size) + 63) / 64, 0);
}

void Sampler::observe_prompt(std::span<const int32_t> ids) {
  if (!track_seen_) return;
  for (int32_t id : ids) {
    QVL_CHECK(id >= 0 && id < vocab_size_) << "prompt token " << id << " outside vocab " << vocab_size_;
    uint64_t& word = seen_bits_[id >> 6];
    uint64_t bit = uint64_t{1} << (id & 63);
    if (!(word & bit)) {
      word |= bit;
      seen_list_.push_back(id);
    }
  }
}

void Sampler::accept(int32_t token) {
  QVL_CHECK(token >= 0 && token < vocab_size_) << "token " << token << " outside vocab " << vocab_size_;
  observe_prompt(std::span<const int32_t>(&token, 1));
  if (track_counts_) ++generated_counts_[token];
  decided_keys_ = nullptr;  // the penalties moved: a decision made before no longer holds
}

void Sampler::apply_penalties(std::span<float> logits) const {
  if (track_seen_) {
    // HF RepetitionPenaltyLogitsProcessor: negative scores are multiplied, positive divided.
    const float p = params_.repetition_penalty;
    for (int32_t id : seen_list_) {
      float& s = logits[id];
      s = s < 0 ? s * p : s / p;
    }
  }
  if (track_counts_) {
    // OpenAI: logit -= count · frequency_penalty + [count > 0] · presence_penalty.
    for (const auto& [id, count] : generated_counts_)
      logits[id] -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
  }
}

void Sampler::keep_top_k(std::span<const float> logits, int k) {
  // The k-th largest score; every score >= it survives (HF: scores < topk[-1] are removed).
  float kth;
  if (k <= 256) {
    // One pass with a min-heap of the k best: most scores lose one comparison with its top.
    sc_->kth.assign(logits.begin(), logits.begin() + k);
    std::make_heap(sc_->kth.begin(), sc_->kth.end(), std::greater<float>());
    for (size_t i = static_cast<size_t>(k); i < logits.size(); ++i) {
      if (logits[i] <= sc_->kth.front()) continue;
      std::pop_heap(sc_->kth.begin(), sc_->kth.end(), std::greater<float>());
      sc_->kth.back() = logits[i];
      std::push_heap(sc_->kth.begin(), sc_->kth.end(), std::greater<float>());
    }
    kth = sc_->kth.front();
  } else {
    sc_->kth.assign(logits.begin(), logits.end());
    std::nth_element(sc_->kth.begin(), sc_->kth.begin() + (k - 1), sc_->kth.end(), std::greater<float>());
    kth = sc_->kth[k - 1];
  }
  sc_->cand.clear();
  for (int32_t i = 0; i < vocab_size_; ++i)
    if (logits[i] >= kth) sc_->cand.push_back({i, logits[i], 0.0f});
}

double Sampler::filter(std::span<const float> logits) {
  all_survive_ = false;
  if (params_.top_k > 0 && params_.top_k < vocab_size_) {
    keep_top_k(logits, params_.top_k);
    return filter_survivors(weigh_candidates());
  }
  // The whole vocabulary: weights in one flat array (vectorised), candidates only if a filter
  // below needs them.
  const float inv_t = 1.0f / params_.temperature;
  float max_score = -INFINITY;
  for (float v : logits) max_score = std::max(max_score, v);
  sc_->full_weights.resize(logits.size());
  float* w = sc_->full_weights.data();
  const float* l = logits.data();
  const size_t n = logits.size();
  row_weights(w, l, n, max_score, inv_t);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += w[i];
  if (params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    all_survive_ = true;
    return total;
  }
  // Top-p below can only keep tokens over its cutoff; min-p only tokens over min_p.
  double floor = params_.top_p < 1.0f ? (1.0 - params_.top_p) * total / static_cast<double>(n) : 0.0;
  if (params_.min_p > 0.0f) floor = std::max(floor, static_cast<double>(params_.min_p) * 0.999);
  sc_->cand.clear();
  for (size_t i = 0; i < n; ++i)
    if (w[i] >= floor) sc_->cand.push_back({static_cast<int32_t>(i), l[i], w[i]});
  return filter_survivors(total);
}

double Sampler::weigh_candidates() {
  const float inv_t = 1.0f / params_.temperature;
  float max_score = -INFINITY;
  for (const auto& c : sc_->cand) max_score = std::max(max_score, c.score);
  double total = 0;
  for (auto& c : sc_->cand) total += c.weight = std::exp((c.score - max_score) * inv_t);
  return total;
}

double Sampler::filter_survivors(double total) {
  if (params_.top_p < 1.0f) {
    // Walk from the most probable: rank r survives while the mass strictly before it is < top_p
    // (HF: ascending cumsum <= 1 - top_p is removed). Tokens under (1 - top_p) · total / n are
    // out however the rest falls (together they weigh less than what top-p removes), so only
    // the others are sorted.
    const double cutoff = (1.0 - params_.top_p) * total / static_cast<double>(std::max<size_t>(sc_->cand.size(), 1));
    std::erase_if(sc_->cand, [&](const Candidate& c) { return c.weight < cutoff; });
    std::sort(sc_->cand.begin(), sc_->cand.end(), [](const Candidate& a, const Candidate& b) {
      return a.score > b.score || (a.score == b.score && a.id < b.id);
    });
    const double target = static_cast<double>(params_.top_p) * total;
    size_t kept = 0;
    double before = 0;
    while (kept < sc_->cand.size() && (kept == 0 || before < target)) before += sc_->cand[kept++].weight;
    sc_->cand.resize(kept);
    std::sort(sc_->cand.begin(), sc_->cand.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }

  if (params_.min_p > 0.0f) {
    // p_i >= min_p · p_max  <=>  weight_i >= min_p (the most probable token weighs exactly 1).
    const float min_p = params_.min_p;
    std::erase_if(sc_->cand, [&](const Candidate& c) { return c.weight < min_p; });
  }

  QVL_CHECK(!sc_->cand.empty()) << "sampler filtered out every token";
  double sum = 0;
  for (const auto& c : sc_->cand) sum += c.weight;
  return sum;
}

Sampler::Scratch& Sampler::scratch() {
  thread_local Scratch s;
  return s;
}

std::vector<TokenProb> Sampler::distribution(std::span<float> logits) {
  QVL_CHECK_EQ(static_cast<int64_t>(logits.size()), static_cast<int64_t>(vocab_size_));
  sc_ = &scratch();
  apply_penalties(logits);
  if (greedy()) return {{greedy_argmax(logits), 1.0}};
  const double sum = filter(logits);
  std::vector<TokenProb> out;
  if (all_survive_) {
    out.resize(sc_->full_weights.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = {static_cast<int32_t>(i), sc_->full_weights[i] / sum};
  } else {
    out.resize(sc_->cand.size());
    for (size_t i = 0; i < sc_->cand.size(); ++i) out[i] = {sc_->cand[i].id, sc_->cand[i].weight / sum};
  }
  return out;
}

int32_t Sampler::pick(const std::vector<TokenProb>& dist, double u) {
  QVL_CHECK(!dist.empty());
  double cum = 0;
  for (const auto& tp : dist) {
    cum += tp.prob;
    if (u < cum) return tp.id;
  }
  return dist.back().id;
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<float> logits) {
  QVL_CHECK_EQ(static_cast<int64_t>(logits.size()), static_cast<int64_t>(vocab_size_));
  sc_ = &scratch();
  apply_penalties(logits);
  if (greedy()) return greedy_argmax(logits);
  return draw(filter(logits));
}

int32_t Sampler::draw(double sum) {
  // Inverse CDF on the unnormalised weights: the first token whose running weight exceeds u·sum.
  const double target = uniform() * sum;
  double cum = 0;
  if (all_survive_) {
    for (size_t i = 0; i < sc_->full_weights.size(); ++i) {
      cum += sc_->full_weights[i];
      if (target < cum) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(sc_->full_weights.size() - 1);
  }
  for (const auto& c : sc_->cand) {
    cum += c.weight;
    if (target < cum) return c.id;
  }
  return sc_->cand.back().id;
}

float Sampler::penalized(int32_t id, float score) const {
  if (track_seen_ && (seen_bits_[static_cast<size_t>(id) >> 6] >> (id & 63) & 1)) {
    const float p = params_.repetition_penalty;
    score = score < 0 ? score * p : score / p;
  }
  if (track_counts_) {
    if (auto it = generated_counts_.find(id); it != generated_counts_.end())
      score -= static_cast<float>(it->second) * params_.frequency_penalty + params_.presence_penalty;
  }
  return score;
}

bool Sampler::can_sample_candidates() const {
  if (vocab_size_ <= kSampleCandidates) return true;  // the candidates are the whole row
  // Penalties may only lower scores: a token left out then stays below the candidates' last.
  if (params_.repetition_penalty < 1.0f || params_.presence_penalty < 0.0f || params_.frequency_penalty < 0.0f)
    return false;
  return greedy() || (params_.top_k >= 1 && params_.top_k < kSampleCandidates);
}

int Sampler::decode_candidates(std::span<const uint64_t> keys) {
  keyed_.clear();
  for (uint64_t key : keys) {
    if (key == 0) break;
    keyed_.push_back({logit_key_index(key), logit_key_value(key), 0.0f});
  }
  return static_cast<int>(keyed_.size());
}

// Token `id`'s score can only be lower than its logit (can_sample_candidates), and every token
// missing from the keys has a logit <= `last`, the smallest one there. So the candidates decide
// greedy when their best score beats `last`, and top-k when their k-th best does: no missing
// token can then reach what survives. Leaves keyed_ penalised and keyed_kth_ set for
// sample_candidates (unless the keys are the whole row).
bool Sampler::candidates_decide(std::span<const uint64_t> keys) {
  decided_keys_ = nullptr;
  if (keys.empty() || keys[0] == kTopKFallback) return false;
  const int n = decode_candidates(keys);
  bool yes = n == vocab_size_;
  if (!yes && n == static_cast<int>(keys.size()) && can_sample_candidates()) {
    sc_ = &scratch();
    const float last = keyed_.back().score;
    sc_->kth.clear();
    for (Candidate& c : keyed_) sc_->kth.push_back(c.score = penalized(c.id, c.score));
    if (greedy()) {
      yes = *std::max_element(sc_->kth.begin(), sc_->kth.end()) > last;
    } else if (const int k = params_.top_k; k < n) {
      std::nth_element(sc_->kth.begin(), sc_->kth.begin() + (k - 1), sc_->kth.end(), std::greater<float>());
      keyed_kth_ = sc_->kth[static_cast<size_t>(k - 1)];
      yes = keyed_kth_ > last;
    }
  }
  if (yes) decided_keys_ = keys.data();
  return yes;
}

int32_t Sampler::sample_candidates(std::span<const uint64_t> keys) {
  if (decided_keys_ != keys.data()) {
    QVL_CHECK(candidates_decide(keys)) << "sample_candidates: the keys do not decide this row";
  }
  decided_keys_ = nullptr;
  sc_ = &scratch();
  if (static_cast<int>(keyed_.size()) == vocab_size_) {
    // The whole row: sample() on it as it is.
    std::vector<float> row(static_cast<size_t>(vocab_size_));
    for (const Candidate& c : keyed_) row[static_cast<size_t>(c.id)] = c.score;
    return sample(row);
  }
  // What sample() computes on the whole row, over the only tokens that can survive: the
  // penalised scores in token-id order, then the same top-k, weights, top-p, min-p and draw.
  std::sort(keyed_.begin(), keyed_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  if (greedy()) {
    size_t best = 0;
    for (size_t i = 1; i < keyed_.size(); ++i)
      if (keyed_[i].score > keyed_[best].score) best = i;
    return keyed_[best].id;
  }
  all_survive_ = false;
  sc_->cand.clear();
  for (const Candidate& c : keyed_)
    if (c.score >= keyed_kth_) sc_->cand.push_back({c.id, c.score, 0.0f});
  return draw(filter_survivors(weigh_candidates()));
}

}  // namespace qvl
