// Fuzz target for the tokenizer (encode, decode, streaming detokenizer) with the pinned Qwen
// tokenizer.json: any bytes either fail encode() with kInvalidArgument (invalid UTF-8) or
// encode, and then decode(encode(s)) == NFC(s) and the streamed text equals decode(ids),
// chunk by chunk valid UTF-8. Without the tokenizer files the target does nothing.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace {
const qvl::Tokenizer* tokenizer() {
  static std::shared_ptr<const qvl::Tokenizer> tok = [] {
    auto r = qvl::Tokenizer::load_dir(QVL_TOKENIZER_DIR);
    return r.is_ok() ? *r : nullptr;
  }();
  return tok.get();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const qvl::Tokenizer* tok = tokenizer();
  if (!tok) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ids = tok->encode(text);
  const bool valid = qvl::tok::find_invalid_utf8(text) == qvl::tok::kValidUtf8;
  if (ids.is_ok() != valid) std::abort();
  if (!ids.is_ok()) return 0;
  std::string nfc;
  if (!qvl::tok::nfc_normalize(text, nfc) || tok->decode(*ids) != nfc) std::abort();
  // Stop string: the last three bytes of the input when they are valid UTF-8 on their own.
  qvl::DetokenizerOptions opts{false, {}};
  if (size >= 3 && qvl::tok::find_invalid_utf8(text.substr(size - 3)) == qvl::tok::kValidUtf8) {
    opts.stop.push_back(text.substr(size - 3));
  }
  qvl::StreamingDetokenizer d(*tok, opts);
  std::string out;
  for (int32_t id : *ids) {
    auto step = d.push(id);
    if (qvl::tok::find_invalid_utf8(step.text) != qvl::tok::kValidUtf8) std::abort();
    out += step.text;
  }
  out += d.finish().text;
  const std::string full = tok->decode(*ids);
  const std::string want = opts.stop.empty() ? full : full.substr(0, full.find(opts.stop[0]));
  if (out != want) std::abort();
  return 0;
}
