// CUDA vs CPU Linear: BF16 and FP8 (128x128 block scales) weights, stacked parts merged at
// load, every dispatch path (skinny kernels for <= 32 rows, the wide FP8 variant where sm_90
// clusters exist, skinny passes for FP8 <= 128 rows,
// cuBLASLt BF16, FP8 dequantised in chunks + cuBLASLt, FP8 W8A8 block-scaled cuBLASLt on sm_90
// and its activation quantisation, checked against a host W8A8 reference), every epilogue (bias,
// GELU tanh/erf, residual, residual aliasing the output), and shapes with N not a multiple of 16,
// K not a multiple of 128 and K not a multiple of 8 (no skinny kernel: cuBLASLt at low alignment).
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "cli/emulate_gpu.h"
#include "gpu/gpu_linear_util.h"
#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

struct Case {
  int64_t n, K;
  std::vector<int64_t> part_rows;  // stacked parts (q|k|v, gate|up)
  bool fp8;
  bool bias;
  Activation act;
  int residual;  // 0 none, 1 separate tensor, 2 aliases out
};

std::string describe(const Case& c) {
  int64_t N = 0;
  for (int64_t r : c.part_rows) N += r;
  std::string s = 'n' + std::to_string(c.n) + " K" + std::to_string(c.K) + " N" + std::to_string(N);
  if (c.part_rows.size() > 1) s += " parts" + std::to_string(c.part_rows.size());
  if (c.bias) s += " +b";
  if (c.act == Activation::kGeluTanh) s += " gelu_tanh";
  if (c.act == Activation::kGeluErf) s += " gelu_erf";
  if (c.residual == 1) s += " +res";
  if (c.residual == 2) s += " +res(in place)";
  return s;
}

// ---- the W8A8 path's reference (sm_90: fp8_quant.cu + block-scaled cuBLASLt) ----

// Host twin of fp8_quant.cu: per row and 128 columns, s = amax / 448 (IEEE fp32 division) and
// q = e4m3(x / max(s, 1e-12)) rounded to nearest even and saturated (core/dtype.h).
struct HostQuant {
  int64_t groups = 0;
  std::vector<uint8_t> q;    // [n, K]
  std::vector<float> scale;  // [groups, n]: row r, group g at g * n + r
};
HostQuant host_quantize(const std::vector<float>& x, int64_t n, int64_t K) {
  HostQuant h;
  h.groups = (K + 127) / 128;
  h.q.resize(static_cast<size_t>(n * K));
  h.scale.resize(static_cast<size_t>(h.groups * n));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < h.groups; ++g) {
      const int64_t c0 = g * 128, c1 = std::min(K, c0 + 128);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x[r * K + c]));
      const float s = amax / 448.0f;
      const float d = std::fmax(s, 1e-12f);
      h.scale[g * n + r] = s;
      for (int64_t c = c0; c < c1; ++c) h.q[r * K + c] = fp8_e4m3_from_float(x[r * K + c] / d);
    }
  }
  return h;
}

// Rows of the W8A8 reference: the first and last 16 (the tail call's rows and the ones before
// them), every 61st, and 840..871 (the chunk boundary of the 1700-row case).
std::vector<int64_t> reference_rows(int64_t n) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < n; ++r)
    if (r < 16 || r >= n - 16 || r % 61 == 0 || (r >= 840 && r < 872)) rows.push_back(r);
  return rows;
}

