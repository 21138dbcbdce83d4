// Recorded op sequences (CUDA graphs) and growable regions:
// - a decode-shaped step (norm, qkv GEMV, q/k-norm+M-RoPE+KV store, split-K attention, o GEMV
//   with residual) run eagerly and through run_graph must give bit-identical results, on the
//   recording call and on replays after the inputs' contents (tokens, context lengths) change;
// - a region keeps its base address and contents while it grows.
#include <cmath>
#include <cstring>

#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

std::vector<uint16_t> bits_of(Backend& be, const Tensor& t) {
  std::vector<uint16_t> b(static_cast<size_t>(t.nbytes() / 2));
  be.copy_to_host(b.data(), t);
  return b;
}

TEST(GpuGraphs, ReplayEqualsEager) {
  QVL_REQUIRE_CUDA();
  Backend& be = *cuda();
  Scratch s;
  const int B = 3, H = 512, hq = 8, hkv = 4, hd = 64, page = 16, max_pages = 8, layers = 1;
  const int64_t width = int64_t{hq + 2 * hkv} * hd;
  // Weights.
  std::vector<uint16_t> wqkv = to_bf16_bits(random_values(width * H, 0.05f));
  std::vector<uint16_t> wo = to_bf16_bits(random_values(int64_t{H} * hq * hd, 0.05f));
  LinearPart pq{Tensor(wqkv.data(), DType::kBF16, {width, H}), Tensor()};
  LinearPart po{Tensor(wo.data(), DType::kBF16, {H, int64_t{hq} * hd}), Tensor()};
  LinearWeight qkv_w = be.load_linear({&pq, 1}, Tensor(), 128).value();
  LinearWeight o_w = be.load_linear({&po, 1}, Tensor(), 128).value();
  std::vector<float> ones(static_cast<size_t>(H), 1.0f), hones(static_cast<size_t>(hd), 1.0f);
  Tensor norm_w = same_bytes(s, DType::kF32, {H}, ones.data()).g;
  Tensor qk_w = same_bytes(s, DType::kF32, {hd}, hones.data()).g;
  // Fixed-address step buffers.
  KvCacheView cache{nullptr, DType::kBF16, B * max_pages, page, layers, hkv, hd};
  Tensor kv = s.alloc(be, DType::kU8, {static_cast<int64_t>(cache.page_bytes()) * cache.num_pages});
  cache.base = kv.data;
  std::vector<uint16_t> kv_fill = to_bf16_bits(random_values(kv.numel() / 2));
  be.copy_to_device(kv, kv_fill.data());
  Tensor x0 = s.alloc(be, DType::kBF16, {B, H}), x = s.alloc(be, DType::kBF16, {B, H});
  Tensor h = s.alloc(be, DType::kBF16, {B, H}), qkv = s.alloc(be, DType::kBF16, {B, width});
  Tensor attn = s.alloc(be, DType::kBF16, {B, int64_t{hq} * hd});
  Tensor qs = s.alloc(be, DType::kI32, {B + 1}), ctx = s.alloc(be, DType::kI32, {B});
  Tensor pt = s.alloc(be, DType::kI32, {B, max_pages}), slots = s.alloc(be, DType::kI32, {B});
  Tensor pos = s.alloc(be, DType::kI32, {B, 3});
  std::vector<int32_t> qsv = {0, 1, 2, 3}, ptv(B * max_pages);
  for (int i = 0; i < B * max_pages; ++i) ptv[i] = (i * 5) % (B * max_pages);  // a permutation
  be.copy_to_device(qs, qsv.data());
  be.copy_to_device(pt, ptv.data());
  TextBatch batch{B, B, max_pages, max_pages * page, qs, ctx, pt, slots, pos};
  MropeSpec rope;
  for (int j = 0; j < hd / 2; ++j) {
    rope.inv_freq.push_back(static_cast<float>(1.0 / std::pow(5e6, 2.0 * j / hd)));
    rope.axis.push_back(static_cast<uint8_t>(j % 3));
  }
  const TextAttentionShape shape{hq, hkv, hd};
  auto step = [&] {
    be.copy(x, x0);
    be.rms_norm(h, x, norm_w, 1e-6f);
    be.linear(qkv, h, qkv_w, {});
    be.text_qkv_prepare(qkv, qk_w, qk_w, 1e-6f, rope, batch, cache, 0, shape);
    be.text_attention(attn, qkv, batch, cache, 0, shape, 0.125f);
    be.linear(x, attn, o_w, {Activation::kNone, x});
  };
  // New inputs: x0, context lengths (and so slots and positions), the cache contents.
  auto set_inputs = [&](std::vector<int32_t> ctxv) {
    std::vector<uint16_t> xb = to_bf16_bits(random_values(int64_t{B} * H));
    be.copy_to_device(x0, xb.data());
    std::vector<int32_t> sl(B), ps(B * 3);
    for (int b = 0; b < B; ++b) {
      const int p = ctxv[b] - 1;
      sl[b] = ptv[b * max_pages + p / page] * page + p % page;
      ps[b * 3] = ps[b * 3 + 1] = ps[b * 3 + 2] = p;
    }
    be.copy_to_device(ctx, ctxv.data());
    be.copy_to_device(slots, sl.data());
    be.copy_to_device(pos, ps.data());
  };
  const std::vector<std::vector<int32_t>> contexts = {{1, 70, 128}, {5, 128, 2}, {100, 3, 64}};
  for (size_t round = 0; round < contexts.size(); ++round) {
    set_inputs(contexts[round]);
    step();
    std::vector<uint16_t> eager_x = bits_of(be, x), eager_kv = bits_of(be, kv);
    be.copy(x, x0);  // scramble the outputs the graph must rewrite
    be.run_graph("decode-test", step);
    std::vector<uint16_t> graph_x = bits_of(be, x), graph_kv = bits_of(be, kv);
    const bool same = eager_x == graph_x && eager_kv == graph_kv;
    CheckRow row{"graph replay == eager", "round " + std::to_string(round) + (round ? " (replay)" : " (record)")};
    row.pass = same;
    record(row);
    EXPECT_TRUE(same) << "round " << round << ": graph output differs from eager";
  }
  be.clear_graphs();
}

