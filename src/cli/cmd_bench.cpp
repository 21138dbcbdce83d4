// qvl bench: drives the model directly (no HTTP, no scheduler) and prints one JSON object:
// vision encoder ms, prefill tok/s, time to first token (`ttft_ms`: the first token taken by the
// device argmax, as the engine serves a greedy request; `ttft_ms_host_logits`: the logits row
// copied to the host and argmax'd there, as for a sampled request), decode tok/s per batch
// size (the decode step captured as a graph per batch size, inputs staged on the device; and,
// separately, with the logits copied to the host and argmax'd every step as a plain engine loop
// would; and sampled as a chat request is by default, temperature 0.7 / top-k 20 / top-p 0.8,
// from the rows' candidate keys as the engine samples (`tokens_per_s_sampled`) and from the
// whole rows brought to the host (`tokens_per_s_sampled_rows`)), peak device memory, bytes read
// per decode step and decode as a fraction of the bandwidth floor (those bytes over a
// device-to-device copy bandwidth measured here, counting read + write: the better of a copy
// before the weights are loaded and one after the work).
//
//   qvl bench MODEL|--model M [--image-size 1024x768|none] [--prompt-tokens 24] [--gen-tokens 64]
//             [--batch 1,8,32] [--backend cuda|cpu] [--repeat 5] [--no-graphs] [--profile] [--out FILE]
//
// The prompt is the chat-templated shape of one image + N text tokens; the image (RGB bytes, as
// the server hands it to the model) and text ids are synthetic (timings do not depend on values). Timings are medians
// of --repeat runs after a warm-up; the host clock is read after a synchronize.
//
// --profile (CUDA) then runs the vision encoder, the TTFT path and one decode step per batch
// size once more with every launch timed by CUDA events (eager, no graphs; the stream is held
// while the host queues the launches, so these are device times) and prints a per-op table to
// stderr for each (op, calls, µs, share, GB/s and TFLOP/s against the op's minimum bytes and
// FLOPs); the JSON gets the same rows under "profile".
//
// --emulate-gpu sm_120 (CUDA, testing) makes every choice as the backend would on that GPU (an
// RTX 5060: no warpgroup MMA, 99 KB of shared memory per block) and checks each launch against
// its limits; the device still runs its own code, so the times are this device's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/top_k.h"
#include "cli/bench_support.h"
#include "cli/command.h"
#include "cli/emulate_gpu.h"
#include "cli/engine_args.h"
#include "cli/model_args.h"
#include "core/arena.h"
#include "image/image.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "memory/activations.h"
#include "memory/offload.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "model/positions.h"
#ifdef QVL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qvl::cli {
namespace {

using bench::Clock;
using bench::copy_bandwidth;
using bench::decode_weight_bytes;
using bench::median;
using bench::ms_since;
using bench::parse_batches;
using bench::SampledSteps;
using bench::synthetic_rgb;
using bench::time_sampled_steps;
using nlohmann::json;
#ifdef QVL_HAVE_CUDA
using bench::decode_trace_summary;
using bench::profile_table;
#endif

struct BenchOptions {
  ModelArgs model;
  std::string image_size = "1024x768";
  int prompt_tokens = 24;
  int gen_tokens = 64;
  std::string batches = "1";
  std::string backend = "cuda";
  int repeat = 5;
  int threads = 0;
  int gpu = 0;
  bool no_graphs = false;
  int offload_layers = 0;
  bool profile = false;
  std::string skinny;  // "variant[,depth[,split[,group[,prewait[,blocks[,outputs[,stage]]]]]]]"
  bool fused_decode = false;
  int skinny_bf16_max_rows = -1;         // A/B: BF16 Linears of at most this many rows take the skinny kernels
  int fused_rms_rows = -1;               // A/B: RMSNorm as a Linear prologue up to this many rows
  int fused_silu_rows = -1;              // A/B: SiLU·mul as a Linear prologue up to this many rows
  int silu_epilogue_rows = -1;           // A/B: SiLU·mul as gate_up's epilogue up to this many rows
  bool no_cluster_attention = false;     // A/B: one block per query tile in vision / prefill attention
  bool no_cublas_gelu = false;           // A/B: CudaBackendOptions::cublas_gelu off
  bool no_token_prepare = false;         // A/B: text_qkv_prepare's per-8-heads kernel
  int vision_mt = 2;                     // A/B: vision attention m-tiles per warp
  int vision_q_through_k = -1;           // A/B: vision attention (flash.cuh) with Q through the K stages
  int prefill_small_tiles = -1;          // A/B: prefill attention (flash.cuh) in key tiles of 32
  bool no_vision_wgmma = false;          // A/B: CudaBackendOptions::vision_wgmma off
  bool no_prefill_wgmma = false;         // A/B: CudaBackendOptions::prefill_wgmma off
  bool no_prefill_q_alias = false;       // A/B: prefill attention with Q in its own shared memory
  int prefill_key_tiles = 8;             // A/B: prefill attention key tiles per block before a split
  int decode_split_blocks = 0;           // A/B: decode attention split blocks (0: the default)
  bool no_decode_cluster_merge = false;  // A/B: decode attention splits merged by the last to arrive
  bool no_decode_attention_tma = false;  // A/B: decode attention keys by cp.async instead of TMA
  bool no_ring_prologue_first = false;   // A/B: ring Linears issue every stage before their PDL wait
  int kv_page_tokens = 16;               // tokens per KV page (the engine's default is 16)
  std::string kv_dtype = "bf16";         // CUDA: bf16 or fp8 (the CPU backend keeps its fp32 cache)
  std::string skip_kernels;              // measurement only: launches left out
  std::string emulate_gpu;               // testing only: CudaBackendOptions::emulate_* as "sm_NN[:BYTES]"
  bool emulate_occupancy = false;        // testing only: CudaBackendOptions::emulate_occupancy
  int decode_attention_exit = 0;         // measurement only: where the decode attention stops
  bool decode_attention_trace = false;   // measurement only: stage stamps of the decode attention
  int decode_attention_trigger = -1;     // A/B: when the decode attention lets o_proj launch (-1: default)
  int decode_early_launch = -1;          // A/B: CudaBackendOptions::decode_early_launch (-1: default)
  double decode_l2_prefetch_mb = -1;     // A/B: CudaBackendOptions::decode_l2_prefetch_bytes / 1e6 (-1: default)
  int fused_prologue_copies = -1;        // A/B: CudaBackendOptions::fused_prologue_max_copies_per_sm (-1: default)
  int decode_stack_debug = 0;
  std::string fp8_gemm = "dequant";  // w8a8 | dequant: FP8 Linears over many rows (CudaFp8Gemm)
  std::string out;
};

Status run_bench(const BenchOptions& o) {
  QVL_ASSIGN_OR_RETURN(std::vector<int> batches, parse_batches(o.batches));
  if (o.prompt_tokens < 1 || o.gen_tokens < 1 || o.repeat < 1)
    return invalid_argument("--prompt-tokens " + std::to_string(o.prompt_tokens) + ", --gen-tokens " +
                            std::to_string(o.gen_tokens) + " and --repeat " + std::to_string(o.repeat) +
                            " must be >= 1");
  ImageGrid grid{1, 0, 0};
  bool with_image = o.image_size != "none" && o.image_size != "0";
  if (with_image) {
    int w = 0, h = 0;
    char x = 0;
    std::istringstream in(o.image_size);
    if (!(in >> w >> x >> h) || x != 'x' || !in.eof() || w <= 0 || h <= 0 || w % 32 != 0 || h % 32 != 0)
      return invalid_argument("--image-size " + o.image_size +
                              ": expected WxH in pixels, multiples of 32 (patch 16 x merge 2), or none");
    grid.h = h / 16;
    grid.w = w / 16;
  }

  // ---- model ----
  const auto t_load = Clock::now();
  QVL_ASSIGN_OR_RETURN(std::string dir, resolve_model_dir(o.model));
  QVL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  QVL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  QVL_ASSIGN_OR_RETURN(ModelWeights host, bind_host_weights(ckpt, config));
  std::unique_ptr<Backend> backend;
  json device = json::object();
  if (o.backend == "cpu") {
    backend = make_cpu_backend(o.threads);
    device["name"] = "cpu";
  } else if (o.backend == "cuda") {
#ifdef QVL_HAVE_CUDA
    QVL_ASSIGN_OR_RETURN(CudaDeviceInfo info, cuda_device_info(o.gpu));
    CudaBackendOptions opts;
    opts.device = o.gpu;
    if (!o.skinny.empty()) {
      std::vector<int> v;
      std::stringstream in(o.skinny);
      std::string item;
      while (std::getline(in, item, ',')) v.push_back(std::atoi(item.c_str()));
      int* fields[] = {&opts.skinny.variant, &opts.skinny.depth,   &opts.skinny.split,
                       &opts.skinny.group,   &opts.skinny.prewait, &opts.skinny.blocks,
                       &opts.skinny.only_n,  &opts.skinny.stage,   &opts.skinny.warps};
      if (v.empty() || v.size() > std::size(fields))
        return invalid_argument(
            "--cuda-skinny " + o.skinny +
            ": expected variant[,depth[,split[,group[,prewait[,blocks[,outputs[,stage[,warps]]]]]]]]");
      for (size_t i = 0; i < v.size(); ++i) *fields[i] = v[i];
    }
    opts.fused_decode = o.fused_decode;
    opts.cluster_attention = !o.no_cluster_attention;
    if (o.skinny_bf16_max_rows >= 0) opts.skinny_bf16_max_rows = o.skinny_bf16_max_rows;
    if (o.fused_rms_rows >= 0) opts.fused_rms_norm_max_rows = o.fused_rms_rows;
    if (o.fused_prologue_copies >= 0) opts.fused_prologue_max_copies_per_sm = o.fused_prologue_copies;
    if (o.fused_silu_rows >= 0) opts.fused_silu_mul_max_rows = o.fused_silu_rows;
    if (o.silu_epilogue_rows >= 0) opts.silu_mul_epilogue_max_rows = o.silu_epilogue_rows;
    opts.cublas_gelu = !o.no_cublas_gelu;
    opts.token_qkv_prepare = !o.no_token_prepare;
    opts.vision_attention_mt = o.vision_mt;
    opts.vision_q_through_k = o.vision_q_through_k;
    opts.prefill_small_tiles = o.prefill_small_tiles;
    opts.vision_wgmma = !o.no_vision_wgmma;
    opts.prefill_wgmma = !o.no_prefill_wgmma;
    opts.prefill_q_alias = !o.no_prefill_q_alias;
    opts.prefill_key_tiles = o.prefill_key_tiles;
    opts.decode_split_blocks = o.decode_split_blocks;
    opts.decode_cluster_merge = !o.no_decode_cluster_merge;
    opts.decode_attention_tma = !o.no_decode_attention_tma;
    opts.ring_prologue_first = !o.no_ring_prologue_first;
    opts.skip_kernels = o.skip_kernels;
    opts.decode_attention_exit = o.decode_attention_exit;
    opts.decode_attention_trace = o.decode_attention_trace;
    if (o.decode_attention_trigger >= 0) opts.decode_attention_trigger = o.decode_attention_trigger;
    opts.decode_early_launch = o.decode_early_launch;
    if (o.decode_l2_prefetch_mb >= 0)
      opts.decode_l2_prefetch_bytes = static_cast<int64_t>(o.decode_l2_prefetch_mb * 1e6);
    opts.fp8_gemm = o.fp8_gemm == "w8a8" ? CudaFp8Gemm::kW8A8 : CudaFp8Gemm::kDequant;
    opts.decode_stack_debug = o.decode_stack_debug;
    if (!o.emulate_gpu.empty()) QVL_RETURN_IF_ERROR(parse_emulate_gpu(o.emulate_gpu, opts));
    opts.emulate_occupancy = o.emulate_occupancy;
    QVL_ASSIGN_OR_RETURN(backend, make_cuda_backend(opts));
    device = {{"name", info.name},
              {"compute_capability", info.compute_capability},
              {"multiprocessors", info.multiprocessors},
              {"total_memory_bytes", info.total_memory},
              {"l2_bytes", info.l2_bytes},
              {"peak_dram_gbps", cuda_peak_dram_gbps(info)},
              {"backend", backend->name()}};
#else
    return failed_precondition("--backend cuda: this qvl was built without the CUDA backend");
#endif
  } else {
    return invalid_argument("--backend " + o.backend + ": cpu or cuda");
  }
  Backend& be = *backend;
  // The floor's bandwidth is the better of a copy measured now, before the weights are loaded,
  // and one after the work (a single reading after a long run of a large model came out ~10%
  // lower, which would flatter the fraction of the floor).
  QVL_ASSIGN_OR_RETURN(const double copy_start_gbps, copy_bandwidth(be, o.backend == "cuda"));
#ifdef QVL_HAVE_CUDA
  if (o.backend == "cuda") cuda_memory_reset_peak(be);  // the copy buffers are not the model's
#endif
  OffloadStats offload;
  QVL_ASSIGN_OR_RETURN(ModelWeights weights, load_weights_offloaded(be, config, host, o.offload_layers, &offload));
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3VLModel> model, Qwen3VLModel::create(be, config, std::move(weights)));
  const double load_ms = ms_since(t_load);
  const TextConfig& tc = config.text;
  const DType act = be.activation_dtype();
  if (o.kv_dtype == "fp8" && act != DType::kBF16)
    return invalid_argument("--kv-dtype fp8: an FP8 KV cache needs the CUDA backend (this one keeps " +
                            std::string(dtype_name(act)) + ")");
  const DType kv_dtype = o.kv_dtype == "fp8" ? DType::kF8E4M3 : act;

