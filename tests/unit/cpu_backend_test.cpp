// CPU backend ops against naive double-precision formulas written out here (the backend.h
// semantics), on random inputs and odd shapes. The CPU backend is the oracle for every other
// backend, so these formulas are the ground truth of the op interface.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "support/test_support.h"
#include "support/tolerances.h"

namespace qvl {
namespace {

using test::compare_allclose;

std::vector<float> randu(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::kF32, dims);
}
Tensor i32(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::kI32, dims);
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::vector<float> w(want.begin(), want.end());
  auto r = compare_allclose(got.data(), w.data(), static_cast<int64_t>(w.size()), test::tol::kCpuOpAbs,
                            test::tol::kCpuOpRel);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(4);
};

// ---- Linear ----

enum class WKind { kF32, kBF16, kFP8 };

struct LinearCase {
  int64_t n, K;
  std::vector<int64_t> part_rows;
  WKind kind;
  bool bias;
  Activation act;
  bool residual;
};

double apply_act(double v, Activation a) {
  if (a == Activation::kGeluTanh) return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  if (a == Activation::kGeluErf) return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  return v;
}

void run_linear_case(Backend& be, const LinearCase& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "n=" << c.n << " K=" << c.K << " kind=" << static_cast<int>(c.kind)
                                  << " act=" << static_cast<int>(c.act));
  const int B = 128;
  std::vector<float> x = randu(c.n * c.K, seed);
  // Storage per part and the dequantised value of every weight, as the reference sees it.
  std::vector<std::vector<float>> wf(c.part_rows.size());
  std::vector<std::vector<uint16_t>> wb(c.part_rows.size());
  std::vector<std::vector<uint8_t>> w8(c.part_rows.size());
  std::vector<std::vector<float>> scales(c.part_rows.size());
  std::vector<std::vector<double>> wref(c.part_rows.size());
  std::vector<LinearPart> parts;
  int64_t O = 0;
  for (size_t p = 0; p < c.part_rows.size(); ++p) {
    const int64_t rows = c.part_rows[p];
    O += rows;
    std::vector<float> raw = randu(rows * c.K, seed + 10 + p, -0.5f, 0.5f);
    wref[p].resize(rows * c.K);
    LinearPart part;
    if (c.kind == WKind::kF32) {
      wf[p] = raw;
      for (int64_t i = 0; i < rows * c.K; ++i) wref[p][i] = raw[i];
      part.weight = Tensor(wf[p].data(), DType::kF32, {rows, c.K});
    } else if (c.kind == WKind::kBF16) {
      wb[p].resize(rows * c.K);
      for (int64_t i = 0; i < rows * c.K; ++i) {
        wb[p][i] = float_to_bf16(raw[i]);
        wref[p][i] = bf16_to_float(wb[p][i]);
      }
      part.weight = Tensor(wb[p].data(), DType::kBF16, {rows, c.K});
    } else {
      const int64_t sr = (rows + B - 1) / B, sc = (c.K + B - 1) / B;
      scales[p] = randu(sr * sc, seed + 20 + p, 0.001f, 0.004f);
      w8[p].resize(rows * c.K);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t k = 0; k < c.K; ++k) {
          const float s = scales[p][(i / B) * sc + k / B];
          w8[p][i * c.K + k] = fp8_e4m3_from_float(raw[i * c.K + k] / s);
          // Dequantised weight: float(w8) · scale_inv in fp32 (transformers' Fp8Dequantize).
          wref[p][i * c.K + k] = fp8_e4m3_to_float(w8[p][i * c.K + k]) * s;
        }
      part.weight = Tensor(w8[p].data(), DType::kF8E4M3, {rows, c.K});
      part.scale_inv = Tensor(scales[p].data(), DType::kF32, {sr, sc});
    }
    parts.push_back(part);
  }
  std::vector<float> bias = randu(O, seed + 30);
  Tensor host_bias = c.bias ? Tensor(bias.data(), DType::kF32, {O}) : Tensor();
  auto lw = be.load_linear(parts, host_bias, B);
  ASSERT_TRUE(lw.is_ok()) << lw.status().to_string();
  ASSERT_EQ(lw->out_features, O);

  std::vector<float> out(c.n * O), res = randu(c.n * O, seed + 40);
  std::vector<double> want(c.n * O);
  for (int64_t i = 0; i < c.n; ++i) {
    int64_t col = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      for (int64_t j = 0; j < c.part_rows[p]; ++j, ++col) {
        double s = 0;
        for (int64_t k = 0; k < c.K; ++k) s += static_cast<double>(x[i * c.K + k]) * wref[p][j * c.K + k];
        if (c.bias) s += bias[col];
        s = apply_act(s, c.act);
        if (c.residual) s += res[i * O + col];
        want[i * O + col] = s;
      }
    }
  }
  Epilogue ep;
  ep.act = c.act;
  if (c.residual) {
    out = res;  // residual aliases the output, as the model uses it
    ep.residual = f32(out, {c.n, O});
  }
  be.linear(f32(out, {c.n, O}), f32(x, {c.n, c.K}), *lw, ep);
  expect_close(out, want, "linear");
}

