#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"

namespace qvl {

namespace {
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
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
  kth_scratch_.assign(logits.begin(), logits.end());
  std::nth_element(kth_scratch_.begin(), kth_scratch_.begin() + (k - 1), kth_scratch_.end(), std::greater<float>());
  const float kth = kth_scratch_[k - 1];
  cand_.clear();
  for (int32_t i = 0; i < vocab_size_; ++i)
    if (logits[i] >= kth) cand_.push_back({i, logits[i]});
}

void Sampler::sort_prefix(size_t n) {
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.score > b.score || (a.score == b.score && a.id < b.id);
  };
  n = std::min(n, cand_.size());
  if (n < cand_.size()) std::nth_element(cand_.begin(), cand_.begin() + n, cand_.end(), better);
  std::sort(cand_.begin(), cand_.begin() + n, better);
}

void Sampler::filter(std::span<float> logits) {
  // Temperature on the whole row, exactly as HF (scores / T), before any thresholds.
  if (params_.temperature != 1.0f)
    for (float& s : logits) s = s / params_.temperature;

  if (params_.top_k > 0 && params_.top_k < vocab_size_) {
    keep_top_k(logits, params_.top_k);
  } else {
    cand_.resize(vocab_size_);
    for (int32_t i = 0; i < vocab_size_; ++i) cand_[i] = {i, logits[i]};
  }

  float max_score = -INFINITY;
  for (const auto& c : cand_) max_score = std::max(max_score, c.score);

  if (params_.top_p < 1.0f) {
    // Mass of every candidate, then walk from the most probable: rank r survives while the mass
    // strictly before it is < top_p (HF: ascending cumsum <= 1 - top_p is removed). Sort only a
    // prefix, widening it when the mass is not reached inside it.
    double total = 0;
    for (const auto& c : cand_) total += std::exp(static_cast<double>(c.score) - max_score);
    const double target = static_cast<double>(params_.top_p) * total;
    size_t kept = 0;
    for (size_t window = 256;; window *= 8) {
      sort_prefix(window);
      const size_t n = std::min(window, cand_.size());
      double before = 0;
      kept = 0;
      while (kept < n && (kept == 0 || before < target)) {
        before += std::exp(static_cast<double>(cand_[kept].score) - max_score);
        ++kept;
      }
      if (kept < n || n == cand_.size()) break;
    }
    cand_.resize(kept);
    std::sort(cand_.begin(), cand_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }

  if (params_.min_p > 0.0f) {
    // p_i >= min_p · p_max  <=>  exp(s_i - s_max) >= min_p (the softmax normaliser cancels).
    const double min_p = params_.min_p;
    std::erase_if(cand_,
                  [&](const Candidate& c) { return std::exp(static_cast<double>(c.score) - max_score) < min_p; });
  }

  QVL_CHECK(!cand_.empty()) << "sampler filtered out every token";
  probs_.resize(cand_.size());
  double sum = 0;
  for (size_t i = 0; i < cand_.size(); ++i)
    sum += probs_[i] = std::exp(static_cast<double>(cand_[i].score) - max_score);
  for (double& p : probs_) p /= sum;
}

std::vector<TokenProb> Sampler::distribution(std::span<float> logits) {
  QVL_CHECK_EQ(static_cast<int64_t>(logits.size()), static_cast<int64_t>(vocab_size_));
  apply_penalties(logits);
  if (greedy()) {
    auto it = std::max_element(logits.begin(), logits.end());  // first maximum, like torch.argmax
    return {{static_cast<int32_t>(it - logits.begin()), 1.0}};
  }
  filter(logits);
  std::vector<TokenProb> out(cand_.size());
  for (size_t i = 0; i < cand_.size(); ++i) out[i] = {cand_[i].id, probs_[i]};
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
  apply_penalties(logits);
  if (greedy()) {
    auto it = std::max_element(logits.begin(), logits.end());
    return static_cast<int32_t>(it - logits.begin());
  }
  filter(logits);
  const double u = uniform();
  double cum = 0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    cum += probs_[i];
    if (u < cum) return cand_[i].id;
  }
  return cand_.back().id;
}

}  // namespace qvl
