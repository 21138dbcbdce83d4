// Internal to decode_stack.cu, and included by it alone (anonymous namespace): the attention of
// the fused decode stack. Attention of kv head g is split over S blocks (item (g, s) on block
// g * S + s); each item prepares q and the new K/V (text_qkv_prepare's numerics), runs an online
// softmax over its keys in rounds of p.keys through shared memory, and leaves an unnormalised
// partial; the last item of a head to arrive merges the S partials. Built on decode_stack.cuh.
#pragma once

#include "backend/cuda/decode_stack.cuh"

namespace qvl::cuda {
namespace {

// Shared-memory row pitch of one K or V row: HD BF16 + 16 bytes, so that the 16-byte loads of
// consecutive rows by consecutive lanes fall on distinct banks.
template <int HD>
constexpr int kv_pitch() {
  return HD * 2 + 16;
}

struct AttnSmem {
  char* kv;      // [keys] K rows, then [keys] V rows (BF16, kv_pitch bytes apart)
  float* q;      // [kMaxGroup][HD] rotated q (BF16 values)
  float* sc;     // [kMaxGroup][keys] scores, then P; the merge's [kMaxGroup][kMaxSplits] weights
  bf16* nkv;     // [2][HD] this step's K and V as the cache holds them
  float* stats;  // [3][kMaxGroup]: running max, sum, rescale
};

template <int HD>
__device__ __forceinline__ AttnSmem attn_smem(const StackParams& p, char* base) {
  AttnSmem a;
  a.kv = base;
  a.q = reinterpret_cast<float*>(base + static_cast<size_t>(p.keys) * 2 * kv_pitch<HD>());
  a.sc = a.q + kMaxGroup * HD;
  a.nkv = reinterpret_cast<bf16*>(a.sc + kMaxGroup * kMaxSplits);
  a.stats = reinterpret_cast<float*>(a.nkv + 2 * HD);
  return a;
}
template <int HD>
constexpr size_t attn_smem_bytes(int keys) {
  return static_cast<size_t>(keys) * 2 * kv_pitch<HD>() + kMaxGroup * HD * 4 + kMaxGroup * kMaxSplits * 4 + 2 * HD * 2 +
         3 * kMaxGroup * 4;
}

// Keys [k0, k1) of this item (an empty range when the split lies past the context).
__device__ __forceinline__ void item_keys(int ctx, int splits, int s, int& k0, int& k1) {
  const int len = (ctx + splits - 1) / splits;
  k0 = min(ctx, s * len);
  k1 = min(ctx, k0 + len);
}

// Issues the cp.async copies of K and V rows of keys [kb, ke) of kv head g (skipping `skip`).
template <int HD>
__device__ void fetch_keys(const StackParams& p, const CacheGeometry& c, int g, int kb, int ke, int skip,
                           const AttnSmem& a) {
  constexpr int CPR = HD / 8;
  const int n = ke - kb;
  for (int i = threadIdx.x; i < 2 * n * CPR; i += kConsumers) {
    const int rr = i / CPR, chunk = i % CPR;
    const bool v = rr >= n;
    const int r = v ? rr - n : rr;
    const int key = kb + r;
    if (key == skip) continue;
    const char* src = cache_row(c, p.page_table[key / c.page_size], key % c.page_size, g, HD, v);
    cp_async16(a.kv + (static_cast<size_t>(v ? p.keys : 0) + r) * kv_pitch<HD>() + chunk * 16, src + chunk * 16);
  }
}

// q/k-norm + M-RoPE of one head (text_qkv_prepare's numerics), by one warp: q heads into a.q,
// the new k (and v, task == group + 1) into a.nkv and the cache.
template <int HD>
__device__ void prepare_task(const StackParams& p, const CacheGeometry& c, int l, int g, int group, int task,
                             const AttnSmem& a) {
  constexpr int kHalf = HD / 2;
  const int lane = threadIdx.x & 31;
  const int32_t slot = p.slots[0];
  const bool store = slot >= 0;
  const int page = store ? slot / c.page_size : 0, off = store ? slot % c.page_size : 0;
  if (task == group + 1) {
    const bf16* src = p.qkv + static_cast<int64_t>(p.hq + p.hkv + g) * HD;
    char* dst = store ? cache_row(c, page, off, g, HD, true) : nullptr;
    for (int d = lane; d < HD; d += 32) {
      const bf16 v = __ldcg(src + d);
      if (dst) reinterpret_cast<bf16*>(dst)[d] = v;
      a.nkv[HD + d] = v;
    }
    return;
  }
  const bool is_q = task < group;
  const bf16* src = p.qkv + static_cast<int64_t>(is_q ? g * group + task : p.hq + g) * HD;
  const void* nw = p.layer[l].norm[is_q ? 2 : 3];
  constexpr int kPairs = (kHalf + 31) / 32;
  float x1[kPairs], x2[kPairs], ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = lane + 32 * i;
    x1[i] = j < kHalf ? __bfloat162float(__ldcg(src + j)) : 0.0f;
    x2[i] = j < kHalf ? __bfloat162float(__ldcg(src + j + kHalf)) : 0.0f;
    ss += x1[i] * x1[i] + x2[i] * x2[i];
  }
  const float rstd = rsqrtf(warp_sum(ss) / static_cast<float>(HD) + p.eps);
  const int32_t pos3[3] = {p.positions[0], p.positions[1], p.positions[2]};
  char* kdst = !is_q && store ? cache_row(c, page, off, g, HD, false) : nullptr;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = lane + 32 * i;
    if (j >= kHalf) continue;
    const int axis = p.rope.axis[j];
    const float pos = static_cast<float>(pos3[axis]);
    float sn, cs;
    sincosf(pos * p.rope.inv_freq[j], &sn, &cs);
    cs = bf16_round(cs);
    sn = bf16_round(sn);
    const float a1 = bf16_round(norm_weight(p, nw, j) * bf16_round(x1[i] * rstd));
    const float a2 = bf16_round(norm_weight(p, nw, j + kHalf) * bf16_round(x2[i] * rstd));
    const float o1 = bf16_round(bf16_round(a1 * cs) + bf16_round(-a2 * sn));
    const float o2 = bf16_round(bf16_round(a2 * cs) + bf16_round(a1 * sn));
    if (is_q) {
      a.q[task * HD + j] = o1;
      a.q[task * HD + j + kHalf] = o2;
    } else {
      if (kdst) {
        reinterpret_cast<bf16*>(kdst)[j] = __float2bfloat16_rn(o1);
        reinterpret_cast<bf16*>(kdst)[j + kHalf] = __float2bfloat16_rn(o2);
      }
      a.nkv[j] = __float2bfloat16_rn(o1);
      a.nkv[j + kHalf] = __float2bfloat16_rn(o2);
    }
  }
}

