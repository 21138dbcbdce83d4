#include "tokenizer/detokenizer.h"

#include <algorithm>

namespace qvl {

namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// How many bytes of a well-formed sequence start at s[i], looking only at what is there:
// returns {n, complete}. n = number of bytes that are a valid (possibly partial) prefix of a
// sequence; complete = those n bytes are a whole character. n == 0: s[i] starts nothing.
std::pair<size_t, bool> scan_sequence(std::string_view s, size_t i) {
  const uint8_t c0 = static_cast<uint8_t>(s[i]);
  if (c0 < 0x80) return {1, true};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    need = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    need = 3;
    if (c0 == 0xE0) lo = 0xA0;
    if (c0 == 0xED) hi = 0x9F;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    need = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;
  } else {
    return {0, false};
  }
  size_t n = 1;
  while (n < need && i + n < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i + n]);
    const bool ok = n == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return {n, false};
    ++n;
  }
  return {n, n == need};
}

}  // namespace

size_t utf8_decode_lossy_prefix(std::string_view bytes, bool final_flush, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t c0 = static_cast<uint8_t>(bytes[i]);
    if (c0 < 0x80) {
      out.push_back(static_cast<char>(c0));
      ++i;
      continue;
    }
    auto [n, complete] = scan_sequence(bytes, i);
    if (complete) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    if (n == 0) {  // a byte that starts nothing: one U+FFFD for it alone
      out += kReplacement;
      ++i;
      continue;
    }
    if (i + n == bytes.size() && !final_flush) return i;  // could still complete: undecided
    // A maximal subpart of an ill-formed sequence (truncated or interrupted): one U+FFFD.
    out += kReplacement;
    i += n;
  }
  return i;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)) {
  // Empty stop strings stay in the list (matched_stop() indexes the caller's list) but are
  // never searched for.
  for (const std::string& s : options_.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
}

StreamingDetokenizer::Step StreamingDetokenizer::push(int32_t id) {
  if (stopped_ || finished_) return {};
  if (!(options_.skip_special_tokens && tokenizer_.is_special(id))) pending_bytes_ += tokenizer_.token_bytes(id);
  const size_t used = utf8_decode_lossy_prefix(pending_bytes_, /*final_flush=*/false, held_);
  pending_bytes_.erase(0, used);
  return emit_ready(false);
}

StreamingDetokenizer::Step StreamingDetokenizer::finish() {
  if (stopped_ || finished_) return {};
  utf8_decode_lossy_prefix(pending_bytes_, /*final_flush=*/true, held_);
  pending_bytes_.clear();
  Step step = emit_ready(true);
  finished_ = true;
  return step;
}

StreamingDetokenizer::Step StreamingDetokenizer::emit_ready(bool final_flush) {
  Step step;
  if (max_stop_len_ == 0) {
    step.text.swap(held_);
    return step;
  }
  // The earliest occurrence of any stop string wins (the first listed on a tie).
  size_t best = std::string::npos;
  int best_index = -1;
  for (size_t k = 0; k < options_.stop.size(); ++k) {
    if (options_.stop[k].empty()) continue;
    const size_t at = held_.find(options_.stop[k]);
    if (at < best) {
      best = at;
      best_index = static_cast<int>(k);
    }
  }
  if (best != std::string::npos) {
    step.text = held_.substr(0, best);
    step.stopped = true;
    stopped_ = true;
    held_.clear();
    matched_stop_ = best_index;
    return step;
  }
  size_t keep = 0;
  if (!final_flush) {
    // Longest suffix of held_ that is a proper prefix of some stop string.
    const size_t max_keep = std::min(held_.size(), max_stop_len_ - 1);
    for (size_t len = max_keep; len > 0 && keep == 0; --len) {
      const std::string_view suffix = std::string_view(held_).substr(held_.size() - len);
      for (const std::string& s : options_.stop) {
        if (s.size() > len && std::string_view(s).substr(0, len) == suffix) {
          keep = len;
          break;
        }
      }
    }
  }
  step.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return step;
}

}  // namespace qvl
