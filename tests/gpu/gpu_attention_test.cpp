// CUDA vs CPU attention: vision (segments of odd lengths, one empty, head dims 64/72 and a
// generic one), text q/k-norm + M-RoPE + KV store, causal prefill over a paged cache with
// random page tables, and split-K decode (one long sequence: many splits; a few: some; many
// sequences: unsplit), GQA groups 2 and 4.
//
// Vision and prefill attention run twice on sm_90+: with the cluster key split (flash.cuh; the
// default there) and on a second backend with it off (one block per query tile, the path of
// older GPUs). The split cases: segments of 1 to 3072 rows (shorter than a tile, >= 2 key
// tiles per rank, several per launch), prefill contexts 1/63/64/65/300/900 alone (split 1, 1, 1,
// 1, 2, 4: flash.cuh's split follows the batch's longest context) and together (all split 4:
// ranks with empty causal shares), chunked prefill after cached context, BF16 and FP8 caches.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

// A CUDA backend with `options` (the shared cuda() uses the defaults).
std::unique_ptr<Backend> cuda_backend_with(const CudaBackendOptions& options) {
  auto b = make_cuda_backend(options);
  QVL_CHECK(b.is_ok()) << b.status().to_string();
  return std::move(b).value();
}

// The CUDA backends a vision / prefill case runs on, made per test: cuda() (on sm_90 vision
// attention at head dim 64 and prefill at head dim 128 over a BF16 cache through the
// warpgroup-MMA kernels, the cluster split on sm_90+); on sm_90 one with those kernels off (the
// mma.sync flash kernels, split); on sm_90+ one with CudaBackendOptions::cluster_attention off
// (and the warpgroup-MMA kernels off); and one with vision attention at one m-tile per warp and
// prefill Q in its own shared memory, splitting from two key tiles on (vision_attention_mt = 1,
// prefill_q_alias off, prefill_key_tiles = 1, the warpgroup-MMA kernels off), whose decode
// attention takes its keys by cp.async where the others take TMA boxes (sm_90+). The no-cluster
// one and one more (split as cuda()) take vision Q through the K stages (vision_q_through_k) and
// prefill key tiles of 32 (prefill_small_tiles).
struct Gpu {
  std::string label;
  Backend* be;
};
class AttentionGpus {
 public:
  AttentionGpus() {
    list_.push_back({"", cuda()});
    auto info = cuda_device_info(0);
    const int cc = info.is_ok() ? info->compute_capability : 0;
    if (cc == 90) {
      CudaBackendOptions o;
      o.vision_wgmma = false;
      o.prefill_wgmma = false;
      mma_sync_ = cuda_backend_with(o);
      list_.push_back({kMmaSync, mma_sync_.get()});
    }
    if (cc >= 90) {
      CudaBackendOptions o;
      o.cluster_attention = false;
      o.vision_wgmma = false;
      o.prefill_wgmma = false;
      o.vision_q_through_k = 1;
      o.prefill_small_tiles = 1;
      unsplit_ = cuda_backend_with(o);
      list_.push_back({" no-cluster q-through-k small-tiles", unsplit_.get()});
    }
    {
      CudaBackendOptions o;
      o.vision_wgmma = false;
      o.prefill_wgmma = false;
      o.vision_q_through_k = 1;
      o.prefill_small_tiles = 1;
      qk_ = cuda_backend_with(o);
      list_.push_back({kQk, qk_.get()});
    }
    CudaBackendOptions o;
    o.vision_attention_mt = 1;
    o.prefill_q_alias = false;
    o.prefill_key_tiles = 1;
    o.vision_wgmma = false;
    o.prefill_wgmma = false;
    o.decode_attention_tma = false;
    mt1_ = cuda_backend_with(o);
    list_.push_back({kMt1, mt1_.get()});
  }
  const std::vector<Gpu>& list() const { return list_; }
  // The label of the backend whose vision attention is the mma.sync kernel at two m-tiles per
  // warp with the same cluster setting as kMt1's.
  std::string mt2_label() const { return mma_sync_ ? kMmaSync : ""; }
  static constexpr const char* kMmaSync = " mma.sync";
  static constexpr const char* kMt1 = " mt1 no-q-alias key-tiles-1 no-tma";
  static constexpr const char* kQk = " mma.sync q-through-k small-tiles";

 private:
  std::unique_ptr<Backend> mma_sync_, unsplit_, qk_, mt1_;
  std::vector<Gpu> list_;
};

// A fresh BF16 device tensor (allocated through cuda(), usable by every CUDA backend) filled
// with `fill`; cuda()'s stream is drained so another backend's stream sees the contents.
Tensor filled_output(Scratch& s, std::initializer_list<int64_t> dims, float fill) {
  Tensor t = s.alloc(*cuda(), DType::kBF16, dims);
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()), float_to_bf16(fill));
  cuda()->copy_to_device(t, bits.data());
  cuda()->synchronize();
  return t;
}

