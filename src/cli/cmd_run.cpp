// qvl run: one request through the engine, answer streamed to stdout (or one JSON object with
// --json). The same path as `qvl serve`: resolve the model, plan, load, build the prompt with the
// chat template, submit to the engine, stream the detokenized text.
//
// With --each, every --image is a request of its own with the same prompt or task (a folder of
// photos to caption), the model loaded once and up to --parallel requests decoding together (the
// memory plan then holds that many contexts).
// The answers come out in the order of the images: after a line "== PATH", or with --json one
// JSON object per line that starts with "image". An image that cannot be answered (unreadable,
// not an image, too long for the context) gets its error there, the others are still answered,
// and the exit status is then 1.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/engine_args.h"
#include "cli/model_args.h"
#include "cli/prompt.h"
#include "core/log.h"
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
  bool ignore_eos = false, json = false, each = false;
  int parallel = 1;
  std::vector<std::string> stop;
  // Set when the flag was given (the rest come from generation_config.json).
  CLI::Option *o_temperature = nullptr, *o_top_p = nullptr, *o_top_k = nullptr, *o_min_p = nullptr,
              *o_repetition = nullptr, *o_seed = nullptr, *o_max_tokens = nullptr, *o_parallel = nullptr;
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

// One request of this run, built: its request and prompt ids, or why it cannot run.
struct Prepared {
  Status status;
  GenerationRequest request;
  std::vector<int32_t> prompt_ids;
};

Prepared prepare(const PromptInput& input, const LoadedModel& model, const SamplingParams& sampling,
                 bool max_tokens_given) {
  Prepared out;
  Result<CliRequest> req = build_cli_request(input, model, sampling);
  if (!req.is_ok()) {
    out.status = req.status();
    return out;
  }
  out.request = std::move(req->request);
  // Without --max-tokens the answer may use the rest of the context (up to 256 tokens).
  const int64_t room = model.context_length - static_cast<int64_t>(out.request.prompt_ids.size());
  if (room < 1) {
    const int64_t pads = std::count(out.request.prompt_ids.begin(), out.request.prompt_ids.end(),
                                    static_cast<int32_t>(model.config.tokens.image_token_id));
    out.status =
        out_of_range("the prompt has " + std::to_string(out.request.prompt_ids.size()) + " tokens (" +
                     std::to_string(pads) + " of them image tokens): no room for an answer in the context of " +
                     std::to_string(model.context_length) + " tokens (--context)");
    return out;
  }
  if (!max_tokens_given && room < out.request.sampling.max_tokens)
    out.request.sampling.max_tokens = static_cast<int>(room);
  out.prompt_ids = out.request.prompt_ids;
  return out;
}

// What one request gave: the tokens and text, and the last event (finish reason, usage, timings).
struct Answer {
  std::vector<int32_t> token_ids;
  std::string text;
  GenerationEvent last;
};

