// qvl plan: the memory plan of a model on a budget, from config.json alone (or a preset): no
// weights and no GPU needed. With a GPU (and a CUDA build) the budget defaults to its free memory
// minus a reserve and the CUDA overheads use its architecture and SM count.
// Exit status: 0 when the plan fits (or there is no budget to judge), 2 when it does not, 1 on
// errors.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/model_args.h"
#include "io/config.h"
#include "memory/byte_size.h"
#include "memory/plan_report.h"
#include "memory/planner.h"
#include "model/presets.h"

#ifdef QVL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qvl::cli {
namespace {

constexpr int kExitDoesNotFit = 2;

struct PlanArgs {
  std::string model;
  std::string preset;
  std::string revision = "main";
  bool fp8 = false;
  std::string gpu_memory;
  int gpu = 0;
  std::string arch;
  std::string reserve;
  std::string margin;
  std::string cuda_overhead;
  RuntimeOptions options;
  std::string kv_dtype = "bf16";
  bool auto_fit = false;
  bool json = false;
};

int fail(const Status& s) {
  std::fprintf(stderr, "qvl plan: %s\n", s.message().c_str());
  return 1;
}

// "sm_89", "89", "8.9" -> 89.
Result<int> parse_arch(const std::string& text) {
  std::string t = text.rfind("sm_", 0) == 0 ? text.substr(3) : text;
  t.erase(std::remove(t.begin(), t.end(), '.'), t.end());
  if (t.empty() || t.size() > 3 || t.find_first_not_of("0123456789") != std::string::npos)
    return invalid_argument("--arch '" + text + "': expected sm_80, sm_86, sm_89, sm_90 or sm_120");
  return std::stoi(t);
}

Result<int64_t> size_option(const std::string& name, const std::string& text) {
  Result<int64_t> r = parse_byte_size(text);
  if (!r.is_ok()) return r.status().with_context(name);
  return r;
}

Result<DeviceFacts> device_facts(const PlanArgs& a) {
  DeviceFacts d;
  if (!a.arch.empty()) {  // planning for another card: its architecture, no local facts
    QVL_ASSIGN_OR_RETURN(d.compute_capability, parse_arch(a.arch));
    return d;
  }
#ifdef QVL_HAVE_CUDA
  if (cuda_device_count() > 0) {
    QVL_ASSIGN_OR_RETURN(CudaDeviceInfo info, cuda_device_info(a.gpu));
    d.present = true;
    d.name = "GPU " + std::to_string(info.ordinal) + " " + info.name;
    d.compute_capability = info.compute_capability;
    d.sm_count = info.multiprocessors;
    d.total_bytes = static_cast<int64_t>(info.total_memory);
    d.free_bytes = static_cast<int64_t>(info.free_memory);
    return d;
  }
#endif
  if (a.gpu != 0) return not_found("--gpu " + std::to_string(a.gpu) + ": no CUDA device in this qvl build or machine");
  return d;
}

int run_plan(PlanArgs a) {
  if (a.model.empty() == a.preset.empty()) return fail(invalid_argument("give exactly one of --model and --preset"));

  // The configuration: a preset, or config.json (+ preprocessor_config.json) of a model dir.
  ModelConfig config;
  std::string label;
  if (!a.preset.empty()) {
    Result<ModelConfig> c = preset_config(a.preset, a.fp8);
    if (!c.is_ok()) return fail(c.status());
    config = std::move(c).value();
    label = "preset " + a.preset + (config.quant.fp8 ? " (FP8)" : "");
  } else {
    Result<std::string> dir = resolve_model_dir(ModelArgs{a.model, a.revision});
    if (!dir.is_ok()) return fail(dir.status());
    Result<ModelConfig> c = load_model_config(dir.value());
    if (!c.is_ok()) return fail(c.status());
    config = std::move(c).value();
    label = a.model;
  }

  RuntimeOptions& o = a.options;
  o.fp8_weights = a.fp8;
  if (a.kv_dtype == "fp8") {
    o.kv_dtype = DType::kF8E4M3;
  } else if (a.kv_dtype != "bf16") {
    return fail(invalid_argument("--kv-dtype '" + a.kv_dtype + "': expected bf16 or fp8"));
  }
  const std::pair<const char*, std::string*> sizes[] = {{"--gpu-memory", &a.gpu_memory},
                                                        {"--reserve", &a.reserve},
                                                        {"--margin", &a.margin},
                                                        {"--cuda-overhead", &a.cuda_overhead}};
  int64_t* targets[] = {&o.gpu_memory_bytes, &o.reserve_bytes, &o.margin_bytes, &o.cuda_overhead_bytes};
  for (size_t i = 0; i < 4; ++i) {
    if (sizes[i].second->empty()) continue;
    Result<int64_t> v = size_option(sizes[i].first, *sizes[i].second);
    if (!v.is_ok()) return fail(v.status());
    *targets[i] = v.value();
  }
  if (!a.gpu_memory.empty() && o.gpu_memory_bytes == 0)
    return fail(invalid_argument("--gpu-memory '" + a.gpu_memory + "': the budget must be more than 0 bytes"));

  Result<DeviceFacts> device = device_facts(a);
  if (!device.is_ok()) return fail(device.status());

  Result<MemoryPlan> p = plan(config, o, device.value());
  if (!p.is_ok()) return fail(p.status());

  if (a.auto_fit) {
    Result<AutoFit> fit = auto_fit(config, o, device.value());
    if (!fit.is_ok()) {
      if (a.json) {
        std::fputs(plan_json(p.value(), label).c_str(), stdout);
      } else {
        std::fputs(plan_table(p.value(), label).c_str(), stdout);
      }
      std::fprintf(stderr, "qvl plan: auto-fit: %s\n", fit.status().message().c_str());
      return fit.status().code() == StatusCode::kResourceExhausted ? kExitDoesNotFit : 1;
    }
    if (a.json) {
      std::fputs(plan_json(fit->plan, label, &fit.value()).c_str(), stdout);
    } else {
      std::fputs(auto_fit_summary(fit.value()).c_str(), stdout);
      std::fputs(plan_table(fit->plan, label).c_str(), stdout);
    }
    return 0;
  }

  if (a.json) {
    std::fputs(plan_json(p.value(), label).c_str(), stdout);
  } else {
    std::fputs(plan_table(p.value(), label).c_str(), stdout);
  }
  return p->has_budget && !p->fits ? kExitDoesNotFit : 0;
}

std::function<int()> setup_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  app.add_option(
      "--model", a->model,
      "Model directory (only config.json is read), built-in name (tiny, ...) or hub id (Qwen/Qwen3-VL-4B-Instruct)");
  app.add_option("--revision", a->revision, "Hub revision: branch, tag or snapshot hash (default main)");
  app.add_option("--preset", a->preset, "Plan a preset instead: 2b, 4b, 8b (or tiny, tiny-untied, tiny-fp8)");
  app.add_flag("--fp8", a->fp8, "Block-FP8 text Linears (the -FP8 checkpoint, or quantized at load)");
  app.add_option("--gpu-memory", a->gpu_memory,
                 "Budget, e.g. 8GiB, 7.5G, 8000MiB, or bytes (default: the GPU's free memory minus --reserve)");
  app.add_option("--gpu", a->gpu, "CUDA device whose free memory and architecture to use");
  app.add_option("--arch", a->arch, "Plan for this architecture instead of the local GPU: sm_80/86/89/90/120");
  app.add_option("--reserve", a->reserve, "Left free for other programs when the budget is the free memory (256MiB)");
  app.add_option("--margin", a->margin, "Held back inside the budget (128MiB)");
  app.add_option("--cuda-overhead", a->cuda_overhead, "Measured CUDA context + kernel modules, replacing the table");
  app.add_option("--context", a->options.context_tokens, "Tokens per sequence, prompt and answer (4096)");
  app.add_option("--max-image-pixels", a->options.max_image_pixels, "Largest image in pixels (the model's max_pixels)");
  app.add_option("--max-image-tokens", a->options.max_image_tokens, "Largest image in merged tokens");
  app.add_option("--concurrency", a->options.concurrency, "Sequences that each hold a full context at once (1)");
  app.add_option("--kv-dtype", a->kv_dtype, "KV cache dtype: bf16 or fp8")->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--prefill-chunk", a->options.prefill_chunk, "Rows per decoder step, prefill and decode (2048)");
  app.add_option("--max-running", a->options.max_running, "Sequences in one decoder step (default: --concurrency)");
  app.add_option("--offload-layers", a->options.offload_layers, "Decoder layers kept in pinned host memory (0)");
  app.add_flag("--auto-fit", a->auto_fit, "Apply the cheapest changes that fit and print what was chosen");
  app.add_flag("--json", a->json, "Print the plan as JSON");
  return [a] { return run_plan(*a); };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("plan", "The memory plan of a model on a GPU budget (no weights or GPU needed)",
                     qvl::cli::setup_plan);
