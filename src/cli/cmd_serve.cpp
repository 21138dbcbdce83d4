// qvl serve MODEL: the OpenAI-compatible server (server/http_server.h) over a model loaded in the
// background (engine/loader.h). This file owns what only the CLI may do: reading flags and the
// environment ($QVL_API_KEY), and the process's signals. SIGINT/SIGTERM are blocked in every
// thread and taken synchronously by the main thread (sigtimedwait), so no handler runs inside
// library code: the first one drains (new requests get 503), lets running requests finish for up
// to --shutdown-timeout, cancels the rest, stops the listener, joins every thread and exits 0; a
// second one exits at once with status 1.
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/command.h"
#include "cli/engine_args.h"
#include "cli/model_args.h"
#include "core/log.h"
#include "engine/loader.h"
#include "memory/byte_size.h"
#include "server/http_server.h"
#include "server/model_prompt_builder.h"

namespace qvl::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct ServeArgs {
  ModelArgs model;
  EngineArgs engine;
  server::ServerOptions server;
  int concurrency = 1;   // sequences the memory plan holds at full context
  int max_running = 16;  // sequences in the running batch
  std::string max_body = "32MiB";
  std::string max_image_bytes = "20MiB";
  int64_t max_image_input_pixels = 64ll << 20;
  double url_fetch_timeout_s = 10;
  std::string cors_origins;
  double shutdown_timeout_s = 30;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

// Everything that can be checked before binding a port or reading a weight.
Status finish_options(ServeArgs& a) {
  server::ServerOptions& s = a.server;
  if (s.port < 0 || s.port > 65535)
    return invalid_argument("--port " + std::to_string(s.port) + " must be in [0, 65535]");
  if (s.api_key.empty()) s.api_key = env_or("QVL_API_KEY", "");
  if (s.served_model_name.empty()) s.served_model_name = a.model.name;
  if (s.max_concurrency < 1)
    return invalid_argument("--max-concurrency " + std::to_string(s.max_concurrency) + " must be >= 1");
  if (a.max_running < 1) return invalid_argument("--max-running " + std::to_string(a.max_running) + " must be >= 1");
  if (a.concurrency < 1) return invalid_argument("--concurrency " + std::to_string(a.concurrency) + " must be >= 1");
  if (s.request_limits.max_images_per_request < 0) return invalid_argument("--max-images-per-request must be >= 0");
  if (a.max_image_input_pixels < 1) return invalid_argument("--max-image-input-pixels must be >= 1");
  if (s.default_max_tokens < 1) return invalid_argument("--default-max-tokens must be >= 1");
  auto body = parse_byte_size(a.max_body);
  if (!body.is_ok()) return body.status().with_context("--max-body-bytes");
  s.max_body_bytes = *body;
  auto img = parse_byte_size(a.max_image_bytes);
  if (!img.is_ok()) return img.status().with_context("--max-image-bytes");
  s.media.max_image_bytes = *img;
  if (a.url_fetch_timeout_s <= 0) return invalid_argument("--url-fetch-timeout must be > 0");
  s.media.url_timeout_ms = static_cast<int>(a.url_fetch_timeout_s * 1000);
  if (!s.media.allowed_media_dir.empty()) {
    struct stat st {};
    if (stat(s.media.allowed_media_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return invalid_argument("--allowed-media-dir '" + s.media.allowed_media_dir + "' is not a directory");
  }
  s.cors_origins = split_commas(a.cors_origins);
  if (a.shutdown_timeout_s < 0) return invalid_argument("--shutdown-timeout must be >= 0");
  return Status::ok();
}

// The model, loaded on a background thread while the server already answers /health with 503.
class Loader {
 public:
  Loader(const ServeArgs& args, server::ApiServer* api) : args_(args), api_(api) {
    thread_ = std::thread([this] { run(); });
  }
  ~Loader() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_; }
  bool failed() const { return failed_; }
  std::shared_ptr<Engine> engine() const {
    std::lock_guard<std::mutex> lock(mu_);
    return engine_;
  }

 private:
  void run() {
    const auto t0 = Clock::now();
    Status s = load();
    if (!s.is_ok()) {
      log_error("qvl serve: loading " + args_.model.name + " failed: " + s.message());
      api_->set_load_error(s);
      failed_ = true;
    } else {
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.1f", secs);
      log_info("qvl serve: " + args_.model.name + " loaded in " + buf + " s; serving as '" +
               args_.server.served_model_name + "'");
    }
    done_ = true;
  }

  Status load() {
    QVL_ASSIGN_OR_RETURN(std::string dir, resolve_model_dir(args_.model));
    auto tokenizer = start_tokenizer_load(dir);  // beside the backend's creation and the upload
    QVL_ASSIGN_OR_RETURN(BackendChoice backend, make_backend(args_.engine));
    QVL_ASSIGN_OR_RETURN(LoadOptions lo,
                         make_load_options(args_.engine, dir, backend.device, args_.concurrency, args_.max_running));
    lo.tokenizer = tokenizer;
    // The HTTP layer admits at most --max-concurrency requests; the engine's queue must hold them
    // all, so that "refused at submit" only ever means "can never fit".
    lo.max_queued = std::max(lo.max_queued, args_.server.max_concurrency);
    QVL_ASSIGN_OR_RETURN(LoadedModel m, load_model(backend.backend, lo));
    if (const std::string fit = auto_fit_report(m); !fit.empty())
      log_info("qvl serve: " + fit.substr(0, fit.size() - 1));

    image::DecodeLimits limits;
    limits.max_file_bytes = args_.server.media.max_image_bytes;
    limits.max_pixels = args_.max_image_input_pixels;
    ChatTemplateOptions tmpl;
    tmpl.merge_size = m.image_options.merge_size;
    server::ModelSession session;
    session.prompt_builder = std::make_shared<server::ModelPromptBuilder>(m.tokenizer, limits, m.image_options, tmpl);
    session.engine = m.engine;
    session.context_length = static_cast<int>(m.context_length);
    const GenerationDefaults& g = m.config.generation;
    session.default_sampling.temperature = g.do_sample ? g.temperature : 0.0f;
    session.default_sampling.top_p = g.top_p;
    session.default_sampling.top_k = g.top_k;
    session.default_sampling.repetition_penalty = g.repetition_penalty;
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine_ = m.engine;
    }
    api_->set_model(std::move(session));
    return Status::ok();
  }

  const ServeArgs& args_;
  server::ApiServer* api_;
  mutable std::mutex mu_;
  std::shared_ptr<Engine> engine_;
  std::atomic<bool> done_{false}, failed_{false};
  std::thread thread_;
};

// Waits for SIGINT/SIGTERM (blocked in every thread, see run_serve) or for `stop_waiting`.
int wait_for_signal(const sigset_t& set, const std::function<bool()>& stop_waiting) {
  while (!stop_waiting()) {
    timespec ts{0, 100 * 1000 * 1000};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
  }
  return 0;
}

int run_serve(ServeArgs& args) {
  Status ok = finish_options(args);
  if (!ok.is_ok()) {
    std::fprintf(stderr, "qvl serve: %s\n", ok.message().c_str());
    return 2;
  }
  // Before any thread exists, so that every thread inherits the mask: the signals are taken
  // only by sigtimedwait below. SIGPIPE (a client gone mid-write) is ignored; writes report it.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // glibc gives each thread that allocates under contention an arena of its own, up to 8 per
  // core, and keeps their pages. A server whose connections wander over a pool of dozens of HTTP
  // workers would let resident memory creep up with every newly used worker; a few shared arenas
  // keep it flat (the hot paths allocate little: the engine works in planned buffers).
  mallopt(M_ARENA_MAX, 4);

  server::ApiServer api(args.server);
  Status bound = api.bind();
  if (!bound.is_ok()) {
    std::fprintf(stderr, "qvl serve: %s\n", bound.message().c_str());
    return 1;
  }
  api.start();
  log_info("qvl serve: listening on http://" + args.server.host + ":" + std::to_string(api.port()) + " (loading " +
           args.model.name + "; /health answers 503 until it is ready)");

  Loader loader(args, &api);
  int sig = wait_for_signal(set, [&] { return loader.failed(); });
  if (sig == 0) {  // the model failed to load: nothing to drain
    api.stop();
    loader.join();
    return 1;
  }

  const auto deadline = std::chrono::milliseconds(static_cast<int64_t>(args.shutdown_timeout_s * 1000));
  log_info(std::string("qvl serve: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ": shutting down; no new requests, " +
           std::to_string(api.in_flight()) + " in flight get up to " + std::to_string(deadline.count() / 1000) +
           " s (signal again to exit now)");
  api.drain();
  if (!loader.done()) {
    // Loading cannot be interrupted midway; nothing is being served, so leave at once.
    log_info("qvl serve: exiting while the model is still loading");
    api.stop();
    std::fflush(stderr);
    std::_Exit(0);
  }
  // Shutdown runs on its own thread so that a second signal can still cut it short.
  std::atomic<bool> finished{false};
  std::thread stopper([&] {
    if (auto engine = loader.engine()) engine->shutdown(deadline);
    api.stop();
    finished = true;
  });
  if (wait_for_signal(set, [&] { return finished.load(); }) != 0) {
    log_warn("qvl serve: second signal: exiting without waiting");
    std::fflush(stderr);
    std::_Exit(1);
  }
  stopper.join();
  loader.join();
  log_info("qvl serve: stopped cleanly");
  return 0;
}

std::function<int()> setup_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  server::ServerOptions& s = a->server;
  app.add_option("model,--model", a->model.name,
                 "Model directory, built-in name (tiny, tiny-untied, tiny-fp8) or hub id (Qwen/Qwen3-VL-2B-Instruct)")
      ->required();
  app.add_option("--revision", a->model.revision, "Hub revision: branch, tag or snapshot hash (default main)");
  add_engine_args(app, &a->engine);
  app.add_option("--concurrency", a->concurrency, "Sequences the memory plan holds at full context at once (1)");
  app.add_option("--max-running", a->max_running, "Sequences in the running batch (16)");
  app.add_option("--host", s.host, "Address to listen on (127.0.0.1)");
  app.add_option("--port", s.port, "Port to listen on; 0 picks a free one (8000)");
  app.add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' on /v1/* (default: $QVL_API_KEY)");
  app.add_option("--served-model-name", s.served_model_name, "Model id in /v1/models and responses (the MODEL)");
  app.add_option("--max-concurrency", s.max_concurrency, "Chat requests held at once; more get 429 (64)");
  app.add_option("--max-images-per-request", s.request_limits.max_images_per_request, "Images per request (8)");
  app.add_option("--max-image-input-pixels", a->max_image_input_pixels,
                 "Refuse images larger than this many pixels, before decoding (67108864)");
  app.add_option("--max-image-bytes", a->max_image_bytes, "Refuse encoded images larger than this (20MiB)");
  app.add_option("--allowed-media-dir", s.media.allowed_media_dir,
                 "Accept file:// image URLs inside this directory only (off)");
  app.add_flag("--allow-url-fetch", s.media.allow_url_fetch, "Fetch http(s):// image URLs (off)");
  app.add_option("--url-fetch-timeout", a->url_fetch_timeout_s, "Seconds per image URL fetch (10)");
  app.add_option("--cors-origins", a->cors_origins, "Comma-separated origins allowed by CORS; * for any (none)");
  app.add_option("--max-body-bytes", a->max_body, "Largest request body; more gets 413 (32MiB)");
  app.add_option("--default-max-tokens", s.default_max_tokens,
                 "Completion tokens when a request sets no max_tokens, capped by the context (2048)");
  app.add_option("--shutdown-timeout", a->shutdown_timeout_s,
                 "Seconds running requests get to finish after SIGINT/SIGTERM (30)");
  return [a] { return run_serve(*a); };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("serve", "OpenAI-compatible HTTP server (chat completions with images, SSE, metrics)",
                     qvl::cli::setup_serve);
