// qvl pull ORG/NAME: downloads a checkpoint into the Hugging Face cache (io/download.h) so
// that `--model ORG/NAME` resolves, then validates it as `qvl check-model` does (config, every
// shard header, every tensor bound by name, dtype and shape) and prints the command to use it.
// Progress goes to stderr (one updating line on a terminal, a line per file otherwise); the
// summary to stdout. Exit 0 when the model was pulled and validates, 1 otherwise.
//
// The environment, read here only: $HF_ENDPOINT (--endpoint), $HF_TOKEN (--token), else the
// token file `huggingface-cli login` writes ($HF_TOKEN_PATH, $HF_HOME/token or
// ~/.cache/huggingface/token), and $HF_HOME for the cache (--hub-dir).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "cli/command.h"
#include "cli/model_args.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/download.h"
#include "io/hub.h"
#include "model/bind.h"

namespace qvl::cli {
namespace {

struct PullArgs {
  std::string repo;
  std::string revision = "main";
  std::string hub_dir;
  std::string endpoint;
  std::string token;
  std::vector<std::string> include;
  int max_retries = 5;
  bool quiet = false;
};

std::string default_token() {
  std::string token = env_or("HF_TOKEN", "");
  if (!token.empty()) return token;
  std::string path = env_or("HF_TOKEN_PATH", "");
  if (path.empty()) {
    const std::string hf_home = env_or("HF_HOME", "");
    path = hf_home.empty() ? env_or("HOME", ".") + "/.cache/huggingface/token" : hf_home + "/token";
  }
  std::ifstream in(path);
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  return token;
}

std::string mb(uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (bytes < 1000)
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  else if (bytes < 1000000)
    std::snprintf(buf, sizeof(buf), "%.1f kB", b / 1e3);
  else if (bytes < 1000000000)
    std::snprintf(buf, sizeof(buf), "%.1f MB", b / 1e6);
  else
    std::snprintf(buf, sizeof(buf), "%.2f GB", b / 1e9);
  return buf;
}

// Renders PullProgress on stderr: bytes, MB/s over the pull so far, ETA for what is left.
class ProgressPrinter {
 public:
  // On a terminal the progress line is redrawn 5 times a second; in a log, a line every 10 s
  // (the first after 10 s, so small files do not print one).
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), tty_(::isatty(2) == 1), last_(tty_ ? -1e9 : 0) {}

  void operator()(const PullProgress& p) {
    if (quiet_) return;
    using Event = PullProgress::Event;
    const double now = seconds();
    if (p.event == Event::kStart) file_start_ = now, file_fetched_start_ = p.fetched;
    if (p.event == Event::kCached) {
      line("  cached   " + p.file + "  " + mb(p.file_total));
    } else if (p.event == Event::kDone) {
      const double dt = std::max(now - file_start_, 1e-3);
      line("  fetched  " + p.file + "  " + mb(p.file_total) + " in " + fixed(dt, 1) + " s (" +
           fixed(static_cast<double>(p.fetched - file_fetched_start_) / 1e6 / dt, 1) + " MB/s)");
    } else if (p.event == Event::kBytes && now - last_ >= (tty_ ? 0.2 : 10.0)) {
      last_ = now;
      const double rate = static_cast<double>(p.fetched) / std::max(now, 1e-3);  // bytes/s since the start
      std::string eta = "--:--";
      if (rate > 0 && p.total >= p.done) {
        const auto left = static_cast<int64_t>(static_cast<double>(p.total - p.done) / rate);
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(left / 60),
                      static_cast<long long>(left % 60));
        eta = buf;
      }
      const std::string text = "  " + p.file + "  " + mb(p.file_done) + " / " + mb(p.file_total) + "  total " +
                               mb(p.done) + " / " + mb(p.total) + "  " + fixed(rate / 1e6, 1) + " MB/s  ETA " + eta;
      if (tty_) {
        std::fprintf(stderr, "\r\033[K%s", text.c_str());
        pending_ = true;
      } else {
        std::fprintf(stderr, "%s\n", text.c_str());
      }
    }
  }

