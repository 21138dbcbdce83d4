// Pieces of `qvl bench` (cmd_bench.cpp) that are not the benchmark itself: timing helpers, the
// --batch parser, the bytes a decode step reads, the copy-bandwidth test behind the floor, the
// per-op profile table, the decode attention trace summary, and the synthetic test image.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/weights.h"
#ifdef QVL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qvl::cli::bench {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t);
double median(std::vector<double> v);

// "1,8,32" -> {1, 8, 32}, sorted, duplicates removed; invalid-argument naming the bad item.
Result<std::vector<int>> parse_batches(const std::string& s);

// Bytes a decode step of `batch` sequences reads: every text weight once, one embedding row per
// sequence (the KV cache is counted by the caller).
int64_t decode_weight_bytes(const ModelWeights& w, int64_t batch);

// Device-to-device copy bandwidth in GB/s, counting the bytes read and the bytes written: the
// median of 5 runs of 4 copies between two buffers of 1 GiB (256 MiB on the CPU backend).
Result<double> copy_bandwidth(Backend& be, bool device);

#ifdef QVL_HAVE_CUDA
// One profile table: launches grouped by op label, largest total first, printed to stderr.
nlohmann::json profile_table(const std::string& title, const std::vector<CudaKernelTime>& times);
// The decode attention's stage stamps of one step (cuda_decode_attention_trace), summarised:
// per stage, the median over layers and blocks of its time from the block's PDL wait (us), and
// the median over layers of the last block to reach it, from the layer's first wait; per
// layer, the attention's span (first block in to last block out) and the gap from its last
// block out to the next layer's first wait release (the Linears between), medians over layers;
// per (layer, sequence x kv head unit) with a cluster merge, the merge's steps after the unit's
// slowest partial, as medians over all units and over each layer's last unit to exit.
nlohmann::json decode_trace_summary(const std::vector<uint64_t>& t, int layers);
#endif

// Decode steps sampled as a chat request is by default (Qwen3-VL's generation_config:
// temperature 0.7, top-k 20, top-p 0.8), each of the B rows by its own seeded Sampler, the rows
// on OpenMP threads as the engine samples them. `run_step(false)` runs a step whose logits
// [B, V] then come to the host for Sampler::sample (the engine without candidate keys);
// `run_step(true)` runs a step that also writes `keys` [B, kSampleCandidates]
// (Backend::top_k_rows), which come to the host for Sampler::sample_candidates, a row fetched
// whole where its keys do not decide (ModelRunner::forward_top_k). Returns ms per step of each
// (`steps` steps each) and the rows fetched whole.
struct SampledSteps {
  double rows_ms = 0, keys_ms = 0;
  int64_t whole_rows = 0;
};
SampledSteps time_sampled_steps(Backend& be, const Tensor& logits, const Tensor& keys, int steps,
                                const std::function<void(bool keys)>& run_step);

// A deterministic RGB8 image of n bytes (an LCG's high bits).
std::vector<uint8_t> synthetic_rgb(int64_t n);

}  // namespace qvl::cli::bench
