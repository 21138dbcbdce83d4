// The options every command that runs the model shares (run, serve, bench): which backend, which
// GPU and how much of its memory, the context, the image cap, the prefill chunk and the KV dtype.
// Flag names match `qvl plan` (memory/planner.h RuntimeOptions), so a plan printed by `qvl plan`
// is the plan `qvl run` / `qvl serve` load with the same flags. This is the CLI half of
// engine/loader.h: it turns flags into a backend, the device facts and LoadOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "engine/loader.h"

namespace qvl::cli {

struct EngineArgs {
  std::string backend = "auto";      // cpu | cuda | auto (cuda when a device is usable)
  int threads = 0;                   // CPU backend threads; 0 = all cores
  int gpu = 0;                       // CUDA device ordinal
  std::string gpu_memory;            // budget, e.g. "6GiB"; "" = free memory minus --reserve
  std::string reserve;               // left free for other programs ("" = 256MiB)
  int64_t context = 4096;            // prompt + answer tokens per sequence
  int64_t max_image_pixels = 0;      // 0 = the model's max_pixels
  int64_t max_image_tokens = 0;      // 0 = only the pixel cap
  int64_t prefill_chunk = 2048;      // rows per decoder step
  std::string kv_dtype = "bf16";     // bf16 | fp8 (CUDA; the CPU backend keeps fp32)
  int offload_layers = 0;            // decoder layers kept in host memory (memory/offload.h)
  bool fp8 = false;                  // block-FP8 text Linears (quantized at load from BF16: memory/quantize.h)
  bool auto_fit = false;             // apply memory/planner.h auto_fit() when the plan does not fit
  std::string fp8_gemm = "dequant";  // CUDA: FP8 Linears over many rows, w8a8 | dequant (CudaFp8Gemm)
};

// Adds the flags to `app`.
void add_engine_args(CLI::App& app, EngineArgs* args);
// --fp8-gemm (w8a8 | dequant), which `qvl bench` and `qvl forward` take too.
void add_fp8_gemm_option(CLI::App& app, std::string* value);
// The CUDA A/B switches of the warpgroup-MMA attention kernels (`qvl bench`, `qvl forward`):
// --no-vision-wgmma, --no-prefill-wgmma.
void add_wgmma_flags(CLI::App& app, bool* no_vision, bool* no_prefill);

struct BackendChoice {
  std::shared_ptr<Backend> backend;
  DeviceFacts device;  // all zero for the CPU backend
};

// Makes the backend the flags ask for; `auto` takes CUDA when this binary has it and a device
// answers, else the CPU. Errors name the flag ("--backend cuda: this qvl was built without CUDA").
Result<BackendChoice> make_backend(const EngineArgs& args);

// What --auto-fit changed, one line each for people (empty when it changed nothing or was off).
std::string auto_fit_report(const LoadedModel& model);

// LoadOptions for `model_dir`: `concurrency` sequences that may each hold a full context, at most
// `max_running` in one step (memory/planner.h RuntimeOptions).
Result<LoadOptions> make_load_options(const EngineArgs& args, const std::string& model_dir, const DeviceFacts& device,
                                      int concurrency, int max_running);

}  // namespace qvl::cli