TEST(GpuOps, VisionAttention) {
  QVL_REQUIRE_CUDA();
  const AttentionGpus gpus;
  struct Case {
    std::vector<int32_t> cu;
    int nh, dh;
  };
  // Key tiles of 64 per segment, split over 2 ranks on sm_90+: 1030 -> 17 (8 + 9 per rank);
  // 1, 63, 65, 571, 1536 -> 1 (one rank empty), 1, 2, 9, 24; 3072 is 2B's image (24 + 24).
  for (const Case& c : {Case{{0, 1}, 2, 64}, Case{{0, 5, 200, 200, 333}, 2, 64}, Case{{0, 1030}, 16, 64},
                        Case{{0, 77, 301}, 3, 72}, Case{{0, 129, 600}, 16, 72}, Case{{0, 40, 97}, 2, 40},
                        Case{{0, 1, 64, 129, 700, 2236}, 4, 64}, Case{{0, 3072}, 2, 64}, Case{{0, 500, 1300}, 4, 72}}) {
    Scratch s;
    const int64_t N = c.cu.back(), width = 3LL * c.nh * c.dh;
    Pair qkv = activation(s, {N, width}, random_values(N * width));
    Pair cu = ints(s, {static_cast<int64_t>(c.cu.size())}, c.cu);
    int max_len = 0;
    for (size_t i = 0; i + 1 < c.cu.size(); ++i) max_len = std::max(max_len, c.cu[i + 1] - c.cu[i]);
    VisionSegments sc{cu.c, c.cu, max_len}, sg{cu.g, c.cu, max_len};
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
    Tensor out_c = s.alloc(cpu(), DType::kF32, {N, int64_t{c.nh} * c.dh});
    cpu().vision_attention(out_c, qkv.c, sc, c.nh, c.dh, scale);
    const std::vector<float> expected = download(cpu(), out_c);
    std::string segs;
    for (size_t i = 0; i + 1 < c.cu.size(); ++i) {  // appended piece by piece: "," + string trips GCC 12's -Wrestrict
      if (i) segs += ',';
      segs += std::to_string(c.cu[i + 1] - c.cu[i]);
    }
    std::vector<float> mt2;
    for (const Gpu& gpu : gpus.list()) {
      // Rows a kernel fails to write keep 5.0 and fail the comparison.
      Tensor out_g = filled_output(s, {N, int64_t{c.nh} * c.dh}, 5.0f);
      gpu.be->vision_attention(out_g, qkv.g, sg, c.nh, c.dh, scale);
      const std::vector<float> got = download(*gpu.be, out_g);
      EXPECT_TRUE(compare("vision_attention",
                          "segs " + segs + " nh" + std::to_string(c.nh) + " dh" + std::to_string(c.dh) + gpu.label, got,
                          expected, tol::kGpuAttention));
      // One or two m-tiles per warp, Q through the K stages or not: the same bits (a row's
      // arithmetic does not depend on the warp or on where Q waited).
      if (gpu.label == gpus.mt2_label()) mt2 = got;
      if (gpu.label == AttentionGpus::kMt1 || gpu.label == AttentionGpus::kQk) {
        EXPECT_TRUE(!mt2.empty() && got == mt2) << "segs " << segs << ":" << gpu.label << " differs from mt2";
      }
    }
  }
}

// A paged cache with the same random BF16 contents on both backends, and a batch of
// sequences (q_len new rows each, ctx tokens in the cache after this step) with random page
// tables drawn from one shuffled pool of pages.
struct TextSetup {
  Scratch s;
  Pair cache_mem;
  std::vector<uint8_t> device_cache;  // the CUDA cache's initial bytes
  KvCacheView cc, cg;
  TextBatch bc, bg;
  std::vector<int32_t> qs, ctx, table, slots;
  int num_tokens = 0;
};

MropeSpec make_mrope(int hd) {
  MropeSpec m;
  const int half = hd / 2;
  for (int j = 0; j < half; ++j) {
    m.inv_freq.push_back(static_cast<float>(1.0 / std::pow(5000000.0, 2.0 * j / hd)));
    m.axis.push_back(static_cast<uint8_t>(j < half / 3 * 3 ? j % 3 : 0));
  }
  return m;
}

