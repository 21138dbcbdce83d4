// qvl bench's support pieces (bench_support.h).
#include "cli/bench_support.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "backend/top_k.h"
#include "core/dtype.h"
#include "engine/sampler.h"

namespace qvl::cli::bench {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

Result<std::vector<int>> parse_batches(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      int b = std::stoi(item, &used);
      if (used != item.size() || b < 1) throw std::invalid_argument(item);
      out.push_back(b);
    } catch (const std::exception&) {
      return invalid_argument("--batch " + s + ": '" + item + "' is not a positive integer");
    }
  }
  if (out.empty()) return invalid_argument("--batch " + s + ": no batch sizes");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {
// Bytes of a device tensor / Linear as the decode step reads them.
int64_t linear_bytes(const LinearWeight& w) {
  int64_t b = static_cast<int64_t>(w.bias.nbytes());
  for (const LinearPart& p : w.parts) b += static_cast<int64_t>(p.weight.nbytes() + p.scale_inv.nbytes());
  return b;
}
}  // namespace

int64_t decode_weight_bytes(const ModelWeights& w, int64_t batch) {
  const TextWeights& t = w.text;
  int64_t b = 0;
  for (const DecoderLayerWeights& l : t.layers) {
    b += linear_bytes(l.qkv) + linear_bytes(l.o) + linear_bytes(l.gate_up) + linear_bytes(l.down);
    b += static_cast<int64_t>(l.input_norm.nbytes() + l.post_attention_norm.nbytes() + l.q_norm.nbytes() +
                              l.k_norm.nbytes());
  }
  b += static_cast<int64_t>(t.final_norm.nbytes()) + linear_bytes(t.lm_head);
  b += batch * t.embed_tokens.row_numel() * dtype_size(t.embed_tokens.dtype);  // one embedding row per sequence
  return b;
}

Result<double> copy_bandwidth(Backend& be, bool device) {
  const size_t bytes = device ? (size_t{1} << 30) : (size_t{256} << 20);
  QVL_ASSIGN_OR_RETURN(DeviceBuffer a, be.allocate(bytes, "bench copy source"));
  QVL_ASSIGN_OR_RETURN(DeviceBuffer b, be.allocate(bytes, "bench copy destination"));
  Tensor ta(a.data(), DType::kU8, {static_cast<int64_t>(bytes)}, be.device());
  Tensor tb(b.data(), DType::kU8, {static_cast<int64_t>(bytes)}, be.device());
  be.copy(tb, ta);
  be.synchronize();
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const auto t = Clock::now();
    for (int i = 0; i < 4; ++i) be.copy(i % 2 ? ta : tb, i % 2 ? tb : ta);
    be.synchronize();
    runs.push_back(ms_since(t) / 4);
  }
  return 2.0 * static_cast<double>(bytes) / (median(runs) * 1e-3) / 1e9;
}