  // ---- prompt: <|im_start|>user\n<|vision_start|> pads <|vision_end|> text <|im_end|>\n<|im_start|>assistant\n
  const TokenIds& tk = config.tokens;
  std::vector<int32_t> ids = {151644, 872, 198};
  std::vector<ImageGrid> grids;
  // The image as the server sends it to the model (RGB bytes, patchified on the device), and
  // the same image as f32 pixel values (the other input form) for comparison.
  std::vector<uint8_t> rgb;
  std::vector<float> pixels;
  std::vector<ImageInput> images, f32_images;
  if (with_image) {
    ids.push_back(tk.vision_start_token_id);
    ids.insert(ids.end(), static_cast<size_t>(grid.num_tokens(config.vision.spatial_merge_size)), tk.image_token_id);
    ids.push_back(tk.vision_end_token_id);
    grids.push_back(grid);
    const VisionConfig& vc = config.vision;
    rgb = synthetic_rgb(grid.num_patches() * vc.patch_size * vc.patch_size * 3);
    pixels.resize(static_cast<size_t>(grid.num_patches() * vc.patch_dim()));
    image::patchify_into(rgb.data(), grid.h * vc.patch_size, grid.w * vc.patch_size, vc.patch_size,
                         vc.spatial_merge_size, vc.temporal_patch_size, pixels.data());
    images.push_back({nullptr, grid, rgb.data()});
    f32_images.push_back({pixels.data(), grid});
  }
  for (int i = 0; i < o.prompt_tokens; ++i) ids.push_back(static_cast<int32_t>(1000 + (37 * i) % 50000));
  for (int32_t t : {151645, 198, 151644, 77091, 198}) ids.push_back(t);
  const int64_t L = static_cast<int64_t>(ids.size());
  QVL_ASSIGN_OR_RETURN(PromptPositions pos, prompt_positions(ids, grids, config));

