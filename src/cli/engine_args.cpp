#include "cli/engine_args.h"

#include <thread>

#include "memory/byte_size.h"
#ifdef QVL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qvl::cli {

void add_engine_args(CLI::App& app, EngineArgs* a) {
  app.add_option("--backend", a->backend, "cpu, cuda or auto (CUDA when a GPU is usable)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--threads", a->threads, "CPU backend threads (0 = all cores)");
  app.add_option("--gpu", a->gpu, "CUDA device ordinal (0)");
  app.add_option("--gpu-memory", a->gpu_memory, "GPU memory budget, e.g. 6GiB (default: free memory minus --reserve)");
  app.add_option("--reserve", a->reserve, "Left free for other programs when the budget is the free memory (256MiB)");
  app.add_option("--context", a->context, "Tokens per sequence: prompt (text + image tokens) and answer (4096)");
  app.add_option("--max-image-pixels", a->max_image_pixels, "Largest image in pixels (the model's max_pixels)");
  app.add_option("--max-image-tokens", a->max_image_tokens, "Largest image in merged tokens");
  app.add_option("--prefill-chunk", a->prefill_chunk, "Rows per decoder step, prefill and decode rows together (2048)");
  app.add_option("--kv-dtype", a->kv_dtype, "KV cache dtype on CUDA: bf16 or fp8")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--offload-layers", a->offload_layers,
                 "Keep the last N decoder layers in pinned host memory, streamed in every step (0)");
  app.add_flag("--fp8", a->fp8,
               "FP8 text Linears: a BF16 checkpoint is quantized at load (128x128 blocks, as the -FP8 checkpoints)");
  app.add_flag("--auto-fit", a->auto_fit,
               "When the model does not fit the budget, apply the cheapest changes that fit (printed)");
  add_fp8_gemm_option(app, &a->fp8_gemm);
}

void add_fp8_gemm_option(CLI::App& app, std::string* value) {
  app.add_option("--fp8-gemm", *value,
                 "CUDA: FP8 Linears over many rows: dequant (BF16 weights, transformers' dequantize=True numerics) or "
                 "w8a8 (quantised activations, block-scaled cuBLASLt on sm_90: faster prefill, less exact) (dequant)")
      ->check(CLI::IsMember({"w8a8", "dequant"}));
}

void add_wgmma_flags(CLI::App& app, bool* no_vision, bool* no_prefill) {
  app.add_flag("--no-vision-wgmma", *no_vision,
               "CUDA A/B: vision attention at head dim 64 through the mma.sync flash kernel instead of the sm_90 "
               "warpgroup-MMA one");
  app.add_flag("--no-prefill-wgmma", *no_prefill,
               "CUDA A/B: text prefill attention through the mma.sync flash kernel instead of the sm_90 "
               "warpgroup-MMA one");
}

std::string auto_fit_report(const LoadedModel& m) {
  std::string out;
  for (const Suggestion& s : m.auto_fit_applied)
    out += "auto-fit: " + s.flag + " (saves " + format_mib(s.saves_bytes) + " MiB: " + s.description + ")\n";
  return out;
}

Result<BackendChoice> make_backend(const EngineArgs& args) {
  BackendChoice out;
  bool want_cuda = args.backend == "cuda";
#ifdef QVL_HAVE_CUDA
  if (args.backend == "auto") want_cuda = cuda_device_count() > 0;
  if (want_cuda) {
    QVL_ASSIGN_OR_RETURN(CudaDeviceInfo info, cuda_device_info(args.gpu));
    CudaBackendOptions opts;
    opts.device = args.gpu;
    opts.fp8_gemm = args.fp8_gemm == "w8a8" ? CudaFp8Gemm::kW8A8 : CudaFp8Gemm::kDequant;
    QVL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_cuda_backend(opts));
    // Free memory after this process made its context and the backend its workspaces.
    QVL_ASSIGN_OR_RETURN(CudaDeviceInfo now, cuda_device_info(args.gpu));
    out.backend = std::move(backend);
    out.device.present = true;
    out.device.name = info.name;
    out.device.compute_capability = info.compute_capability;
    out.device.sm_count = info.multiprocessors;
    out.device.total_bytes = static_cast<int64_t>(info.total_memory);
    out.device.free_bytes = static_cast<int64_t>(now.free_memory);
    out.device.workspaces_allocated = true;
    return out;
  }
#else
  if (want_cuda) return failed_precondition("--backend cuda: this qvl was built without the CUDA backend");
#endif
  if (args.threads < 0) return invalid_argument("--threads " + std::to_string(args.threads) + " must be >= 0");
  const int threads =
      args.threads > 0 ? args.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  out.backend = make_cpu_backend(threads);
  return out;
}

Result<LoadOptions> make_load_options(const EngineArgs& args, const std::string& model_dir, const DeviceFacts& device,
                                      int concurrency, int max_running) {
  LoadOptions o;
  o.model_dir = model_dir;
  RuntimeOptions& rt = o.runtime;
  if (args.context < 2) return invalid_argument("--context " + std::to_string(args.context) + " must be >= 2");
  rt.context_tokens = args.context;
  rt.concurrency = concurrency;
  rt.max_running = max_running;
  rt.max_image_pixels = args.max_image_pixels;
  rt.max_image_tokens = args.max_image_tokens;
  if (args.prefill_chunk < 1)
    return invalid_argument("--prefill-chunk " + std::to_string(args.prefill_chunk) + " must be >= 1");
  rt.prefill_chunk = args.prefill_chunk;
  rt.kv_dtype = args.kv_dtype == "fp8" ? DType::kF8E4M3 : DType::kBF16;
  if (args.offload_layers < 0)
    return invalid_argument("--offload-layers " + std::to_string(args.offload_layers) + " must be >= 0");
  rt.offload_layers = args.offload_layers;
  rt.fp8_weights = args.fp8;
  rt.fp8_w8a8 = args.fp8_gemm == "w8a8";
  o.auto_fit = args.auto_fit;
  if (!args.gpu_memory.empty() && !device.present)
    return invalid_argument("--gpu-memory " + args.gpu_memory + " applies to the CUDA backend; this run uses the CPU");
  if (!args.gpu_memory.empty()) {
    auto b = parse_byte_size(args.gpu_memory);
    if (!b.is_ok()) return b.status().with_context("--gpu-memory");
    rt.gpu_memory_bytes = *b;
  }
  if (!args.reserve.empty()) {
    auto b = parse_byte_size(args.reserve);
    if (!b.is_ok()) return b.status().with_context("--reserve");
    rt.reserve_bytes = *b;
  }
  o.device = device;
  o.sampling_threads = args.threads;  // --threads bounds the CPU work, sampling included
  return o;
}

}  // namespace qvl::cli
