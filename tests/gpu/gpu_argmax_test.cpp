// CUDA argmax_rows and top_k_rows (greedy and candidate sampling on the device) against the CPU
// backend's on the same logits, ids and keys compared exactly:
// - BF16 and F32 rows; vocab sizes that are multiples of 8 (the 16-byte loads) and that are not
//   (the scalar path), one row split over many blocks (151,936 = Qwen's vocabulary, and one past
//   the 64-block cap), slice edges (4095, 4097), rows misaligned for 16-byte loads;
// - more rows than one launch takes (kArgmaxMaxRows), so the keys and counters are reused and must
//   have been left zero;
// - rows built to trip the rule: many tied maxima (small integers), NaN first and scattered, rows
//   of NaN, -0 beside +0, ±inf;
// - a recorded graph replayed over new logits.
// The CPU ids are also checked against greedy_argmax (the host sampler's rule), and the CPU keys
// against top_k_keys. top_k_rows also takes k = 1, 20 and 64 and rows shorter than k; a row built
// against the kernel's thread stride (more candidates than a block holds) must come back as
// kTopKFallback, every other row as the CPU's keys.
#include <cmath>
#include <functional>

#include "backend/cuda/cuda_backend.h"
#include "backend/top_k.h"
#include "engine/sampler.h"
#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

// Row r of kind r % 7; every value is exact in BF16, so both dtypes hold the same numbers.
std::vector<float> tricky_logits(int64_t rows, int64_t vocab) {
  const float nan = std::nanf(""), inf = INFINITY;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(-8, 3), pick(0, 9);
  std::vector<float> x(static_cast<size_t>(rows * vocab));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) {
      float v = 0;
      switch (r % 7) {
        case 0:  // random: a unique maximum, most likely
          v = round_to_bf16(normal(rng()));
          break;
        case 1:  // integers up to 3: the maximum tied many times over
          v = static_cast<float>(small(rng()));
          break;
        case 2:  // as 1, with NaN first and in about one entry in ten
          v = i == 0 || pick(rng()) == 0 ? nan : static_cast<float>(small(rng()));
          break;
        case 3:  // nothing but NaN: 0
          v = nan;
          break;
        case 4: {  // at most zero: -0 and +0 tied at the top
          const float z[4] = {-0.0f, 0.0f, -1.0f, -2.0f};
          v = z[pick(rng()) % 4];
          break;
        }
        case 5: {  // infinities, NaN and a finite value: +inf tied
          const float z[4] = {-inf, inf, nan, 1.0f};
          v = pick(rng()) < 8 ? -inf : z[pick(rng()) % 4];
          break;
        }
        default:  // every entry -inf: 0
          v = -inf;
      }
      row[i] = v;
    }
  }
  return x;
}

struct Logits {
  Tensor c, g;  // the CPU's and CUDA's copies, same dtype
};

// `offset` elements into a buffer: an offset of 1 misaligns every row for 16-byte loads.
Logits upload(Scratch& s, DType dt, int64_t rows, int64_t vocab, const std::vector<float>& x, int64_t offset) {
  const int64_t n = rows * vocab + offset;
  Logits l{s.alloc(cpu(), dt, {n}), s.alloc(*cuda(), dt, {n})};
  std::vector<float> padded(static_cast<size_t>(offset), 0.0f);
  padded.insert(padded.end(), x.begin(), x.end());
  if (dt == DType::kBF16) {
    std::vector<uint16_t> b = to_bf16_bits(padded);
    cpu().copy_to_device(l.c, b.data());
    cuda()->copy_to_device(l.g, b.data());
  } else {
    cpu().copy_to_device(l.c, padded.data());
    cuda()->copy_to_device(l.g, padded.data());
  }
  const size_t skip = static_cast<size_t>(offset) * dtype_size(dt);
  l.c = Tensor(static_cast<char*>(l.c.data) + skip, dt, {rows, vocab}, cpu().device());
  l.g = Tensor(static_cast<char*>(l.g.data) + skip, dt, {rows, vocab}, cuda()->device());
  return l;
}

std::vector<int32_t> ids_of(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t);
  return v;
}

// One summary row for a comparison of `op` over rows: `bad` rows differed from the CPU's,
// `host_bad` of the CPU's from the host rule.
void record_rows(const std::string& op, DType dt, int64_t offset, const std::string& shape, int64_t bad,
                 int64_t host_bad) {
  CheckRow row{op + " " + std::string(dtype_name(dt)) + (offset ? " misaligned" : ""), shape};
  row.max_abs = static_cast<double>(bad);
  row.pass = bad == 0 && host_bad == 0;
  record(row);
}