  // ---- buffers: arena, step inputs, logits, KV (max batch x pages per sequence) ----
  const int max_b = batches.back();
  const int page = o.kv_page_tokens;
  // Decode steps per batch size, each one more token of context: warm-up, timed, host argmax,
  // sampled (rows, then keys after one recording step), profiled.
  const int steps = 4 + o.gen_tokens + 3 * std::min(o.gen_tokens, 32) + 1 + 1;
  const int64_t per_seq_tokens = L + steps;
  const int64_t P = (per_seq_tokens + page - 1) / page;
  RunnerShape shape{std::max<int64_t>(L, max_b), max_b, P, with_image ? grid.num_patches() : 0};
  const RunnerBuffers rb = runner_buffers(config, shape, act);
  QVL_ASSIGN_OR_RETURN(DeviceBuffer arena_buf, be.allocate(static_cast<size_t>(rb.arena), "bench arena"));
  QVL_ASSIGN_OR_RETURN(DeviceBuffer input_buf, be.allocate(static_cast<size_t>(rb.step_inputs), "bench inputs"));
  QVL_ASSIGN_OR_RETURN(DeviceBuffer logits_buf, be.allocate(static_cast<size_t>(rb.logits), "bench logits"));
  DeviceBuffer staging_buf;
  if (rb.upload_staging > 0) {
    QVL_ASSIGN_OR_RETURN(staging_buf, be.allocate_host(static_cast<size_t>(rb.upload_staging), "bench staging"));
  }
  const HostStaging staging{staging_buf.data(), staging_buf.size()};
  Arena arena(arena_buf.data(), arena_buf.size(), be.device(), "bench arena");
  KvCacheView cache;
  cache.dtype = kv_dtype;
  cache.page_size = page;
  cache.num_pages = P * max_b;
  cache.num_layers = tc.num_hidden_layers;
  cache.num_kv_heads = tc.num_key_value_heads;
  cache.head_dim = tc.head_dim;
  QVL_ASSIGN_OR_RETURN(DeviceBuffer kv_buf, be.allocate(cache.page_bytes() * cache.num_pages, "bench KV cache"));
  cache.base = kv_buf.data();
  std::vector<int32_t> table(static_cast<size_t>(max_b * P));
  for (int64_t i = 0; i < max_b * P; ++i) table[i] = static_cast<int32_t>(i);  // sequence s owns pages [sP, sP+P)