TEST_F(CpuOps, LinearMatchesNaiveSumAcrossDtypesAndShapes) {
  uint32_t seed = 1;
  for (WKind kind : {WKind::kF32, WKind::kBF16, WKind::kFP8}) {
    run_linear_case(*be, {1, 64, {48}, kind, false, Activation::kNone, false}, seed++);
    run_linear_case(*be, {7, 300, {200}, kind, true, Activation::kNone, false}, seed++);
    run_linear_case(*be, {65, 37, {5, 19, 3}, kind, true, Activation::kGeluTanh, false}, seed++);
    run_linear_case(*be, {130, 520, {130, 260}, kind, false, Activation::kGeluErf, true}, seed++);
    run_linear_case(*be, {3, 256, {17}, kind, true, Activation::kNone, true}, seed++);
  }
}

TEST_F(CpuOps, Fp8LinearDecodesEveryByteExactly) {
  // W [256, 8]: row j holds byte j in column 0, zeros elsewhere; x = e_0, so out[j] is the
  // decoded byte times its block scale (NaN for 0x7f / 0xff), through the 8-wide vector path.
  std::vector<uint8_t> w(256 * 8, 0);
  for (int j = 0; j < 256; ++j) w[j * 8] = static_cast<uint8_t>(j);
  std::vector<float> scale = {1.0f, 0.25f};  // blocks of rows [0,128) and [128,256)
  LinearPart p{Tensor(w.data(), DType::kF8E4M3, {256, 8}), Tensor(scale.data(), DType::kF32, {2, 1})};
  auto lw = be->load_linear(std::span(&p, 1), Tensor(), 128);
  ASSERT_TRUE(lw.is_ok()) << lw.status().to_string();
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 0, 0}, out(256);
  be->linear(f32(out, {1, 256}), f32(x, {1, 8}), *lw, {});
  for (int j = 0; j < 256; ++j) {
    const float want = fp8_e4m3_to_float(static_cast<uint8_t>(j)) * scale[j / 128];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(out[j])) << "byte " << j;
    } else {
      EXPECT_EQ(out[j], want) << "byte " << j;
    }
  }
}

TEST_F(CpuOps, LinearRejectsBadScaleShapes) {
  std::vector<uint8_t> w(10 * 300, 0x38);
  std::vector<float> s(2 * 3, 1.0f);
  LinearPart p{Tensor(w.data(), DType::kF8E4M3, {10, 300}), Tensor(s.data(), DType::kF32, {2, 3})};
  auto r = be->load_linear(std::span(&p, 1), Tensor(), 128);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("scale_inv [1, 3]"), std::string::npos) << r.status().message();
}

