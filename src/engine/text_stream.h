// TokenTextStream: turns one request's generated token ids into final UTF-8 text, piece by piece,
// and finds its stop strings. The engine owns one per sequence; the implementation wraps the
// tokenizer's streaming detokenizer (engine/loader.cpp), tests use simple fakes.
//
// Contract: push() returns only text that can no longer change: an incomplete UTF-8 sequence, or
// a suffix that may still become the start of a stop string, is held back until it resolves.
// When a stop string completes, push() returns the text before it and stopped = true; the stop
// string and everything after it are never returned. finish() returns what was held back when
// generation ends for another reason (eos, length). Special tokens (eos) produce no text.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace qvl {

class TokenTextStream {
 public:
  struct Piece {
    std::string text;
    bool stopped = false;
  };
  virtual ~TokenTextStream() = default;
  virtual Piece push(int32_t token) = 0;
  virtual std::string finish() = 0;
};

// Makes the text stream of one request (its stop strings from SamplingParams::stop).
using TextStreamFactory = std::function<std::unique_ptr<TokenTextStream>(const std::vector<std::string>& stop)>;

}  // namespace qvl