// Attention item (g, s) of layer l: prepare, softmax over its keys round by round, partial out,
// and the merge when it is the head's last item to arrive. Round 0 was fetched by the caller.
template <int HD>
__device__ void attention_item(const StackParams& p, int l, int g, int s, int splits, const AttnSmem& a, bool* s_last) {
  constexpr int OPT = (kMaxGroup * HD + kConsumers - 1) / kConsumers;  // outputs per thread
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int group = p.hq / p.hkv;
  CacheGeometry c = p.cache;
  c.layer_offset += static_cast<int64_t>(l) * p.layer_bytes;
  const int ctx = p.context_len[0], newest = ctx - 1;
  int k0, k1;
  item_keys(ctx, splits, s, k0, k1);

  wait_counter(&p.counters[kQkv], static_cast<uint32_t>(gridDim.x) * (l + 1), p.debug);
  stamp(p, l, 3);
  const bool own_newest = newest >= k0 && newest < k1;
  for (int task = warp; task < group + (own_newest ? 2 : 0); task += kConsumerWarps)
    prepare_task<HD>(p, c, l, g, group, task, a);
  if (tid < kMaxGroup) {
    a.stats[tid] = -INFINITY;  // running max (log2 domain)
    a.stats[kMaxGroup + tid] = 0.0f;
  }
  consumer_sync();  // q, the new K/V and the running stats are in place
  float o[OPT];
#pragma unroll
  for (int i = 0; i < OPT; ++i) o[i] = 0.0f;

  for (int kb = k0; kb < k1; kb += p.keys) {
    const int ke = min(k1, kb + p.keys), n = ke - kb;
    if (kb != k0) fetch_keys<HD>(p, c, g, kb, ke, newest, a);
    cp_async_wait_all();
    consumer_sync();
    if (newest >= kb && newest < ke) {  // this step's key joins from a.nkv
      const int r = newest - kb;
      for (int d = tid; d < HD; d += kConsumers) {
        reinterpret_cast<bf16*>(a.kv + static_cast<size_t>(r) * kv_pitch<HD>())[d] = a.nkv[d];
        reinterpret_cast<bf16*>(a.kv + static_cast<size_t>(p.keys + r) * kv_pitch<HD>())[d] = a.nkv[HD + d];
      }
      consumer_sync();
    }
    // Scores (log2 domain): one (head, key) per thread, the whole dot product in registers.
    for (int idx = tid; idx < group * n; idx += kConsumers) {
      const int h = idx / n, j = idx % n;
      const uint4* krow = reinterpret_cast<const uint4*>(a.kv + static_cast<size_t>(j) * kv_pitch<HD>());
      const float4* qh = reinterpret_cast<const float4*>(a.q + h * HD);
      float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        float kf[8];
        unpack8(krow[c], kf);
        const float4 q0 = qh[2 * c], q1 = qh[2 * c + 1];
        d0 = fmaf(q0.x, kf[0], d0);
        d1 = fmaf(q0.y, kf[1], d1);
        d0 = fmaf(q0.z, kf[2], d0);
        d1 = fmaf(q0.w, kf[3], d1);
        d0 = fmaf(q1.x, kf[4], d0);
        d1 = fmaf(q1.y, kf[5], d1);
        d0 = fmaf(q1.z, kf[6], d0);
        d1 = fmaf(q1.w, kf[7], d1);
      }
      a.sc[h * p.keys + j] = (d0 + d1) * p.scale_log2;
    }
    consumer_sync();
    // Online softmax per head (warp h): P = exp2(S - m) rounded to BF16 for P·V, l in fp32.
    if (warp < group) {
      const int h = warp;
      float mx = -INFINITY;
      for (int j = lane; j < n; j += 32) mx = fmaxf(mx, a.sc[h * p.keys + j]);
      mx = warp_max(mx);
      const float m_old = a.stats[h], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int j = lane; j < n; j += 32) {
        const float e = exp2f(a.sc[h * p.keys + j] - m_new);
        sum += e;
        a.sc[h * p.keys + j] = bf16_round(e);
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
        a.stats[h] = m_new;
        a.stats[kMaxGroup + h] = a.stats[kMaxGroup + h] * alpha + sum;
        a.stats[2 * kMaxGroup + h] = alpha;
      }
    }
    consumer_sync();
    // O = O * alpha + P · V: thread owns outputs (h, d) = tid + kConsumers * i; four keys at a
    // time into separate sums (shorter dependency chains).
    const char* vbase = a.kv + static_cast<size_t>(p.keys) * kv_pitch<HD>();
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
      const int idx = tid + kConsumers * i, h = idx / HD, d = idx % HD;
      if (h < group) {
        const float* ph = a.sc + h * p.keys;
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int j = 0;
        for (; j + 4 <= n; j += 4) {
#pragma unroll
          for (int u = 0; u < 4; ++u)
            s4[u] = fmaf(ph[j + u],
                         __bfloat162float(reinterpret_cast<const bf16*>(vbase + (j + u) * kv_pitch<HD>())[d]), s4[u]);
        }
        for (; j < n; ++j)
          s4[0] = fmaf(ph[j], __bfloat162float(reinterpret_cast<const bf16*>(vbase + j * kv_pitch<HD>())[d]), s4[0]);
        o[i] = o[i] * a.stats[2 * kMaxGroup + h] + ((s4[0] + s4[1]) + (s4[2] + s4[3]));
      }
    }
    consumer_sync();  // the stage and the scores are rewritten by the next round
  }

  if (splits == 1) {  // the only item of its head: the output itself, no merge
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
      const int idx = tid + kConsumers * i, h = idx / HD, d = idx % HD;
      if (h < group) {
        const float l_sum = a.stats[kMaxGroup + h];
        p.attn[(g * group + h) * HD + d] = __float2bfloat16_rn(l_sum > 0.0f ? o[i] / l_sum : 0.0f);
      }
    }
    signal_counter(&p.counters[kAttn]);
    return;
  }
  // Partial (unnormalised O, m, l) of this item.
  float* part = p.partial + static_cast<int64_t>(g * group) * splits * (HD + 2);