// ---- row ops and norms ----

TEST_F(CpuOps, EmbeddingGatherScatter) {
  const int64_t V = 11, H = 5;
  std::vector<float> tf = randu(V * H, 3);
  std::vector<uint16_t> tb(V * H);
  for (size_t i = 0; i < tb.size(); ++i) tb[i] = float_to_bf16(tf[i]);
  std::vector<int32_t> ids = {3, 0, 10, 3};
  std::vector<float> out(4 * H);
  be->embedding(f32(out, {4, H}), Tensor(tb.data(), DType::kBF16, {V, H}), i32(ids, {4}));
  std::vector<double> want;
  for (int32_t id : ids)
    for (int64_t j = 0; j < H; ++j) want.push_back(bf16_to_float(tb[id * H + j]));
  expect_close(out, want, "embedding");

  std::vector<float> x = randu(6 * H, 4), src = randu(2 * H, 5);
  std::vector<int32_t> rows = {4, 1};
  std::vector<double> acc(x.begin(), x.end());
  for (int r = 0; r < 2; ++r)
    for (int64_t j = 0; j < H; ++j) acc[rows[r] * H + j] += src[r * H + j];
  std::vector<float> xa = x;
  be->scatter_rows(f32(xa, {6, H}), i32(rows, {2}), f32(src, {2, H}), true);
  expect_close(xa, acc, "scatter accumulate");
  std::vector<double> rep(x.begin(), x.end());
  for (int r = 0; r < 2; ++r)
    for (int64_t j = 0; j < H; ++j) rep[rows[r] * H + j] = src[r * H + j];
  std::vector<float> xr = x;
  be->scatter_rows(f32(xr, {6, H}), i32(rows, {2}), f32(src, {2, H}), false);
  expect_close(xr, rep, "scatter replace");

  std::vector<float> g(2 * H);
  be->gather_rows(f32(g, {2, H}), f32(x, {6, H}), i32(rows, {2}));
  std::vector<double> gw;
  for (int32_t r : rows)
    for (int64_t j = 0; j < H; ++j) gw.push_back(x[r * H + j]);
  expect_close(g, gw, "gather");
}

