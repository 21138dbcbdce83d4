#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"

namespace qvl {

namespace {

// Words longer than this are merged afresh each time (rare; keeps cache entries small).
constexpr size_t kMaxCachedWordBytes = 64;

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return data_loss("error reading " + path);
  return ss.str();
}

bool file_exists(const std::string& path) {
  return static_cast<bool>(std::ifstream(path));
}

}  // namespace

// ---- encoding ----

Status TokenizerImpl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::pair<size_t, size_t>> spans;
  QVL_RETURN_IF_ERROR(splitter->find_spans(text, spans));
  for (auto [b, e] : spans) {
    const std::string_view word = text.substr(b, e - b);
    if (word.size() == 1) {
      out.push_back(bpe.byte_ids[static_cast<uint8_t>(word[0])]);
      continue;
    }
    if (word.size() > kMaxCachedWordBytes) {
      tok::bpe_encode_word(bpe, word, out);
      continue;
    }
    if (cache.lookup(word, out)) continue;
    const size_t before = out.size();
    tok::bpe_encode_word(bpe, word, out);
    cache.insert(word, out.data() + before, out.size() - before);
  }
  return Status::ok();
}

Status TokenizerImpl::encode_normalized_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (normalized_matcher.empty()) return encode_plain(piece, out);
  std::vector<tok::Piece> pieces;
  normalized_matcher.split(piece, pieces);
  for (const tok::Piece& p : pieces) {
    if (p.id >= 0) {
      out.push_back(p.id);
    } else {
      QVL_RETURN_IF_ERROR(encode_plain(piece.substr(p.begin, p.end - p.begin), out));
    }
  }
  return Status::ok();
}

Status TokenizerImpl::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  if (const size_t bad = tok::find_invalid_utf8(text); bad != tok::kValidUtf8) {
    return invalid_argument("text is not valid UTF-8: byte " + std::to_string(bad) + " of " +
                            std::to_string(text.size()) + " (0x" +
                            "0123456789abcdef"[static_cast<uint8_t>(text[bad]) >> 4] +
                            "0123456789abcdef"[static_cast<uint8_t>(text[bad]) & 15] + ") starts no valid sequence");
  }
  std::vector<tok::Piece> pieces;
  if (raw_matcher.empty()) {
    pieces.push_back({0, text.size(), -1});
  } else {
    raw_matcher.split(text, pieces);
  }
  std::string normalized;
  for (const tok::Piece& p : pieces) {
    if (p.id >= 0) {
      out.push_back(p.id);
      continue;
    }
    const std::string_view piece = text.substr(p.begin, p.end - p.begin);
    // Each piece between added tokens is normalised on its own, as `tokenizers` does.
    if (!nfc || tok::nfc_quick_unchanged(piece)) {
      QVL_RETURN_IF_ERROR(encode_normalized_piece(piece, out));
      continue;
    }
    if (!tok::nfc_normalize(piece, normalized)) return internal_error("utf8proc NFC failed on valid UTF-8");
    QVL_RETURN_IF_ERROR(encode_normalized_piece(normalized, out));
  }
  return Status::ok();
}

// ---- the public class ----

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json,
                                                              std::string_view tokenizer_config_json,
                                                              const std::string& origin) {
  QVL_ASSIGN_OR_RETURN(auto impl, load_tokenizer_impl(tokenizer_json, tokenizer_config_json, origin));
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load_file(const std::string& path) {
  QVL_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return from_json(text, {}, path);
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load_dir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (!file_exists(path)) return not_found("tokenizer.json not found in " + dir);
  QVL_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string config;
  const std::string config_path = dir + "/tokenizer_config.json";
  if (file_exists(config_path)) {
    QVL_ASSIGN_OR_RETURN(config, read_file(config_path));
  }
  return from_json(text, config, path);
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  QVL_RETURN_IF_ERROR(impl_->encode_append(text, ids));
  return ids;
}

Status Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  return impl_->encode_append(text, out);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special_tokens && is_special(id)) continue;
    bytes += impl_->token_bytes[id];
  }
  std::string text;
  text.reserve(bytes.size());
  utf8_decode_lossy_prefix(bytes, /*final_flush=*/true, text);
  return text;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  return (id >= 0 && id < vocab_size()) ? std::string_view(impl_->token_bytes[id]) : std::string_view();
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
  return (id >= 0 && id < vocab_size()) ? std::string_view(impl_->token_str[id]) : std::string_view();
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && (impl_->flags[id] & TokenizerImpl::kSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && (impl_->flags[id] & TokenizerImpl::kAdded);
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->token_str.size());
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}
const SpecialTokenIds& Tokenizer::special_ids() const {
  return impl_->special;
}
std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->eos;
}

}  // namespace qvl