  // Step inputs at fixed addresses (graphs replay over them).
  struct StepInputs {
    Tensor ids, logits_rows, positions, slots, query_start, context_len, page_table, logits;
  };
  // ids, positions, slots and context_len are adjacent ([rows | 3 rows | rows | seqs] I32), so
  // that a decode step's inputs arrive in one copy.
  auto make_inputs = [&](int64_t rows, int64_t seqs) {
    Arena in(input_buf.data(), input_buf.size(), be.device(), "bench inputs");
    StepInputs s;
    Tensor step = in.alloc(DType::kI32, {5 * rows + seqs});
    s.ids = step.rows(0, rows);
    s.positions = step.rows(rows, 4 * rows).reshape({rows, 3});
    s.slots = step.rows(4 * rows, 5 * rows);
    s.context_len = step.rows(5 * rows, 5 * rows + seqs);
    s.logits_rows = in.alloc(DType::kI32, {seqs});
    s.query_start = in.alloc(DType::kI32, {seqs + 1});
    s.page_table = in.alloc(DType::kI32, {seqs, P});
    s.logits = Tensor(logits_buf.data(), act, {seqs, tc.vocab_size}, be.device());
    return s;
  };

  // ---- vision ----
  // vision_ms: RGB bytes up through the pinned staging buffer (as the runners do);
  // vision_ms_f32: the same image as f32 pixel values, for comparison.
  double vision_ms = 0, vision_ms_f32 = 0;
  if (with_image) {
    for (const bool from_rgb : {true, false}) {
      std::vector<double> runs;
      for (int r = 0; r <= o.repeat; ++r) {
        arena.reset();
        be.synchronize();
        const auto t = Clock::now();
        QVL_ASSIGN_OR_RETURN(VisionOutput vis, model->encode_images(from_rgb ? images : f32_images, arena, staging));
        be.synchronize();
        if (r > 0) runs.push_back(ms_since(t));  // run 0 warms up
      }
      (from_rgb ? vision_ms : vision_ms_f32) = median(runs);
    }
  }
  json profiles = json::array();
#ifdef QVL_HAVE_CUDA
  const bool profile = o.profile && o.backend == "cuda";
  if (profile && with_image) {
    arena.reset();
    be.synchronize();
    cuda_profile_start(be, 50.0);
    QVL_ASSIGN_OR_RETURN(VisionOutput vis, model->encode_images(images, arena, staging));
    (void)vis;
    profiles.push_back(
        profile_table("vision encoder, " + std::to_string(grid.num_patches()) + " patches", cuda_profile_stop(be)));
  }
#endif