#ifdef QVL_HAVE_CUDA
nlohmann::json decode_trace_summary(const std::vector<uint64_t>& t, int layers) {
  nlohmann::json j = nlohmann::json::object();
  if (t.empty()) return j;
  auto at = [&](int l, int b, int s) {
    return t[(static_cast<size_t>(l) * kDecodeSplitBlocks + b) * kDecodeTraceStamps + s];
  };
  constexpr int kTimes = kDecodeTraceUnit;  // the stamps that are times
  const char* names[kTimes] = {"entry",           "keys_issued",    "wait_passed",     "prepared",
                               "keys_landed",     "keys_done",      "partial_written", "merged",
                               "warps_ml_shared", "inbox_complete", "split_weights",   "outputs_written"};
  std::vector<std::vector<double>> rel(kTimes), last(kTimes);
  std::vector<double> span, gap, first_in_to_wait;
  // Per (layer, unit) of the blocks that hold keys: the latest of each stage over the unit's
  // blocks, and the spread of their entries (one cluster enters together).
  std::vector<std::vector<double>> unit_gap(4), last_unit_gap(4);
  std::vector<double> entry_spread;
  const int L = std::min(layers, kDecodeTraceLayers);
  for (int l = 0; l < L; ++l) {
    uint64_t first_in = UINT64_MAX, last_out = 0, first_wait = UINT64_MAX;
    std::vector<uint64_t> latest(kTimes, 0);
    std::map<uint64_t, std::vector<uint64_t>> unit_latest;  // unit -> latest stage times
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> unit_entry;
    for (int b = 0; b < kDecodeSplitBlocks; ++b) {
      if (at(l, b, 0) == 0) continue;
      first_in = std::min(first_in, at(l, b, 0));
      const uint64_t unit = at(l, b, kDecodeTraceUnit);
      auto ue = unit_entry.emplace(unit, std::make_pair(at(l, b, 0), at(l, b, 0))).first;
      ue->second.first = std::min(ue->second.first, at(l, b, 0));
      ue->second.second = std::max(ue->second.second, at(l, b, 0));
      if (at(l, b, 2) == 0) continue;  // an empty split (returned early)
      first_wait = std::min(first_wait, at(l, b, 2));
      last_out = std::max(last_out, at(l, b, 7) ? at(l, b, 7) : at(l, b, 6));
      auto ul = unit_latest.emplace(unit, std::vector<uint64_t>(kTimes, 0)).first;
      for (int s = 0; s < kTimes; ++s) {
        if (at(l, b, s)) rel[s].push_back((static_cast<double>(at(l, b, s)) - static_cast<double>(at(l, b, 2))) / 1e3);
        latest[s] = std::max(latest[s], at(l, b, s));
        ul->second[s] = std::max(ul->second[s], at(l, b, s));
      }
    }
    if (first_wait == UINT64_MAX) continue;
    for (int s = 0; s < kTimes; ++s)
      if (latest[s]) last[s].push_back((static_cast<double>(latest[s]) - static_cast<double>(first_wait)) / 1e3);
    for (const auto& [unit, e] : unit_entry) entry_spread.push_back(static_cast<double>(e.second - e.first) / 1e3);
    // The merge's steps after the unit's slowest partial: partial -> inbox complete ->
    // outputs written -> exit (every block's latest), and the same for the unit that ends last.
    auto push_gaps = [](const std::vector<uint64_t>& v, std::vector<std::vector<double>>& out) {
      const int seq[4] = {6, 9, 11, 7};
      for (int i = 0; i < 3; ++i)
        out[i].push_back((static_cast<double>(v[seq[i + 1]]) - static_cast<double>(v[seq[i]])) / 1e3);
      out[3].push_back((static_cast<double>(v[6]) - static_cast<double>(v[2])) / 1e3);
    };
    uint64_t last_exit = 0;
    const std::vector<uint64_t>* last_unit = nullptr;
    for (const auto& [unit, v] : unit_latest) {
      if (v[7] == 0 || v[9] == 0 || v[11] == 0) continue;  // no cluster merge
      push_gaps(v, unit_gap);
      if (v[7] > last_exit) last_exit = v[7], last_unit = &v;
    }
    if (last_unit) push_gaps(*last_unit, last_unit_gap);
    span.push_back((static_cast<double>(last_out) - static_cast<double>(first_in)) / 1e3);
    first_in_to_wait.push_back((static_cast<double>(first_wait) - static_cast<double>(first_in)) / 1e3);
    if (l + 1 < L) {
      uint64_t next_wait = UINT64_MAX;
      for (int b = 0; b < kDecodeSplitBlocks; ++b)
        if (at(l + 1, b, 2)) next_wait = std::min(next_wait, at(l + 1, b, 2));
      if (next_wait != UINT64_MAX)
        gap.push_back((static_cast<double>(next_wait) - static_cast<double>(last_out)) / 1e3);
    }
  }
  nlohmann::json stages = nlohmann::json::object();
  for (int s = 0; s < kTimes; ++s) stages[names[s]] = median(rel[s]);
  j["stage_us_from_wait_median"] = stages;
  nlohmann::json slowest =
      nlohmann::json::object();  // per layer, the last block to reach the stage, from the first wait
  for (int s = 0; s < kTimes; ++s) slowest[names[s]] = median(last[s]);
  j["stage_us_last_block_from_first_wait_median"] = slowest;
  const char* gap_names[4] = {"slowest_partial_to_last_inbox", "last_inbox_to_last_outputs",
                              "last_outputs_to_last_exit", "last_wait_to_slowest_partial"};
  nlohmann::json units = nlohmann::json::object(), last_units = nlohmann::json::object();
  for (int i = 0; i < 4; ++i) {
    units[gap_names[i]] = median(unit_gap[i]);
    last_units[gap_names[i]] = median(last_unit_gap[i]);
  }
  j["cluster_us_median"] = units;            // over every (layer, unit) with a cluster merge
  j["last_cluster_us_median"] = last_units;  // per layer, the unit that exits last
  j["cluster_entry_spread_us_median"] = median(entry_spread);
  j["attention_span_us_median"] = median(span);
  j["first_entry_to_first_wait_us_median"] = median(first_in_to_wait);
  j["last_exit_to_next_wait_us_median"] = median(gap);
  return j;
}