 private:
  static std::string fixed(double v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
    return buf;
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  void line(const std::string& text) {
    std::fprintf(stderr, "%s%s\n", pending_ ? "\r\033[K" : "", text.c_str());
    pending_ = false;
  }

  bool quiet_, tty_;
  bool pending_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_, file_start_ = 0;
  uint64_t file_fetched_start_ = 0;
};

// The same checks as `qvl check-model`: config, shard headers, every tensor bound.
Status validate(const std::string& dir, std::string* summary) {
  QVL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  QVL_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::open(dir));
  BindReport report;
  QVL_ASSIGN_OR_RETURN(ModelWeights weights, bind_host_weights(ck, config, &report));
  (void)weights;
  *summary = config.architecture + ", text " + std::to_string(config.text.num_hidden_layers) + " layers x " +
             std::to_string(config.text.hidden_size) + ", vision " + std::to_string(config.vision.depth) +
             " blocks x " + std::to_string(config.vision.hidden_size) + "; " + std::to_string(ck.tensors().size()) +
             " tensors, " + mb(ck.total_bytes()) + " in " + std::to_string(ck.files().size()) + " shard" +
             (ck.files().size() == 1 ? "" : "s") + "; " +
             (config.quant.fp8 ? std::to_string(report.fp8_linears) + " block-FP8 Linears"
                               : std::to_string(report.bf16_linears) + " BF16 Linears");
  return Status::ok();
}

int run(const PullArgs& args) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "qvl pull: %s\n", s.message().c_str());
    return 1;
  };
  PullOptions o;
  o.repo_id = args.repo;
  o.revision = args.revision;
  o.hub_dir = args.hub_dir.empty() ? default_hub_dir() : args.hub_dir;
  o.endpoint = args.endpoint.empty() ? env_or("HF_ENDPOINT", "https://huggingface.co") : args.endpoint;
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  o.include = args.include;
  o.http.token = args.token.empty() ? default_token() : args.token;
  o.http.max_retries = args.max_retries;
  o.http.user_agent = "qvl/0.1.0";
  ProgressPrinter printer(args.quiet);
  o.on_progress = [&printer](const PullProgress& p) { printer(p); };

  if (!args.quiet)
    std::fprintf(stderr, "pulling %s revision %s from %s into %s\n", o.repo_id.c_str(), o.revision.c_str(),
                 o.endpoint.c_str(), o.hub_dir.c_str());
  auto pulled = pull_model(o);
  if (!pulled.is_ok()) return fail(pulled.status());
  const PullResult& r = *pulled;
  std::printf("pulled %s revision %s (commit %s) into %s\n", o.repo_id.c_str(), o.revision.c_str(), r.commit.c_str(),
              r.snapshot_dir.c_str());
  std::printf("  %zu files, %s: %d downloaded (%s received), %d already in the cache\n", r.files.size(),
              mb(r.bytes_total).c_str(), r.files_fetched, mb(r.bytes_fetched).c_str(), r.files_cached);

  // The name must now resolve exactly as `--model` will resolve it.
  auto resolved = resolve_hub_snapshot(o.hub_dir, o.repo_id, o.revision);
  if (!resolved.is_ok()) return fail(resolved.status());
  std::string summary;
  Status valid = validate(*resolved, &summary);
  if (!valid.is_ok()) return fail(valid.with_context("the pulled model does not pass check-model"));
  std::printf("check-model: OK: %s\n", summary.c_str());

  std::string model = o.repo_id, prefix;
  if (o.revision != "main") model += " --revision " + o.revision;
  if (o.hub_dir != default_hub_dir()) {
    const std::string suffix = "/hub";
    const std::string& h = o.hub_dir;
    if (h.size() > suffix.size() && h.compare(h.size() - suffix.size(), suffix.size(), suffix) == 0)
      prefix = "HF_HOME=" + h.substr(0, h.size() - suffix.size()) + " ";
    else
      model = r.snapshot_dir;  // no HF_HOME makes this directory the hub cache: name the snapshot
  }
  std::printf("use it:\n  %sqvl run --model %s --image photo.jpg --task caption\n  %sqvl serve %s\n", prefix.c_str(),
              model.c_str(), prefix.c_str(), model.c_str());
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto args = std::make_shared<PullArgs>();
  app.add_option("repo", args->repo, "Hub model id, e.g. Qwen/Qwen3-VL-4B-Instruct-FP8")->required();
  app.add_option("--revision", args->revision, "Branch, tag or commit (default main)");
  app.add_option("--hub-dir", args->hub_dir,
                 "Hugging Face cache to fill (default $HF_HOME/hub or ~/.cache/huggingface/hub)");
  app.add_option("--endpoint", args->endpoint, "Hub URL (default $HF_ENDPOINT or https://huggingface.co)");
  app.add_option(
      "--token", args->token,
      "Access token for gated or private models (default $HF_TOKEN, else the `huggingface-cli login` token)");
  app.add_option("--include", args->include,
                 "Also download the files matching this glob (repeatable; '*' also matches '/')")
      ->allow_extra_args(false);
  app.add_option("--max-retries", args->max_retries, "Retries per request after a network failure or HTTP 5xx")
      ->check(CLI::Range(0, 100));
  app.add_flag("--quiet", args->quiet, "No progress on stderr");
  return [args] { return run(*args); };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("pull", "Download a model from the Hugging Face Hub into the Hugging Face cache", qvl::cli::setup);
