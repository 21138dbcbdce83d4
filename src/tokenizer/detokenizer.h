// Streaming detokenizer: turns generated token ids, one at a time, into text that is final.
// The engine calls push() once per generated token and forwards the returned text to the
// client. Two things are held back until they are decided:
//   - bytes of an incomplete UTF-8 sequence (a character split across tokens), so every
//     emitted chunk is valid UTF-8; bytes that can never become valid UTF-8 are emitted as
//     U+FFFD exactly where Tokenizer::decode would put it;
//   - text that could still grow into a stop string (a suffix equal to a prefix of one), so a
//     stop string spanning token boundaries is found and never partly emitted.
// Invariant: without stop strings, the concatenation of everything push() and finish() return
// equals Tokenizer::decode(all ids, skip_special_tokens). With stop strings it is the prefix of
// that text before the earliest occurrence of any stop string (the stop string itself is not
// emitted), and after a stop push() returns nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qvl {

struct DetokenizerOptions {
  bool skip_special_tokens = true;  // leave `special: true` tokens out of the text
  std::vector<std::string> stop;    // stop strings; empty strings are ignored
};

class StreamingDetokenizer {
 public:
  struct Step {
    std::string text;      // UTF-8 text that became final with this token (may be empty)
    bool stopped = false;  // a stop string completed; `text` ends right before it
  };

  // `tokenizer` must outlive the detokenizer.
  StreamingDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options);

  // Feeds one token. After a stop (or finish) it returns an empty, non-stopping Step.
  Step push(int32_t id);
  // End of generation: flushes what was held back (an incomplete UTF-8 tail becomes U+FFFD,
  // a partial stop-string prefix is emitted as text). Also reports a stop found only now.
  Step finish();

  bool stopped() const { return stopped_; }
  // Index into options.stop of the stop string that ended the text, or -1.
  int matched_stop() const { return matched_stop_; }

 private:
  Step emit_ready(bool final_flush);

  const Tokenizer& tokenizer_;
  DetokenizerOptions options_;
  std::string pending_bytes_;  // undecided bytes: a possibly incomplete UTF-8 sequence
  std::string held_;           // decoded text that may still become part of a stop string
  size_t max_stop_len_ = 0;
  bool stopped_ = false;
  bool finished_ = false;
  int matched_stop_ = -1;
};

// Splits `bytes` into the longest prefix whose UTF-8 decoding (lossy, U+FFFD for invalid
// sequences, as Tokenizer::decode) is already decided and the undecided tail: an incomplete
// but so far valid sequence at the very end. Appends the decided text to `out` and returns
// the number of bytes consumed. With `final_flush`, everything is decided (the tail becomes
// one U+FFFD).
size_t utf8_decode_lossy_prefix(std::string_view bytes, bool final_flush, std::string& out);

}  // namespace qvl
