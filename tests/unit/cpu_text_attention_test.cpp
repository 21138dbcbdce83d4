// CPU text attention ops (q/k RMSNorm + interleaved M-RoPE + paged KV store, then causal GQA
// over the paged cache) against a double-precision reference that keeps each sequence's K/V
// history in plain arrays. Two steps over two sequences with scattered page tables: a prefill
// step, then a step mixing a 2-row chunk and a decode row.
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

constexpr int kHq = 4, kHkv = 2, kDh = 16, kLayers = 2, kPage = 4, kPages = 8, kLayer = 1;
constexpr int kWidth = (kHq + 2 * kHkv) * kDh;

std::vector<float> randu(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

struct Reference {
  MropeSpec rope;
  std::vector<float> qn, kn;
  // Per sequence: K and V rows (kHkv·kDh each) by absolute token index.
  std::vector<std::vector<std::vector<double>>> k, v;

  // RMSNorm over kDh then x·cos + rotate_half(x)·sin at position `pos`.
  std::vector<double> norm_rope(const float* x, const std::vector<float>& w, const int32_t* pos) const {
    double ss = 0;
    for (int d = 0; d < kDh; ++d) ss += double(x[d]) * x[d];
    const double r = 1.0 / std::sqrt(ss / kDh + 1e-6);
    std::vector<double> y(kDh), out(kDh);
    for (int d = 0; d < kDh; ++d) y[d] = w[d] * x[d] * r;
    for (int d = 0; d < kDh; ++d) {
      const int j = d % (kDh / 2);
      const double angle = double(pos[rope.axis[j]]) * rope.inv_freq[j];
      const double rot = d < kDh / 2 ? -y[d + kDh / 2] : y[d - kDh / 2];
      out[d] = y[d] * std::cos(angle) + rot * std::sin(angle);
    }
    return out;
  }
};

struct Step {
  std::vector<int32_t> rows_per_seq;  // new rows of each sequence
};

TEST(CpuTextAttention, PagedGqaMatchesReference) {
  auto be = make_cpu_backend(3);
  Reference ref;
  for (int j = 0; j < kDh / 2; ++j) {
    ref.rope.inv_freq.push_back(static_cast<float>(std::pow(100.0, -2.0 * j / kDh)));
    ref.rope.axis.push_back(static_cast<uint8_t>(j % 3));
  }
  ref.qn = randu(kDh, 1);
  ref.kn = randu(kDh, 2);
  ref.k.resize(2);
  ref.v.resize(2);

  KvCacheView cache;
  cache.dtype = DType::kF32;
  cache.num_pages = kPages;
  cache.page_size = kPage;
  cache.num_layers = kLayers;
  cache.num_kv_heads = kHkv;
  cache.head_dim = kDh;
  std::vector<uint8_t> kv_mem(cache.page_bytes() * kPages);
  cache.base = kv_mem.data();

  const int max_pages = 3;
  std::vector<int32_t> page_table = {5, 2, 7, 0, 3, -1};  // seq 0 and seq 1
  std::vector<int32_t> cached = {0, 0};
  const TextAttentionShape shape{kHq, kHkv, kDh};
  const double scale = 1.0 / std::sqrt(double(kDh));

  const std::vector<Step> steps = {{{5, 3}}, {{2, 1}}};
  uint32_t seed = 10;
  for (const Step& st : steps) {
    const int n = st.rows_per_seq[0] + st.rows_per_seq[1];
    std::vector<float> qkv = randu(static_cast<size_t>(n) * kWidth, seed++);
    const std::vector<float> raw = qkv;
    std::vector<int32_t> qs = {0, st.rows_per_seq[0], n};
    std::vector<int32_t> ctx = {cached[0] + st.rows_per_seq[0], cached[1] + st.rows_per_seq[1]};
    std::vector<int32_t> slots(n), positions(n * 3);
    for (int s = 0; s < 2; ++s)
      for (int r = qs[s]; r < qs[s + 1]; ++r) {
        const int t = cached[s] + (r - qs[s]);
        slots[r] = page_table[s * max_pages + t / kPage] * kPage + t % kPage;
        // Distinct T/H/W so the axis map matters.
        positions[r * 3 + 0] = t + 3 * s;
        positions[r * 3 + 1] = 2 * t + 1;
        positions[r * 3 + 2] = 7 - t;
      }
    TextBatch batch;
    batch.num_seqs = 2;
    batch.num_tokens = n;
    batch.max_pages_per_seq = max_pages;
    batch.max_context = std::max(ctx[0], ctx[1]);
    batch.query_start = Tensor(qs.data(), DType::kI32, {3});
    batch.context_len = Tensor(ctx.data(), DType::kI32, {2});
    batch.page_table = Tensor(page_table.data(), DType::kI32, {2, max_pages});
    batch.slots = Tensor(slots.data(), DType::kI32, {n});
    batch.positions = Tensor(positions.data(), DType::kI32, {n, 3});

    Tensor qkv_t(qkv.data(), DType::kF32, {n, kWidth});
    be->text_qkv_prepare(qkv_t, Tensor(ref.qn.data(), DType::kF32, {kDh}), Tensor(ref.kn.data(), DType::kF32, {kDh}),
                         1e-6f, ref.rope, batch, cache, kLayer, shape);
    std::vector<float> out(static_cast<size_t>(n) * kHq * kDh);
    be->text_attention(Tensor(out.data(), DType::kF32, {n, kHq * kDh}), qkv_t, batch, cache, kLayer, shape,
                       static_cast<float>(scale));

    // Reference: extend each sequence's history, then attend causally.
    std::vector<float> want_q(qkv.size()), want_out(out.size());
    for (int s = 0; s < 2; ++s)
      for (int r = qs[s]; r < qs[s + 1]; ++r) {
        const float* row = &raw[static_cast<size_t>(r) * kWidth];
        std::vector<double> kr, vr;
        for (int h = 0; h < kHkv; ++h) {
          auto k = ref.norm_rope(row + (kHq + h) * kDh, ref.kn, &positions[r * 3]);
          kr.insert(kr.end(), k.begin(), k.end());
          vr.insert(vr.end(), row + (kHq + kHkv + h) * kDh, row + (kHq + kHkv + h + 1) * kDh);
        }
        ref.k[s].push_back(kr);
        ref.v[s].push_back(vr);
      }
    for (int s = 0; s < 2; ++s)
      for (int r = qs[s]; r < qs[s + 1]; ++r) {
        const int p = cached[s] + (r - qs[s]);
        const float* row = &raw[static_cast<size_t>(r) * kWidth];
        std::copy(row, row + kWidth, &want_q[static_cast<size_t>(r) * kWidth]);
        for (int h = 0; h < kHq; ++h) {
          auto q = ref.norm_rope(row + h * kDh, ref.qn, &positions[r * 3]);
          for (int d = 0; d < kDh; ++d) want_q[static_cast<size_t>(r) * kWidth + h * kDh + d] = float(q[d]);
          const int g = h / (kHq / kHkv);
          std::vector<double> sc(p + 1);
          double mx = -1e300, sum = 0;
          for (int t = 0; t <= p; ++t) {
            double dot = 0;
            for (int d = 0; d < kDh; ++d) dot += q[d] * ref.k[s][t][g * kDh + d];
            sc[t] = dot * scale;
            mx = std::max(mx, sc[t]);
          }
          for (double& x : sc) sum += (x = std::exp(x - mx));
          for (int d = 0; d < kDh; ++d) {
            double acc = 0;
            for (int t = 0; t <= p; ++t) acc += sc[t] / sum * ref.v[s][t][g * kDh + d];
            want_out[static_cast<size_t>(r) * kHq * kDh + h * kDh + d] = float(acc);
          }
        }
      }
    // q is normalised and rotated in place (k and v parts of qkv may hold anything after).
    for (int r = 0; r < n; ++r) {
      auto c = test::compare_allclose(&qkv[static_cast<size_t>(r) * kWidth], &want_q[static_cast<size_t>(r) * kWidth],
                                      kHq * kDh, test::tol::kCpuOpAbs, test::tol::kCpuOpRel);
      EXPECT_TRUE(c.ok) << "q row " << r << ": " << c.message;
    }
    auto c = test::compare_allclose(out.data(), want_out.data(), static_cast<int64_t>(out.size()), test::tol::kCpuOpAbs,
                                    test::tol::kCpuOpRel);
    EXPECT_TRUE(c.ok) << "attention: " << c.message;
    cached = ctx;
  }
}

TEST(CpuTextAttention, Bf16CacheStoresRoundedValues) {
  // The same prepare into an F32 and a BF16 cache: every stored element of the BF16 cache is
  // the bf16 rounding of the F32 one.
  auto be = make_cpu_backend(2);
  MropeSpec rope;
  for (int j = 0; j < kDh / 2; ++j) {
    rope.inv_freq.push_back(1.0f / (j + 1));
    rope.axis.push_back(0);
  }
  std::vector<float> qn(kDh, 1.0f), kn(kDh, 1.0f);
  std::vector<int32_t> qs = {0, 3}, ctx = {3}, pt = {1}, slots = {4, 5, 6}, pos = {0, 0, 0, 1, 1, 1, 2, 2, 2};
  TextBatch b;
  b.num_seqs = 1;
  b.num_tokens = 3;
  b.max_pages_per_seq = 1;
  b.max_context = 3;
  b.query_start = Tensor(qs.data(), DType::kI32, {2});
  b.context_len = Tensor(ctx.data(), DType::kI32, {1});
  b.page_table = Tensor(pt.data(), DType::kI32, {1, 1});
  b.slots = Tensor(slots.data(), DType::kI32, {3});
  b.positions = Tensor(pos.data(), DType::kI32, {3, 3});
  std::vector<std::vector<uint8_t>> mem(2);
  KvCacheView caches[2];
  for (int i = 0; i < 2; ++i) {
    caches[i] = KvCacheView{nullptr, i == 0 ? DType::kF32 : DType::kBF16, 2, kPage, 1, kHkv, kDh};
    mem[i].assign(caches[i].page_bytes() * 2, 0);
    caches[i].base = mem[i].data();
    std::vector<float> qkv = randu(3 * kWidth, 99);
    be->text_qkv_prepare(Tensor(qkv.data(), DType::kF32, {3, kWidth}), Tensor(qn.data(), DType::kF32, {kDh}),
                         Tensor(kn.data(), DType::kF32, {kDh}), 1e-6f, rope, b, caches[i], 0, {kHq, kHkv, kDh});
  }
  const float* f = reinterpret_cast<const float*>(mem[0].data());
  const uint16_t* h = reinterpret_cast<const uint16_t*>(mem[1].data());
  const size_t elems = mem[0].size() / 4;
  for (size_t i = 0; i < elems; ++i) ASSERT_EQ(h[i], float_to_bf16(f[i])) << i;
}

}  // namespace
}  // namespace qvl
