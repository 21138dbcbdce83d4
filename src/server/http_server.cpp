#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"
#include "server/chat_response.h"
#include "server/connection_probe.h"

namespace qvl::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.to_json(), "application/json");
}

ApiError make_error(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

const char* endpoint_label(const std::string& path) {
  if (path == "/v1/chat/completions") return "chat_completions";
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return "models";
  if (path == "/health") return "health";
  if (path == "/metrics") return "metrics";
  return "other";
}

// Constant-time comparison, so the API key cannot be recovered from response timing.
bool equal_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

struct ApiServer::State {
  mutable std::mutex mu;
  std::shared_ptr<const ModelSession> session;
  Status load_error;
  std::atomic<bool> draining{false};
  std::atomic<int> in_flight{0};
  int64_t started_unix = static_cast<int64_t>(std::time(nullptr));

  std::shared_ptr<const ModelSession> model() const {
    std::lock_guard<std::mutex> lock(mu);
    return session;
  }
};

namespace {

// Holds one slot of --max-concurrency for as long as a chat request lives (for a stream, until
// the last byte is written or the client is gone).
class InFlightSlot {
 public:
  explicit InFlightSlot(std::atomic<int>* counter) : counter_(counter) { counter_->fetch_add(1); }
  ~InFlightSlot() { counter_->fetch_sub(1); }
  InFlightSlot(const InFlightSlot&) = delete;
  InFlightSlot& operator=(const InFlightSlot&) = delete;

 private:
  std::atomic<int>* counter_;
};

// Per-request latency bookkeeping for the TTFT and inter-token histograms.
struct TokenClock {
  Clock::time_point arrival;
  Clock::time_point first;
  Clock::time_point last;
  bool first_seen = false;

  void on_tokens(size_t n, Metrics* metrics) {
    if (n == 0) return;
    const auto now = Clock::now();
    if (!first_seen) {
      // Tokens that come with the first one have no measurable interval; only TTFT counts.
      metrics->observe_ttft(std::chrono::duration<double>(now - arrival).count());
      first = now;
      first_seen = true;
    } else {
      // Tokens that arrive together share the interval evenly.
      const double dt = std::chrono::duration<double>(now - last).count() / static_cast<double>(n);
      for (size_t i = 0; i < n; ++i) metrics->observe_inter_token(dt);
    }
    last = now;
  }
};

// Counts a finished request and writes its access-log line.
void record_finish(Metrics* metrics, const std::string& id, const GenerationEvent& ev, const TokenClock& clock,
                   const char* reason) {
  const double total = seconds_since(clock.arrival);
  metrics->count_finished(reason, ev.usage.prompt_tokens, ev.usage.completion_tokens);
  metrics->observe_e2e(total);
  char line[160];
  std::snprintf(line, sizeof line, ": %s, %d prompt + %d completion tokens, %.0f ms to the first token, %.0f ms in all",
                reason, ev.usage.prompt_tokens, ev.usage.completion_tokens,
                clock.first_seen ? std::chrono::duration<double, std::milli>(clock.first - clock.arrival).count() : 0.0,
                total * 1000);
  log_info(id + line);
}

// The answer to a request that the engine ended without a normal finish.
ApiError error_for_abnormal_finish(const GenerationEvent& ev) {
  if (ev.finish_reason == FinishReason::kCancelled)
    return make_error(503, "server_error", "the request was cancelled: the server is shutting down");
  Status s = ev.error.is_ok() ? internal_error("generation ended with an error but no status") : ev.error;
  return api_error_from_status(s);
}

// Everything a streamed request needs after the handler has returned: httplib calls the
// content provider later, on the same worker thread, and destroys it (and this) when the
// response is done or the client is gone. Destroying `stream` cancels the engine sequence.
struct StreamJob {
  std::unique_ptr<InFlightSlot> slot;
  std::unique_ptr<RequestStream> stream;
  ResponseMeta meta;
  std::vector<int32_t> prompt_ids;
  ConnectionProbe probe;
  Metrics* metrics = nullptr;
  TokenClock clock;

  // Writes the whole stream. Returns false when the client went away.
  bool run(httplib::DataSink& sink) {
    auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
    if (!write(sse_role_chunk(meta, prompt_ids))) return cancel("client closed the stream");
    while (true) {
      std::optional<GenerationEvent> ev = stream->next(ApiServer::kPollInterval);
      // Checked on every event as well as on timeouts: a busy engine may never time out, and a
      // write into a closed socket can still succeed once (it only fills the kernel buffer).
      if (probe.peer_closed() || (!ev && !sink.is_writable())) return cancel("client disconnected");
      if (!ev) continue;
      clock.on_tokens(ev->token_ids.size(), metrics);
      if (!ev->text.empty() || (meta.return_token_ids && !ev->token_ids.empty())) {
        if (!write(sse_content_chunk(meta, ev->text, ev->token_ids))) return cancel("client disconnected");
      }
      if (ev->kind != GenerationEvent::Kind::kFinished) continue;
      const char* reason = openai_finish_reason(ev->finish_reason);
      if (*reason) {
        record_finish(metrics, meta.id, *ev, clock, reason);
        bool ok = write(sse_finish_chunk(meta, ev->finish_reason));
        if (ok && meta.include_usage) ok = write(sse_usage_chunk(meta, ev->usage));
        return ok && write(kSseDone);
      }
      record_finish(metrics, meta.id, *ev, clock,
                    ev->finish_reason == FinishReason::kCancelled ? "cancelled" : "error");
      ApiError e = error_for_abnormal_finish(*ev);
      log_warn("request " + meta.id + " ended in the stream: " + e.message);
      return write(sse_error_event(e.to_json())) && write(kSseDone);
    }
  }

  bool cancel(const char* why) {
    log_info(meta.id + ": cancelled, " + why);
    stream->cancel();
    metrics->count_finished("cancelled", 0, 0);
    return false;
  }
};

}  // namespace

ApiServer::ApiServer(ServerOptions options)
    : options_(std::move(options)),
      http_(std::make_unique<httplib::Server>()),
      metrics_(std::make_unique<Metrics>()),
      state_(std::make_shared<State>()) {
  QVL_CHECK_GT(options_.max_concurrency, 0);
  const int threads = options_.http_threads > 0 ? options_.http_threads : options_.max_concurrency + 8;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  http_->set_keep_alive_timeout(options_.keep_alive_timeout_s);
  http_->set_tcp_nodelay(true);  // SSE chunks are small and latency-bound
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half the connections. Only SO_REUSEADDR: a restart can rebind at once, a
  // second instance fails to bind.
  http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  install_routes();
}

ApiServer::~ApiServer() {
  stop();
}

Status ApiServer::bind() {
  if (options_.port == 0) {
    bound_port_ = http_->bind_to_any_port(options_.host);
  } else if (http_->bind_to_port(options_.host, options_.port)) {
    bound_port_ = options_.port;
  } else {
    bound_port_ = -1;
  }
  if (bound_port_ <= 0)
    return unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                       " (address in use or not available)");
  return Status::ok();
}