// `kv` is the CUDA cache's dtype; the CPU cache is always BF16 (the CPU backend has no FP8
// cache) and holds the same values: for an FP8 cache, the exact BF16 images of its bytes.
void setup_text(TextSetup& t, const std::vector<std::pair<int, int>>& seqs, int hkv, int hd, int layers,
                DType kv = DType::kBF16, int page = 16) {
  int max_pages = 1, total_pages = 0;
  for (auto [q, c] : seqs) {
    max_pages = std::max(max_pages, (c + page - 1) / page);
    total_pages += (c + page - 1) / page;
  }
  const int num_pages = total_pages + 3;  // a few pages nobody uses
  std::vector<int32_t> pool(static_cast<size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng());
  const int B = static_cast<int>(seqs.size());
  t.table.assign(static_cast<size_t>(B) * max_pages, 0);
  t.qs = {0};
  size_t next = 0;
  for (int b = 0; b < B; ++b) {
    auto [q, c] = seqs[b];
    for (int p = 0; p < (c + page - 1) / page; ++p) t.table[b * max_pages + p] = pool[next++];
    t.qs.push_back(t.qs.back() + q);
    t.ctx.push_back(c);
    for (int i = c - q; i < c; ++i) t.slots.push_back(t.table[b * max_pages + i / page] * page + i % page);
  }
  t.num_tokens = t.qs.back();
  t.cc = KvCacheView{nullptr, DType::kBF16, num_pages, page, layers, hkv, hd};
  t.cg = KvCacheView{nullptr, kv, num_pages, page, layers, hkv, hd};
  const int64_t elems = static_cast<int64_t>(t.cc.page_bytes()) * num_pages / 2;
  std::vector<uint16_t> fill;
  if (kv == DType::kBF16) {
    fill = to_bf16_bits(random_values(elems));
    t.cache_mem = same_bytes(t.s, DType::kU8, {elems * 2}, fill.data());
    t.device_cache.resize(static_cast<size_t>(elems) * 2);
    std::memcpy(t.device_cache.data(), fill.data(), t.device_cache.size());
  } else {
    std::vector<uint8_t> codes(static_cast<size_t>(elems));
    std::uniform_int_distribution<int> d(0, 255);
    for (auto& c : codes) {
      do c = static_cast<uint8_t>(d(rng()));
      while ((c & 0x7f) == 0x7f || (c & 0x78) > 0x50);  // no NaN; |v| <= 2^3 like real K/V
    }
    fill.resize(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) fill[i] = float_to_bf16(fp8_e4m3_to_float(codes[i]));
    t.cache_mem.c = t.s.alloc(cpu(), DType::kU8, {elems * 2});
    t.cache_mem.g = t.s.alloc(*cuda(), DType::kU8, {elems});
    cpu().copy_to_device(t.cache_mem.c, fill.data());
    cuda()->copy_to_device(t.cache_mem.g, codes.data());
    t.device_cache = codes;
  }
  t.cc.base = t.cache_mem.c.data;
  t.cg.base = t.cache_mem.g.data;
  std::vector<int32_t> pos(static_cast<size_t>(t.num_tokens) * 3);
  std::uniform_int_distribution<int32_t> pd(0, 5000);
  for (auto& p : pos) p = pd(rng());
  const int n = t.num_tokens;
  Pair qs = ints(t.s, {B + 1}, t.qs), cl = ints(t.s, {B}, t.ctx), pt = ints(t.s, {B, max_pages}, t.table);
  Pair sl = ints(t.s, {n}, t.slots), ps = ints(t.s, {n, 3}, pos);
  int max_ctx = *std::max_element(t.ctx.begin(), t.ctx.end());
  t.bc = TextBatch{B, n, max_pages, max_ctx, qs.c, cl.c, pt.c, sl.c, ps.c};
  t.bg = TextBatch{B, n, max_pages, max_ctx, qs.g, cl.g, pt.g, sl.g, ps.g};
}

// A cache's elements as floats (BF16 or FP8 bytes).
std::vector<float> cache_values(Backend& be, const Tensor& mem, DType dt) {
  std::vector<float> v;
  if (dt == DType::kBF16) {
    std::vector<uint16_t> bits(static_cast<size_t>(mem.numel() / 2));
    be.copy_to_host(bits.data(), mem);
    for (uint16_t b : bits) v.push_back(bf16_to_float(b));
  } else {
    std::vector<uint8_t> codes(static_cast<size_t>(mem.numel()));
    be.copy_to_host(codes.data(), mem);
    for (uint8_t c : codes) v.push_back(fp8_e4m3_to_float(c));
  }
  return v;
}

template <typename T>
std::vector<T> raw(Backend& be, const Tensor& t) {
  std::vector<T> v(t.nbytes() / sizeof(T));
  be.copy_to_host(v.data(), t);
  return v;
}
// Index of the first difference, or -1.
template <typename T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  auto m = std::mismatch(a.begin(), a.end(), b.begin());
  return m.first == a.end() ? -1 : m.first - a.begin();
}

