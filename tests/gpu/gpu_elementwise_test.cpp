// CUDA vs CPU: row copies, norms, SiLU·mul, interpolated position embedding, vision RoPE.
// Shapes include one row, odd row counts, widths that are not multiples of 8 (the scalar
// paths) and widths past the register-resident limit of the norm kernel.
#include <numeric>

#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

std::vector<int32_t> random_ids(int64_t n, int32_t limit) {
  std::uniform_int_distribution<int32_t> d(0, limit - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng());
  if (n > 1) {  // the table's first and last rows
    v[0] = 0;
    v[1] = limit - 1;
  }
  return v;
}

// A weight-like host tensor (BF16 bits) and both backends' loaded copies.
struct LoadedTable {
  std::vector<uint16_t> bits;
  Tensor c, g;
};
LoadedTable load_table(int64_t rows, int64_t cols, DType as, float scale = 1.0f) {
  LoadedTable t;
  t.bits = to_bf16_bits(random_values(rows * cols, scale));
  Tensor host(t.bits.data(), DType::kBF16, {rows, cols});
  auto c = cpu().load_tensor(host, as);
  auto g = cuda()->load_tensor(host, as);
  EXPECT_TRUE(c.is_ok() && g.is_ok());
  t.c = c.value();
  t.g = g.value();
  return t;
}
LoadedTable load_vector(int64_t n, DType as, float mean, float scale) {
  LoadedTable t;
  std::vector<float> v = random_values(n, scale);
  for (auto& x : v) x = round_to_bf16(x + mean);
  t.bits = to_bf16_bits(v);
  Tensor host(t.bits.data(), DType::kBF16, {n});
  t.c = cpu().load_tensor(host, as).value();
  t.g = cuda()->load_tensor(host, as).value();
  return t;
}

TEST(GpuOps, Embedding) {
  QVL_REQUIRE_CUDA();
  for (int64_t H : {2048, 12}) {
    for (int64_t n : {1, 7, 40}) {
      Scratch s;
      LoadedTable table = load_table(300, H, DType::kBF16);
      Pair ids = ints(s, {n}, random_ids(n, 300));
      Pair out = activation(s, {n, H}, std::vector<float>(static_cast<size_t>(n * H), 7.0f));
      cpu().embedding(out.c, table.c, ids.c);
      cuda()->embedding(out.g, table.g, ids.g);
      EXPECT_TRUE(compare_pair("embedding", dims({n, H}) + " of [300, H]", out, tol::kGpuCopy));
    }
  }
}

TEST(GpuOps, GatherScatterRows) {
  QVL_REQUIRE_CUDA();
  for (int64_t H : {1024, 20}) {
    Scratch s;
    const int64_t n = 50, m = 13;
    std::vector<int32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    perm.resize(m);  // distinct rows: scatter has one writer per row
    Pair rows = ints(s, {m}, perm);
    Pair x = activation(s, {n, H}, random_values(n * H));
    Pair src = activation(s, {m, H}, random_values(m * H));
    Pair out = activation(s, {m, H}, std::vector<float>(static_cast<size_t>(m * H), 3.0f));
    cpu().gather_rows(out.c, x.c, rows.c);
    cuda()->gather_rows(out.g, x.g, rows.g);
    EXPECT_TRUE(compare_pair("gather_rows", dims({m, H}) + " of " + dims({n, H}), out, tol::kGpuCopy));
    cpu().scatter_rows(x.c, rows.c, src.c, false);
    cuda()->scatter_rows(x.g, rows.g, src.g, false);
    EXPECT_TRUE(compare_pair("scatter_rows", dims({m, H}) + " into " + dims({n, H}), x, tol::kGpuCopy));
    cpu().scatter_rows(x.c, rows.c, src.c, true);
    cuda()->scatter_rows(x.g, rows.g, src.g, true);
    EXPECT_TRUE(compare_pair("scatter_rows +=", dims({m, H}) + " into " + dims({n, H}), x, tol::kGpuElementwise));
  }
}

TEST(GpuOps, RmsNorm) {
  QVL_REQUIRE_CUDA();
  struct Case {
    int64_t n, H;
    DType wdt;
    bool in_place;
  };
  for (Case c :
       {Case{1, 2048, DType::kF32, false}, Case{7, 2048, DType::kBF16, false}, Case{64, 128, DType::kF32, false},
        Case{5, 100, DType::kF32, false}, Case{3, 8200, DType::kF32, false}, Case{9, 2560, DType::kF32, true},
        // rows past 16 per multiprocessor (8 per block) and a prefill's 802 (4 per block, a partial one)
        Case{3001, 2048, DType::kF32, false}, Case{802, 2048, DType::kBF16, true},
        Case{3001, 4096, DType::kF32, true}}) {
    Scratch s;
    LoadedTable w = load_vector(c.H, c.wdt, 1.0f, 0.3f);
    Pair x = activation(s, {c.n, c.H}, random_values(c.n * c.H, 2.0f));
    Pair out = c.in_place ? x : activation(s, {c.n, c.H}, std::vector<float>(static_cast<size_t>(c.n * c.H), 0.0f));
    cpu().rms_norm(out.c, x.c, w.c, 1e-6f);
    cuda()->rms_norm(out.g, x.g, w.g, 1e-6f);
    EXPECT_TRUE(compare_pair(
        std::string("rms_norm") + (c.in_place ? " in place" : "") + (c.wdt == DType::kBF16 ? " w:bf16" : " w:f32"),
        dims({c.n, c.H}), out, tol::kGpuElementwise));
  }
}