TEST(GpuRegions, GrowInPlace) {
  QVL_REQUIRE_CUDA();
  Backend& be = *cuda();
  auto region = be.reserve_region(size_t{1} << 30, "test region");
  ASSERT_TRUE(region.is_ok()) << region.status().to_string();
  DeviceRegion& r = **region;
  void* base = r.base();
  EXPECT_EQ(r.committed_bytes(), 0u);
  ASSERT_TRUE(r.grow_to(10 << 20).is_ok());
  EXPECT_GE(r.committed_bytes(), size_t{10} << 20);
  std::vector<uint16_t> a = to_bf16_bits(random_values(1 << 20));
  Tensor head(base, DType::kBF16, {1 << 20}, Device::kCuda);
  be.copy_to_device(head, a.data());
  ASSERT_TRUE(r.grow_to(300 << 20).is_ok());
  EXPECT_EQ(r.base(), base);
  Tensor tail(static_cast<char*>(base) + (299 << 20), DType::kBF16, {1 << 19}, Device::kCuda);
  std::vector<uint16_t> b = to_bf16_bits(random_values(1 << 19));
  be.copy_to_device(tail, b.data());
  EXPECT_EQ(bits_of(be, head), a);
  EXPECT_EQ(bits_of(be, tail), b);
  EXPECT_FALSE(r.grow_to(size_t{2} << 30).is_ok());  // past the reservation
  CheckRow row{"region grow (base fixed, contents kept)", "1 GiB reserved, 10 MiB -> 300 MiB"};
  row.pass = !::testing::Test::HasFailure();
  record(row);
}

}  // namespace
}  // namespace qvl::test::gpu