TEST(GpuOps, TextQkvPrepare) {
  QVL_REQUIRE_CUDA();
  struct Case {
    std::vector<std::pair<int, int>> seqs;
    int hq, hkv, hd;
    DType kv;
    DType norm = DType::kF32;
  };
  const DType bf = DType::kBF16, f8 = DType::kF8E4M3;
  // text_qkv_prepare through the one-block-per-8-heads kernel for every head dim.
  CudaBackendOptions per_head_group;
  per_head_group.token_qkv_prepare = false;
  const std::unique_ptr<Backend> other_be = cuda_backend_with(per_head_group);
  Backend& other = *other_be;
  // 802/802: 2B's TTFT prefill (32 heads, 200 blocks of 4 tokens and a partial one); 32/8: 4B's 48 heads.
  for (const Case& c :
       {Case{{{1, 1}}, 16, 8, 128, bf}, Case{{{9, 30}, {1, 17}}, 32, 8, 128, bf}, Case{{{5, 5}}, 4, 2, 64, bf},
        Case{{{3, 20}}, 2, 1, 40, bf}, Case{{{9, 30}, {1, 17}}, 16, 8, 128, f8}, Case{{{3, 20}}, 2, 1, 40, f8},
        Case{{{802, 802}}, 16, 8, 128, bf}, Case{{{300, 300}, {40, 100}}, 32, 8, 128, f8},
        Case{{{70, 90}, {3, 3}}, 4, 2, 64, f8, bf}, Case{{{64, 64}}, 40, 8, 128, bf, bf}}) {
    TextSetup t;
    setup_text(t, c.seqs, c.hkv, c.hd, 2, c.kv);
    const int n = t.num_tokens, layer = 1;
    const int64_t width = int64_t{c.hq + 2 * c.hkv} * c.hd;
    const std::vector<float> qkv_values = random_values(n * width, 2.0f);
    Pair qkv = activation(t.s, {n, width}, qkv_values);
    std::vector<float> qn = random_values(c.hd, 0.2f), kn = random_values(c.hd, 0.2f);
    for (auto& v : qn) v += 1.0f;
    for (auto& v : kn) v += 1.0f;
    Pair qnorm, knorm;
    if (c.norm == bf) {
      const std::vector<uint16_t> qb = to_bf16_bits(qn), kb = to_bf16_bits(kn);
      qnorm = same_bytes(t.s, bf, {c.hd}, qb.data());
      knorm = same_bytes(t.s, bf, {c.hd}, kb.data());
    } else {
      qnorm = same_bytes(t.s, DType::kF32, {c.hd}, qn.data());
      knorm = same_bytes(t.s, DType::kF32, {c.hd}, kn.data());
    }
    const MropeSpec rope = make_mrope(c.hd);
    const TextAttentionShape shape{c.hq, c.hkv, c.hd};
    // The same qkv and cache again, for the per-8-heads kernel.
    Tensor qkv2 = t.s.alloc(*cuda(), bf, {n, width});
    Tensor cache2 = t.s.alloc(*cuda(), DType::kU8, {static_cast<int64_t>(t.device_cache.size())});
    const std::vector<uint16_t> qkv_bits = to_bf16_bits(qkv_values);
    cuda()->copy_to_device(qkv2, qkv_bits.data());
    cuda()->copy_to_device(cache2, t.device_cache.data());
    cuda()->synchronize();
    KvCacheView cg2 = t.cg;
    cg2.base = cache2.data;
    cpu().text_qkv_prepare(qkv.c, qnorm.c, knorm.c, 1e-6f, rope, t.bc, t.cc, layer, shape);
    cuda()->text_qkv_prepare(qkv.g, qnorm.g, knorm.g, 1e-6f, rope, t.bg, t.cg, layer, shape);
    other.text_qkv_prepare(qkv2, qnorm.g, knorm.g, 1e-6f, rope, t.bg, cg2, layer, shape);
    // q columns of qkv (rotated in place)
    std::vector<float> a = download(*cuda(), qkv.g), e = download(cpu(), qkv.c), qa, qe;
    for (int i = 0; i < n; ++i) {
      qa.insert(qa.end(), a.begin() + i * width, a.begin() + i * width + int64_t{c.hq} * c.hd);
      qe.insert(qe.end(), e.begin() + i * width, e.begin() + i * width + int64_t{c.hq} * c.hd);
    }
    const std::string shp = 'n' + std::to_string(n) + " " + std::to_string(c.hq) + "/" + std::to_string(c.hkv) +
                            " heads dh" + std::to_string(c.hd) + (c.kv == f8 ? " kv:fp8" : "");
    EXPECT_TRUE(compare("text_qkv_prepare q", shp, qa, qe, tol::kGpuRope));
    // K and V rows written at the slots (layer 1); the rest of the cache must be untouched.
    std::vector<float> ca = cache_values(*cuda(), t.cache_mem.g, c.kv), ce = cache_values(cpu(), t.cache_mem.c, bf);
    std::vector<float> ka, ke, va, ve;
    const int64_t tok = int64_t{c.hkv} * c.hd;
    for (int32_t slot : t.slots) {
      const int64_t page = slot / t.cc.page_size, off = slot % t.cc.page_size;
      // element offsets of this token's K and V rows in each cache (same structure, own dtype)
      auto at = [&](const KvCacheView& v) {
        const int64_t es = dtype_size(v.dtype);
        const int64_t k0 = (page * v.page_bytes() + layer * v.layer_bytes()) / es + off * tok;
        return std::make_pair(k0, k0 + int64_t{v.page_size} * tok);
      };
      auto [gk, gv] = at(t.cg);
      auto [ck, cv] = at(t.cc);
      ka.insert(ka.end(), ca.begin() + gk, ca.begin() + gk + tok);
      ke.insert(ke.end(), ce.begin() + ck, ce.begin() + ck + tok);
      va.insert(va.end(), ca.begin() + gv, ca.begin() + gv + tok);
      ve.insert(ve.end(), ce.begin() + cv, ce.begin() + cv + tok);
    }
    const bool fp8 = c.kv == f8;
    EXPECT_TRUE(compare("text_qkv_prepare k -> cache", shp, ka, ke, fp8 ? tol::kGpuFp8Kv : tol::kGpuRope));
    EXPECT_TRUE(compare("text_qkv_prepare v -> cache", shp, va, ve, fp8 ? tol::kGpuFp8Kv : tol::kGpuCopy));
    if (!fp8) {
      EXPECT_TRUE(compare("kv cache (all bytes)", shp, ca, ce, tol::kGpuRope));
    }
    // Both CUDA kernels write the same bits: all of qkv (q rotated, k and v untouched) and the
    // whole cache.
    EXPECT_EQ(first_difference(raw<uint16_t>(*cuda(), qkv.g), raw<uint16_t>(other, qkv2)), -1) << shp << ": qkv";
    EXPECT_EQ(first_difference(raw<uint8_t>(*cuda(), t.cache_mem.g), raw<uint8_t>(other, cache2)), -1)
        << shp << ": cache";
  }
}