  // ---- prefill of sequence 0 (whole prompt in one step), and TTFT = vision + prefill + argmax ----
  // The first token as the engine takes it for a greedy request (EngineOptions::device_greedy:
  // Backend::argmax_rows, 4 bytes back), or with the logits row brought to the host and
  // argmax'd there (what a sampled request pays before its sampler runs).
  QVL_ASSIGN_OR_RETURN(DeviceBuffer greedy_buf, be.allocate(sizeof(int32_t), "bench greedy id"));
  const Tensor greedy_id(greedy_buf.data(), DType::kI32, {1}, be.device());
  auto prefill = [&](int32_t* first_token, bool device_greedy) -> Status {
    arena.reset();
    VisionOutput vis;
    if (with_image) {
      QVL_ASSIGN_OR_RETURN(vis, model->encode_images(images, arena, staging));
    }
    StepInputs s = make_inputs(L, 1);
    std::vector<int32_t> slots(static_cast<size_t>(L)), qs = {0, static_cast<int32_t>(L)};
    for (int64_t i = 0; i < L; ++i) slots[i] = static_cast<int32_t>(i);
    const int32_t ctx = static_cast<int32_t>(L), last = static_cast<int32_t>(L - 1);
    be.copy_to_device(s.ids, ids.data());
    be.copy_to_device(s.positions, pos.positions.data());
    be.copy_to_device(s.slots, slots.data());
    be.copy_to_device(s.query_start, qs.data());
    be.copy_to_device(s.context_len, &ctx);
    be.copy_to_device(s.page_table, table.data());
    be.copy_to_device(s.logits_rows, &last);
    TextBatch batch{1,
                    static_cast<int>(L),
                    static_cast<int>(P),
                    static_cast<int>(L),
                    s.query_start,
                    s.context_len,
                    s.page_table,
                    s.slots,
                    s.positions};
    TextStepInputs in;
    in.token_ids = s.ids;
    in.logits_rows = s.logits_rows;
    if (with_image) {
      const int64_t start = 4;  // first pad row: after <|im_start|> user \n <|vision_start|>
      VisionOutput::Slice sl = vis.rows(0, vis.embeds.dim(0));
      in.visual.push_back({static_cast<int32_t>(start), sl.embeds, sl.deepstack});
    }
    Tensor logits = s.logits.rows(0, 1);
    model->forward(batch, in, cache, logits, arena);
    if (device_greedy) {
      be.argmax_rows(greedy_id, logits);
      be.copy_to_host(first_token, greedy_id);
      return Status::ok();
    }
    std::vector<float> host(static_cast<size_t>(tc.vocab_size));
    if (act == DType::kF32) {
      be.copy_to_host(host.data(), logits);
    } else {
      std::vector<uint16_t> bits(host.size());
      be.copy_to_host(bits.data(), logits);
      for (size_t i = 0; i < bits.size(); ++i) host[i] = bf16_to_float(bits[i]);
    }
    *first_token = static_cast<int32_t>(std::max_element(host.begin(), host.end()) - host.begin());
    return Status::ok();
  };
  std::vector<double> ttft_runs, ttft_host_runs;
  int32_t first = 0, first_host = 0;
  for (int r = 0; r <= o.repeat; ++r) {
    for (const bool device_greedy : {true, false}) {
      be.synchronize();
      const auto t = Clock::now();
      QVL_RETURN_IF_ERROR(prefill(device_greedy ? &first : &first_host, device_greedy));
      if (r > 0) (device_greedy ? ttft_runs : ttft_host_runs).push_back(ms_since(t));
    }
  }
  if (first != first_host)
    return internal_error("bench: the device argmax gave token " + std::to_string(first) + ", the host " +
                          std::to_string(first_host));
  const double ttft_ms = median(ttft_runs), ttft_host_ms = median(ttft_host_runs);
  const double prefill_ms = std::max(0.0, ttft_ms - vision_ms);
#ifdef QVL_HAVE_CUDA
  if (profile) {
    be.synchronize();
    cuda_profile_start(be, 50.0);
    QVL_RETURN_IF_ERROR(prefill(&first, true));
    profiles.push_back(profile_table("TTFT (vision + prefill of " + std::to_string(L) + " tokens + the device argmax)",
                                     cuda_profile_stop(be)));
  }
#endif
  arena.reset();