// out[r, j] for `rows`: Σ_g s_x[r, g] · s_w[j / 128, g] · Σ_{k∈g} q[r, k] · w8[j, k] in double
// (each group's sum is exact), + bias, then the CUDA epilogue's roundings where an activation
// follows (the Linear's output is rounded to BF16 first), + residual.
std::vector<float> w8a8_reference(const Case& c, const std::vector<HostPart>& parts, const std::vector<float>& x,
                                  const std::vector<float>& bias, const std::vector<float>& res,
                                  const std::vector<int64_t>& rows) {
  const int64_t K = c.K, cb = (K + 127) / 128;
  int64_t N = 0;
  for (const HostPart& p : parts) N += p.rows;
  const HostQuant hq = host_quantize(x, c.n, K);
  std::vector<float> out;
  out.reserve(rows.size() * static_cast<size_t>(N));
  std::vector<float> xq(static_cast<size_t>(K));
  for (int64_t r : rows) {
    for (int64_t k = 0; k < K; ++k) xq[k] = fp8_e4m3_to_float(hq.q[r * K + k]);
    int64_t j0 = 0;
    for (const HostPart& p : parts) {
      for (int64_t jl = 0; jl < p.rows; ++jl) {
        const uint8_t* w8 = &p.fp8[jl * K];
        double acc = 0.0;
        for (int64_t g = 0; g < cb; ++g) {
          double part = 0.0;
          for (int64_t k = g * 128; k < std::min(K, g * 128 + 128); ++k)
            part += static_cast<double>(xq[k]) * fp8_e4m3_to_float(w8[k]);
          acc += part * hq.scale[g * c.n + r] * p.scale[(jl / 128) * cb + g];
        }
        const int64_t j = j0 + jl;
        if (!bias.empty()) acc += bias[j];
        if (c.act != Activation::kNone) {
          const double z = round_to_bf16(static_cast<float>(acc));
          const double a = c.act == Activation::kGeluTanh
                               ? 0.5 * z * (1.0 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
                               : 0.5 * z * (1.0 + std::erf(z * 0.7071067811865476));
          acc = round_to_bf16(static_cast<float>(a));
        }
        if (!res.empty()) acc += res[r * N + j];
        out.push_back(static_cast<float>(acc));
      }
      j0 += p.rows;
    }
  }
  return out;
}

// Which path an FP8 Linear over more than kSkinnyFp8MaxRows rows must take.
enum class Expect { kAny, kW8A8OnSm90, kDequant };

bool is_sm90() {
  return cuda_device_info(0).value().compute_capability / 10 == 9;
}

// Runs one Linear on `gpu` and checks it: against the host W8A8 reference when the backend took
// the W8A8 path, else against the CPU backend (FP8: transformers' dequantised weights). With
// gpu_out, also returns the GPU's output.
void run_case(const Case& c, Backend& gpu = *cuda(), Expect expect = Expect::kAny,
              std::vector<float>* gpu_out = nullptr) {
  Scratch s;
  const int64_t K = c.K;
  std::vector<HostPart> host;
  std::vector<LinearPart> parts;
  int64_t N = 0;
  for (int64_t rows : c.part_rows) {
    host.push_back(make_part(rows, K, c.fp8, 1.0f / std::sqrt(static_cast<float>(K))));
    N += rows;
  }
  for (HostPart& h : host) parts.push_back(part_view(h, K, c.fp8));
  std::vector<float> bias;
  std::vector<uint16_t> bias_bits;
  Tensor host_bias;
  if (c.bias) {
    bias = random_values(N, 0.5f);
    bias_bits = to_bf16_bits(bias);
    host_bias = Tensor(bias_bits.data(), DType::kBF16, {N});
  }
  auto wg = gpu.load_linear(parts, host_bias, 128);
  ASSERT_TRUE(wg.is_ok()) << wg.status().to_string();
  ASSERT_EQ(wg->out_features, N);

  // Rows and 128-column groups of different magnitudes, so that a scale applied to the wrong row
  // or group shows.
  std::vector<float> xv = random_values(c.n * K);
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t k = 0; k < K; ++k)
      xv[r * K + k] = round_to_bf16(xv[r * K + k] *
                                    std::ldexp(1.0f + static_cast<float>((k / 128) % 3), static_cast<int>(r % 3) - 1));
  std::vector<float> res, out0(static_cast<size_t>(c.n * N), 99.0f);
  if (c.residual == 1) res = random_values(c.n * N);
  if (c.residual == 2) res = out0 = random_values(c.n * N);
  Pair x{s.alloc(cpu(), DType::kF32, {c.n, K}), s.alloc(gpu, DType::kBF16, {c.n, K})};
  Pair out{s.alloc(cpu(), DType::kF32, {c.n, N}), s.alloc(gpu, DType::kBF16, {c.n, N})};
  Pair rp;
  if (c.residual == 1) rp = {s.alloc(cpu(), DType::kF32, {c.n, N}), s.alloc(gpu, DType::kBF16, {c.n, N})};
  if (c.residual == 2) rp = out;
  auto upload = [&](const Pair& p, const std::vector<float>& v) {
    cpu().copy_to_device(p.c, v.data());
    const std::vector<uint16_t> b = to_bf16_bits(v);
    gpu.copy_to_device(p.g, b.data());
  };
  upload(x, xv);
  upload(out, out0);
  if (c.residual == 1) upload(rp, res);

  // Past the skinny kernels (more rows, or a K they cannot stream): a counted GEMM path.
  const bool counted = c.fp8 && (c.n > kSkinnyFp8MaxRows || K % 16 != 0);
  const CudaFp8GemmCounts before = cuda_fp8_gemm_counts(gpu);
  gpu.linear(out.g, x.g, *wg, {c.act, rp.g});
  const CudaFp8GemmCounts after = cuda_fp8_gemm_counts(gpu);
  const bool w8a8 = after.w8a8 > before.w8a8;
  EXPECT_EQ(after.w8a8 + after.dequant - before.w8a8 - before.dequant, counted ? 1 : 0) << describe(c);
  if (expect == Expect::kW8A8OnSm90) {
    EXPECT_EQ(w8a8, is_sm90()) << describe(c) << ": W8A8 on sm_90 (cuBLASLt refused it?), dequantised elsewhere";
  }
  if (expect == Expect::kDequant) {
    EXPECT_FALSE(w8a8) << describe(c);
  }

  const std::string op = std::string("linear ") + (!c.fp8 ? "bf16" : w8a8 ? "fp8 w8a8" : "fp8");
  if (w8a8) {
    const std::vector<int64_t> rows = reference_rows(c.n);
    const std::vector<float> all = download(gpu, out.g);
    std::vector<float> got;
    got.reserve(rows.size() * static_cast<size_t>(N));
    for (int64_t r : rows) got.insert(got.end(), all.begin() + r * N, all.begin() + (r + 1) * N);
    EXPECT_TRUE(compare(op, describe(c) + " (" + std::to_string(rows.size()) + " rows)", got,
                        w8a8_reference(c, host, xv, bias, res, rows), tol::kGpuFp8W8A8));
    return;
  }
  auto wc = cpu().load_linear(parts, host_bias, 128);
  ASSERT_TRUE(wc.is_ok()) << wc.status().to_string();
  cpu().linear(out.c, x.c, *wc, {c.act, rp.c});
  const std::vector<float> got = download(gpu, out.g);
  EXPECT_TRUE(compare(op, describe(c), got, download(cpu(), out.c), tol::kGpuLinear));
  if (gpu_out) *gpu_out = got;
}

TEST(GpuOps, LinearBf16) {
  QVL_REQUIRE_CUDA();
  const auto none = Activation::kNone;
  std::vector<Case> cases = {
      {1, 2048, {2048}, false, false, none, 0},              // decode o_proj shape
      {1, 2048, {2048, 1024, 1024}, false, false, none, 0},  // q|k|v merged
      {7, 2048, {1000}, false, true, none, 1},               // N % 16 != 0
      {8, 256, {384}, false, false, Activation::kGeluTanh, 0},
      {17, 4096, {136}, false, true, none, 2},                      // in-place residual
      {32, 1000, {64, 64}, false, false, Activation::kGeluErf, 0},  // K % 128 != 0
      {33, 512, {640}, false, true, none, 2},                       // cuBLASLt
      {200, 1536, {1024}, false, true, none, 0},                    // patch embed shape
      {129, 1024, {4096}, false, true, Activation::kGeluTanh, 0},
      {64, 4096, {4096}, false, true, Activation::kGeluErf, 0},  // merger fc1 shape
      {5, 36, {24}, false, true, none, 1},                       // K % 8 != 0: cuBLASLt
      {300, 36, {50}, false, false, Activation::kGeluTanh, 0},
      {9, 2048, {2048}, false, true, none, 2},  // 9 rows: cuBLASLt by default
      {16, 2048, {1024, 1024}, false, false, none, 0},
  };
  for (const Case& c : cases) run_case(c);
  // BF16 over kSkinnyBf16MaxRows rows takes cuBLASLt by default; the skinny kernels still take
  // up to kSkinnyMaxRows where asked (CudaBackendOptions::skinny_bf16_max_rows): checked too.
  CudaBackendOptions o;
  o.skinny_bf16_max_rows = kSkinnyMaxRows;
  auto skinny = make_cuda_backend(o);
  ASSERT_TRUE(skinny.is_ok()) << skinny.status().to_string();
  int forced = 0;
  for (const Case& c : cases) {
    if (c.n <= kSkinnyBf16MaxRows || c.n > kSkinnyMaxRows || c.K % 8 != 0) continue;
    SCOPED_TRACE("skinny up to 32 rows: " + describe(c));
    run_case(c, **skinny);
    ++forced;
  }
  EXPECT_EQ(forced, 4);  // 9, 16, 17 and 32 rows
}

