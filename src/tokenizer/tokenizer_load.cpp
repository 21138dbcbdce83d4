// tokenizer.json -> TokenizerImpl. Accepts exactly the pipeline Qwen ships (and its close
// variants): normalizer NFC or none; pre_tokenizer Split(regex, Isolated) + ByteLevel(no prefix
// space, no regex); model BPE without dropout / byte fallback / subword affixes; decoder
// ByteLevel. Anything else is refused with the JSON path of the field that differs, because
// silently tokenizing differently from the reference is worse than not loading.
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"

namespace qvl {

namespace {

using nlohmann::json;

std::string dump_short(const json& j) {
  std::string s = j.dump();
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}

Status unsupported(const std::string& origin, const std::string& path, const json& value, const std::string& want) {
  return unimplemented(origin + ": " + path + " = " + dump_short(value) + " is not supported (expected " + want + ")");
}

bool is_type(const json& j, const char* type) {
  return j.is_object() && j.contains("type") && j["type"].is_string() && j["type"] == type;
}

// j[key] by reference, or null when j is no object or lacks it. (json::value() returns a copy:
// for "model" that is the whole vocabulary and merge list, a third of the load's time.)
const json& member(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it != j.end() ? *it : kNull;
}

bool flag(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return (it != j.end() && it->is_boolean()) ? it->get<bool>() : fallback;
}

// What the ByteLevel decoder turns a token string into: each symbol's byte, or the string's
// own UTF-8 when any character is not a byte symbol.
std::string byte_level_decode(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const int b = tok::symbol_to_byte(tok::next_code_point(s, i));
    if (b < 0) return s;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

// Regex-quotes a literal for PCRE2.
std::string quote_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

Status check_normalizer(TokenizerImpl& t, const json& n, const std::string& origin) {
  if (n.is_null()) return Status::ok();
  if (is_type(n, "NFC")) {
    t.nfc = true;
    return Status::ok();
  }
  if (is_type(n, "Sequence") && n.contains("normalizers") && n["normalizers"].is_array()) {
    const json& list = n["normalizers"];
    if (list.empty()) return Status::ok();
    if (list.size() == 1 && is_type(list[0], "NFC")) {
      t.nfc = true;
      return Status::ok();
    }
  }
  return unsupported(origin, "normalizer", n, "null or NFC");
}

Status check_pre_tokenizer(TokenizerImpl& t, const json& p, const std::string& origin) {
  const std::string want = "Sequence[Split(Regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]";
  if (!is_type(p, "Sequence") || !p.contains("pretokenizers") || !p["pretokenizers"].is_array() ||
      p["pretokenizers"].size() != 2) {
    return unsupported(origin, "pre_tokenizer", p, want);
  }
  const json& split = p["pretokenizers"][0];
  const json& byte_level = p["pretokenizers"][1];
  if (!is_type(split, "Split") || split.value("behavior", "") != "Isolated" || flag(split, "invert", false)) {
    return unsupported(origin, "pre_tokenizer.pretokenizers[0]", split, "Split with behavior Isolated, invert false");
  }
  if (!is_type(byte_level, "ByteLevel") || flag(byte_level, "add_prefix_space", true) ||
      flag(byte_level, "use_regex", true)) {
    return unsupported(origin, "pre_tokenizer.pretokenizers[1]", byte_level,
                       "ByteLevel with add_prefix_space false and use_regex false");
  }
  const json& pattern = member(split, "pattern");
  std::string regex;
  if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
    regex = pattern["Regex"].get<std::string>();
  } else if (pattern.contains("String") && pattern["String"].is_string()) {
    regex = quote_literal(pattern["String"].get<std::string>());
  } else {
    return unsupported(origin, "pre_tokenizer.pretokenizers[0].pattern", pattern, "{\"Regex\": ...}");
  }
  auto splitter = tok::RegexSplitter::compile(regex);
  if (!splitter.is_ok()) return splitter.status().with_context(origin);
  t.splitter = std::move(splitter).value();
  return Status::ok();
}

Status load_bpe(TokenizerImpl& t, const json& m, const std::string& origin) {
  if (!is_type(m, "BPE")) return unsupported(origin, "model", json(m.value("type", "")), "type BPE");
  if (m.contains("dropout") && !m["dropout"].is_null())
    return unsupported(origin, "model.dropout", m["dropout"], "null");
  if (flag(m, "byte_fallback", false)) return unsupported(origin, "model.byte_fallback", true, "false");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty())) {
      return unsupported(origin, std::string("model.") + key, m[key], "null or \"\"");
    }
  }
  t.bpe.ignore_merges = flag(m, "ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object()) return data_loss(origin + ": model.vocab is missing");
  const json& vocab = m["vocab"];
  // One walk over the vocabulary's tree (151,669 nodes for Qwen): the entries, checked.
  std::vector<std::pair<const std::string*, int32_t>> entries;
  entries.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (1 << 30)) {
      return data_loss(origin + ": model.vocab[\"" + it.key() + "\"] = " + dump_short(it.value()) +
                       " is not a valid id");
    }
    entries.emplace_back(&it.key(), it.value().get<int32_t>());
    max_id = std::max(max_id, entries.back().second);
  }
  t.token_str.assign(max_id + 1, std::string());
  t.token_bytes.assign(max_id + 1, std::string());
  t.vocab.reserve(vocab.size());
  for (const auto& [key, id] : entries) {
    t.token_str[id] = *key;
    t.token_bytes[id] = byte_level_decode(*key);
    t.vocab[*key] = id;
    if (t.bpe.ignore_merges) t.bpe.bytes_to_id[t.token_bytes[id]] = id;
  }
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    tok::append_utf8(sym, tok::byte_to_symbol(static_cast<uint8_t>(b)));
    auto it = t.vocab.find(sym);
    if (it == t.vocab.end()) {
      return unimplemented(origin + ": model.vocab lacks the byte-level symbol \"" + sym + "\" of byte " +
                           std::to_string(b) + " (every byte must have a token)");
    }
    t.bpe.byte_ids[b] = it->second;
  }
  if (!m.contains("merges") || !m["merges"].is_array()) return data_loss(origin + ": model.merges is missing");
  const json& merges = m["merges"];
  t.bpe.merges.reserve(merges.size());
  auto lookup = [&](const std::string& s, size_t rank, const char* what) -> Result<int32_t> {
    auto it = t.vocab.find(s);
    if (it == t.vocab.end()) {
      return data_loss(origin + ": model.merges[" + std::to_string(rank) + "]: " + what + " \"" + s +
                       "\" is not in the vocabulary");
    }
    return it->second;
  };
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    std::string a, b;
    if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return data_loss(origin + ": model.merges[" + std::to_string(r) + "] = \"" + s +
                         "\" is not two tokens separated by one space");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      return data_loss(origin + ": model.merges[" + std::to_string(r) + "] = " + dump_short(e) +
                       " is neither [a, b] nor \"a b\"");
    }
    QVL_ASSIGN_OR_RETURN(int32_t ia, lookup(a, r, "left token"));
    QVL_ASSIGN_OR_RETURN(int32_t ib, lookup(b, r, "right token"));
    QVL_ASSIGN_OR_RETURN(int32_t im, lookup(a + b, r, "merged token"));
    t.bpe.merges.insert(ia, ib, static_cast<int32_t>(r), im);
  }
  return Status::ok();
}

