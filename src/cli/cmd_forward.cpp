// qvl forward: one prefill of given token ids and preprocessed images, dumping every named
// stage of the model (model/model.h debug hook) and the logits of the last prompt positions as
// raw little-endian float32, for comparisons with the reference (tools/reference/*.py).
//
//   qvl forward --model M --input-ids ids.json [--pixel-values px.f32]... [--grid t,h,w]...
//               --dump DIR [--backend cpu|cuda] [--logits-last N] [--decode-steps N] [--no-stages]
//
// DIR receives <stage>[.<index>].f32 (text stages of a chunked prefill are concatenated in row
// order), logits.f32 [logits_last, vocab], and forward.json (shapes, positions' rope delta,
// greedy tokens of --decode-steps, timings).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/command.h"
#include "cli/emulate_gpu.h"
#include "cli/engine_args.h"
#include "cli/model_args.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "model/runner.h"
#ifdef QVL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qvl::cli {
namespace {

struct ForwardOptions {
  std::string model, revision = "main";
  std::string input_ids;
  std::vector<std::string> pixel_values;
  std::vector<std::string> grids;
  std::string dump;
  std::string backend = "cpu";
  int threads = 0;
  int prefill_chunk = 0;
  int logits_last = 1;
  int decode_steps = 0;
  bool no_stages = false;
  std::string fp8_gemm = "dequant";  // CUDA: FP8 Linears over many rows, w8a8 | dequant (CudaFp8Gemm)
  bool no_cublas_gelu = false;       // CUDA: GELU (tanh) as a pass (CudaBackendOptions::cublas_gelu off)
  bool no_vision_wgmma = false;      // CUDA: CudaBackendOptions::vision_wgmma off
  bool no_prefill_wgmma = false;     // CUDA: CudaBackendOptions::prefill_wgmma off
  std::string emulate_gpu;           // CUDA testing: CudaBackendOptions::emulate_* as "sm_NN[:BYTES]"
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

Result<std::string> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Token ids: raw int32 (.i32), raw int64 (.i64), or text (a JSON array or numbers separated by
// spaces/commas).
Result<std::vector<int32_t>> read_ids(const std::string& path) {
  QVL_ASSIGN_OR_RETURN(std::string bytes, read_bytes(path));
  std::vector<int32_t> ids;
  if (path.ends_with(".i32") || path.ends_with(".i64")) {
    const size_t w = path.ends_with(".i32") ? 4 : 8;
    if (bytes.size() % w != 0)
      return data_loss(path + ": " + std::to_string(bytes.size()) + " bytes is not a whole number of ids");
    for (size_t i = 0; i < bytes.size(); i += w) {
      int64_t v = 0;
      if (w == 4) {
        int32_t x;
        std::memcpy(&x, bytes.data() + i, 4);
        v = x;
      } else {
        std::memcpy(&v, bytes.data() + i, 8);
      }
      ids.push_back(static_cast<int32_t>(v));
    }
  } else {
    for (char& c : bytes)
      if (c == '[' || c == ']' || c == ',') c = ' ';
    std::istringstream in(bytes);
    std::string tok;
    while (in >> tok) {
      try {
        size_t used = 0;
        long long v = std::stoll(tok, &used);
        if (used != tok.size()) throw std::invalid_argument(tok);
        ids.push_back(static_cast<int32_t>(v));
      } catch (const std::exception&) {
        return invalid_argument(path + ": '" + tok + "' is not a token id");
      }
    }
  }
  if (ids.empty()) return invalid_argument(path + ": no token ids");
  return ids;
}

Result<ImageGrid> parse_grid(const std::string& s) {
  ImageGrid g;
  char c1 = 0, c2 = 0;
  std::istringstream in(s);
  if (!(in >> g.t >> c1 >> g.h >> c2 >> g.w) || c1 != ',' || c2 != ',' || !in.eof())
    return invalid_argument("--grid " + s + ": expected t,h,w (patch counts, e.g. 1,16,24)");
  return g;
}

Result<std::unique_ptr<Backend>> make_backend(const ForwardOptions& o) {
  if (o.backend == "cpu") return make_cpu_backend(o.threads);
#ifdef QVL_HAVE_CUDA
  if (o.backend == "cuda") {
    CudaBackendOptions opts;
    opts.fp8_gemm = o.fp8_gemm == "w8a8" ? CudaFp8Gemm::kW8A8 : CudaFp8Gemm::kDequant;
    opts.cublas_gelu = !o.no_cublas_gelu;
    opts.vision_wgmma = !o.no_vision_wgmma;
    opts.prefill_wgmma = !o.no_prefill_wgmma;
    if (!o.emulate_gpu.empty()) QVL_RETURN_IF_ERROR(parse_emulate_gpu(o.emulate_gpu, opts));
    return make_cuda_backend(opts);
  }
#endif
  return invalid_argument("--backend " + o.backend + ": this qvl has " +
#ifdef QVL_HAVE_CUDA
                          "cpu and cuda"
#else
                          "only cpu"
#endif
  );
}

Status write_f32(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!out) return data_loss("cannot write " + path);
  return Status::ok();
}

Status run_forward(const ForwardOptions& o) {
  const auto t_load = Clock::now();
  QVL_ASSIGN_OR_RETURN(std::string dir, resolve_model_dir(ModelArgs{o.model, o.revision}));
  QVL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  QVL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  QVL_ASSIGN_OR_RETURN(ModelWeights host, bind_host_weights(ckpt, config));
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(o));
  QVL_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(*backend, host));
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3VLModel> model, Qwen3VLModel::create(*backend, config, std::move(weights)));
  const double load_ms = ms_since(t_load);

  // Inputs.
  QVL_ASSIGN_OR_RETURN(std::vector<int32_t> ids, read_ids(o.input_ids));
  std::vector<ImageGrid> grids;
  for (const std::string& g : o.grids) {
    QVL_ASSIGN_OR_RETURN(ImageGrid grid, parse_grid(g));
    grids.push_back(grid);
  }
  const int64_t P = config.vision.patch_dim();
  std::vector<float> pixels;
  for (const std::string& f : o.pixel_values) {
    QVL_ASSIGN_OR_RETURN(std::string bytes, read_bytes(f));
    if (bytes.size() % (P * 4) != 0)
      return invalid_argument(f + ": " + std::to_string(bytes.size()) +
                              " bytes is not a whole number of float32 rows of " + std::to_string(P));
    const size_t old = pixels.size();
    pixels.resize(old + bytes.size() / 4);
    std::memcpy(pixels.data() + old, bytes.data(), bytes.size());
  }
  int64_t patches = 0;
  for (const ImageGrid& g : grids) patches += g.num_patches();
  if (static_cast<int64_t>(pixels.size()) != patches * P)
    return invalid_argument("pixel values hold " + std::to_string(pixels.size() / P) + " patches but the " +
                            std::to_string(grids.size()) + " --grid(s) need " + std::to_string(patches));
  std::vector<ImageInput> images;
  int64_t row = 0;
  for (const ImageGrid& g : grids) {
    images.push_back({pixels.data() + row * P, g});
    row += g.num_patches();
  }

  std::error_code ec;
  std::filesystem::create_directories(o.dump, ec);
  if (ec) return invalid_argument("--dump " + o.dump + ": " + ec.message());
  std::map<std::string, std::vector<float>> stages;
  std::map<std::string, int64_t> stage_cols;
  if (!o.no_stages) {
    model->set_debug_hook([&](std::string_view name, int index, const Tensor& t) {
      const std::string key = index < 0 ? std::string(name) : std::string(name) + "." + std::to_string(index);
      std::vector<float>& dst = stages[key];
      const size_t old = dst.size(), n = static_cast<size_t>(t.numel());
      dst.resize(old + n);
      if (t.dtype == DType::kF32) {
        backend->copy_to_host(dst.data() + old, t);
      } else {
        std::vector<uint16_t> tmp(n);
        backend->copy_to_host(tmp.data(), t);
        for (size_t i = 0; i < n; ++i) dst[old + i] = bf16_to_float(tmp[i]);
      }
      stage_cols[key] = t.row_numel();
    });
  }

  SequenceRunner::Options ro;
  ro.max_tokens = static_cast<int>(ids.size()) + o.decode_steps + 1;
  ro.prefill_chunk = o.prefill_chunk;
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<SequenceRunner> runner, SequenceRunner::create(*model, ro));
  const auto t_prefill = Clock::now();
  QVL_ASSIGN_OR_RETURN(std::vector<float> logits, runner->prefill(ids, images, o.logits_last));
  const double prefill_ms = ms_since(t_prefill);
  model->set_debug_hook(nullptr);

  // Greedy decode steps (timing, and tokens for comparisons).
  const int64_t V = config.text.vocab_size;
  std::vector<int64_t> tokens;
  const float* last = logits.data() + logits.size() - V;
  std::vector<float> cur(last, last + V);
  const auto t_decode = Clock::now();
  for (int s = 0; s < o.decode_steps; ++s) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (cur[i] > cur[best]) best = i;
    tokens.push_back(best);
    QVL_ASSIGN_OR_RETURN(cur, runner->decode(static_cast<int32_t>(best)));
  }
  const double decode_ms = ms_since(t_decode);

  // Outputs.
  nlohmann::json meta;
  meta["model"] = dir;
  meta["backend"] = backend->name();
  meta["prompt_tokens"] = ids.size();
  meta["rope_delta"] = runner->rope_delta();
  meta["images"] = nlohmann::json::array();
  for (const ImageGrid& g : grids) meta["images"].push_back({g.t, g.h, g.w});
  QVL_RETURN_IF_ERROR(write_f32(o.dump + "/logits.f32", logits));
  meta["logits_shape"] = {o.logits_last, V};
  for (const auto& [key, v] : stages) {
    QVL_RETURN_IF_ERROR(write_f32(o.dump + "/" + key + ".f32", v));
    meta["stages"][key] = {static_cast<int64_t>(v.size()) / stage_cols[key], stage_cols[key]};
  }
  meta["greedy_tokens"] = tokens;
  meta["timings"] = {{"load_ms", load_ms},
                     {"prefill_ms", prefill_ms},
                     {"prefill_tokens_per_s", ids.size() / (prefill_ms / 1000.0)},
                     {"decode_steps", o.decode_steps},
                     {"decode_ms_per_token", o.decode_steps > 0 ? decode_ms / o.decode_steps : 0.0}};
  std::ofstream(o.dump + "/forward.json") << meta.dump(1) << "\n";
  std::printf("%s\n", meta["timings"].dump().c_str());
  return Status::ok();
}