// GELU (tanh) over many rows as a pass after the rounded cuBLASLt output (CudaBackendOptions::
// cublas_gelu off; on, LinearBf16 takes them through cuBLASLt's epilogue).
TEST(GpuOps, LinearGeluPass) {
  QVL_REQUIRE_CUDA();
  CudaBackendOptions o;
  o.cublas_gelu = false;
  auto be = make_cuda_backend(o);
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  run_case({129, 1024, {4096}, false, true, Activation::kGeluTanh, 0}, **be);
  run_case({300, 36, {50}, false, false, Activation::kGeluTanh, 0}, **be);
}

TEST(GpuOps, LinearFp8) {
  QVL_REQUIRE_CUDA();
  const auto none = Activation::kNone;
  std::vector<Case> cases = {
      {1, 2048, {2048, 1024, 1024}, true, false, none, 0},       // decode q|k|v
      {1, 6144, {2048}, true, false, none, 2},                   // decode down + residual
      {3, 2048, {6144, 6144}, true, false, none, 0},             // gate|up
      {16, 2560, {200, 184}, true, true, none, 1},               // parts off the 128 grid: per-row scales
      {32, 1008, {300}, true, false, Activation::kGeluTanh, 0},  // K, N off the 128 grid
      {20, 1000, {136}, true, true, none, 0},                    // K % 16 != 0: dequant + cuBLASLt
      {77, 2048, {1024}, true, false, none, 2},                  // skinny passes (<= 128 rows)
      {128, 512, {640}, true, true, none, 0},
      {129, 2048, {2048, 512, 512}, true, false, none, 0},  // dequant + cuBLASLt
      {300, 1024, {4100}, true, true, none, 1},             // dequant + cuBLASLt, N off the 128 grid
      {16, 2048, {6144, 6144}, true, false, none, 0},       // 2B gate|up at 16 rows: wide on sm_90
      {32, 4096, {2560}, true, false, none, 2},             // 4B o_proj at 32 rows: wide, split over a cluster
      {64, 2048, {6144, 6144}, true, false, none, 0},       // one wide pass of 64 rows
      {100, 4096, {2560}, true, true, none, 2},             // wide passes of 64 and 36 rows
  };
  for (const Case& c : cases) run_case(c);
}

// The one-tile skinny kernel's load orders (kernels.h SkinnyTuning: group = chunks a warp loads
// at once, prewait = groups issued before the PDL wait), each forced on decode shapes whose
// warps hold one chunk, part of a group, two groups and more (K = 1008, 2048, 2560, 9728), at one
// row and at 8 and 17 rows, BF16 and FP8 (block and per-row scales).
TEST(GpuOps, LinearSkinnyLoadOrders) {
  QVL_REQUIRE_CUDA();
  const auto none = Activation::kNone;
  const std::vector<Case> fp8_cases = {
      {1, 1008, {300}, true, false, Activation::kGeluTanh, 0},  // 8 chunks, the last one short
      {1, 2560, {200, 184}, true, true, none, 1},               // 20 chunks, per-row scales
      {1, 9728, {256}, true, false, none, 2},                   // 76 chunks: groups in turn
      {8, 2048, {2048}, true, false, none, 2},
      {17, 2560, {384}, true, true, none, 0},
  };
  const std::vector<Case> bf16_cases = {
      {1, 1000, {64, 64}, false, false, none, 0},  // K % 128 != 0
      {1, 6144, {272}, false, false, none, 2},
      {8, 2048, {512}, false, true, none, 1},
  };
  for (int group : {1, 2, 3, 5}) {  // 3 and 5: FP8 up to 8 rows (17 rows keep 2)
    for (int prewait : {1, 2}) {
      CudaBackendOptions o;
      o.skinny.variant = 1;
      o.skinny.group = group;
      o.skinny.prewait = prewait;
      auto be = make_cuda_backend(o);
      ASSERT_TRUE(be.is_ok()) << be.status().to_string();
      SCOPED_TRACE("group " + std::to_string(group) + " prewait " + std::to_string(prewait));
      for (const Case& c : fp8_cases) run_case(c, **be);
      if (group == 1)  // BF16 chunks already fill a load round
        for (const Case& c : bf16_cases) run_case(c, **be);
    }
  }
}

// 16 warps per block (SkinnyTuning::warps, up to 8 rows), forced with groups of one and two FP8
// chunks, before and after the wait: against the CPU oracle, on K of 8 chunks (the last one
// short), 20 (per-row scales), 48 (2B down, residual), 76 (groups in turn) and at 8 rows, and on
// BF16 weights (K % 128 != 0, 2B down, 8 rows). The launch counter shows that every case ran the
// 16-warp blocks.
TEST(GpuOps, LinearSkinnySixteenWarps) {
  QVL_REQUIRE_CUDA();
  const auto none = Activation::kNone;
  const std::vector<Case> cases = {
      {1, 1008, {300}, true, false, Activation::kGeluTanh, 0},
      {1, 2560, {200, 184}, true, true, none, 1},
      {1, 6144, {2048}, true, false, none, 2},
      {1, 9728, {256}, true, false, none, 2},
      {8, 2048, {2048}, true, false, none, 2},
  };
  const std::vector<Case> bf16_cases = {
      {1, 1000, {64, 64}, false, false, none, 0},
      {1, 6144, {2048}, false, false, none, 2},
      {8, 2048, {512}, false, true, none, 1},
  };
  for (int group : {1, 2}) {
    for (int prewait : {1, 2}) {
      CudaBackendOptions o;
      o.skinny.variant = 1;
      o.skinny.group = group;
      o.skinny.prewait = prewait;
      o.skinny.warps = 16;
      auto be = make_cuda_backend(o);
      ASSERT_TRUE(be.is_ok()) << be.status().to_string();
      SCOPED_TRACE("group " + std::to_string(group) + " prewait " + std::to_string(prewait));
      const int64_t before = cuda_fp8_gemm_counts(**be).skinny_16_warps;
      for (const Case& c : cases) run_case(c, **be);
      size_t launched = cases.size();
      if (group == 1) {  // BF16 takes groups of one chunk
        for (const Case& c : bf16_cases) run_case(c, **be);
        launched += bf16_cases.size();
      }
      EXPECT_EQ(cuda_fp8_gemm_counts(**be).skinny_16_warps - before, static_cast<int64_t>(launched));
    }
  }
}

