// CUDA vs CPU Linear: BF16 and FP8 (128x128 block scales) weights, stacked parts merged at
// load, every dispatch path (skinny kernel for <= 32 rows, skinny passes for FP8 <= 128 rows,
// cuBLASLt BF16, FP8 dequantised in chunks + cuBLASLt), every epilogue (bias, GELU tanh/erf,
// residual, residual aliasing the output), and shapes with N not a multiple of 16, K not a
// multiple of 128 and K not a multiple of 8 (no skinny kernel: cuBLASLt at low alignment).
#include <cmath>

#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

struct HostPart {
  std::vector<uint16_t> bf16;  // BF16 weights
  std::vector<uint8_t> fp8;    // or FP8 weights
  std::vector<float> scale;    // and their block scales
  int64_t rows = 0;
};

// Random weights for one part; FP8 quantised per 128x128 block the way checkpoints are
// (scale = amax / 448, w8 = e4m3(w / scale)).
HostPart make_part(int64_t rows, int64_t cols, bool fp8, float wscale) {
  HostPart p;
  p.rows = rows;
  std::vector<float> w = random_values(rows * cols, wscale);
  if (!fp8) {
    p.bf16 = to_bf16_bits(w);
    return p;
  }
  const int64_t B = 128, rb = (rows + B - 1) / B, cb = (cols + B - 1) / B;
  // Vary the blocks' ranges so that a wrong scale index shows.
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) w[i * cols + j] *= 1.0f + static_cast<float>((i / B + 2 * (j / B)) % 5);
  p.scale.assign(static_cast<size_t>(rb * cb), 0.0f);
  p.fp8.resize(static_cast<size_t>(rows * cols));
  for (int64_t bi = 0; bi < rb; ++bi) {
    for (int64_t bj = 0; bj < cb; ++bj) {
      float amax = 0.0f;
      for (int64_t i = bi * B; i < std::min(rows, (bi + 1) * B); ++i)
        for (int64_t j = bj * B; j < std::min(cols, (bj + 1) * B); ++j)
          amax = std::max(amax, std::fabs(w[i * cols + j]));
      const float s = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
      p.scale[bi * cb + bj] = s;
      for (int64_t i = bi * B; i < std::min(rows, (bi + 1) * B); ++i)
        for (int64_t j = bj * B; j < std::min(cols, (bj + 1) * B); ++j)
          p.fp8[i * cols + j] = fp8_e4m3_from_float(w[i * cols + j] / s);
    }
  }
  return p;
}

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
  std::string s = "n" + std::to_string(c.n) + " K" + std::to_string(c.K) + " N" + std::to_string(N);
  if (c.part_rows.size() > 1) s += " parts" + std::to_string(c.part_rows.size());
  if (c.bias) s += " +b";
  if (c.act == Activation::kGeluTanh) s += " gelu_tanh";
  if (c.act == Activation::kGeluErf) s += " gelu_erf";
  if (c.residual == 1) s += " +res";
  if (c.residual == 2) s += " +res(in place)";
  return s;
}

void run_case(const Case& c) {
  Scratch s;
  const int64_t K = c.K;
  std::vector<HostPart> host;
  std::vector<LinearPart> parts;
  int64_t N = 0;
  for (int64_t rows : c.part_rows) {
    host.push_back(make_part(rows, K, c.fp8, 1.0f / std::sqrt(static_cast<float>(K))));
    N += rows;
  }
  for (HostPart& h : host) {
    LinearPart lp;
    if (c.fp8) {
      lp.weight = Tensor(h.fp8.data(), DType::kF8E4M3, {h.rows, K});
      lp.scale_inv = Tensor(h.scale.data(), DType::kF32, {(h.rows + 127) / 128, (K + 127) / 128});
    } else {
      lp.weight = Tensor(h.bf16.data(), DType::kBF16, {h.rows, K});
    }
    parts.push_back(lp);
  }
  std::vector<uint16_t> bias_bits;
  Tensor host_bias;
  if (c.bias) {
    bias_bits = to_bf16_bits(random_values(N, 0.5f));
    host_bias = Tensor(bias_bits.data(), DType::kBF16, {N});
  }
  auto wc = cpu().load_linear(parts, host_bias, 128);
  auto wg = cuda()->load_linear(parts, host_bias, 128);
  ASSERT_TRUE(wc.is_ok()) << wc.status().to_string();
  ASSERT_TRUE(wg.is_ok()) << wg.status().to_string();
  ASSERT_EQ(wg->out_features, N);

  Pair x = activation(s, {c.n, K}, random_values(c.n * K));
  Pair out = activation(s, {c.n, N}, std::vector<float>(static_cast<size_t>(c.n * N), 99.0f));
  Pair res;
  if (c.residual == 1) res = activation(s, {c.n, N}, random_values(c.n * N));
  if (c.residual == 2) {
    out = activation(s, {c.n, N}, random_values(c.n * N));
    res = out;
  }
  cpu().linear(out.c, x.c, *wc, {c.act, res.c});
  cuda()->linear(out.g, x.g, *wg, {c.act, res.g});
  EXPECT_TRUE(compare_pair(std::string("linear ") + (c.fp8 ? "fp8" : "bf16"), describe(c), out, tol::kGpuLinear));
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
  };
  for (const Case& c : cases) run_case(c);
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
      {300, 1024, {4100}, true, true, none, 1},             // dequant in several chunks
  };
  for (const Case& c : cases) run_case(c);
}

