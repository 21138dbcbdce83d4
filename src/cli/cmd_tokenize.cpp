// qvl tokenize: the tokenizer and chat template from the command line.
//   qvl tokenize [--model M | --tokenizer DIR] "text"        -> JSON array of ids
//   echo "text" | qvl tokenize                                  -> same, text from stdin
//   qvl tokenize --decode "[151644, 872]"                       -> the text
//   qvl tokenize --jsonl < strings.jsonl                        -> one JSON array of ids per line
//   qvl tokenize --decode --jsonl < ids.jsonl                   -> one JSON string per line
//   qvl tokenize --template conversation.json                   -> {"text": ..., "ids": [...]}
//   qvl tokenize --jsonl --bench 5 < strings.jsonl              -> encode throughput as JSON
// A conversation file is an array of OpenAI-style messages, or an object with "messages" and
// optional "add_generation_prompt" (default true), "add_vision_id", "tools"; image parts are
// {"type": "image", "grid": [t, h, w]}.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/model_args.h"
#include "tokenizer/chat_json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

struct TokenizeOptions {
  qvl::cli::ModelArgs model;
  std::string tokenizer_dir;
  std::string text;
  std::string template_file;
  bool decode = false;
  bool jsonl = false;
  bool skip_special = false;
  bool show_tokens = false;
  int bench = 0;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "qvl tokenize: %s\n", message.c_str());
  return 1;
}

std::string read_all(std::istream& in) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