Status load_added_tokens(TokenizerImpl& t, const json& list, const std::string& origin) {
  if (list.is_null()) return Status::ok();
  if (!list.is_array()) return data_loss(origin + ": added_tokens is not an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string()) {
      return data_loss(origin + ": added_tokens[" + std::to_string(i) + "] = " + dump_short(a) +
                       " lacks an integer id or a string content");
    }
    AddedToken tok;
    tok.id = a["id"].get<int32_t>();
    if (tok.id < 0 || tok.id >= (1 << 30)) {
      return data_loss(origin + ": added_tokens[" + std::to_string(i) + "].id = " + std::to_string(tok.id) +
                       " is out of range");
    }
    tok.content = a["content"].get<std::string>();
    tok.special = flag(a, "special", false);
    tok.normalized = flag(a, "normalized", !tok.special);
    tok.lstrip = flag(a, "lstrip", false);
    tok.rstrip = flag(a, "rstrip", false);
    tok.single_word = flag(a, "single_word", false);
    if (tok.content.empty()) continue;  // `tokenizers` ignores empty added tokens
    if (tok::find_invalid_utf8(tok.content) != tok::kValidUtf8) {
      return data_loss(origin + ": added_tokens[" + std::to_string(i) + "].content is not valid UTF-8");
    }
    t.added.push_back(tok);
  }
  return Status::ok();
}