  // ---- decode per batch size ----
  const int64_t kv_token_bytes =
      2LL * tc.num_hidden_layers * tc.num_key_value_heads * tc.head_dim * dtype_size(kv_dtype);
  json decode = json::array();
  json trace_json = nullptr;
  for (int B : batches) {
    // Every sequence starts from sequence 0's prefilled cache (its pages copied).
    for (int s = 1; s < B; ++s) {
      const int64_t bytes = static_cast<int64_t>(cache.page_bytes()) * P;
      Tensor src(cache.base, DType::kU8, {bytes}, be.device());
      Tensor dst(static_cast<char*>(cache.base) + s * bytes, DType::kU8, {bytes}, be.device());
      be.copy(dst, src);
    }
    StepInputs s = make_inputs(B, B);
    std::vector<int32_t> qs(B + 1), rows(B);
    for (int i = 0; i <= B; ++i) qs[i] = i;
    for (int i = 0; i < B; ++i) rows[i] = i;
    be.copy_to_device(s.query_start, qs.data());
    be.copy_to_device(s.logits_rows, rows.data());
    be.copy_to_device(s.page_table, table.data());
    // Inputs of every step staged on the device once, each step's [ids | positions | slots |
    // context_len] block (6B I32) laid out as make_inputs places them; a step copies its block
    // (one device-to-device copy, asynchronous) into the fixed tensors.
    std::vector<int32_t> h_stage;
    for (int st = 0; st < steps; ++st) {
      const int64_t n = L + st;  // absolute index of this step's token
      const int32_t p = static_cast<int32_t>(decode_position(n, pos.rope_delta));
      for (int b = 0; b < B; ++b) h_stage.push_back(first);
      for (int b = 0; b < 3 * B; ++b) h_stage.push_back(p);
      for (int b = 0; b < B; ++b) h_stage.push_back(static_cast<int32_t>(b * P * page + n));
      for (int b = 0; b < B; ++b) h_stage.push_back(static_cast<int32_t>(n + 1));
    }
    QVL_ASSIGN_OR_RETURN(DeviceBuffer stage_buf, be.allocate(h_stage.size() * 4, "bench staging"));
    Tensor g_stage(stage_buf.data(), DType::kI32, {static_cast<int64_t>(steps), 6LL * B}, be.device());
    be.copy_to_device(g_stage, h_stage.data());
    Tensor step_block(s.ids.data, DType::kI32, {1, 6LL * B}, be.device());

    TextBatch batch{B,
                    B,
                    static_cast<int>(P),
                    static_cast<int>(per_seq_tokens),
                    s.query_start,
                    s.context_len,
                    s.page_table,
                    s.slots,
                    s.positions};
    TextStepInputs in;
    in.token_ids = s.ids;
    in.logits_rows = s.logits_rows;
    const std::string key = "bench/decode/b" + std::to_string(B) + "/p" + std::to_string(P);
    // The candidate keys of a sampled step (with_keys), taken in the step's graph as the engine
    // takes them.
    QVL_ASSIGN_OR_RETURN(DeviceBuffer keys_buf,
                         be.allocate(static_cast<size_t>(B) * kSampleCandidates * sizeof(uint64_t), "bench keys"));
    const Tensor keys(keys_buf.data(), DType::kI64, {B, kSampleCandidates}, be.device());
    auto step = [&](int st, bool with_keys = false) {
      be.copy(step_block, g_stage.rows(st, st + 1));
      auto fwd = [&] {
        model->forward(batch, in, cache, s.logits, arena);
        if (with_keys) be.top_k_rows(keys, s.logits);
      };
      if (o.no_graphs)
        fwd();
      else
        be.run_graph(with_keys ? key + "/top-k" : key, fwd);
    };
    int st = 0;
    for (; st < 4; ++st) step(st);  // records the graph, warms up
    be.synchronize();
    auto t = Clock::now();
    for (int i = 0; i < o.gen_tokens; ++i) step(st++);
    be.synchronize();
    const double step_ms = ms_since(t) / o.gen_tokens;
    // The same steps with the logits brought to the host and argmax'd every step.
    const int sync_steps = std::min(o.gen_tokens, 32);
    std::vector<uint16_t> bits(static_cast<size_t>(B * tc.vocab_size));
    std::vector<float> f32(bits.size());
    t = Clock::now();
    for (int i = 0; i < sync_steps; ++i) {
      step(st++);
      int64_t checksum = 0;
      if (act == DType::kF32) {
        be.copy_to_host(f32.data(), s.logits);
        for (int b = 0; b < B; ++b)
          checksum +=
              std::max_element(f32.begin() + b * tc.vocab_size, f32.begin() + (b + 1) * tc.vocab_size) - f32.begin();
      } else {
        be.copy_to_host(bits.data(), s.logits);
        for (int b = 0; b < B; ++b) {
          int64_t best = 0;
          float bv = -INFINITY;
          for (int64_t v = 0; v < tc.vocab_size; ++v) {
            const float x = bf16_to_float(bits[b * tc.vocab_size + v]);
            if (x > bv) {
              bv = x;
              best = v;
            }
          }
          checksum += best;
        }
      }
      (void)checksum;
    }
    const double sync_step_ms = ms_since(t) / sync_steps;
    // Sampled as a chat request is by default: the rows to the host for the sampler, or their
    // candidate keys (the engine's two paths).
    step(st++, true);  // records the keyed graph
    const SampledSteps sampled =
        time_sampled_steps(be, s.logits, keys, sync_steps, [&](bool with_keys) { step(st++, with_keys); });
#ifdef QVL_HAVE_CUDA
    if (o.decode_attention_trace && B == 1)
      trace_json = decode_trace_summary(cuda_decode_attention_trace(be), tc.num_hidden_layers);
    if (profile) {
      be.synchronize();
      cuda_profile_start(be, 20.0);
      step(st++);
      profiles.push_back(profile_table("decode step, batch " + std::to_string(B), cuda_profile_stop(be)));
    }
#endif
    // Bytes of the timed steps: weights once per step, each sequence's KV (average context).
    const double avg_ctx = static_cast<double>(L) + 4 + o.gen_tokens / 2.0;
    const double bytes = static_cast<double>(decode_weight_bytes(model->weights(), B)) + B * avg_ctx * kv_token_bytes;
    decode.push_back({{"batch", B},
                      {"graphs", !o.no_graphs},
                      {"fused_decode", o.backend == "cuda" && o.fused_decode && B == 1},
                      {"step_ms", step_ms},
                      {"tokens_per_s", B * 1000.0 / step_ms},
                      {"tokens_per_s_host_argmax", B * 1000.0 / sync_step_ms},
                      {"step_ms_host_argmax", sync_step_ms},
                      {"tokens_per_s_sampled", B * 1000.0 / sampled.keys_ms},
                      {"step_ms_sampled", sampled.keys_ms},
                      {"tokens_per_s_sampled_rows", B * 1000.0 / sampled.rows_ms},
                      {"step_ms_sampled_rows", sampled.rows_ms},
                      {"sampled_whole_rows", sampled.whole_rows},
                      {"bytes_per_step", bytes},
                      {"bytes_per_token", bytes / B},
                      {"avg_context", avg_ctx}});
    be.clear_graphs();
  }

#ifdef QVL_HAVE_CUDA
  // Memory high-water mark of the real work, before the bandwidth test's two buffers.
  json memory = nullptr;
  if (o.backend == "cuda") {
    const CudaMemoryStats m = cuda_memory_stats(be);
    memory = {{"peak_allocated_bytes", m.peak_allocated_bytes},
              {"context_bytes", m.context_bytes},
              {"peak_device_bytes", m.peak_allocated_bytes + m.context_bytes},
              {"device_used_bytes_now", m.device_used_bytes}};
    const CudaFp8GemmCounts f = cuda_fp8_gemm_counts(be);
    memory["fp8_gemm"] = {{"option", o.fp8_gemm},
                          {"w8a8_linears", f.w8a8},
                          {"dequant_linears", f.dequant},
                          {"skinny_wide_launches", f.skinny_wide},
                          {"skinny_16_warp_launches", f.skinny_16_warps},
                          {"skinny_pair_launches", f.skinny_pairs},
                          {"skinny_glu_launches", f.skinny_glu},
                          {"skinny_prologue_launches", f.skinny_prologue},
                          {"skinny_early_launches", f.skinny_early},
                          {"decode_l2_prefetches", f.decode_l2_prefetch},
                          {"decode_tma_launches", f.decode_tma},
                          {"ring_prologue_first_launches", f.ring_prologue_first}};
  }
#endif
  kv_buf = DeviceBuffer();  // room for the copy test
  arena_buf = DeviceBuffer();

  // ---- copy bandwidth (bytes read + written per second), again after the work ----
  QVL_ASSIGN_OR_RETURN(const double copy_end_gbps, copy_bandwidth(be, o.backend == "cuda"));
  const double copy_gbps = std::max(copy_start_gbps, copy_end_gbps);

  for (json& d : decode) {
    const double floor_ms = d["bytes_per_step"].get<double>() / (copy_gbps * 1e9) * 1e3;
    d["floor_ms"] = floor_ms;
    d["fraction_of_floor"] = floor_ms / d["step_ms"].get<double>();
  }