// A tile's K over a cluster pair of blocks (SkinnyTuning::split 2, FP8 up to 8 rows, sm_90+),
// forced: against the CPU oracle, on K of 8 chunks (block 1 has none), 20 (per-row scales), 32
// (4B o_proj), 76 (4B down, residual in place), at 5 and 8 rows and with N ending in a partial
// tile; the launch counter shows that every case ran as pairs.
TEST(GpuOps, LinearSkinnyFp8ClusterPairs) {
  QVL_REQUIRE_CUDA();
  auto info = cuda_device_info(0);
  if (!info.is_ok() || info->compute_capability < 90) GTEST_SKIP() << "no thread-block clusters";
  const auto none = Activation::kNone;
  const std::vector<Case> cases = {
      {1, 1008, {300}, true, true, Activation::kGeluTanh, 0},
      {1, 2560, {200, 184}, true, false, none, 1},
      {1, 4096, {2560}, true, false, none, 0},
      {1, 9728, {2560}, true, false, none, 2},
      {5, 2560, {300}, true, false, none, 1},
      {8, 2048, {1024}, true, true, none, 0},
  };
  for (int prewait : {1, 2}) {
    CudaBackendOptions o;
    o.skinny.variant = 1;
    o.skinny.split = 2;
    o.skinny.prewait = prewait;
    auto be = make_cuda_backend(o);
    ASSERT_TRUE(be.is_ok()) << be.status().to_string();
    SCOPED_TRACE("prewait " + std::to_string(prewait));
    const int64_t before = cuda_fp8_gemm_counts(**be).skinny_pairs;
    for (const Case& c : cases) run_case(c, **be);
    EXPECT_EQ(cuda_fp8_gemm_counts(**be).skinny_pairs - before, static_cast<int64_t>(cases.size()));
  }
}

// Runs c on a, then with the same weights and inputs on b: how many outputs differ in any bit
// (-1 where the output sizes differ).
int64_t outputs_differing(const Case& c, Backend& a, Backend& b) {
  const std::mt19937 seed = rng();
  std::vector<float> x, y;
  run_case(c, a, Expect::kAny, &x);
  rng() = seed;
  run_case(c, b, Expect::kAny, &y);
  EXPECT_EQ(x.size(), y.size());
  return x.size() == y.size() ? bits_differ(x, y) : -1;
}

// Three FP8 blocks per multiprocessor (SkinnyTuning::blocks: groups of one chunk at 80
// registers), forced on every K: against the CPU oracle, and the same bits as the default
// blocks of groups of one chunk. K = 1008 ends in a short chunk, 9728 takes buffers A and B in
// turn; N = 300, 584 and 48 end in a partial tile.
TEST(GpuOps, LinearSkinnyFp8BlockShapes) {
  QVL_REQUIRE_CUDA();
  const auto none = Activation::kNone;
  const std::vector<Case> cases = {
      {1, 2048, {2048}, true, false, none, 0},                 // a one-round K
      {1, 1008, {300}, true, true, Activation::kGeluTanh, 0},  // short last chunk, bias
      {1, 2560, {384, 200}, true, false, none, 2},             // stacked parts, in-place residual
      {1, 9728, {48}, true, false, none, 1},                   // 76 chunks
      {8, 2048, {1024}, true, false, none, 0},                 // 8 rows
      {5, 2560, {300}, true, false, none, 1},
  };
  CudaBackendOptions o;
  o.skinny.variant = 1;
  o.skinny.group = 1;
  o.skinny.prewait = 2;
  auto two = make_cuda_backend(o);
  o.skinny.blocks = 3;
  auto three = make_cuda_backend(o);
  ASSERT_TRUE(two.is_ok() && three.is_ok());
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    EXPECT_EQ(outputs_differing(c, **two, **three), 0)
        << "outputs differ between two and three blocks per multiprocessor";
  }
}

// The bulk-copy ring kernel (SkinnyTuning::variant 3, sm_90+), forced: against the CPU oracle,
// and the same bits as the default kernels with 8 warps per block (the ring's consumers take the
// chunks of a tile as the 8 warps of a one-tile block do; 16-warp blocks, the default for some
// shapes, add in another order). Whole tiles and row segments of 8, 16 and 32 chunks
// (ending mid-K at K = 2560, 9728 and in a short chunk at 1008), rings of 2 stages that wrap many
// times, one and two blocks per multiprocessor; N = 300, 584 and 48 end in a partial tile (whole
// tiles leave its missing rows uncopied); 1, 5 and 8 rows. Each ring also as on an RTX 5060
// (CudaBackendOptions::emulate_*: sm_120, 99 KB per block), where its budget leaves room for two
// or three stages of row segments: depths over that are cut to what fits, and a ring that cannot
// fit two stages gives way to the default kernels (the same bits either way).
TEST(GpuOps, LinearSkinnyRing) {
  QVL_REQUIRE_CUDA();
  if (!is_sm90()) GTEST_SKIP() << "the ring kernel needs sm_90 (cp.async.bulk)";
  const auto none = Activation::kNone;
  const std::vector<Case> cases = {
      {1, 2048, {2048}, true, false, none, 0},
      {1, 1008, {300}, true, true, Activation::kGeluTanh, 0},  // short last chunk, bias
      {1, 2560, {384, 200}, true, false, none, 2},             // stacked parts, in-place residual
      {1, 9728, {48}, true, false, none, 1},                   // 76 chunks
      {8, 2048, {1024}, true, false, none, 0},
      {5, 2560, {300}, true, false, none, 1},
      {1, 2048, {2048, 1024, 1024}, false, false, none, 0},
      {1, 6144, {272}, false, false, none, 2},
      {1, 1000, {64, 64}, false, false, none, 0},  // K % 128 != 0
      {8, 2048, {512}, false, true, none, 1},
  };
  struct Ring {
    int depth, mode, group, blocks;
  };
  CudaBackendOptions eight;
  eight.skinny.warps = 8;
  auto base = make_cuda_backend(eight);
  ASSERT_TRUE(base.is_ok()) << base.status().to_string();
  // mode 1: whole tiles (K = 9728 does not fit two: rows), 2: row segments of 8 * group chunks.
  for (const bool emulate : {false, true})
    for (const Ring r :
         {Ring{0, 0, 0, 1}, Ring{0, 1, 0, 1}, Ring{2, 1, 0, 2}, Ring{2, 2, 1, 1}, Ring{0, 2, 4, 1}, Ring{3, 2, 2, 2}}) {
      CudaBackendOptions o;
      if (emulate) {
        ASSERT_TRUE(parse_emulate_gpu("sm_120", o).is_ok());
      }
      o.skinny.variant = 3;
      o.skinny.depth = r.depth;
      o.skinny.split = r.mode;
      o.skinny.group = r.group;
      o.skinny.blocks = r.blocks;
      auto ring = make_cuda_backend(o);
      ASSERT_TRUE(ring.is_ok()) << ring.status().to_string();
      SCOPED_TRACE("depth " + std::to_string(r.depth) + " mode " + std::to_string(r.mode) + " group " +
                   std::to_string(r.group) + " blocks " + std::to_string(r.blocks) + (emulate ? " as sm_120" : ""));
      for (const Case& c : cases) {
        SCOPED_TRACE(describe(c));
        cuda_profile_start(**ring, 0.0);  // records the ring backend's launches only
        EXPECT_EQ(outputs_differing(c, **base, **ring), 0)
            << "outputs differ between the 8-warp default kernels and the ring";
        int rings = 0;  // every case fits two stages of row segments, also in 99 KB
        for (const CudaKernelTime& k : cuda_profile_stop(**ring)) rings += k.kernel.starts_with("skinny_ring");
        EXPECT_GT(rings, 0) << "the ring did not run";
      }
    }
}