nlohmann::json profile_table(const std::string& title, const std::vector<CudaKernelTime>& times) {
  struct Row {
    std::string op, kernel;
    int calls = 0;
    double us = 0, bytes = 0, flops = 0;
  };
  std::vector<Row> rows;
  std::map<std::string, size_t> index;
  double total = 0, span = 0;
  for (const CudaKernelTime& t : times) {
    auto [it, fresh] = index.emplace(t.op, rows.size());
    if (fresh) rows.push_back({t.op, t.kernel});
    Row& r = rows[it->second];
    if (r.kernel.find(t.kernel) == std::string::npos) r.kernel += "," + t.kernel;
    r.calls += 1;
    r.us += t.us;
    r.bytes += t.bytes;
    r.flops += t.flops;
    total += t.us;
    span = std::max(span, t.start_us + t.us);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.us > b.us; });
  std::fprintf(stderr, "\n== profile: %s: %zu launches, %.1f us in kernels, %.1f us first start to last end ==\n",
               title.c_str(), times.size(), total, span);
  std::fprintf(stderr, "%10s %6s %6s %9s %8s %8s  %s\n", "total_us", "share", "calls", "mean_us", "GB/s", "TFLOP/s",
               "op [kernels]");
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    const double gbps = r.bytes > 0 ? r.bytes / (r.us * 1e-6) / 1e9 : 0.0;
    const double tflops = r.flops > 0 ? r.flops / (r.us * 1e-6) / 1e12 : 0.0;
    std::fprintf(stderr, "%10.1f %5.1f%% %6d %9.2f %8.0f %8.1f  %s [%s]\n", r.us, 100.0 * r.us / total, r.calls,
                 r.us / r.calls, gbps, tflops, r.op.c_str(), r.kernel.c_str());
    out.push_back({{"op", r.op},
                   {"kernels", r.kernel},
                   {"calls", r.calls},
                   {"us", r.us},
                   {"bytes", r.bytes},
                   {"flops", r.flops},
                   {"gbps", gbps},
                   {"tflops", tflops}});
  }
  return nlohmann::json{
      {"title", title}, {"launches", times.size()}, {"kernel_us", total}, {"span_us", span}, {"ops", out}};
}
#endif

SampledSteps time_sampled_steps(Backend& be, const Tensor& logits, const Tensor& keys, int steps,
                                const std::function<void(bool keys)>& run_step) {
  const int64_t B = logits.dim(0), V = logits.dim(1), K = kSampleCandidates;
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_k = 20;
  sp.top_p = 0.8f;
  std::vector<Sampler> samplers;
  for (int64_t b = 0; b < B; ++b) samplers.emplace_back(sp, static_cast<int>(V), static_cast<uint64_t>(b + 1));
  std::vector<float> rows(static_cast<size_t>(B * V));
  std::vector<uint16_t> bits(logits.dtype == DType::kBF16 ? rows.size() : 0);
  std::vector<uint64_t> host_keys(static_cast<size_t>(B * K));
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  std::vector<char> whole(static_cast<size_t>(B));  // rows the keys leave undecided
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(B, omp_get_max_threads())));
  // logits rows [r0, r0 + n) -> rows, as f32 (the runner's conversion: one thread).
  auto fetch = [&](int64_t r0, int64_t n) {
    const Tensor part = logits.rows(r0, r0 + n);
    if (logits.dtype == DType::kF32) return be.copy_to_host(rows.data() + r0 * V, part);
    be.copy_to_host(bits.data() + r0 * V, part);
    for (int64_t i = r0 * V; i < (r0 + n) * V; ++i)
      rows[static_cast<size_t>(i)] = bf16_to_float(bits[static_cast<size_t>(i)]);
  };
  // The first sampling failure (non-finite logits, say, where a measurement left kernels out),
  // rethrown outside the OpenMP regions, which an exception must not leave. `sample` is any
  // callable (a template parameter: no std::function wrapped around every row of a timed step).
  std::string failure;
  auto sample_row = [&](int64_t b, auto&& sample) {
    try {
      tokens[static_cast<size_t>(b)] = sample();
    } catch (const std::exception& e) {
#pragma omp critical(qvl_bench_sampling)
      if (failure.empty()) failure = "sequence " + std::to_string(b) + ": " + e.what();
    }
  };
  auto check = [&] {
    if (!failure.empty()) throw std::runtime_error("the sampled decode timing: " + failure);
  };
  SampledSteps out;
  auto t = Clock::now();
  for (int i = 0; i < steps; ++i) {
    run_step(false);
    fetch(0, B);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t b = 0; b < B; ++b)
      sample_row(b, [&] { return samplers[static_cast<size_t>(b)].sample(std::span(rows).subspan(b * V, V)); });
    check();
  }
  out.rows_ms = ms_since(t) / steps;
  t = Clock::now();
  for (int i = 0; i < steps; ++i) {
    run_step(true);
    be.copy_to_host(host_keys.data(), keys);
    for (int64_t b = 0; b < B; ++b) {
      whole[static_cast<size_t>(b)] =
          !samplers[static_cast<size_t>(b)].candidates_decide(std::span(host_keys).subspan(b * K, K));
      if (!whole[static_cast<size_t>(b)]) continue;
      fetch(b, 1);
      ++out.whole_rows;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t b = 0; b < B; ++b) {
      Sampler& sm = samplers[static_cast<size_t>(b)];
      sample_row(b, [&] {
        return whole[static_cast<size_t>(b)] ? sm.sample(std::span(rows).subspan(b * V, V))
                                             : sm.sample_candidates(std::span(host_keys).subspan(b * K, K));
      });
    }
    check();
  }
  out.keys_ms = ms_since(t) / steps;
  return out;
}

std::vector<uint8_t> synthetic_rgb(int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  uint32_t s = 12345;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<uint8_t>(s >> 24);
  }
  return v;
}

}  // namespace qvl::cli::bench