TEST(GpuOps, LayerNorm) {
  QVL_REQUIRE_CUDA();
  // 3073 rows: 8 per block past 16 rows per multiprocessor (a partial last block)
  for (auto [n, H] :
       {std::pair<int64_t, int64_t>{1, 1024}, {7, 4096}, {300, 1024}, {4, 36}, {2, 8200}, {3073, 1024}, {3073, 4096}}) {
    Scratch s;
    LoadedTable w = load_vector(H, DType::kF32, 1.0f, 0.3f);
    LoadedTable b = load_vector(H, DType::kF32, 0.0f, 0.5f);
    std::vector<float> xv = random_values(n * H, 1.5f);
    for (auto& v : xv) v = round_to_bf16(v + 0.7f);  // a mean to subtract
    Pair x = activation(s, {n, H}, xv);
    Pair out = activation(s, {n, H}, std::vector<float>(static_cast<size_t>(n * H), 0.0f));
    cpu().layer_norm(out.c, x.c, w.c, b.c, 1e-6f);
    cuda()->layer_norm(out.g, x.g, w.g, b.g, 1e-6f);
    EXPECT_TRUE(compare_pair("layer_norm", dims({n, H}), out, tol::kGpuElementwise));
  }
}

TEST(GpuOps, SiluMul) {
  QVL_REQUIRE_CUDA();
  for (auto [n, I] : {std::pair<int64_t, int64_t>{1, 6144}, {7, 100}, {130, 8}, {33, 9728}}) {
    Scratch s;
    Pair gu = activation(s, {n, 2 * I}, random_values(n * 2 * I, 2.0f));
    Pair out = activation(s, {n, I}, std::vector<float>(static_cast<size_t>(n * I), 0.0f));
    cpu().silu_mul(out.c, gu.c);
    cuda()->silu_mul(out.g, gu.g);
    EXPECT_TRUE(compare_pair("silu_mul", dims({n, I}), out, tol::kGpuElementwise));
  }
}

TEST(GpuOps, AddInterpolated) {
  QVL_REQUIRE_CUDA();
  for (auto [n, D] : {std::pair<int64_t, int64_t>{1, 1024}, {7, 20}, {257, 1152}}) {
    Scratch s;
    const int64_t P = 2304;
    LoadedTable table = load_table(P, D, DType::kBF16, 0.5f);
    Pair idx = ints(s, {n, 4}, random_ids(n * 4, static_cast<int32_t>(P)));
    std::vector<float> w = random_uniform(n * 4, 0.0f, 1.0f);
    Pair wt = same_bytes(s, DType::kF32, {n, 4}, w.data());
    Pair x = activation(s, {n, D}, random_values(n * D));
    cpu().add_interpolated(x.c, table.c, idx.c, wt.c);
    cuda()->add_interpolated(x.g, table.g, idx.g, wt.g);
    EXPECT_TRUE(compare_pair("add_interpolated", dims({n, D}), x, tol::kGpuElementwise));
  }
}

TEST(GpuOps, VisionRope) {
  QVL_REQUIRE_CUDA();
  struct Case {
    int64_t n;
    int nh, dh;
  };
  // Head dims 64 and 80: 8 pairs per thread; 72 (8B): 4; 6 and 20: one (20's half of 10 is no
  // multiple of 4).
  for (Case c : {Case{1, 16, 64}, Case{7, 2, 72}, Case{641, 16, 72}, Case{300, 3, 80}, Case{5, 1, 6}, Case{9, 2, 20}}) {
    Scratch s;
    const int64_t width = 3LL * c.nh * c.dh;
    Pair qkv = activation(s, {c.n, width}, random_values(c.n * width));
    std::vector<float> rope(static_cast<size_t>(c.n * 2 * c.dh));
    std::uniform_real_distribution<float> angle(-100.0f, 100.0f);
    for (int64_t i = 0; i < c.n; ++i) {
      for (int d = 0; d < c.dh; ++d) {
        const float a = angle(rng());
        rope[i * 2 * c.dh + d] = std::cos(a);
        rope[i * 2 * c.dh + c.dh + d] = std::sin(a);
      }
    }
    Pair r = same_bytes(s, DType::kF32, {c.n, 2, c.dh}, rope.data());
    cpu().vision_rope(qkv.c, r.c, c.nh, c.dh);
    cuda()->vision_rope(qkv.g, r.g, c.nh, c.dh);
    EXPECT_TRUE(compare_pair("vision_rope", dims({c.n, c.nh, c.dh}), qkv, tol::kGpuElementwise));
  }
}

}  // namespace
}  // namespace qvl::test::gpu