// The wide FP8 kernel (SkinnyTuning::variant 4, sm_90+ thread-block clusters; the default for
// FP8 Linears over 8 rows there), forced at the default split and at 1, 2, 4 and 8 splits per
// 128-row tile, on 1..64 rows: against the CPU oracle. K = 640 (5 chunks: splits past them are
// empty), 1008 (a short last chunk), 6144 and 9728 (48 and 76 chunks: the 4-stage ring wraps,
// uneven splits); N = 300 and 200 + 184 end in partial tiles, the latter with per-row scales;
// bias, GELU, residual separate and in place.
TEST(GpuOps, LinearSkinnyWide) {
  QVL_REQUIRE_CUDA();
  if (cuda_device_info(0).value().compute_capability < 90) GTEST_SKIP() << "the wide kernel needs clusters (sm_90+)";
  const auto none = Activation::kNone;
  const std::vector<Case> cases = {
      {32, 2048, {2048, 512, 512}, true, false, none, 0},       // 2B q|k|v at 32 rows
      {9, 6144, {2048}, true, false, none, 2},                  // 2B down, residual in place
      {17, 9728, {256}, true, false, none, 1},                  // 76 chunks
      {24, 1008, {300}, true, true, Activation::kGeluTanh, 0},  // short last chunk, partial tile
      {32, 640, {200, 184}, true, true, none, 2},               // per-row scales, 5 chunks
      {16, 2560, {4096}, true, false, none, 0},
      {1, 2048, {1024}, true, false, none, 1},  // one row, forced
      {5, 2560, {300}, true, true, none, 0},
      {8, 2048, {2048}, true, false, none, 2},
      {33, 2048, {1024}, true, true, none, 1},  // 33..64 rows: 5..8 token tiles in one launch
      {48, 6144, {300}, true, false, Activation::kGeluTanh, 0},
      {64, 2560, {200, 184}, true, false, none, 2},
  };
  for (int split : {0, 1, 2, 4, 8}) {
    CudaBackendOptions o;
    o.skinny.variant = 4;
    o.skinny.split = split;
    auto be = make_cuda_backend(o);
    ASSERT_TRUE(be.is_ok()) << be.status().to_string();
    SCOPED_TRACE("wide kernel, split " + std::to_string(split));
    for (const Case& c : cases) {
      const int64_t before = cuda_fp8_gemm_counts(**be).skinny_wide;
      run_case(c, **be);
      EXPECT_EQ(cuda_fp8_gemm_counts(**be).skinny_wide - before, 1) << "one launch of the wide kernel: " << describe(c);
    }
  }
}

// FP8 Linears over more than 128 rows on sm_90: the W8A8 path (quantised activations,
// block-scaled cuBLASLt) against the host doing the same quantisation and exact dot products.
// Row counts 1..5 past the skinny passes and 802 (a 4B prefill) leave 1..7 rows to the tail
// call; 1700 rows of K = 9728 take two chunks of the 16 MiB activation workspace. Elsewhere these
// shapes take the dequantised path and are checked against the CPU oracle.
TEST(GpuOps, LinearFp8W8A8) {
  QVL_REQUIRE_CUDA();
  const auto none = Activation::kNone;
  std::vector<Case> cases = {
      {129, 2560, {2560}, true, false, none, 2},              // o_proj-like, residual in place
      {130, 2048, {6144, 6144}, true, false, none, 0},        // 2B gate|up
      {131, 2560, {4096, 1024, 1024}, true, false, none, 1},  // 4B q|k|v, separate residual
      {132, 9728, {2560}, true, false, none, 2},              // 4B down_proj
      {133, 2048, {2048}, true, true, none, 1},               // + bias
      {136, 1008, {1000}, true, true, none, 2},               // K and N off the 128 grid (ceil(K/128) = 8)
      {802, 2560, {9728, 9728}, true, false, none, 0},        // 4B gate|up, N = 19456
      {802, 2048, {2048}, true, false, none, 2},
      {1700, 9728, {512}, true, false, none, 2},  // two chunks; the second ends in 4 tail rows
      {200, 512, {640}, true, true, Activation::kGeluTanh, 0},
  };
  CudaBackendOptions o;
  o.fp8_gemm = CudaFp8Gemm::kW8A8;
  auto be = make_cuda_backend(o);
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  for (const Case& c : cases) run_case(c, **be, Expect::kW8A8OnSm90);
}