// Runs both backends over `x` and compares the ids.
void check(const std::string& what, DType dt, int64_t rows, int64_t vocab, const std::vector<float>& x,
           int64_t offset = 0) {
  Scratch s;
  Logits l = upload(s, dt, rows, vocab, x, offset);
  Tensor ic = s.alloc(cpu(), DType::kI32, {rows}), ig = s.alloc(*cuda(), DType::kI32, {rows});
  std::vector<int32_t> minus(static_cast<size_t>(rows), -1);
  cuda()->copy_to_device(ig, minus.data());  // stale ids must be overwritten
  cpu().argmax_rows(ic, l.c);
  cuda()->argmax_rows(ig, l.g);
  const std::vector<int32_t> want = ids_of(cpu(), ic), got = ids_of(*cuda(), ig);
  int64_t bad = 0, host_bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(x.begin() + r * vocab, x.begin() + (r + 1) * vocab);
    if (dt == DType::kBF16)
      for (float& v : row) v = round_to_bf16(v);
    host_bad += want[static_cast<size_t>(r)] != greedy_argmax(row);
    if (got[static_cast<size_t>(r)] != want[static_cast<size_t>(r)]) {
      if (bad < 5)
        ADD_FAILURE() << what << " row " << r << " (kind " << r % 7 << "): CUDA " << got[static_cast<size_t>(r)]
                      << ", CPU " << want[static_cast<size_t>(r)];
      ++bad;
    }
  }
  EXPECT_EQ(host_bad, 0) << what << ": the CPU backend and greedy_argmax disagree";
  record_rows("argmax_rows", dt, offset, what, bad, host_bad);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << rows << " rows differ";
}

TEST(GpuArgmax, MatchesTheCpuBackend) {
  QVL_REQUIRE_CUDA();
  struct Case {
    int64_t rows, vocab;
  };
  const int64_t many = kArgmaxMaxRows * 2 + 52;  // three launches
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (Case c : {Case{1, 151936}, Case{7, 151936}, Case{14, 37}, Case{21, 1001}, Case{7, 8}, Case{9, 4095},
                   Case{9, 4097}, Case{3, 262144 + 4104}, Case{many, 264}, Case{kArgmaxMaxRows + 1, 9}}) {
      check(dims({c.rows, c.vocab}), dt, c.rows, c.vocab, tricky_logits(c.rows, c.vocab));
    }
    for (Case c : {Case{7, 1024}, Case{kArgmaxMaxRows + 3, 40}})  // vocab a multiple of 8, rows misaligned
      check(dims({c.rows, c.vocab}), dt, c.rows, c.vocab, tricky_logits(c.rows, c.vocab), 1);
  }
}

// Records `op` over BF16 logits [5, 151936] as a graph in round 0 and replays it in rounds 1 and 2
// over new logits at the same addresses; every round's output (dtype, dims) must be the CPU's.
void check_graph_replay(const std::string& op_name, DType out_dtype, std::initializer_list<int64_t> out_dims,
                        const std::function<void(Backend&, Tensor, const Tensor&)>& op) {
  Backend& be = *cuda();
  const int64_t rows = 5, vocab = 151936;
  Scratch s;
  Tensor logits = s.alloc(be, DType::kBF16, {rows, vocab}), out = s.alloc(be, out_dtype, out_dims);
  Tensor lc = s.alloc(cpu(), DType::kBF16, {rows, vocab}), oc = s.alloc(cpu(), out_dtype, out_dims);
  auto bytes = [](Backend& b, const Tensor& t) {
    std::vector<uint8_t> v(static_cast<size_t>(t.nbytes()));
    b.copy_to_host(v.data(), t);
    return v;
  };
  for (int round = 0; round < 3; ++round) {
    std::vector<uint16_t> b = to_bf16_bits(tricky_logits(rows, vocab));
    be.copy_to_device(logits, b.data());
    cpu().copy_to_device(lc, b.data());
    be.run_graph(op_name + "-test", [&] { op(be, out, logits); });
    op(cpu(), oc, lc);
    const bool same = bytes(be, out) == bytes(cpu(), oc);
    CheckRow row{op_name + " graph", "round " + std::to_string(round) + (round ? " (replay)" : " (record)")};
    row.pass = same;
    record(row);
    EXPECT_TRUE(same) << op_name << " round " << round;
  }
  be.clear_graphs();
}

TEST(GpuArgmax, GraphReplayTakesNewLogits) {
  QVL_REQUIRE_CUDA();
  check_graph_replay("argmax_rows", DType::kI32, {5},
                     [](Backend& b, Tensor ids, const Tensor& logits) { b.argmax_rows(ids, logits); });
}

std::vector<uint64_t> keys_of(Backend& be, const Tensor& t) {
  std::vector<uint64_t> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t);
  return v;
}