TEST_F(CpuOps, ArgmaxRows) {
  // The greedy rule (backend.h): the largest entry, the first one on ties, NaN skipped (a row of
  // NaN gives 0), -0 == +0. Each row's answer is worked out beside it.
  const float nan = std::nanf(""), inf = INFINITY;
  const int64_t V = 7;
  std::vector<float> x = {
      1,    3,     2,    3,    -1,    0,      3,        // ties of 3 at 1, 3, 6: 1
      nan,  -5,    nan,  -2,   -2,    nan,    -7,       // NaN first and between; -2 at 3 and 4: 3
      nan,  nan,   nan,  nan,  nan,   nan,    nan,      // all NaN: 0
      -1,   -0.0f, 0.0f, -2,   -0.0f, -inf,   -3,       // zeros at 1, 2, 4 (signs differ, equal): 1
      -inf, -inf,  inf,  nan,  inf,   5,      6,        // +inf at 2 and 4: 2
      -inf, -inf,  -inf, -inf, -inf,  -inf,   -inf,     // every entry equal: 0
      -4,   -3,    -2,   -1,   -0.5f, -0.25f, -0.125f,  // increasing: the last, 6
  };
  const std::vector<int32_t> want = {1, 3, 0, 1, 2, 0, 6};
  const int64_t R = static_cast<int64_t>(want.size());
  std::vector<int32_t> ids(static_cast<size_t>(R), -1);
  be->argmax_rows(i32(ids, {R}), f32(x, {R, V}));
  EXPECT_EQ(ids, want) << "F32";

  // The same rows in BF16 (every value above is exact in BF16), and one row where BF16 makes two
  // F32 values equal: 1 + 2^-8 rounds to 1 (half an ulp of BF16's 7-bit mantissa, ties to even),
  // so F32 picks index 1 and BF16 the first of the now equal pair, index 0.
  std::vector<float> extra = {1.0f, 1.00390625f, 0.5f, -1, 0, 0.75f, 0.99609375f};
  std::vector<float> xe = x;
  xe.insert(xe.end(), extra.begin(), extra.end());
  std::vector<uint16_t> xb(xe.size());
  for (size_t i = 0; i < xe.size(); ++i) xb[i] = float_to_bf16(xe[i]);
  EXPECT_EQ(bf16_to_float(xb[xb.size() - 6]), 1.0f);  // the rounding the row relies on
  std::vector<int32_t> idb(static_cast<size_t>(R + 1), -1), ide(static_cast<size_t>(R + 1), -1);
  be->argmax_rows(i32(idb, {R + 1}), Tensor(xb.data(), DType::kBF16, {R + 1, V}));
  std::vector<int32_t> wantb = want;
  wantb.push_back(0);
  EXPECT_EQ(idb, wantb) << "BF16";
  be->argmax_rows(i32(ide, {R + 1}), f32(xe, {R + 1, V}));
  EXPECT_EQ(ide.back(), 1) << "F32 keeps 1 + 2^-8 above 1";

  // A long row: values in [-1, 1) with 2 planted at 613 and 877 (the first wins).
  std::vector<float> big = randu(1000, 21);
  big[877] = 2.0f;
  big[613] = 2.0f;
  std::vector<int32_t> one(1, -1);
  be->argmax_rows(i32(one, {1}), f32(big, {1, 1000}));
  EXPECT_EQ(one[0], 613);

  // ids must hold one entry per row.
  std::vector<int32_t> short_ids(2);
  EXPECT_THROW(be->argmax_rows(i32(short_ids, {2}), f32(x, {R, V})), CheckFailure);
}

TEST_F(CpuOps, RmsNormAndLayerNorm) {
  const int64_t n = 5, H = 37;
  std::vector<float> x = randu(n * H, 6, -3, 3), w = randu(H, 7), b = randu(H, 8), out(n * H);
  const double eps = 1e-6;
  be->rms_norm(f32(out, {n, H}), f32(x, {n, H}), f32(w, {H}), static_cast<float>(eps));
  std::vector<double> want(n * H);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < H; ++j) ss += double(x[i * H + j]) * x[i * H + j];
    for (int64_t j = 0; j < H; ++j) want[i * H + j] = w[j] * x[i * H + j] / std::sqrt(ss / H + eps);
  }
  expect_close(out, want, "rms_norm");

  be->layer_norm(f32(out, {n, H}), f32(x, {n, H}), f32(w, {H}), f32(b, {H}), static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < H; ++j) m += x[i * H + j];
    m /= H;
    for (int64_t j = 0; j < H; ++j) v += (x[i * H + j] - m) * (x[i * H + j] - m);
    v /= H;
    for (int64_t j = 0; j < H; ++j) want[i * H + j] = (x[i * H + j] - m) / std::sqrt(v + eps) * w[j] + b[j];
  }
  expect_close(out, want, "layer_norm");
}

TEST_F(CpuOps, SiluMulAndInterpolatedAdd) {
  const int64_t n = 4, I = 9;
  std::vector<float> gu = randu(n * 2 * I, 9, -4, 4), out(n * I);
  be->silu_mul(f32(out, {n, I}), f32(gu, {n, 2 * I}));
  std::vector<double> want(n * I);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < I; ++j) {
      double g = gu[i * 2 * I + j];
      want[i * I + j] = g / (1 + std::exp(-g)) * gu[i * 2 * I + I + j];
    }
  expect_close(out, want, "silu_mul");

  const int64_t P = 9, D = 6;
  std::vector<float> tf = randu(P * D, 10);
  std::vector<uint16_t> tb(P * D);
  for (size_t i = 0; i < tb.size(); ++i) tb[i] = float_to_bf16(tf[i]);
  std::vector<float> x = randu(n * D, 11), w = randu(n * 4, 12, 0, 1);
  std::vector<int32_t> idx = {0, 1, 3, 4, 8, 8, 8, 8, 2, 5, 2, 5, 6, 7, 0, 1};
  std::vector<double> xw(x.begin(), x.end());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < D; ++j)
      for (int k = 0; k < 4; ++k) xw[i * D + j] += double(w[i * 4 + k]) * bf16_to_float(tb[idx[i * 4 + k] * D + j]);
  be->add_interpolated(f32(x, {n, D}), Tensor(tb.data(), DType::kBF16, {P, D}), i32(idx, {n, 4}), f32(w, {n, 4}));
  expect_close(x, xw, "add_interpolated");
}