// Shapes the W8A8 path leaves to the dequantised one on every architecture.
TEST(GpuOps, LinearFp8DequantFallbacks) {
  QVL_REQUIRE_CUDA();
  const auto none = Activation::kNone;
  std::vector<Case> cases = {
      {140, 1152, {256}, true, false, none, 1},       // ceil(K/128) = 9: the scales' K stride is not a multiple of 4
      {150, 2560, {200, 184}, true, false, none, 2},  // parts off the 128 grid: per-row scales
      {160, 1000, {136}, true, true, none, 0},        // K % 16 != 0
      {300, 1024, {4100}, true, false, none, 0},      // N % 8 != 0
  };
  for (const Case& c : cases) run_case(c, *cuda(), Expect::kDequant);
}

// CudaFp8Gemm::kDequant keeps transformers' dequantised numerics on sm_90 too.
TEST(GpuOps, LinearFp8DequantOption) {
  QVL_REQUIRE_CUDA();
  CudaBackendOptions o;
  o.fp8_gemm = CudaFp8Gemm::kDequant;
  auto be = make_cuda_backend(o);
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  run_case({130, 2560, {2560}, true, false, Activation::kNone, 2}, **be, Expect::kDequant);
}

// A dequant workspace smaller than the weights: the Linear runs in several chunks of equal whole
// 128-row blocks. 1 MiB holds 512 rows of K = 1024 (4 blocks); 1100 rows are 9 blocks, so three
// chunks of 3 blocks: 384 + 384 + 332 rows. With block scales and with per-row scales (parts off
// the 128 grid), a bias and a residual, against the CPU oracle.
TEST(GpuOps, LinearFp8DequantChunks) {
  QVL_REQUIRE_CUDA();
  CudaBackendOptions o;
  o.dequant_workspace_bytes = size_t{1} << 20;
  auto be = make_cuda_backend(o);
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  run_case({300, 1024, {1100}, true, true, Activation::kNone, 1}, **be, Expect::kDequant);
  run_case({300, 1024, {600, 500}, true, false, Activation::kNone, 2}, **be, Expect::kDequant);
  run_case({150, 2048, {700}, true, true, Activation::kGeluTanh, 0}, **be, Expect::kDequant);  // 256-row chunks
}

// The FP8 dequant workspace comes with the first FP8 Linear a backend loads, once, and not with
// a BF16 one: what the memory planner counts for FP8 models only (MemoryPlan::dequant_workspace).
TEST(GpuOps, DequantWorkspaceComesWithTheFirstFp8Linear) {
  QVL_REQUIRE_CUDA();
  CudaBackendOptions o;
  auto be = make_cuda_backend(o);
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  auto load = [&](bool fp8) {
    const int64_t before = cuda_memory_stats(**be).allocated_bytes;
    HostPart h = make_part(256, 512, fp8, 0.05f);
    LinearPart lp;
    lp.weight =
        fp8 ? Tensor(h.fp8.data(), DType::kF8E4M3, {256, 512}) : Tensor(h.bf16.data(), DType::kBF16, {256, 512});
    if (fp8) lp.scale_inv = Tensor(h.scale.data(), DType::kF32, {2, 4});
    auto w = (**be).load_linear({&lp, 1}, Tensor(), 128);
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    return cuda_memory_stats(**be).allocated_bytes - before;
  };
  EXPECT_EQ(load(false), 256 * 512 * 2);  // BF16: the weights alone
  const int64_t first = load(true), second = load(true);
  EXPECT_EQ(second, 256 * 512 + 2 * 4 * 4);  // FP8: weights and scales
  EXPECT_EQ(first - second, static_cast<int64_t>(o.dequant_workspace_bytes));
}

// Weights past CudaBackend's 4 MiB staging threshold go up through its two pinned 32 MiB buffers:
// a tensor of 3 chunks and a few bytes (the last chunk partial), and a BF16 Linear of two parts
// whose second starts mid-chunk, come back byte for byte; so does one loaded after end_loading()
// released the buffers (they are made again).
TEST(GpuOps, StagedWeightUploadsKeepEveryByte) {
  QVL_REQUIRE_CUDA();
  auto be = make_cuda_backend(CudaBackendOptions());
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  auto pattern = [](size_t n, uint32_t seed) {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>((i * 2654435761u + seed) >> 7);
    return v;
  };
  auto round_trip = [&](const std::vector<uint16_t>& host, const Tensor& dev) {
    std::vector<uint16_t> back(host.size());
    (**be).copy_to_host(back.data(), dev);
    return back == host;
  };
  for (int pass = 0; pass < 2; ++pass) {
    const size_t n = 3 * (size_t{32} << 20) / 2 + 12345;  // BF16 elements: 96 MiB + 24,690 bytes
    const std::vector<uint16_t> big = pattern(n, 7 + pass);
    auto t = (**be).load_tensor(Tensor(const_cast<uint16_t*>(big.data()), DType::kBF16, {static_cast<int64_t>(n)}),
                                DType::kBF16);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_TRUE(round_trip(big, *t)) << "tensor, pass " << pass;
    // q|k stacked: 5000 + 3000 rows of K = 2048 (19.5 + 11.7 MiB).
    const std::vector<uint16_t> a = pattern(5000 * 2048, 11 + pass), b = pattern(3000 * 2048, 13 + pass);
    LinearPart parts[2];
    parts[0].weight = Tensor(const_cast<uint16_t*>(a.data()), DType::kBF16, {5000, 2048});
    parts[1].weight = Tensor(const_cast<uint16_t*>(b.data()), DType::kBF16, {3000, 2048});
    auto w = (**be).load_linear(parts, Tensor(), 128);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    std::vector<uint16_t> ab = a;
    ab.insert(ab.end(), b.begin(), b.end());
    EXPECT_TRUE(round_trip(ab, w->parts[0].weight)) << "linear, pass " << pass;
    (**be).end_loading();
  }
}

// A fresh backend holds exactly the workspaces the memory planner counts for this device: the
// W8A8 activation workspace with kW8A8 on sm_90 only.
TEST(GpuOps, BackendWorkspacesAreThePlannedOnes) {
  QVL_REQUIRE_CUDA();
  const int cc = cuda_device_info(0).value().compute_capability;
  for (CudaFp8Gemm mode : {CudaFp8Gemm::kDequant, CudaFp8Gemm::kW8A8}) {
    CudaBackendOptions o;
    o.fp8_gemm = mode;
    auto be = make_cuda_backend(o);
    ASSERT_TRUE(be.is_ok()) << be.status().to_string();
    EXPECT_EQ(cuda_memory_stats(**be).allocated_bytes, cuda_backend_workspace_bytes(o, cc));
    const bool w8a8_here = mode == CudaFp8Gemm::kW8A8 && cc / 10 == 9;
    EXPECT_EQ(cuda_fp8_act_workspace_bytes(o, cc), w8a8_here ? o.fp8_act_workspace_bytes : 0u);
  }
}

