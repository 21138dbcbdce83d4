// The OpenAI-compatible HTTP server behind `qvl serve` (cpp-httplib underneath).
//
// Routes: GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions (JSON or SSE),
// OPTIONS * for CORS preflight. Lifecycle: bind() -> start() (listens on its own thread) ->
// set_model() once the model has loaded in the background (/health answers 503 until then) ->
// drain() on SIGINT/SIGTERM (new chat requests get 503, in-flight ones finish or are cancelled
// by the engine's deadline) -> stop() (closes the socket, joins every worker).
//
// Per request, everything a client can get wrong is checked before the engine sees it: the API
// key, the body size, the JSON schema and ranges, the image count, fetching and decoding the
// images, the chat template, the prompt length against the context. A client that disconnects
// is noticed within one poll interval (kPollInterval) and its RequestStream is destroyed, which
// cancels the sequence in the engine. A CheckFailure (a bug) inside one request becomes a 500
// for that request only; the server keeps serving.
//
// Threads: one listener plus a fixed pool of http_threads workers created at start() and
// joined at stop(); the count never grows with load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "server/chat_request.h"
#include "server/media.h"
#include "server/metrics.h"
#include "server/model_session.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace qvl::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                // 0 -> an ephemeral port (see ApiServer::port())
  std::string api_key;            // "" -> no authentication
  std::string served_model_name;  // the id in /v1/models and in responses
  int max_concurrency = 64;       // chat requests in flight at once; more get 429
  int64_t max_body_bytes = 32ll << 20;
  ChatRequestLimits request_limits;
  MediaPolicy media;
  std::vector<std::string> cors_origins;  // "*" allows any origin; empty -> no CORS headers
  int default_max_tokens = 2048;          // when the request sets none (capped by the context)
  int http_threads = 0;                   // 0 -> max_concurrency + 8
  int keep_alive_timeout_s = 5;
};

class ApiServer {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{50};

  explicit ApiServer(ServerOptions options);
  ~ApiServer();  // stops and joins if still running
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket (kUnavailable with the address if it is taken).
  Status bind();
  int port() const { return bound_port_; }
  // Starts accepting on a background thread.
  void start();
  // The model is ready: /health turns 200 and chat requests are served.
  void set_model(ModelSession session);
  // Loading failed: /health answers 503 with this message from now on.
  void set_load_error(const Status& status);
  // Stops admitting chat requests (503); requests already admitted continue.
  void drain();
  // Chat requests currently being served.
  int in_flight() const;
  // Stops listening, waits for the workers (each in-flight request must already have been
  // finished or cancelled by the engine's shutdown), and joins every thread.
  void stop();

  const Metrics& metrics() const { return *metrics_; }

 private:
  struct State;
  void install_routes();
  void handle_chat(const httplib::Request& req, httplib::Response& res);

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<Metrics> metrics_;
  std::shared_ptr<State> state_;
  std::thread listener_;
  std::atomic<bool> listener_done_{false};
  int bound_port_ = -1;
};

}  // namespace qvl::server