qvl::Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return qvl::invalid_argument("ids must be a JSON array of integers");
  std::vector<int32_t> ids;
  for (const json& v : j) {
    if (!v.is_number_integer()) return qvl::invalid_argument("ids must be integers, got " + v.dump());
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

int run_template(const qvl::Tokenizer& tok, const TokenizeOptions& o) {
  std::ifstream f(o.template_file);
  if (!f) return fail("cannot open " + o.template_file);
  ordered_json conv = ordered_json::parse(read_all(f), nullptr, false);
  if (conv.is_discarded()) return fail(o.template_file + " is not valid JSON");
  qvl::ChatTemplateOptions opts;
  ordered_json messages = conv;
  if (conv.is_object()) {
    messages = conv.value("messages", ordered_json());
    opts.add_generation_prompt = conv.value("add_generation_prompt", true);
    opts.add_vision_id = conv.value("add_vision_id", false);
    if (conv.contains("tools") && !conv["tools"].is_null()) {
      auto tools = qvl::parse_chat_tools(conv["tools"]);
      if (!tools.is_ok()) return fail(tools.status().to_string());
      opts.tools_json = std::move(tools).value();
    }
  }
  auto parsed = qvl::parse_chat_messages(messages);
  if (!parsed.is_ok()) return fail(parsed.status().to_string());
  auto prompt = qvl::build_chat_prompt(tok, *parsed, opts);
  if (!prompt.is_ok()) return fail(prompt.status().to_string());
  std::printf("{\"text\":%s,\"ids\":%s}\n", json(prompt->text).dump().c_str(), ids_json(prompt->ids).c_str());
  return 0;
}

int run_bench(const qvl::Tokenizer& tok, const std::vector<std::string>& lines, int reps) {
  size_t bytes = 0, tokens = 0;
  for (const std::string& s : lines) bytes += s.size();
  std::vector<int32_t> ids;
  // One untimed pass first, so the word cache is warm as in a long-running server.
  for (const std::string& s : lines) {
    ids.clear();
    qvl::Status st = tok.encode_append(s, ids);
    if (!st.is_ok()) return fail(st.to_string());
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    for (const std::string& s : lines) {
      ids.clear();
      qvl::Status st = tok.encode_append(s, ids);
      if (!st.is_ok()) return fail(st.to_string());
      tokens += ids.size();
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"strings\":%zu,\"reps\":%d,\"bytes\":%zu,\"tokens\":%zu,\"seconds\":%.6f,\"tokens_per_s\":%.1f,"
      "\"mb_per_s\":%.3f}\n",
      lines.size(), reps, bytes * reps, tokens, secs, tokens / secs, bytes * reps / secs / 1e6);
  return 0;
}

int run_tokenize(const TokenizeOptions& o) {
  // --tokenizer DIR, else the model's directory (local, built-in or hub id), else the pinned
  // Qwen3 tokenizer.
  std::string dir = o.tokenizer_dir;
  if (dir.empty() && !o.model.name.empty()) {
    auto resolved = qvl::cli::resolve_model_dir(o.model);
    if (!resolved.is_ok()) return fail(resolved.status().to_string());
    dir = *resolved;
  }
  if (dir.empty()) dir = qvl::cli::default_tokenizer_dir();
  auto loaded = qvl::Tokenizer::load_dir(dir);
  if (!loaded.is_ok()) return fail(loaded.status().to_string());
  const qvl::Tokenizer& tok = **loaded;

  if (!o.template_file.empty()) return run_template(tok, o);

  if (o.jsonl) {
    std::vector<std::string> lines;
    std::string line;
    size_t line_no = 0;
    while (std::getline(std::cin, line)) {
      ++line_no;
      if (o.decode) {
        auto ids = parse_ids(line);
        if (!ids.is_ok()) return fail("line " + std::to_string(line_no) + ": " + ids.status().message());
        std::printf("%s\n", json(tok.decode(*ids, o.skip_special)).dump().c_str());
        continue;
      }
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_string()) {
        return fail("line " + std::to_string(line_no) + " is not a JSON string");
      }
      lines.push_back(j.get<std::string>());
    }
    if (o.decode) return 0;
    if (o.bench > 0) return run_bench(tok, lines, o.bench);
    for (const std::string& s : lines) {
      auto ids = tok.encode(s);
      if (!ids.is_ok()) return fail(ids.status().to_string());
      std::printf("%s\n", ids_json(*ids).c_str());
    }
    return 0;
  }

  const std::string input = o.text.empty() ? read_all(std::cin) : o.text;
  if (o.decode) {
    auto ids = parse_ids(input);
    if (!ids.is_ok()) return fail(ids.status().message());
    std::printf("%s", tok.decode(*ids, o.skip_special).c_str());
    return 0;
  }
  auto ids = tok.encode(input);
  if (!ids.is_ok()) return fail(ids.status().to_string());
  if (o.show_tokens) {
    for (int32_t id : *ids) std::printf("%d\t%s\n", id, json(std::string(tok.id_to_token(id))).dump().c_str());
    return 0;
  }
  std::printf("%s\n", ids_json(*ids).c_str());
  return 0;
}

std::function<int()> setup_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  app.add_option("text", o->text, "Text to encode (or ids to decode); read from stdin when absent");
  app.add_option("--model", o->model.name, "Model: a directory, a built-in name or a hub id (tokenizer.json in it)");
  app.add_option("--revision", o->model.revision, "Hub revision of --model");
  app.add_option("--tokenizer", o->tokenizer_dir, "Directory holding tokenizer.json (overrides --model)");
  app.add_flag("--decode", o->decode, "Decode ids (a JSON array) to text");
  app.add_flag("--jsonl", o->jsonl, "Batch mode: one JSON string (or id array with --decode) per line");
  app.add_flag("--skip-special", o->skip_special, "Leave special tokens out when decoding");
  app.add_flag("--tokens", o->show_tokens, "Print one id and its token string per line");
  app.add_option("--template", o->template_file, "Render a conversation JSON file with the chat template");
  app.add_option("--bench", o->bench,
                 "With --jsonl: encode all lines once untimed, then N times timed; print throughput as JSON");
  return [o] { return run_tokenize(*o); };
}

}  // namespace

QVL_REGISTER_COMMAND("tokenize", "Encode or decode text, or render a chat template", setup_tokenize);