  json out;
  out["model"] = dir;
  out["backend"] = be.name();
  out["device"] = device;
  out["load_ms"] = load_ms;
  out["copy_bandwidth_gbps"] = copy_gbps;
  out["copy_bandwidth_gbps_start_end"] = {copy_start_gbps, copy_end_gbps};
  out["image"] = with_image ? json{{"size", o.image_size},
                                   {"grid_thw", {1, grid.h, grid.w}},
                                   {"patches", grid.num_patches()},
                                   {"tokens", grid.num_tokens(config.vision.spatial_merge_size)}}
                            : json(nullptr);
  out["prompt_tokens"] = L;
  out["text_tokens"] = o.prompt_tokens;
  out["vision_ms"] = vision_ms;
  out["vision_ms_f32"] = vision_ms_f32;
  out["prefill_ms"] = prefill_ms;
  out["prefill_tokens_per_s"] = prefill_ms > 0 ? L / (prefill_ms * 1e-3) : 0.0;
  out["ttft_ms"] = ttft_ms;
  out["ttft_ms_host_logits"] = ttft_host_ms;
  out["decode"] = decode;
  if (!trace_json.is_null()) out["decode_attention_trace"] = trace_json;
  out["weights_bytes_decode"] = decode_weight_bytes(model->weights(), 1);
  out["kv_bytes_per_token"] = kv_token_bytes;
  out["kv_dtype"] = std::string(dtype_name(kv_dtype));
  out["offload"] = {
      {"layers", offload.layers}, {"host_bytes", offload.host_bytes}, {"staging_bytes", offload.staging_bytes}};
  if (!profiles.empty()) out["profile"] = profiles;
#ifdef QVL_HAVE_CUDA
  if (!memory.is_null()) out["memory"] = memory;
#endif
  const std::string text = out.dump(1);
  std::printf("%s\n", text.c_str());
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << text << "\n";
    if (!f) return data_loss("cannot write " + o.out);
  }
  return Status::ok();
}

}  // namespace