// Runs both backends' top_k_rows over `x` and compares the keys; rows in `fallback` must come
// back as kTopKFallback from CUDA (their CPU keys are checked against top_k_keys only).
void check_top_k(const std::string& what, DType dt, int64_t rows, int64_t vocab, int64_t k, const std::vector<float>& x,
                 int64_t offset = 0, const std::vector<int64_t>& fallback = {}) {
  Scratch s;
  Logits l = upload(s, dt, rows, vocab, x, offset);
  Tensor kc = s.alloc(cpu(), DType::kI64, {rows, k}), kg = s.alloc(*cuda(), DType::kI64, {rows, k});
  std::vector<uint64_t> stale(static_cast<size_t>(rows * k), 0x1234u);
  cuda()->copy_to_device(kg, stale.data());  // stale keys must be overwritten
  cpu().top_k_rows(kc, l.c);
  cuda()->top_k_rows(kg, l.g);
  const std::vector<uint64_t> want = keys_of(cpu(), kc), got = keys_of(*cuda(), kg);
  int64_t bad = 0, host_bad = 0, fallbacks = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(x.begin() + r * vocab, x.begin() + (r + 1) * vocab);
    if (dt == DType::kBF16)
      for (float& v : row) v = round_to_bf16(v);
    std::vector<uint64_t> ref(static_cast<size_t>(k));
    top_k_keys(row, ref);
    const auto w = want.begin() + r * k, g = got.begin() + r * k;
    host_bad += !std::equal(ref.begin(), ref.end(), w);
    const bool must_fall_back = std::find(fallback.begin(), fallback.end(), r) != fallback.end();
    const bool ok = must_fall_back
                        ? g[0] == kTopKFallback && std::all_of(g + 1, g + k, [](uint64_t v) { return v == 0; })
                        : std::equal(w, w + k, g);
    fallbacks += must_fall_back;
    if (!ok) {
      if (bad < 5) {
        int64_t first = 0;
        while (first < k && w[first] == g[first]) ++first;
        ADD_FAILURE() << what << " row " << r << " (kind " << r % 7 << ")"
                      << (must_fall_back ? " (must fall back)" : "") << ": first difference at " << first << ": CUDA "
                      << std::hex << g[std::min(first, k - 1)] << ", CPU " << w[std::min(first, k - 1)] << std::dec;
      }
      ++bad;
    }
  }
  EXPECT_EQ(host_bad, 0) << what << ": the CPU backend and top_k_keys disagree";
  record_rows("top_k_rows", dt, offset, what + " k " + std::to_string(k) + (fallbacks ? " +fallback" : ""), bad,
              host_bad);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << rows << " rows differ";
}

TEST(GpuTopK, MatchesTheCpuBackend) {
  QVL_REQUIRE_CUDA();
  struct Case {
    int64_t rows, vocab, k;
  };
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (Case c :
         {Case{7, 151936, 64}, Case{14, 151936, 20}, Case{7, 151936, 1}, Case{14, 37, 64}, Case{7, 1001, 64},
          Case{7, 8, 64}, Case{7, 4097, 64}, Case{3, 262144 + 4104, 64}, Case{70, 264, 64}, Case{7, 2048, 1024}}) {
      check_top_k(dims({c.rows, c.vocab}), dt, c.rows, c.vocab, c.k, tricky_logits(c.rows, c.vocab));
    }
    check_top_k(dims({7, 1024}), dt, 7, 1024, 64, tricky_logits(7, 1024), 1);  // rows misaligned
  }
}

TEST(GpuTopK, TooManyCandidatesFallBack) {
  QVL_REQUIRE_CUDA();
  // BF16, 151,936 entries: thread t of the block reads the 8-entry vectors t, t + 1024, ... Give
  // every entry of threads 0..99 its thread's value (1000 - t): the 64th largest thread maximum
  // is thread 63's, and all 148 entries of threads 0..62 lie above it, 9,000 candidates. Row 1 is
  // random and must not be affected.
  const int64_t vocab = 151936;
  std::vector<float> x = tricky_logits(2, vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    const int64_t thread = (i / 8) % 1024;
    x[static_cast<size_t>(i)] = thread < 100 ? 1000.0f - static_cast<float>(thread) : -5.0f;
  }
  check_top_k("strided", DType::kBF16, 2, vocab, 64, x, 0, {0});
}

TEST(GpuTopK, GraphReplayTakesNewLogits) {
  QVL_REQUIRE_CUDA();
  check_graph_replay("top_k_rows", DType::kI64, {5, kSampleCandidates},
                     [](Backend& b, Tensor keys, const Tensor& logits) { b.top_k_rows(keys, logits); });
}

}  // namespace
}  // namespace qvl::test::gpu