// Reads `stream` to its end; `on_text` sees each piece of text as it comes.
Answer collect(RequestStream& stream, const std::function<void(const std::string&)>& on_text) {
  Answer a;
  while (true) {
    std::optional<GenerationEvent> ev = stream.next(std::chrono::milliseconds(1000));
    if (!ev) continue;
    a.token_ids.insert(a.token_ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    a.text += ev->text;
    if (on_text && !ev->text.empty()) on_text(ev->text);
    if (ev->kind == GenerationEvent::Kind::kFinished) {
      a.last = std::move(*ev);
      return a;
    }
  }
}

void print_line(const nlohmann::ordered_json& j) {
  const std::string out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// The --json object of an answer.
nlohmann::ordered_json answer_json(const std::vector<int32_t>& prompt_ids, const Answer& ans) {
  const Timings& t = ans.last.timings;
  nlohmann::ordered_json j;
  j["prompt_token_ids"] = prompt_ids;
  j["token_ids"] = ans.token_ids;
  j["text"] = ans.text;
  j["finish_reason"] = finish_reason_name(ans.last.finish_reason);
  j["usage"] = {{"prompt_tokens", ans.last.usage.prompt_tokens},
                {"completion_tokens", ans.last.usage.completion_tokens},
                {"total_tokens", ans.last.usage.prompt_tokens + ans.last.usage.completion_tokens}};
  j["timings"] = {{"queue_ms", t.queue_ms}, {"vision_ms", t.vision_ms}, {"prefill_ms", t.prefill_ms},
                  {"ttft_ms", t.ttft_ms},   {"decode_ms", t.decode_ms}, {"decode_tokens_per_s", t.decode_tokens_per_s}};
  return j;
}

// --each: one request per image, at most `parallel` in the engine at once, answers in order.
int run_each(RunArgs& a, LoadedModel& model, const SamplingParams& sampling, int parallel) {
  const size_t n = a.input.images.size();
  std::vector<Prepared> prepared(n);
  std::deque<std::pair<size_t, std::unique_ptr<RequestStream>>> running;
  size_t next = 0;
  int failed = 0;
  auto report = [&](size_t i, const Status& st) {
    ++failed;
    const std::string& path = a.input.images[i];
    // The image's name once: most errors (unreadable, not an image) already give it.
    const std::string msg = st.message().find(path) == std::string::npos ? path + ": " + st.message() : st.message();
    std::fprintf(stderr, "qvl run: %s\n", msg.c_str());
    if (a.json) {
      nlohmann::ordered_json j;
      j["image"] = path;
      j["error"] = msg;
      print_line(j);
    } else {
      std::printf("== %s\nerror: %s\n", path.c_str(), msg.c_str());
    }
    std::fflush(stdout);
  };
  // Submits images until `parallel` are running; an image that cannot run is reported in its turn.
  auto fill = [&] {
    while (next < n && static_cast<int>(running.size()) < parallel) {
      const size_t i = next++;
      PromptInput in = a.input;
      in.images = {a.input.images[i]};
      prepared[i] = prepare(in, model, sampling, a.o_max_tokens->count() > 0);
      if (prepared[i].status.is_ok()) {
        Result<std::unique_ptr<RequestStream>> stream = model.engine->submit(std::move(prepared[i].request));
        if (stream.is_ok()) {
          running.emplace_back(i, std::move(stream).value());
          continue;
        }
        prepared[i].status = stream.status();
      }
      running.emplace_back(i, nullptr);  // keeps its place in the order
    }
  };
  fill();
  while (!running.empty()) {
    auto [i, stream] = std::move(running.front());
    running.pop_front();
    if (!stream) {
      report(i, prepared[i].status);
      fill();
      continue;
    }
    const Answer ans = collect(*stream, nullptr);
    fill();
    if (ans.last.finish_reason == FinishReason::kError) {
      report(i, ans.last.error);
      continue;
    }
    if (a.json) {
      nlohmann::ordered_json j;
      j["image"] = a.input.images[i];
      j.update(answer_json(prepared[i].prompt_ids, ans));
      print_line(j);
    } else {
      std::printf("== %s\n%s%s", a.input.images[i].c_str(), ans.text.c_str(),
                  ans.text.empty() || ans.text.back() != '\n' ? "\n" : "");
    }
    std::fflush(stdout);
  }
  return failed > 0 ? 1 : 0;
}

int run(RunArgs& a) {
  if (a.each && a.input.images.empty())
    return fail(invalid_argument("--each answers every --image: give at least one"));
  if (a.o_parallel->count() && !a.each) return fail(invalid_argument("--parallel applies with --each"));
  if (a.parallel < 1) return fail(invalid_argument("--parallel " + std::to_string(a.parallel) + " must be >= 1"));
  const int parallel = a.each ? std::min(a.parallel, static_cast<int>(a.input.images.size())) : 1;
  log_debug("run: start");
  RUN_ASSIGN_OR_FAIL(std::string dir, resolve_model_dir(a.model));
  auto tokenizer = start_tokenizer_load(dir);  // beside the backend's creation and the upload
  RUN_ASSIGN_OR_FAIL(BackendChoice bc, make_backend(a.engine));
  log_debug("run: backend ready");
  RUN_ASSIGN_OR_FAIL(LoadOptions lo, make_load_options(a.engine, dir, bc.device, parallel, parallel));
  lo.tokenizer = tokenizer;
  RUN_ASSIGN_OR_FAIL(LoadedModel model, load_model(bc.backend, lo));
  log_debug("run: model loaded");
  if (const std::string fit = auto_fit_report(model); !fit.empty()) std::fputs(fit.c_str(), stderr);

  SamplingParams sampling = sampling_from(a, model.config.generation);
  sampling.max_tokens = a.o_max_tokens->count() ? a.max_tokens : 256;
  if (Status st = validate_sampling_params(sampling); !st.is_ok()) return fail(st);
  if (a.each) return run_each(a, model, sampling, parallel);

  Prepared one = prepare(a.input, model, sampling, a.o_max_tokens->count() > 0);
  if (!one.status.is_ok()) return fail(one.status);
  RUN_ASSIGN_OR_FAIL(std::unique_ptr<RequestStream> stream, model.engine->submit(std::move(one.request)));
  const Answer ans = collect(*stream, [&](const std::string& text) {
    if (a.json) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  if (ans.last.finish_reason == FinishReason::kError) {
    if (!a.json && !ans.text.empty()) std::fputc('\n', stdout);
    return fail(ans.last.error);
  }
  if (a.json) {
    print_line(answer_json(one.prompt_ids, ans));
  } else if (ans.text.empty() || ans.text.back() != '\n') {
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
  app.add_flag("--each", a->each,
               "Answer the prompt once per --image, each its own request, the model loaded once; answers in order "
               "after '== PATH' lines (--json: one object per line, with \"image\")");
  a->o_parallel = app.add_option("--parallel", a->parallel,
                                 "With --each: requests decoding together (1; more need memory for as many contexts)");
  add_engine_args(app, &a->engine);
  return [a] { return run(*a); };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("run", "Answer one prompt about images, streaming the text to stdout", qvl::cli::setup_run);