QVL_REGISTER_COMMAND("bench", "Benchmark vision, prefill, TTFT and decode (JSON)", [](CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  app.add_option("model,--model", o->model.name, "Model directory, built-in name or hub id")->required();
  app.add_option("--revision", o->model.revision, "Hub revision (default main)");
  app.add_option("--image-size", o->image_size, "WxH of one synthetic image, multiples of 32, or none (1024x768)");
  app.add_option("--prompt-tokens", o->prompt_tokens, "Text tokens after the image (24)");
  app.add_option("--gen-tokens", o->gen_tokens, "Timed decode steps per batch size (64)");
  app.add_option("--batch", o->batches, "Decode batch sizes, comma-separated (1)");
  app.add_option("--backend", o->backend, "cuda | cpu (cuda)");
  app.add_option("--gpu", o->gpu, "CUDA device ordinal (0)");
  app.add_option("--threads", o->threads, "CPU backend threads (0 = all)");
  app.add_option("--repeat", o->repeat, "Timed runs of vision and TTFT; medians are reported (5)");
  app.add_flag("--no-graphs", o->no_graphs, "Decode without CUDA graphs (eager launches)");
  app.add_flag("--no-cublas-gelu", o->no_cublas_gelu,
               "CUDA A/B: GELU (tanh) Linears as a pass after cuBLASLt instead of its GELU epilogue");
  app.add_option("--skinny-bf16-max-rows", o->skinny_bf16_max_rows,
                 "CUDA A/B: BF16 Linears of at most this many rows take the skinny kernels, more take cuBLASLt (8)")
      ->check(CLI::Range(0, 32));
  app.add_option("--fused-rms-norm-max-rows", o->fused_rms_rows,
                 "CUDA A/B: RMSNorm runs inside the Linear that reads it up to this many rows, as its own kernel "
                 "past it (4)")
      ->check(CLI::Range(0, 8));
  app.add_option("--fused-prologue-max-copies-per-sm", o->fused_prologue_copies,
                 "CUDA A/B: a prologue is fused only into Linears whose blocks compute at most this many copies "
                 "of it per multiprocessor (16-row tiles x rows; 20, and never more than 12 past two rows)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--fused-silu-mul-max-rows", o->fused_silu_rows,
                 "CUDA A/B: SiLU·mul runs inside the Linear that reads it up to this many rows, as its own kernel "
                 "past it (1)")
      ->check(CLI::Range(0, 8));
  app.add_option("--silu-mul-epilogue-max-rows", o->silu_epilogue_rows,
                 "CUDA A/B: SiLU·mul runs in the epilogue of the gate_up Linear before it up to this many rows (8)")
      ->check(CLI::Range(0, 8));
  app.add_flag("--no-cluster-attention", o->no_cluster_attention,
               "CUDA A/B: vision and prefill attention without the thread-block-cluster key split");
  app.add_flag("--no-token-prepare", o->no_token_prepare,
               "CUDA A/B: text_qkv_prepare with its per-8-heads kernel instead of the vectorised one");
  app.add_flag("--no-prefill-q-alias", o->no_prefill_q_alias,
               "CUDA A/B: text prefill attention with Q in its own shared memory (2 blocks per SM)");
  app.add_option("--prefill-key-tiles", o->prefill_key_tiles,
                 "CUDA A/B: text prefill attention splits a query tile's keys over 2 or 4 blocks past this "
                 "many 64-key tiles (8)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--decode-split-blocks", o->decode_split_blocks,
                 "CUDA A/B: decode attention blocks over sequences x kv heads x splits (256)")
      ->check(CLI::Range(0, 256));
  app.add_option("--kv-page-tokens", o->kv_page_tokens, "Tokens per KV cache page (16)")->check(CLI::Range(1, 4096));
  app.add_option("--kv-dtype", o->kv_dtype, "KV cache dtype on CUDA: bf16 or fp8 (bf16)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--emulate-gpu", o->emulate_gpu,
                 "CUDA testing: choose kernels, shared memory and clusters as on this GPU, \"sm_NN[:BYTES]\" "
                 "(e.g. sm_120: an RTX 5060's 99 KB per block), every launch checked against its limits; "
                 "the device runs its own code, so the times are this device's");
  app.add_flag("--emulate-occupancy", o->emulate_occupancy,
               "CUDA testing, with --emulate-gpu: every launch pads its shared memory so that a multiprocessor "
               "holds no more of its blocks than on that GPU (its multiprocessors, clocks and bandwidth stay "
               "this device's)");
  app.add_option("--skip-kernels", o->skip_kernels,
                 "CUDA measurement only (results are wrong): leave out launches of these kernels, "
                 "\"name[@grid_x],...\" (e.g. text_decode_attention, skinny_linear@128)");
  app.add_option("--decode-attention-exit", o->decode_attention_exit,
                 "CUDA measurement only (results are wrong): stop the decode attention kernel early "
                 "(attention_decode.cu DecodeParams::debug_exit; 8: no key round after the first is loaded)")
      ->check(CLI::Range(0, 8));
  app.add_option("--decode-attention-trigger", o->decode_attention_trigger,
                 "CUDA A/B: when a decode attention block lets the next kernel launch: 0 after its PDL wait, "
                 "1 once its keys are done, 2 once its partial is written, 3 when it exits (default: chosen "
                 "per launch, CudaBackendOptions::decode_attention_trigger)")
      ->check(CLI::Range(-1, 3));
  app.add_option("--decode-l2-prefetch-mb", o->decode_l2_prefetch_mb,
                 "CUDA: MB of gate_up's and of down_proj's weights the decode attention asks L2 for, at every "
                 "batch (0: none; default: CudaBackendOptions::decode_l2_prefetch_bytes)");
  app.add_option("--decode-early-launch", o->decode_early_launch,
                 "CUDA A/B: whether a decode Linear without a prologue that does not follow the attention "
                 "(down_proj) lets the next kernel launch before its PDL wait: 0 never, 1 always (default -1: "
                 "at one row where its grid is over one and at most 1.5 blocks per multiprocessor, "
                 "CudaBackendOptions::decode_early_launch)")
      ->check(CLI::Range(-1, 1));
  app.add_flag("--decode-attention-trace", o->decode_attention_trace,
               "CUDA measurement: %globaltimer stamps of the decode attention's stages at batch 1 "
               "(JSON decode_attention_trace)");
  app.add_flag("--no-decode-cluster-merge", o->no_decode_cluster_merge,
               "CUDA A/B: decode attention splits merged by the last block to arrive (through L2) instead of "
               "in a thread-block cluster");
  app.add_flag("--no-decode-attention-tma", o->no_decode_attention_tma,
               "CUDA A/B: decode attention key rounds by cp.async from every thread instead of TMA boxes");
  app.add_flag("--no-ring-prologue-first", o->no_ring_prologue_first,
               "CUDA A/B: decode Linears through the bulk-copy ring issue every stage of weights before their PDL "
               "wait, also where a prologue reads its row after it");
  add_wgmma_flags(app, &o->no_vision_wgmma, &o->no_prefill_wgmma);
  app.add_option("--vision-attention-mt", o->vision_mt,
                 "CUDA A/B: vision attention 16-row m-tiles per warp, 2 (4 warps) or 1 (8 warps) (2)")
      ->check(CLI::IsMember({1, 2}));
  app.add_option("--prefill-small-tiles", o->prefill_small_tiles,
                 "CUDA A/B: text prefill attention through flash.cuh in key tiles of 32 (1) or 64 (0); default -1: "
                 "32 where that fits twice the blocks per multiprocessor")
      ->check(CLI::Range(-1, 1));
  app.add_option("--vision-q-through-k", o->vision_q_through_k,
                 "CUDA A/B: vision attention through flash.cuh with Q through its K stages (1) or in its own "
                 "shared memory (0); default -1: the former where it fits twice the blocks per multiprocessor")
      ->check(CLI::Range(-1, 1));
  app.add_option("--offload-layers", o->offload_layers,
                 "Keep the last N decoder layers in pinned host memory, streamed in every step (0)");
  app.add_option("--cuda-skinny", o->skinny,
                 "Decode Linear kernel override: "
                 "variant[,depth[,split[,group[,prewait[,blocks[,outputs[,stage[,warps]]]]]]]] "
                 "(benchmarks; outputs > 0: only Linears of that many outputs)");
  app.add_flag("--fused-decode", o->fused_decode,
               "CUDA, experimental: run one-sequence decode steps as one persistent kernel (sm_90+)");
  app.add_option(
      "--decode-stack-debug", o->decode_stack_debug,
      "CUDA diagnostics: switch parts of the fused decode stack off (1 waits, 2 math, 4 attention, 8 L2 prefetch; "
      "wrong results, for timing)");
  add_fp8_gemm_option(app, &o->fp8_gemm);
  app.add_flag("--profile", o->profile, "CUDA: per-op device times of vision, TTFT and one decode step (stderr)");
  app.add_option("--out", o->out, "Also write the JSON to this file");
  return [o]() -> int {
    Status s = run_bench(*o);
    if (!s.is_ok()) {
      std::fprintf(stderr, "qvl bench: %s\n", s.to_string().c_str());
      return 1;
    }
    return 0;
  };
});

}  // namespace qvl::cli