std::function<int()> setup_forward(CLI::App& app) {
  auto o = std::make_shared<ForwardOptions>();
  app.add_option("--model", o->model, "Model directory, built-in name (tiny...) or hub id")->required();
  app.add_option("--revision", o->revision, "Hub revision (default main)");
  app.add_option("--input-ids", o->input_ids, "Token ids: .json/.txt list, or raw .i32/.i64")->required();
  app.add_option("--pixel-values", o->pixel_values, "float32 pixel_values [patches, 1536]; repeatable, concatenated");
  app.add_option("--grid", o->grids, "Image grid t,h,w in patches, one per image in prompt order");
  app.add_option("--dump", o->dump, "Output directory")->required();
  app.add_option("--backend", o->backend, "cpu | cuda (default cpu)");
  app.add_option("--threads", o->threads, "CPU backend threads (default: all cores)");
  app.add_option("--prefill-chunk", o->prefill_chunk, "Rows per prefill step (default: whole prompt)");
  app.add_option("--logits-last", o->logits_last, "Logits of the last N prompt positions (default 1)");
  app.add_option("--decode-steps", o->decode_steps, "Greedy decode steps after the prefill (timing, tokens)");
  app.add_flag("--no-stages", o->no_stages, "Only logits and forward.json (no stage dumps)");
  app.add_option("--emulate-gpu", o->emulate_gpu,
                 "CUDA testing: choose kernels as on this GPU, \"sm_NN[:BYTES]\" (e.g. sm_120), every launch "
                 "checked against its limits (qvl bench --emulate-gpu)");
  app.add_flag("--no-cublas-gelu", o->no_cublas_gelu,
               "CUDA: GELU (tanh) Linears as a pass after the rounded output, not in cuBLASLt's epilogue");
  add_wgmma_flags(app, &o->no_vision_wgmma, &o->no_prefill_wgmma);
  add_fp8_gemm_option(app, &o->fp8_gemm);
  return [o] {
    Status s = run_forward(*o);
    if (!s.is_ok()) {
      std::fprintf(stderr, "qvl forward: %s\n", s.message().c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("forward", "One prefill with stage dumps and logits (reference comparisons)",
                     qvl::cli::setup_forward);