// The CUDA backend computes an RMSNorm or SiLU·mul over <= 8 rows inside the Linear that reads
// it (decode); both the Linear's output and the intermediate it also writes must match.
TEST(GpuOps, LinearFusedPrologues) {
  QVL_REQUIRE_CUDA();
  for (bool fp8 : {false, true}) {
    for (int64_t n : {1, 5, 8}) {
      Scratch s;
      const int64_t K = 2048, N = 1000, I = 1536, D = 512;
      auto load = [&](int64_t rows, int64_t cols, std::vector<HostPart>& keep) {
        keep.push_back(make_part(rows, cols, fp8, 1.0f / std::sqrt(static_cast<float>(cols))));
        HostPart& h = keep.back();
        LinearPart lp;
        if (fp8) {
          lp.weight = Tensor(h.fp8.data(), DType::kF8E4M3, {rows, cols});
          lp.scale_inv = Tensor(h.scale.data(), DType::kF32, {(rows + 127) / 128, (cols + 127) / 128});
        } else {
          lp.weight = Tensor(h.bf16.data(), DType::kBF16, {rows, cols});
        }
        return std::make_pair(cpu().load_linear({&lp, 1}, Tensor(), 128).value(),
                              cuda()->load_linear({&lp, 1}, Tensor(), 128).value());
      };
      std::vector<HostPart> keep;
      keep.reserve(2);
      auto [w1c, w1g] = load(N, K, keep);
      auto [w2c, w2g] = load(D, I, keep);
      const std::string shape = std::string(fp8 ? "fp8 " : "bf16 ") + "n" + std::to_string(n);

      // rms_norm -> linear (+ separate residual)
      std::vector<float> nw = random_values(K, 0.2f);
      for (auto& v : nw) v += 1.0f;
      Pair norm_w = same_bytes(s, DType::kF32, {K}, nw.data());
      Pair x = activation(s, {n, K}, random_values(n * K, 3.0f));
      Pair h = activation(s, {n, K}, std::vector<float>(static_cast<size_t>(n * K), -1.0f));
      Pair res = activation(s, {n, N}, random_values(n * N));
      Pair out = activation(s, {n, N}, std::vector<float>(static_cast<size_t>(n * N), 5.0f));
      cpu().rms_norm(h.c, x.c, norm_w.c, 1e-6f);
      cpu().linear(out.c, h.c, w1c, {Activation::kNone, res.c});
      cuda()->rms_norm(h.g, x.g, norm_w.g, 1e-6f);
      cuda()->linear(out.g, h.g, w1g, {Activation::kNone, res.g});
      EXPECT_TRUE(compare_pair("rms_norm+linear: linear", shape + " K2048 N1000", out, tol::kGpuLinear));
      EXPECT_TRUE(compare_pair("rms_norm+linear: norm", shape + " K2048", h, tol::kGpuElementwise));

      // silu_mul -> linear (+ residual in place)
      Pair gu = activation(s, {n, 2 * I}, random_values(n * 2 * I, 2.0f));
      Pair a = activation(s, {n, I}, std::vector<float>(static_cast<size_t>(n * I), -1.0f));
      Pair xr = activation(s, {n, D}, random_values(n * D));
      cpu().silu_mul(a.c, gu.c);
      cpu().linear(xr.c, a.c, w2c, {Activation::kNone, xr.c});
      cuda()->silu_mul(a.g, gu.g);
      cuda()->linear(xr.g, a.g, w2g, {Activation::kNone, xr.g});
      EXPECT_TRUE(compare_pair("silu_mul+linear: linear", shape + " I1536 N512 +res", xr, tol::kGpuLinear));
      EXPECT_TRUE(compare_pair("silu_mul+linear: silu_mul", shape + " I1536", a, tol::kGpuElementwise));
    }
  }
}

}  // namespace
}  // namespace qvl::test::gpu