// `seqs`: (new rows, context after this step) per sequence; runs on every backend of `gpus`
// (none: cuda() only).
void run_text_attention(const std::string& op, const std::vector<std::pair<int, int>>& seqs, int hq, int hkv, int hd,
                        DType kv = DType::kBF16, const AttentionGpus* gpus = nullptr, int page = 16) {
  TextSetup t;
  setup_text(t, seqs, hkv, hd, 2, kv, page);
  const int n = t.num_tokens, layer = 1;
  const int64_t width = int64_t{hq + 2 * hkv} * hd;
  Pair qkv = activation(t.s, {n, width}, random_values(n * width));
  const TextAttentionShape shape{hq, hkv, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor out_c = t.s.alloc(cpu(), DType::kF32, {n, int64_t{hq} * hd});
  cpu().text_attention(out_c, qkv.c, t.bc, t.cc, layer, shape, scale);
  const std::vector<float> expected = download(cpu(), out_c);
  std::string desc = std::to_string(seqs.size()) + " seqs (";
  for (size_t i = 0; i < std::min<size_t>(seqs.size(), 6); ++i) {
    if (i) desc += ',';
    desc += std::to_string(seqs[i].first) + '/' + std::to_string(seqs[i].second);
  }
  desc += seqs.size() > 6 ? ",..)" : ")";
  desc += ' ' + std::to_string(hq) + '/' + std::to_string(hkv) + " dh" + std::to_string(hd);
  if (kv == DType::kF8E4M3) desc += " kv:fp8";
  if (page != 16) desc += " page " + std::to_string(page);
  const std::vector<Gpu> only_cuda = {{"", cuda()}};
  for (const Gpu& gpu : gpus ? gpus->list() : only_cuda) {
    // Rows a kernel fails to write keep 9.0 and fail the comparison.
    Tensor out_g = filled_output(t.s, {n, int64_t{hq} * hd}, 9.0f);
    gpu.be->text_attention(out_g, qkv.g, t.bg, t.cg, layer, shape, scale);
    EXPECT_TRUE(compare(op, desc + gpu.label, download(*gpu.be, out_g), expected, tol::kGpuAttention));
  }
}

TEST(GpuOps, TextPrefillAttention) {
  QVL_REQUIRE_CUDA();
  const AttentionGpus gpus;
  const std::vector<std::pair<int, int>> mixed = {{1, 1}, {17, 40}, {70, 70}, {5, 300}, {130, 1000}};
  run_text_attention("text_attention prefill", mixed, 16, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention prefill", {{64, 64}}, 32, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention prefill", {{100, 250}, {3, 3}}, 4, 2, 64, DType::kBF16, &gpus);
  run_text_attention("text_attention prefill", {{9, 20}, {2, 2}}, 2, 1, 40, DType::kBF16, &gpus);  // generic kernel
  // Head dim 128 over an FP8 cache: on sm_90 the default backend's warpgroup-MMA kernel (its
  // producer widens the raw tiles), the others' flash.cuh.
  const int64_t wgmma_fp8 = cuda_fp8_gemm_counts(*cuda()).prefill_wgmma_fp8;
  run_text_attention("text_attention prefill", mixed, 16, 8, 128, DType::kF8E4M3, &gpus);
  auto info = cuda_device_info(0);
  if (info.is_ok() && info->compute_capability == 90) {
    EXPECT_GT(cuda_fp8_gemm_counts(*cuda()).prefill_wgmma_fp8, wgmma_fp8) << "FP8 prefill by warpgroup MMA";
  }
  for (const auto& gpu : gpus.list()) {
    if (gpu.be != cuda()) {
      EXPECT_EQ(cuda_fp8_gemm_counts(*gpu.be).prefill_wgmma_fp8, 0) << gpu.label;
    }
  }
  run_text_attention("text_attention prefill", {{100, 250}, {3, 3}}, 4, 2, 64, DType::kF8E4M3, &gpus);
  run_text_attention("text_attention prefill", {{9, 20}, {2, 2}}, 2, 1, 40, DType::kF8E4M3, &gpus);
}

// The cluster key split (flash.cuh) at the context lengths around tile edges, alone and in one
// batch, after cached context, with both caches and both head dims.
TEST(GpuOps, TextPrefillAttentionSplit) {
  QVL_REQUIRE_CUDA();
  const AttentionGpus gpus;
  const DType f8 = DType::kF8E4M3;
  for (int ctx : {1, 63, 64, 65, 300, 900})
    run_text_attention("text_attention prefill", {{ctx, ctx}}, 16, 8, 128, DType::kBF16, &gpus);
  // (32 and 33: the edges of the small tiles' 32-key tiles.)
  const std::vector<std::pair<int, int>> edges = {{1, 1},   {32, 32}, {33, 33},   {63, 63},
                                                  {64, 64}, {65, 65}, {300, 300}, {900, 900}};
  run_text_attention("text_attention prefill", edges, 16, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention prefill", edges, 16, 8, 128, f8, &gpus);
  run_text_attention("text_attention prefill", {{300, 300}, {900, 900}}, 32, 8, 128, DType::kBF16, &gpus);
  // chunked prefill: new rows after cached context
  run_text_attention("text_attention prefill", {{200, 900}}, 16, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention prefill", {{200, 900}}, 16, 8, 128, f8, &gpus);
  run_text_attention("text_attention prefill", {{37, 301}, {64, 128}}, 16, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention prefill", {{65, 700}, {2, 64}, {129, 129}}, 16, 8, 128, f8, &gpus);
  run_text_attention("text_attention prefill", {{129, 600}, {65, 65}, {1, 1}}, 4, 2, 64, DType::kBF16, &gpus);
  run_text_attention("text_attention prefill", {{129, 600}, {65, 65}, {1, 1}}, 4, 2, 64, f8, &gpus);
  // An FP8 cache's raw tiles come two ahead of the one being widened: long shares (47 key tiles),
  // with a share's last tiles before and after the rows it widens.
  run_text_attention("text_attention prefill", {{300, 3000}, {70, 70}}, 16, 8, 128, f8, &gpus);
  run_text_attention("text_attention prefill", {{130, 2000}, {2, 130}}, 4, 2, 64, f8, &gpus);
}

// Pages of other sizes than 16: powers of two (page lookups by shift; on sm_90 the
// warpgroup-MMA prefill reads 64 / page boxes per key tile at 64, part of a page at 256, and
// leaves 4 to flash.cuh) and not (by division), for prefill and decode.
TEST(GpuOps, TextAttentionPageSizes) {
  QVL_REQUIRE_CUDA();
  const AttentionGpus gpus;
  for (int page : {4, 12, 64, 256}) {
    run_text_attention("text_attention prefill", {{37, 301}, {64, 128}, {5, 5}}, 16, 8, 128, DType::kBF16, &gpus, page);
    run_text_attention("text_attention prefill", {{100, 250}}, 4, 2, 64, DType::kF8E4M3, &gpus, page);
    run_text_attention("text_attention prefill", {{37, 301}, {5, 5}}, 16, 8, 128, DType::kF8E4M3, &gpus, page);
    run_text_attention("text_attention decode", {{1, 700}, {1, 33}}, 16, 8, 128, DType::kBF16, nullptr, page);
    run_text_attention("text_attention decode", {{1, 300}}, 4, 2, 64, DType::kF8E4M3, nullptr, page);
  }
}

// Every case runs on every backend of AttentionGpus: on sm_90+ cuda() merges a sequence's
// splits in a thread-block cluster (16 splits for one sequence of 8 kv heads, 10 for three,
// 16 for 4/2 heads) and the no-cluster backend through L2 (32 for one sequence).
TEST(GpuOps, TextDecodeAttention) {
  QVL_REQUIRE_CUDA();
  const AttentionGpus gpus;
  run_text_attention("text_attention decode", {{1, 1}}, 16, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention decode", {{1, 5000}}, 16, 8, 128, DType::kBF16, &gpus);  // 16 / 32 splits
  run_text_attention("text_attention decode", {{1, 2000}, {1, 33}, {1, 700}}, 32, 8, 128, DType::kBF16, &gpus);
  std::vector<std::pair<int, int>> many;
  std::uniform_int_distribution<int> d(1, 600);
  for (int i = 0; i < 40; ++i) many.push_back({1, d(rng())});
  run_text_attention("text_attention decode", many, 16, 8, 128, DType::kBF16, &gpus);  // unsplit (320 blocks)
  std::vector<std::pair<int, int>> lots;
  for (int i = 0; i < 200; ++i) lots.push_back({1, 1 + i % 37});
  run_text_attention("text_attention decode", lots, 16, 8, 128, DType::kBF16, &gpus);  // unsplit
  run_text_attention("text_attention decode", {{1, 300}, {1, 1}}, 4, 2, 64, DType::kBF16, &gpus);
  // 8 q heads per kv head (the kernel's largest group): each cluster block merges part of one head.
  run_text_attention("text_attention decode", {{1, 3000}}, 64, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention decode", {{1, 3000}, {1, 17}}, 64, 8, 128, DType::kF8E4M3, &gpus);
  run_text_attention("text_attention decode", {{1, 200}}, 4, 2, 64, DType::kBF16, &gpus);  // empty splits
  // Splits whose last round ends inside different 16-key warp tiles, the newest key among them.
  for (int ctx : {64 * 16 + 1, 64 * 16 + 17, 64 * 16 + 40, 64 * 16 + 63, 64 * 16 + 64})
    run_text_attention("text_attention decode", {{1, ctx}}, 16, 8, 128, DType::kBF16, &gpus);
  run_text_attention("text_attention decode", {{1, 64 * 16 + 40}, {1, 64 * 3 + 5}}, 32, 8, 128, DType::kF8E4M3, &gpus);
  run_text_attention("text_attention decode", {{1, 50}, {1, 9}}, 2, 1, 40, DType::kBF16, &gpus);  // generic kernel
  run_text_attention("text_attention decode", {{1, 2000}, {1, 33}, {1, 700}}, 32, 8, 128, DType::kF8E4M3, &gpus);
  run_text_attention("text_attention decode", {{1, 300}, {1, 1}}, 4, 2, 64, DType::kF8E4M3, &gpus);
  run_text_attention("text_attention decode", {{1, 50}, {1, 9}}, 2, 1, 40, DType::kF8E4M3, &gpus);
}

// An FP8 cache is widened exactly (to f16) on each path the decode attention reads it by: the
// newest key's buffer (context 1), the first round before the PDL wait (50) and the later rounds
// (300: 5 rounds in one split), through TMA and by cp.async. Every K row is zero, so every key
// scores 0 and weighs exactly 1; with one split the output is then n · v / n = v. Each of the 254
// non-NaN E4M3 codes, written in the V rows of every key (codes 0..127 in one run, 128..255 in the
// other, one per head dim), must come back as its exact value in both query heads.
TEST(GpuOps, TextDecodeFp8CacheWidensExactly) {
  QVL_REQUIRE_CUDA();
  constexpr int hd = 128, hq = 2;
  for (const bool tma : {true, false}) {  // boxes into raw stages (sm_90+), or cp.async copies
    CudaBackendOptions o;
    o.decode_split_blocks = 1;  // one split of one kv head
    o.decode_attention_tma = tma;
    const std::unique_ptr<Backend> be = cuda_backend_with(o);
    for (int half : {0, 1}) {
      for (int ctx : {1, 50, 300}) {
        TextSetup t;
        setup_text(t, {{1, ctx}}, 1, hd, 2, DType::kF8E4M3, 16);
        const KvCacheView& g = t.cg;
        std::vector<uint8_t> codes(t.device_cache.size(), 0);
        for (int64_t page = 0; page < g.num_pages; ++page)
          for (int l = 0; l < g.num_layers; ++l)
            for (int tok = 0; tok < g.page_size; ++tok)
              for (int d = 0; d < hd; ++d)  // [page][layer][K rows, then V rows][hd] (one kv head)
                codes[static_cast<size_t>(page * g.page_bytes() + l * g.layer_bytes() + (g.page_size + tok) * hd + d)] =
                    static_cast<uint8_t>(half * 128 + d);
        cuda()->copy_to_device(t.cache_mem.g, codes.data());
        cuda()->synchronize();
        const int64_t width = int64_t{hq + 2} * hd;
        Pair qkv = activation(t.s, {1, width}, random_values(width));
        Tensor out = filled_output(t.s, {1, int64_t{hq} * hd}, 9.0f);
        be->text_attention(out, qkv.g, t.bg, t.cg, 1, TextAttentionShape{hq, 1, hd}, 1.0f / std::sqrt(float{hd}));
        const std::vector<float> got = download(*be, out);
        int wrong = 0;
        std::string first;
        for (int h = 0; h < hq; ++h) {
          for (int d = 0; d < hd; ++d) {
            const int code = half * 128 + d;
            if ((code & 0x7f) == 0x7f) continue;  // NaN
            const float want = fp8_e4m3_to_float(static_cast<uint8_t>(code));
            if (got[h * hd + d] != want && wrong++ == 0)
              first = "code " + std::to_string(code) + ": " + std::to_string(got[h * hd + d]) + " for " +
                      std::to_string(want);
          }
        }
        EXPECT_EQ(wrong, 0) << "context " << ctx << (tma ? "" : " cp.async") << ", first " << first;
      }
    }
  }
}

// The cluster merge and the L2 merge do the same arithmetic: with the same number of splits
// they write the same bits. Both backends are held to 64 split blocks (8 splits of 8 kv heads:
// a portable cluster size, so the cluster backend cannot take fewer).
TEST(GpuOps, TextDecodeClusterMergeSameBits) {
  QVL_REQUIRE_CUDA();
  auto info = cuda_device_info(0);
  if (!info.is_ok() || info->compute_capability < 90) GTEST_SKIP() << "no thread-block clusters";
  CudaBackendOptions o;
  o.decode_split_blocks = 64;
  const std::unique_ptr<Backend> cluster = cuda_backend_with(o);
  o.decode_cluster_merge = false;
  const std::unique_ptr<Backend> l2 = cuda_backend_with(o);
  for (const auto& [ctx, kv] :
       {std::pair{5000, DType::kBF16}, std::pair{777, DType::kF8E4M3}, std::pair{40, DType::kBF16}}) {
    TextSetup t;
    setup_text(t, {{1, ctx}}, 8, 128, 2, kv, 16);
    const int64_t width = int64_t{16 + 2 * 8} * 128;
    Pair qkv = activation(t.s, {1, width}, random_values(width));
    const TextAttentionShape shape{16, 8, 128};
    std::vector<std::vector<uint16_t>> bits;
    for (Backend* be : {cluster.get(), l2.get()}) {
      Tensor out = filled_output(t.s, {1, 16 * 128}, 9.0f);
      be->text_attention(out, qkv.g, t.bg, t.cg, 1, shape, 1.0f / std::sqrt(128.0f));
      bits.push_back(raw<uint16_t>(*be, out));
    }
    EXPECT_EQ(first_difference(bits[0], bits[1]), -1) << "context " << ctx;
  }
}

// The decode attention's key rounds through TMA (sm_90+; the default for a cache whose pages hold a
// multiple of 16 tokens) against cp.async from every thread: the same bits, and within the oracle's
// tolerance, for BF16 and FP8 caches. TMA lands whole 16-key groups, so the rows past a context in
// its last page are read too: here they hold NaN (the cp.async rounds never read them), which the
// kernel must zero before P·V. Cases: one round, splits ending inside a group, several rounds per
// split (20 of 64 keys at 20000 keys over 16 splits, 10 over the L2 merge's 32; 9 at 9000 keys over
// 4/2 heads' 16, the last split ending inside its sixth), the L2 merge, several sequences, 64-token
// pages, head dim 64; for the FP8 cache the same kinds, its boxes widened from two raw stages.
TEST(GpuOps, TextDecodeTmaSameBits) {
  QVL_REQUIRE_CUDA();
  auto info = cuda_device_info(0);
  if (!info.is_ok() || info->compute_capability < 90) GTEST_SKIP() << "TMA needs sm_90";
  struct Case {
    std::vector<std::pair<int, int>> seqs;
    int hq, hkv, hd, page;
    bool cluster;
    DType kv = DType::kBF16;
  };
  const DType f8 = DType::kF8E4M3;
  const std::vector<Case> cases = {
      {{{1, 1}}, 16, 8, 128, 16, true},
      {{{1, 838}}, 16, 8, 128, 16, true},
      {{{1, 64 * 16 + 40}}, 16, 8, 128, 16, true},
      {{{1, 5000}}, 16, 8, 128, 16, true},
      {{{1, 5000}}, 16, 8, 128, 16, false},
      {{{1, 20000}}, 16, 8, 128, 16, true},
      {{{1, 20000 + 37}}, 16, 8, 128, 16, false},
      {{{1, 9000}}, 4, 2, 64, 16, true},
      {{{1, 2000}, {1, 33}, {1, 700}}, 32, 8, 128, 16, true},
      {{{1, 700}, {1, 45}}, 16, 8, 128, 64, true},
      {{{1, 300}, {1, 1}}, 4, 2, 64, 16, true},
      // An FP8 cache: its boxes widened from the raw stages (tma_issue).
      {{{1, 1}}, 16, 8, 128, 16, true, f8},
      {{{1, 20000 + 37}}, 16, 8, 128, 16, true, f8},
      {{{1, 5000}}, 16, 8, 128, 16, false, f8},
      {{{1, 2000}, {1, 33}, {1, 700}}, 32, 8, 128, 16, true, f8},
      {{{1, 700}, {1, 45}}, 16, 8, 128, 64, true, f8},
      {{{1, 9000}, {1, 130}}, 4, 2, 64, 16, true, f8},
  };
  const int layer = 1;
  for (const Case& c : cases) {
    CudaBackendOptions o;
    o.cluster_attention = c.cluster;
    const std::unique_ptr<Backend> tma = cuda_backend_with(o);
    o.decode_attention_tma = false;
    const std::unique_ptr<Backend> copies = cuda_backend_with(o);
    TextSetup t;
    setup_text(t, c.seqs, c.hkv, c.hd, 2, c.kv, c.page);
    std::string desc = std::to_string(c.seqs.size()) + " seqs, context " + std::to_string(c.seqs[0].second) + ", " +
                       std::to_string(c.hq) + "/" + std::to_string(c.hkv) + " dh" + std::to_string(c.hd) + " page " +
                       std::to_string(c.page) + (c.cluster ? "" : " L2 merge") + (c.kv == f8 ? " kv:fp8" : "");
    // NaN in every K and V row past each context, in its last page (this layer, all kv heads):
    // BF16 0x7FC0, or the E4M3 code 0x7F.
    std::vector<uint8_t> bytes = t.device_cache;
    const size_t row = t.cg.token_bytes_per_layer();
    const int max_pages = static_cast<int>(t.table.size() / c.seqs.size());
    for (size_t b = 0; b < c.seqs.size(); ++b)
      for (int i = t.ctx[b]; i % c.page != 0; ++i)
        for (int v = 0; v < 2; ++v) {
          const size_t at = static_cast<size_t>(t.table[b * max_pages + i / c.page]) * t.cg.page_bytes() +
                            layer * t.cg.layer_bytes() + (v * c.page + i % c.page) * row;
          if (c.kv == f8) {
            std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(at), row, uint8_t{0x7F});
          } else {
            for (size_t e = 0; e < row / 2; ++e) {
              bytes[at + 2 * e] = 0xC0;  // little-endian 0x7FC0
              bytes[at + 2 * e + 1] = 0x7F;
            }
          }
        }
    cuda()->copy_to_device(t.cache_mem.g, bytes.data());
    cuda()->synchronize();
    const int n = t.num_tokens;
    const int64_t width = int64_t{c.hq + 2 * c.hkv} * c.hd;
    Pair qkv = activation(t.s, {n, width}, random_values(n * width));
    const TextAttentionShape shape{c.hq, c.hkv, c.hd};
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    Tensor out_c = t.s.alloc(cpu(), DType::kF32, {n, int64_t{c.hq} * c.hd});
    cpu().text_attention(out_c, qkv.c, t.bc, t.cc, layer, shape, scale);
    std::vector<std::vector<uint16_t>> bits;
    for (Backend* be : {tma.get(), copies.get()}) {
      Tensor out = filled_output(t.s, {n, int64_t{c.hq} * c.hd}, 9.0f);
      be->text_attention(out, qkv.g, t.bg, t.cg, layer, shape, scale);
      bits.push_back(raw<uint16_t>(*be, out));
      EXPECT_TRUE(compare("text_attention decode", desc + (be == tma.get() ? " tma" : " cp.async"), download(*be, out),
                          download(cpu(), out_c), tol::kGpuAttention));
    }
    EXPECT_EQ(first_difference(bits[0], bits[1]), -1) << desc;
    EXPECT_GT(cuda_fp8_gemm_counts(*tma).decode_tma, 0) << desc << ": TMA launches";
    EXPECT_EQ(cuda_fp8_gemm_counts(*copies).decode_tma, 0) << desc << ": TMA launches with it off";
  }
}

}  // namespace
}  // namespace qvl::test::gpu