// ---- vision attention ----

TEST_F(CpuOps, VisionRopeAndSegmentAttention) {
  const int nh = 2, dh = 8;
  const int64_t N = 7, width = 3 * nh * dh;
  std::vector<float> qkv = randu(N * width, 13), rope(N * 2 * dh);
  for (int64_t i = 0; i < N; ++i)
    for (int d = 0; d < dh; ++d) {
      double a = 0.3 * (i + 1) * (d % (dh / 2) + 1);
      rope[(i * 2) * dh + d] = static_cast<float>(std::cos(a));
      rope[(i * 2 + 1) * dh + d] = static_cast<float>(std::sin(a));
    }
  // Reference rotation: x' = x·cos + rotate_half(x)·sin, rotate_half(x) = (−x[h:], x[:h]).
  std::vector<double> rot(qkv.begin(), qkv.end());
  for (int64_t i = 0; i < N; ++i)
    for (int part = 0; part < 2; ++part)
      for (int h = 0; h < nh; ++h) {
        const float* src = &qkv[i * width + (part * nh + h) * dh];
        for (int d = 0; d < dh; ++d) {
          double r = d < dh / 2 ? -src[d + dh / 2] : src[d - dh / 2];
          rot[i * width + (part * nh + h) * dh + d] = src[d] * rope[(i * 2) * dh + d] + r * rope[(i * 2 + 1) * dh + d];
        }
      }
  be->vision_rope(f32(qkv, {N, width}), f32(rope, {N, 2, dh}), nh, dh);
  expect_close(qkv, rot, "vision_rope");

  // Two segments [0,3) and [3,7): softmax(q·kᵀ·scale)·v inside each.
  std::vector<int32_t> cu = {0, 3, 7};
  VisionSegments seg{i32(cu, {3}), cu, 4};
  std::vector<float> out(N * nh * dh);
  const double scale = 1.0 / std::sqrt(double(dh));
  be->vision_attention(f32(out, {N, nh * dh}), f32(qkv, {N, width}), seg, nh, dh, static_cast<float>(scale));
  std::vector<double> want(N * nh * dh, 0.0);
  for (int s = 0; s < 2; ++s)
    for (int64_t i = cu[s]; i < cu[s + 1]; ++i)
      for (int h = 0; h < nh; ++h) {
        std::vector<double> p;
        double mx = -1e300, sum = 0;
        for (int64_t j = cu[s]; j < cu[s + 1]; ++j) {
          double d = 0;
          for (int e = 0; e < dh; ++e) d += double(qkv[i * width + h * dh + e]) * qkv[j * width + (nh + h) * dh + e];
          p.push_back(d * scale);
          mx = std::max(mx, d * scale);
        }
        for (double& v : p) sum += (v = std::exp(v - mx));
        for (int64_t j = cu[s]; j < cu[s + 1]; ++j)
          for (int e = 0; e < dh; ++e)
            want[i * nh * dh + h * dh + e] += p[j - cu[s]] / sum * qkv[j * width + (2 * nh + h) * dh + e];
      }
  expect_close(out, want, "vision_attention");
}

}  // namespace
}  // namespace qvl