// The quantisation kernel writes the bytes and scales of the host quantisation, bit for bit:
// rows and groups of magnitudes 2^-120 (scales below fp32's normal range: the 1e-12 floor) to
// 2^100, all-zero groups, negative zeros, K off the 128 grid and below one group, the tail
// scales of the last 8 rows.
TEST(GpuOps, QuantizeFp8RowsMatchesTheHost) {
  QVL_REQUIRE_CUDA();
  struct QCase {
    int64_t n, K, main_rows;
    bool tail;
  };
  const float factors[] = {1.0f, 0x1p-20f, 0x1p20f, 0x1p-100f, 0x1p100f, 0.0f, 0x1p-120f, 3.0f, -0.0f};
  for (const QCase& c : {QCase{8, 128, 8, false}, QCase{13, 2560, 8, true}, QCase{300, 1008, 296, true},
                         QCase{16, 2048, 16, false}, QCase{9, 48, 8, true}, QCase{133, 9728, 128, true}}) {
    Scratch s;
    const int64_t groups = (c.K + 127) / 128;
    std::vector<float> x = random_values(c.n * c.K);
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t k = 0; k < c.K; ++k) {
        float& v = x[r * c.K + k];
        const float f = factors[(r * 7 + (k / 128) * 3) % 9];
        v = f == 0.0f ? f : round_to_bf16(v * f);  // +0 or -0 for the whole group
        if (k % 37 == 5) v = -0.0f;
      }
    const std::vector<uint16_t> bits = to_bf16_bits(x);
    Tensor xg = s.alloc(*cuda(), DType::kBF16, {c.n, c.K});
    Tensor q = s.alloc(*cuda(), DType::kF8E4M3, {c.n, c.K});
    Tensor sc = s.alloc(*cuda(), DType::kF32, {groups, c.main_rows});
    Tensor tail = c.tail ? s.alloc(*cuda(), DType::kF32, {groups, 8}) : Tensor();
    cuda()->copy_to_device(xg, bits.data());
    // Poison what the kernel must overwrite.
    const std::vector<uint8_t> q0(static_cast<size_t>(c.n * c.K), 0x55);
    const std::vector<float> s0(static_cast<size_t>(groups * std::max<int64_t>(c.main_rows, 8)), -7.0f);
    cuda()->copy_to_device(q, q0.data());
    cuda()->copy_to_device(sc, s0.data());
    if (c.tail) cuda()->copy_to_device(tail, s0.data());
    cuda_quantize_fp8_rows(*cuda(), q, sc, tail, xg);

    const HostQuant h = host_quantize(x, c.n, c.K);
    std::vector<uint8_t> gq(q0.size());
    std::vector<float> gs(static_cast<size_t>(groups * c.main_rows)), gt(static_cast<size_t>(groups * 8));
    cuda()->copy_to_host(gq.data(), q);
    cuda()->copy_to_host(gs.data(), sc);
    if (c.tail) cuda()->copy_to_host(gt.data(), tail);
    const std::string shape = 'n' + std::to_string(c.n) + " K" + std::to_string(c.K);
    int64_t bad = 0;
    for (size_t i = 0; i < gq.size(); ++i)
      if (gq[i] != h.q[i] && bad++ == 0)
        ADD_FAILURE() << shape << ": q[" << i / c.K << ", " << i % c.K << "] = 0x" << std::hex << int{gq[i]}
                      << ", host 0x" << int{h.q[i]} << std::dec << " (x = " << x[i] << ")";
    auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t r = 0; r < c.main_rows; ++r)
        if (!same(gs[g * c.main_rows + r], h.scale[g * c.n + r]) && bad++ == 0)
          ADD_FAILURE() << shape << ": scale[row " << r << ", group " << g << "] = " << gs[g * c.main_rows + r]
                        << ", host " << h.scale[g * c.n + r];
      for (int64_t i = 0; c.tail && i < 8; ++i)
        if (!same(gt[g * 8 + i], h.scale[g * c.n + c.n - 8 + i]) && bad++ == 0)
          ADD_FAILURE() << shape << ": tail scale[row " << c.n - 8 + i << ", group " << g << "] = " << gt[g * 8 + i]
                        << ", host " << h.scale[g * c.n + c.n - 8 + i];
    }
    EXPECT_EQ(bad, 0) << shape << ": bytes or scales differ from the host quantisation";
  }
}

