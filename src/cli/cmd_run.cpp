// qvl run: one request through the engine, answer streamed to stdout (or one JSON object with
// --json). The same path as `qvl serve`: resolve the model, plan, load, build the prompt with the
// chat template, submit to the engine, stream the detokenized text.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/engine_args.h"
#include "cli/model_args.h"
#include "cli/prompt.h"
#include "engine/sampler.h"

namespace qvl::cli {
namespace {

struct RunArgs {
  ModelArgs model;
  PromptInput input;
  EngineArgs engine;
  float temperature = 0, top_p = 1, min_p = 0, repetition_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
  int top_k = 0, max_tokens = 0;
  uint64_t seed = 0;
  bool ignore_eos = false, json = false;
  std::vector<std::string> stop;
  // Set when the flag was given (the rest come from generation_config.json).
  CLI::Option *o_temperature = nullptr, *o_top_p = nullptr, *o_top_k = nullptr, *o_min_p = nullptr,
              *o_repetition = nullptr, *o_seed = nullptr, *o_max_tokens = nullptr;
};

int fail(const Status& st) {
  std::fprintf(stderr, "qvl run: %s\n", st.message().c_str());
  return st.code() == StatusCode::kInternal ? 70 : 1;
}

// Binds the value of a Result or prints its error and returns the exit code.
#define RUN_ASSIGN_OR_FAIL(lhs, expr) RUN_ASSIGN_OR_FAIL_IMPL(QVL_CONCAT(run_result_, __LINE__), lhs, expr)
#define RUN_ASSIGN_OR_FAIL_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                            \
  if (!tmp.is_ok()) return fail(tmp.status());  \
  lhs = std::move(tmp).value()

// Sampling: generation_config.json's defaults, then the flags.
SamplingParams sampling_from(const RunArgs& a, const GenerationDefaults& g) {
  SamplingParams p;
  p.temperature = g.do_sample ? g.temperature : 0.0f;
  p.top_p = g.do_sample ? g.top_p : 1.0f;
  p.top_k = g.do_sample ? g.top_k : 0;
  p.repetition_penalty = g.repetition_penalty;
  if (a.o_temperature->count()) p.temperature = a.temperature;
  if (a.o_top_p->count()) p.top_p = a.top_p;
  if (a.o_top_k->count()) p.top_k = a.top_k;
  if (a.o_min_p->count()) p.min_p = a.min_p;
  if (a.o_repetition->count()) p.repetition_penalty = a.repetition_penalty;
  p.presence_penalty = a.presence_penalty;
  p.frequency_penalty = a.frequency_penalty;
  if (a.o_seed->count()) p.seed = a.seed;
  p.ignore_eos = a.ignore_eos;
  p.stop = a.stop;
  return p;
}

int run(RunArgs& a) {
  RUN_ASSIGN_OR_FAIL(std::string dir, resolve_model_dir(a.model));
  RUN_ASSIGN_OR_FAIL(BackendChoice bc, make_backend(a.engine));
  RUN_ASSIGN_OR_FAIL(LoadOptions lo, make_load_options(a.engine, dir, bc.device, 1, 1));
  RUN_ASSIGN_OR_FAIL(LoadedModel model, load_model(bc.backend, lo));
  if (const std::string fit = auto_fit_report(model); !fit.empty()) std::fputs(fit.c_str(), stderr);

  SamplingParams sampling = sampling_from(a, model.config.generation);
  sampling.max_tokens = a.o_max_tokens->count() ? a.max_tokens : 256;
  if (Status st = validate_sampling_params(sampling); !st.is_ok()) return fail(st);
  RUN_ASSIGN_OR_FAIL(CliRequest req, build_cli_request(a.input, model, sampling));
  // Without --max-tokens the answer may use the rest of the context (up to 256 tokens).
  const int64_t room = model.context_length - static_cast<int64_t>(req.request.prompt_ids.size());
  if (room < 1) {
    int64_t pads = std::count(req.request.prompt_ids.begin(), req.request.prompt_ids.end(),
                              static_cast<int32_t>(model.config.tokens.image_token_id));
    return fail(out_of_range("the prompt has " + std::to_string(req.request.prompt_ids.size()) + " tokens (" +
                             std::to_string(pads) + " of them image tokens): no room for an answer in the context of " +
                             std::to_string(model.context_length) + " tokens (--context)"));
  }
  if (!a.o_max_tokens->count() && room >= 1 && room < sampling.max_tokens)
    req.request.sampling.max_tokens = static_cast<int>(room);
  const std::vector<int32_t> prompt_ids = req.request.prompt_ids;

  RUN_ASSIGN_OR_FAIL(std::unique_ptr<RequestStream> stream, model.engine->submit(std::move(req.request)));
  std::vector<int32_t> token_ids;
  std::string text;
  GenerationEvent last;
  while (true) {
    std::optional<GenerationEvent> ev = stream->next(std::chrono::milliseconds(1000));
    if (!ev) continue;
    token_ids.insert(token_ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    text += ev->text;
    if (!a.json && !ev->text.empty()) {
      std::fwrite(ev->text.data(), 1, ev->text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev->kind == GenerationEvent::Kind::kFinished) {
      last = std::move(*ev);
      break;
    }
  }
  if (last.finish_reason == FinishReason::kError) {
    if (!a.json && !text.empty()) std::fputc('\n', stdout);
    return fail(last.error);
  }
  if (a.json) {
    const Timings& t = last.timings;
    nlohmann::ordered_json j;
    j["prompt_token_ids"] = prompt_ids;
    j["token_ids"] = token_ids;
    j["text"] = text;
    j["finish_reason"] = finish_reason_name(last.finish_reason);
    j["usage"] = {{"prompt_tokens", last.usage.prompt_tokens},
                  {"completion_tokens", last.usage.completion_tokens},
                  {"total_tokens", last.usage.prompt_tokens + last.usage.completion_tokens}};
    j["timings"] = {{"queue_ms", t.queue_ms},     {"vision_ms", t.vision_ms},
                    {"prefill_ms", t.prefill_ms}, {"ttft_ms", t.ttft_ms},
                    {"decode_ms", t.decode_ms},   {"decode_tokens_per_s", t.decode_tokens_per_s}};
    const std::string out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else if (text.empty() || text.back() != '\n') {
    std::fputc('\n', stdout);
  }
  return 0;
}

std::function<int()> setup_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  app.add_option("model,--model", a->model.name,
                 "Model directory, built-in name (tiny, tiny-untied, tiny-fp8) or hub id (Qwen/Qwen3-VL-2B-Instruct)")
      ->required();
  app.add_option("--revision", a->model.revision, "Hub revision: branch, tag or snapshot hash (default main)");
  app.add_option("--image", a->input.images, "Image file (repeatable); each <image> in --prompt places the next one")
      ->allow_extra_args(false);
  app.add_option("--prompt", a->input.prompt, "The prompt; <image> marks where the next --image goes");
  app.add_option("--task", a->input.task,
                 "caption, vqa (question in --prompt), scene or detect (categories in --prompt)")
      ->check(CLI::IsMember(task_names()));
  app.add_option("--system", a->input.system, "System message");
  a->o_temperature = app.add_option("--temperature", a->temperature, "0 = greedy (default: generation_config.json)");
  a->o_top_p = app.add_option("--top-p", a->top_p, "Nucleus sampling mass (default: generation_config.json)");
  a->o_top_k =
      app.add_option("--top-k", a->top_k, "Keep the k most likely tokens, 0 = off (default: generation_config.json)");
  a->o_min_p = app.add_option("--min-p", a->min_p, "Drop tokens below min_p x the top probability (0)");
  a->o_repetition = app.add_option("--repetition-penalty", a->repetition_penalty, "HF repetition penalty (1 = off)");
  app.add_option("--presence-penalty", a->presence_penalty, "OpenAI presence penalty (0)");
  app.add_option("--frequency-penalty", a->frequency_penalty, "OpenAI frequency penalty (0)");
  a->o_seed = app.add_option("--seed", a->seed, "Sampling seed: the same seed gives the same answer");
  a->o_max_tokens = app.add_option("--max-tokens", a->max_tokens, "Most tokens to generate (256)");
  app.add_option("--stop", a->stop, "Stop string (repeatable); not included in the answer")->allow_extra_args(false);
  app.add_flag("--ignore-eos", a->ignore_eos, "Keep generating past the end-of-sequence token");
  app.add_flag("--json", a->json, "Print one JSON object: ids, text, finish_reason, usage, timings");
  add_engine_args(app, &a->engine);
  return [a] { return run(*a); };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("run", "Answer one prompt about images, streaming the text to stdout", qvl::cli::setup_run);