#pragma unroll
  for (int i = 0; i < OPT; ++i) {
    const int idx = tid + kConsumers * i, h = idx / HD, d = idx % HD;
    if (h < group) {
      float* ph = part + (static_cast<int64_t>(h) * splits + s) * (HD + 2);
      ph[d] = o[i];
      if (d == 0) {
        ph[HD] = a.stats[h];
        ph[HD + 1] = a.stats[kMaxGroup + h];
      }
    }
  }
  consumer_sync();
  if (tid == 0) {
    __threadfence();
    const uint32_t arrived = atomicAdd(&p.counters[kArrive + g], 1u);
    *s_last = arrived == static_cast<uint32_t>(splits) * (l + 1) - 1;
  }
  consumer_sync();
  if (!*s_last) return;
  __threadfence();
  // Merge: warp h computes split weights exp2(m_s - M) / L into a.sc[h][s]; then every output.
  if (warp < group) {
    const int h = warp;
    const float* ph = part + static_cast<int64_t>(h) * splits * (HD + 2);
    float mx = -INFINITY;
    for (int sp = lane; sp < splits; sp += 32) mx = fmaxf(mx, __ldcg(ph + sp * (HD + 2) + HD));
    mx = warp_max(mx);
    float total = 0.0f;
    for (int sp = lane; sp < splits; sp += 32) {
      const float m = __ldcg(ph + sp * (HD + 2) + HD);
      const float w = m == -INFINITY ? 0.0f : exp2f(m - mx);
      a.sc[h * kMaxSplits + sp] = w;
      total += w * __ldcg(ph + sp * (HD + 2) + HD + 1);
    }
    total = warp_sum(total);
    for (int sp = lane; sp < splits; sp += 32) {
      const float w = a.sc[h * kMaxSplits + sp];
      a.sc[h * kMaxSplits + sp] = total > 0.0f ? w / total : 0.0f;
    }
  }
  consumer_sync();
  for (int idx = tid; idx < group * HD; idx += kConsumers) {
    const int h = idx / HD, d = idx % HD;
    const float* ph = part + static_cast<int64_t>(h) * splits * (HD + 2) + d;
    float acc = 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < splits; ++sp) acc = fmaf(__ldcg(ph + sp * (HD + 2)), a.sc[h * kMaxSplits + sp], acc);
    p.attn[(g * group + h) * HD + d] = __float2bfloat16_rn(acc);
  }
  signal_counter(&p.counters[kAttn]);
}

}  // namespace
}  // namespace qvl::cuda