// SiLU·mul as the SwiGLU epilogue of the gate_up Linear before it (CudaBackendOptions::
// silu_mul_epilogue_max_rows; each 16-row tile pairs 8 gate rows with their 8 up rows):
// rms_norm -> linear(gate_up) -> silu_mul -> linear(down, residual in place) against the CPU
// oracle, and gate_up's and SiLU·mul's outputs bit for bit those of the same kernels with the
// epilogue off (every row's sum is unchanged), the launch counter showing which launches took it.
// The oracle takes each op on the GPU's own input (gate_up after the CPU's rms_norm, as
// LinearFusedPrologues does; SiLU·mul of the GPU's gate_up; down of the GPU's SiLU·mul), so that
// each op is held to its own tolerance.
// Kernels: the defaults, 16 warps, three FP8 blocks per multiprocessor, the ring (whole tiles and
// row segments, BF16 and FP8) and cluster pairs (FP8: a separate SiLU·mul, the fallback). I = 2048
// (256 tiles: more than cluster pairs take by default on up to 170 multiprocessors, so the
// defaults keep the one-tile kernel); I = 1000, whose up rows start inside a 128-row FP8 scale
// block (a tile's gate and up rows take different scale rows); I = 1004 (I % 8 != 0: no
// epilogue); 9 rows: past the epilogue's 8.
TEST(GpuOps, LinearSiluMulEpilogue) {
  QVL_REQUIRE_CUDA();
  struct Config {
    const char* name;
    SkinnyTuning tune;
    bool bf16_takes, fp8_takes;  // whether the epilogue runs in the Linear
    bool sm90;                   // needs sm_90 (else skipped)
  };
  const std::vector<Config> configs = {
      {"defaults", {}, true, true, false},
      {"16 warps", {.variant = 1, .warps = 16}, true, true, false},
      {"3 blocks", {.variant = 1, .blocks = 3}, true, true, false},
      {"ring, whole tiles", {.variant = 3, .split = 1}, true, true, true},
      {"ring, row segments", {.variant = 3, .split = 2, .group = 1}, true, true, true},
      {"cluster pairs", {.variant = 1, .split = 2}, true, false, true},
  };
  for (const Config& cfg : configs) {
    if (cfg.sm90 && !is_sm90()) continue;
    SCOPED_TRACE(cfg.name);
    CudaBackendOptions on, off;
    on.skinny = off.skinny = cfg.tune;
    off.silu_mul_epilogue_max_rows = 0;
    auto epi = make_cuda_backend(on);
    auto sep = make_cuda_backend(off);
    ASSERT_TRUE(epi.is_ok() && sep.is_ok());
    for (bool fp8 : {false, true}) {
      for (int64_t I : {2048, 1000, 1004}) {
        for (int64_t n : {1, 3, 8, 9}) {
          Scratch s;
          const int64_t K = 2048, D = 512;
          std::vector<HostPart> keep;
          keep.reserve(2);
          auto load = [&](int64_t rows, int64_t cols) {
            keep.push_back(make_part(rows, cols, fp8, 1.0f / std::sqrt(static_cast<float>(cols))));
            const LinearPart lp = part_view(keep.back(), cols, fp8);
            return std::make_tuple(cpu().load_linear({&lp, 1}, Tensor(), 128).value(),
                                   (**epi).load_linear({&lp, 1}, Tensor(), 128).value(),
                                   (**sep).load_linear({&lp, 1}, Tensor(), 128).value());
          };
          auto [guc, gue, gus] = load(2 * I, K);
          auto [dnc, dne, dns] = load(D, I);
          const std::string shape = std::string(fp8 ? "fp8" : "bf16") + " n" + std::to_string(n) + " K2048 I" +
                                    std::to_string(I) + " " + cfg.name;
          SCOPED_TRACE(shape);
          std::vector<float> nw = random_values(K, 0.2f);
          for (auto& v : nw) v += 1.0f;
          Pair norm_w = same_bytes(s, DType::kF32, {K}, nw.data());
          Pair x = activation(s, {n, K}, random_values(n * K, 3.0f));
          const std::vector<float> res0 = random_values(n * D);
          const std::vector<float> fill(static_cast<size_t>(n * 2 * I), -1.0f);
          Pair h = activation(s, {n, K}, std::vector<float>(fill.begin(), fill.begin() + n * K));
          Pair gu = activation(s, {n, 2 * I}, fill);
          Pair a = activation(s, {n, I}, std::vector<float>(fill.begin(), fill.begin() + n * I));
          Pair xr = activation(s, {n, D}, res0);
          // The epilogue-off run's outputs, on cuda()'s memory beside the pair's.
          Tensor h2 = s.alloc(*cuda(), DType::kBF16, {n, K}), gu2 = s.alloc(*cuda(), DType::kBF16, {n, 2 * I});
          Tensor a2 = s.alloc(*cuda(), DType::kBF16, {n, I}), xr2 = s.alloc(*cuda(), DType::kBF16, {n, D});
          cuda()->copy_to_device(xr2, to_bf16_bits(res0).data());
          cuda()->synchronize();
          cpu().rms_norm(h.c, x.c, norm_w.c, 1e-6f);
          cpu().linear(gu.c, h.c, guc, {});
          auto chain = [&](Backend& be, const LinearWeight& wgu, const LinearWeight& wdn, Tensor hh, Tensor g,
                           Tensor aa, Tensor out) {
            be.rms_norm(hh, x.g, norm_w.g, 1e-6f);
            be.linear(g, hh, wgu, {});
            be.silu_mul(aa, g);
            be.linear(out, aa, wdn, {Activation::kNone, out});
            be.synchronize();
          };
          const int64_t before = cuda_fp8_gemm_counts(**epi).skinny_glu;
          chain(**epi, gue, dne, h.g, gu.g, a.g, xr.g);
          const bool takes = (fp8 ? cfg.fp8_takes : cfg.bf16_takes) && n <= 8 && I % 8 == 0;
          EXPECT_EQ(cuda_fp8_gemm_counts(**epi).skinny_glu - before, takes ? 1 : 0);
          const int64_t off_before = cuda_fp8_gemm_counts(**sep).skinny_glu;
          chain(**sep, gus, dns, h2, gu2, a2, xr2);
          EXPECT_EQ(cuda_fp8_gemm_counts(**sep).skinny_glu, off_before);
          EXPECT_TRUE(compare_pair("silu_mul epilogue: gate_up", shape, gu, tol::kGpuLinear));
          // The later ops on the GPU's own inputs, on the CPU.
          auto on_cpu = [&](const std::vector<float>& v, std::initializer_list<int64_t> d) {
            Tensor t = s.alloc(cpu(), DType::kF32, d);
            cpu().copy_to_device(t, v.data());
            return t;
          };
          const std::vector<float> gu_gpu = download(*cuda(), gu.g), a_gpu = download(*cuda(), a.g);
          cpu().silu_mul(a.c, on_cpu(gu_gpu, {n, 2 * I}));
          cpu().copy_to_device(xr.c, res0.data());
          cpu().linear(xr.c, on_cpu(a_gpu, {n, I}), dnc, {Activation::kNone, xr.c});
          EXPECT_TRUE(compare_pair("silu_mul epilogue: silu_mul", shape, a, tol::kGpuElementwise));
          EXPECT_TRUE(compare_pair("silu_mul epilogue: down +res", shape, xr, tol::kGpuLinear));
          EXPECT_EQ(bits_differ(download(*cuda(), gu.g), download(*cuda(), gu2)), 0) << "gate_up, epilogue on / off";
          EXPECT_EQ(bits_differ(download(*cuda(), a.g), download(*cuda(), a2)), 0) << "silu_mul, epilogue on / off";
          EXPECT_EQ(bits_differ(download(*cuda(), xr.g), download(*cuda(), xr2)), 0) << "down, epilogue on / off";
        }
      }
    }
  }
}

}  // namespace
}  // namespace qvl::test::gpu