void ApiServer::start() {
  QVL_CHECK_GT(bound_port_, 0) << "bind() must succeed before start()";
  QVL_CHECK(!listener_.joinable()) << "start() called twice";
  listener_done_ = false;
  listener_ = std::thread([this] {
    http_->listen_after_bind();
    listener_done_ = true;
  });
  // httplib's stop() does nothing until the listener has marked itself running, so a stop()
  // right after start() would leave it blocked in accept() forever: wait for that mark.
  while (!http_->is_running() && !listener_done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void ApiServer::set_model(ModelSession session) {
  QVL_CHECK(session.engine && session.prompt_builder) << "set_model needs an engine and a prompt builder";
  QVL_CHECK_GT(session.context_length, 0);
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->session = std::make_shared<const ModelSession>(std::move(session));
}

void ApiServer::set_load_error(const Status& status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->load_error = status;
}

void ApiServer::drain() {
  state_->draining = true;
}

int ApiServer::in_flight() const {
  return state_->in_flight.load();
}

void ApiServer::stop() {
  if (http_) http_->stop();
  if (listener_.joinable()) listener_.join();
}

void ApiServer::install_routes() {
  auto state = state_;
  Metrics* metrics = metrics_.get();
  const ServerOptions& opt = options_;

  http_->set_pre_routing_handler([&opt](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = req.get_header_value("Origin");
    bool cors = false;
    if (!origin.empty()) {
      for (const auto& o : opt.cors_origins) cors = cors || o == "*" || o == origin;
    }
    if (cors) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {  // preflight: answered here, before authentication
      if (cors) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
      }
      res.set_header("Allow", "GET, POST, OPTIONS");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!opt.api_key.empty() && req.path.rfind("/v1/", 0) == 0) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      ApiError e = make_error(401, "invalid_request_error", "", "invalid_api_key");
      if (auth.empty()) {
        e.message = "missing API key: send the header 'Authorization: Bearer <key>'";
      } else if (auth.rfind(prefix, 0) != 0 || !equal_secret(auth.substr(prefix.size()), opt.api_key)) {
        e.message = "incorrect API key provided";
      } else {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      send_error(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Responses httplib produces itself (unknown route, body over the limit, malformed HTTP)
  // get an OpenAI-shaped body too. Called for every status >= 400; keeps bodies we set.
  http_->set_error_handler(
      httplib::Server::HandlerWithResponse([&opt](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.http_status = res.status;
        if (res.status == 413) {
          const std::string len = req.get_header_value("Content-Length");
          e.message = (len.empty() ? std::string("request body") : "request body of " + len + " bytes") +
                      " exceeds the limit of " + std::to_string(opt.max_body_bytes) + " bytes (--max-body-bytes)";
          e.code = "request_too_large";
        } else if (res.status == 404) {
          e.message = "no route for " + req.method + " " + req.path;
        } else if (res.status == 405) {
          e.message = "method " + req.method + " is not allowed on " + req.path;
        } else {
          e.message = "HTTP error " + std::to_string(res.status);
        }
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));

  http_->set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log_error("internal error in " + req.method + " " + req.path + ": " + what);
    send_error(res, make_error(500, "server_error", "internal error: " + what));
  });

  http_->set_logger([metrics](const httplib::Request& req, const httplib::Response& res) {
    metrics->count_http_request(endpoint_label(req.path), res.status);
    log_debug(req.method + " " + req.path + " -> " + std::to_string(res.status));
  });

  http_->Get("/health", [state](const httplib::Request&, httplib::Response& res) {
    if (state->draining) return send_error(res, make_error(503, "server_error", "the server is shutting down"));
    if (state->model()) return res.set_content("{\"status\":\"ok\"}", "application/json");
    std::lock_guard<std::mutex> lock(state->mu);
    if (!state->load_error.is_ok())
      return send_error(res, make_error(503, "server_error", "model failed to load: " + state->load_error.message()));
    send_error(res, make_error(503, "server_error", "the model is loading"));
  });

  http_->Get("/metrics", [state, metrics](const httplib::Request&, httplib::Response& res) {
    std::optional<EngineStats> stats;
    if (auto m = state->model()) stats = m->engine->stats();
    res.set_content(metrics->render(stats, state->in_flight.load()), "text/plain; version=0.0.4; charset=utf-8");
  });

  auto model_json = [state, &opt]() {
    json m = {
        {"id", opt.served_model_name}, {"object", "model"}, {"created", state->started_unix}, {"owned_by", "qvl"}};
    if (auto s = state->model()) m["max_model_len"] = s->context_length;
    return m;
  };
  http_->Get("/v1/models", [model_json](const httplib::Request&, httplib::Response& res) {
    json body = {{"object", "list"}, {"data", json::array({model_json()})}};
    res.set_content(body.dump(), "application/json");
  });
  http_->Get(R"(/v1/models/(.+))", [model_json, &opt](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != opt.served_model_name)
      return send_error(
          res, make_error(404, "invalid_request_error",
                          "the model '" + std::string(req.matches[1]) + "' does not exist", "model_not_found"));
    res.set_content(model_json().dump(), "application/json");
  });

  http_->Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { handle_chat(req, res); });
}

}  // namespace qvl::server

namespace qvl::server {

void ApiServer::handle_chat(const httplib::Request& req, httplib::Response& res) {
  TokenClock clock;
  clock.arrival = Clock::now();
  if (state_->draining) return send_error(res, make_error(503, "server_error", "the server is shutting down"));
  std::shared_ptr<const ModelSession> model = state_->model();
  if (!model)
    return send_error(res, make_error(503, "server_error", "the model is loading; retry when /health is 200"));
  auto slot = std::make_unique<InFlightSlot>(&state_->in_flight);
  if (state_->in_flight.load() > options_.max_concurrency)
    return send_error(res, make_error(429, "rate_limit_error",
                                      "the server is at its limit of " + std::to_string(options_.max_concurrency) +
                                          " concurrent requests (--max-concurrency); retry later",
                                      "too_many_requests"));

  // 1. Schema and ranges.
  ApiResult<ChatRequest> parsed = parse_chat_request(req.body, options_.request_limits, model->default_sampling);
  if (!parsed.is_ok()) return send_error(res, parsed.error());
  ChatRequest chat = std::move(parsed).value();
  if (!chat.model.empty() && chat.model != options_.served_model_name)
    return send_error(res, make_error(404, "invalid_request_error",
                                      "the model '" + chat.model + "' does not exist; this server serves '" +
                                          options_.served_model_name + "'",
                                      "model_not_found"));

  // 2. Image bytes, under the media policy.
  std::vector<ImageBytes> images;
  images.reserve(chat.images.size());
  for (const ImageRef& ref : chat.images) {
    Result<std::string> bytes = load_image_bytes(ref.url, options_.media);
    if (!bytes.is_ok())
      return send_error(res, api_error_from_status(bytes.status().with_context(ref.param), ref.param));
    images.push_back({std::move(bytes).value(), ref.param});
  }

  // 3. Chat template, tokenization and image preprocessing.
  Result<BuiltPrompt> built = model->prompt_builder->build(chat.messages, images);
  if (!built.is_ok()) {
    // Image errors start with the part's JSON path (PromptBuilder's contract): point param at it.
    std::string param = "messages";
    for (const ImageRef& ref : chat.images)
      if (built.status().message().rfind(ref.param + ":", 0) == 0) param = ref.param;
    return send_error(res, api_error_from_status(built.status(), param));
  }
  BuiltPrompt prompt = std::move(built).value();
  images.clear();  // the encoded bytes are no longer needed while generating

  // 4. Prompt and completion against the context.
  const int context = model->context_length;
  const int prompt_tokens = static_cast<int>(prompt.prompt_ids.size());
  if (chat.max_tokens) {
    if (static_cast<int64_t>(prompt_tokens) + *chat.max_tokens > context)
      return send_error(
          res, bad_request(
                   "this model's maximum context length is " + std::to_string(context) + " tokens; the request needs " +
                       std::to_string(static_cast<int64_t>(prompt_tokens) + *chat.max_tokens) + " (" +
                       std::to_string(prompt_tokens) + " in the messages, of which " +
                       std::to_string(prompt.image_tokens) + " image tokens, and " + std::to_string(*chat.max_tokens) +
                       " for the completion); shorten the messages or lower max_tokens",
                   "messages", "context_length_exceeded"));
    chat.sampling.max_tokens = *chat.max_tokens;
  } else {
    if (prompt_tokens >= context)
      return send_error(
          res, bad_request("this model's maximum context length is " + std::to_string(context) +
                               " tokens; the messages have " + std::to_string(prompt_tokens) + " (of which " +
                               std::to_string(prompt.image_tokens) + " image tokens), leaving no room for a completion",
                           "messages", "context_length_exceeded"));
    chat.sampling.max_tokens = std::min(options_.default_max_tokens, context - prompt_tokens);
  }

  // 5. Queue it.
  ResponseMeta meta;
  meta.id = new_completion_id();
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.model = options_.served_model_name;
  meta.include_usage = chat.include_usage;
  meta.return_token_ids = chat.return_token_ids;
  res.set_header("X-Request-Id", meta.id);
  GenerationRequest gen;
  gen.prompt_ids = prompt.prompt_ids;
  gen.images = std::move(prompt.images);
  gen.sampling = std::move(chat.sampling);
  gen.request_id = meta.id;
  Result<std::unique_ptr<RequestStream>> submitted = model->engine->submit(std::move(gen));
  if (!submitted.is_ok()) {
    const Status& s = submitted.status();
    // The engine refuses only what can never run here: a client-side 400, with its numbers.
    if (s.code() == StatusCode::kOutOfRange || s.code() == StatusCode::kResourceExhausted)
      return send_error(res, bad_request(s.message(), "messages", "context_length_exceeded"));
    return send_error(res, api_error_from_status(s));
  }
  std::unique_ptr<RequestStream> stream = std::move(submitted).value();
  ConnectionProbe probe = ConnectionProbe::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);

  if (chat.stream) {
    auto job = std::make_shared<StreamJob>();
    job->slot = std::move(slot);
    job->stream = std::move(stream);
    job->meta = std::move(meta);
    job->prompt_ids = std::move(prompt.prompt_ids);
    job->probe = probe;
    job->metrics = metrics_.get();
    job->clock = clock;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // tell reverse proxies not to buffer the stream
    res.set_chunked_content_provider(
        "text/event-stream",
        [job](size_t, httplib::DataSink& sink) {
          bool ok = false;
          try {
            ok = job->run(sink);
          } catch (const std::exception& e) {  // a bug in this request only: report it, keep serving
            log_error("request " + job->meta.id + ": internal error while streaming: " + e.what());
            job->stream->cancel();
            const std::string event =
                sse_error_event(make_error(500, "server_error", std::string("internal error: ") + e.what()).to_json());
            ok = sink.write(event.data(), event.size());
          }
          if (ok) sink.done();
          return ok;
        },
        [job](bool) { job->stream.reset(); });  // cancels the sequence if it is still running
    return;
  }

  // Non-streamed: wait for the end, watching the connection.
  std::string text;
  std::vector<int32_t> token_ids;
  while (true) {
    std::optional<GenerationEvent> ev = stream->next(kPollInterval);
    // Checked on every event too: a busy engine may never let next() time out. poll() with a
    // zero timeout costs about a microsecond.
    if (probe.peer_closed()) {
      log_info(meta.id + ": cancelled, client disconnected");
      stream->cancel();
      metrics_->count_finished("cancelled", 0, 0);
      res.status = 499;  // nginx's "client closed request"; nobody reads it
      return;
    }
    if (!ev) continue;
    clock.on_tokens(ev->token_ids.size(), metrics_.get());
    text += ev->text;
    token_ids.insert(token_ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    if (ev->kind != GenerationEvent::Kind::kFinished) continue;
    const char* reason = openai_finish_reason(ev->finish_reason);
    if (!*reason) {
      record_finish(metrics_.get(), meta.id, *ev, clock,
                    ev->finish_reason == FinishReason::kCancelled ? "cancelled" : "error");
      return send_error(res, error_for_abnormal_finish(*ev));
    }
    record_finish(metrics_.get(), meta.id, *ev, clock, reason);
    res.set_content(completion_json(meta, text, ev->finish_reason, ev->usage, prompt.prompt_ids, token_ids),
                    "application/json");
    return;
  }
}

}  // namespace qvl::server