Status finish(TokenizerImpl& t, const std::string& origin) {
  int32_t max_id = static_cast<int32_t>(t.token_str.size()) - 1;
  for (const AddedToken& a : t.added) max_id = std::max(max_id, a.id);
  t.token_str.resize(max_id + 1);
  t.token_bytes.resize(max_id + 1);
  t.flags.assign(max_id + 1, 0);
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (const AddedToken& a : t.added) {
    // The decoder sees the added token's content (its NFC form for a normalized token whose
    // form changes), through the ByteLevel decoder like every other token.
    std::string form = a.content;
    if (a.normalized && t.nfc) {
      std::string n;
      if (!tok::nfc_normalize(a.content, n)) return internal_error(origin + ": NFC of added token failed");
      form = n;
    }
    t.token_str[a.id] = a.content;
    t.token_bytes[a.id] = byte_level_decode(form);
    t.flags[a.id] = TokenizerImpl::kAdded | (a.special ? TokenizerImpl::kSpecial : 0);
    t.added_by_content[a.content] = a.id;
    if (a.normalized) {
      normalized.push_back(a);
      normalized_patterns.push_back(form);
    } else {
      raw.push_back(a);
      raw_patterns.push_back(a.content);
    }
  }
  t.raw_matcher = tok::AddedTokenMatcher(raw, raw_patterns);
  t.normalized_matcher = tok::AddedTokenMatcher(normalized, normalized_patterns);
  auto id_of = [&](const char* s) {
    auto it = t.added_by_content.find(s);
    if (it != t.added_by_content.end()) return it->second;
    auto v = t.vocab.find(s);
    return v != t.vocab.end() ? v->second : -1;
  };
  t.special = {id_of("<|endoftext|>"),  id_of("<|im_start|>"),  id_of("<|im_end|>"),   id_of("<|vision_start|>"),
               id_of("<|vision_end|>"), id_of("<|image_pad|>"), id_of("<|video_pad|>")};
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<TokenizerImpl>> load_tokenizer_impl(std::string_view tokenizer_json,
                                                           std::string_view tokenizer_config_json,
                                                           const std::string& origin) {
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss(origin + ": not a valid JSON object");
  auto t = std::make_unique<TokenizerImpl>();
  QVL_RETURN_IF_ERROR(check_normalizer(*t, member(j, "normalizer"), origin));
  QVL_RETURN_IF_ERROR(check_pre_tokenizer(*t, member(j, "pre_tokenizer"), origin));
  const json& decoder = member(j, "decoder");
  if (!is_type(decoder, "ByteLevel")) return unsupported(origin, "decoder", decoder, "ByteLevel");
  QVL_RETURN_IF_ERROR(load_bpe(*t, member(j, "model"), origin));
  QVL_RETURN_IF_ERROR(load_added_tokens(*t, member(j, "added_tokens"), origin));
  QVL_RETURN_IF_ERROR(finish(*t, origin));

  if (!tokenizer_config_json.empty()) {
    json c = json::parse(tokenizer_config_json, nullptr, false);
    if (c.is_discarded() || !c.is_object()) return data_loss(origin + ": tokenizer_config.json is not a JSON object");
    const json eos = c.value("eos_token", json());
    std::string name;
    if (eos.is_string()) name = eos.get<std::string>();
    if (eos.is_object() && eos.contains("content") && eos["content"].is_string()) name = eos["content"];
    if (!name.empty()) {
      auto it = t->added_by_content.find(name);
      if (it != t->added_by_content.end()) {
        t->eos = it->second;
      } else if (auto v = t->vocab.find(name); v != t->vocab.end()) {
        t->eos = v->second;
      } else {
        return data_loss(origin + ": tokenizer_config.json eos_token \"" + name + "\" is not a token");
      }
    }
  }
  return t;
}

}  // namespace qvl
