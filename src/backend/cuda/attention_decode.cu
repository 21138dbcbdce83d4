// Decode attention (one new row per sequence) over the paged KV cache: split-K flash-decoding
// on tensor cores.
//
// A block owns one (sequence, kv head, split) and all G = Hq/Hkv query heads of that group, so
// each K/V row is read once for the group. The split count depends only on the number of
// sequences (graph-safe); the keys of a split follow the actual context length, read on the
// device. Keys go through shared memory in rounds of 64 (two stages, cp.async for a BF16 cache;
// an FP8 cache's bytes come into two raw stages, two rounds ahead, and are widened into one
// stage, to f16: one conversion a pair on sm_89+ where BF16 takes five, exact, with q converted
// to f16 and P rounded to f16). Each of the 4 warps takes 16 keys of a round and runs its own
// online softmax, so
// warps never wait for each other inside a split:
//   S^T[16 keys x 8 heads] = K[16 x dh] . q^T       (mma m16n8k16; heads >= G are zero rows of q)
//   O^T[dh x 8 heads]     += V^T[dh x 16 keys] . P^T (P = exp2(S - m), rounded to BF16 as
//                                                    FlashAttention and SDPA round it)
// At the end the 4 warps' (m, l, O) merge in shared memory; with one split the block writes the
// output, otherwise its partial (O, m, l), and the last split of a (sequence, kv head) to
// arrive merges the splits (an arrival counter: no second kernel). On sm_90 the splits of a
// (sequence, kv head) can instead be one thread-block cluster (kCluster): each block stores its
// partial straight into the shared memory of the blocks that write its outputs (each owns a
// slice of the group's outputs; asynchronous remote stores that count their bytes on the
// receiver's mbarrier), and each block merges its slice from its own shared memory as soon as
// its bytes are in, with the same arithmetic as the last-arriver merge (the same bits for the
// same number of splits; a cluster holds at most 16) but no fence, atomic, L2 or remote read,
// and no barrier of the whole cluster.
//
// The newest key of a sequence (context_len - 1, this step's row) never goes through the stages:
// its K and V sit in a buffer of their own, and the ldmatrix row address of that key points
// there. Fused with text_qkv_prepare (the backend defers it into this kernel for decode
// batches), the block computes them itself: q/k RMSNorm, M-RoPE and the cache store of the new
// K and V happen here (by the block that owns the newest key; attention_decode_prepare.cuh), and
// q is rotated into shared memory only (nothing else reads it). Unfused, they are read from qkv
// and the cache.
//
// Programmatic dependent launch: the keys before the newest one were written to the cache by
// kernels that finished before the previous kernel passed its own grid_dep_wait, so they are
// fetched before this kernel's grid_dep_wait; the newest key and q are read after it. A block lets
// the next kernel launch once its keys are done or when it exits, never right after its wait
// (o_proj's weight loads would queue ahead of the remaining key rounds); which of the two, the
// backend chooses per launch (CudaBackendOptions::decode_attention_trigger).
//
// While the attention runs, DRAM is mostly idle (its keys are a few MB). Its blocks may ask L2
// for the weights of the Linears after o_proj (CudaBackendOptions::decode_l2_prefetch_bytes),
// which those kernels then read from L2: bulk prefetches spread over the threads, right after the
// first key round is issued, so that the keys go first, and only where that round is the split's
// only one (a later round's keys would wait behind the prefetch).
//
// On sm_90+ a cache with pages of a multiple of 16 tokens reaches the stages through TMA
// (kTma, CudaBackendOptions::decode_attention_tma): one thread issues a box per 16 keys for K and
// one for V (a tensor map over the layer's cache in the 128-byte swizzle) where every thread
// issued 16-byte cp.async for its share: a round's 32 KB in 8 requests instead of 2048, which
// took the blocks ~1.8 us to issue (bench/RESULTS.md run 35, item 9). The same arithmetic. An
// FP8 cache's rounds come the same way into its raw stages (unswizzled boxes of 16 rows of a
// head's HD bytes), 8 requests where its cp.async took 1024 (bench/RESULTS.md run 45).
#include "backend/cuda/attention_cache.cuh"
#include "backend/cuda/attention_decode_keys.cuh"
#include "backend/cuda/attention_decode_params.cuh"
#include "backend/cuda/attention_decode_prepare.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/wgmma.cuh"

namespace qvl::cuda {
namespace {

using decode_prepare::pitch;
using decode_prepare::PrepLane;
using decode_prepare::PrepNorm;

using namespace decode_keys;  // the key rounds (attention_decode_keys.cuh)
using decode_params::DecodeParams;
using decode_params::prefetch_l2;
using decode_params::stamp;
using decode_params::stamp_unit;
constexpr int kMaxGroup = 8;  // query heads per kv head (the mma's N)
constexpr int kStages = 2;
constexpr int kMaxClusterSplits = 16;  // the largest decode cluster (configure_decode_attention)

// The stages at the start of shared memory: kStages x (K, V) x keys x pitch (cp.async rounds), or
// the TMA rounds' stages from the first 1024-aligned byte within the same bytes.
template <int HD>
constexpr int stages_bytes() {
  return kStages * stage_bytes<HD, false>();
}
template <int HD>
constexpr size_t decode_smem_bytes() {
  // the stages, then q [8][pitch], the newest key's K and V [2][pitch], then P [warps][8 heads][16
  // keys + 8]
  return static_cast<size_t>(stages_bytes<HD>()) + (kMaxGroup + 2) * pitch<HD>() +
         kWarps * kMaxGroup * 24 * sizeof(bf16);
}

// Keys per split for a context of `ctx` tokens: a multiple of 16, at least one round.
__device__ __forceinline__ int split_len(int ctx, int splits) {
  const int per = (ctx + splits - 1) / splits;
  return max(kRound, (per + 15) / 16 * 16);
}
// Splits that hold keys (split_len keys each; at least one, which reports an empty context).
__device__ __forceinline__ int active_splits(int ctx, int len, int splits) {
  return max(1, min(splits, (ctx + len - 1) / len));
}

// The cluster merge's inbox, past the kernel's other shared memory: what the blocks of the
// cluster push into this one (st.async, counted on its mbarrier): [splits][per] floats of O (the
// slice of every split's partial whose outputs this block writes, per = merge_per), then
// [splits][group][m, l] (only the heads of that slice are sent). Sized per launch (inbox_bytes).
// per is a multiple of 4, so that a split sends 4 consecutive outputs of one head and one
// receiver in one st.async (hd is a multiple of 4).
__host__ __device__ inline int merge_per(int group, int hd, int splits) {
  return ((group * hd + splits - 1) / splits + 3) / 4 * 4;
}
inline size_t inbox_bytes(int group, int hd, int splits) {
  return static_cast<size_t>(splits) * (merge_per(group, hd, splits) + 2 * group) * sizeof(float);
}
constexpr size_t kMaxInboxBytes =
    static_cast<size_t>(kMaxGroup * 128 + 4 * kDecodeMaxSplits + kDecodeMaxSplits * 2 * kMaxGroup) * sizeof(float);
template <int HD>
constexpr size_t inbox_offset() {
  return (decode_smem_bytes<HD>() + 15) / 16 * 16;
}

// The block's merge of its warps' O: [warp][head][red_pitch] floats at the start of the (then
// idle) stages. HD + 4: the 4 lanes of an mma fragment row hold heads 2t (t = 0..3), and rows
// 2 * (HD + 4) floats apart start 8 banks apart (at a pitch of HD they would share one: 4-way
// conflicts on every store); float4 reads stay aligned. The cluster merge's split weights follow
// it, so that no block writes them over values its other warps may still be reading to push.
template <int HD>
constexpr int red_pitch() {
  return HD + 4;
}
template <int HD>
constexpr int wsplit_offset() {  // floats
  return kWarps * kMaxGroup * red_pitch<HD>();
}

// The cluster's merge, run by every block of it: it waits until every active split's share of
// its outputs has landed in its inbox (bytes counted on its mbarrier), then warp h takes
// head h's (m, l) of every split (one per lane) and leaves each split's weight exp2(m_s - M) / L,
// as the last-arriver merge does; then block `rank` writes output elements [rank * per,
// (rank + 1) * per) of the group's heads from its inbox (the same arithmetic as the
// last-arriver merge: the same bits for the same number of splits). Nothing reads another
// block's shared memory and no block waits for the whole cluster.
template <int HD>
__device__ __forceinline__ void cluster_merge(const DecodeParams& p, char* smem, const float* inbox, uint64_t* bar,
                                              int row, int kvh, int group, int rank, int active, int warp, int lane) {
  static_assert((wsplit_offset<HD>() + kMaxGroup * kDecodeMaxSplits) * sizeof(float) <= stages_bytes<HD>(),
                "the warps' O and the split weights fit in the stages");
  const int per = merge_per(group, HD, p.splits);
  const int n = group * HD, i0 = rank * per, i1 = min(n, i0 + per);
  if (i0 >= i1) return;  // no outputs here, nothing sent here
  // What the active splits send here: their slice of O and (m, l) of the slice's heads.
  const int heads = (i1 - 1) / HD - i0 / HD + 1;
  if (threadIdx.x == 0) mbar_arrive_expect_tx(bar, static_cast<uint32_t>(active * ((i1 - i0) + 2 * heads) * 4));
  mbar_wait_cluster(bar);
  stamp(p, 9);
  const float* in_ml = inbox + p.splits * per;
  // [head][kDecodeMaxSplits], over the idle stages, past the warps' O
  float* wsplit = reinterpret_cast<float*>(smem) + wsplit_offset<HD>();
  // Only the heads of this block's outputs have their (m, l) here.
  for (int h = i0 / HD + warp; h <= (i1 - 1) / HD; h += kWarps) {
    const float m = lane < active ? in_ml[(lane * group + h) * 2] : -INFINITY;
    const float l = lane < active ? in_ml[(lane * group + h) * 2 + 1] : 0.0f;
    const float mm = warp_max(m);
    const float w = m == -INFINITY ? 0.0f : exp2f(m - mm);
    const float total = warp_sum(l * w);
    wsplit[h * kDecodeMaxSplits + lane] = total > 0.0f ? w / total : 0.0f;
  }
  __syncthreads();
  stamp(p, 10);
  for (int i = i0 + static_cast<int>(threadIdx.x); i < i1; i += kThreads) {
    const int h = i / HD, d = i % HD;
    float acc = 0.0f;
    // Unrolled over the largest cluster: the inbox loads are issued together, the sum keeps its
    // order.
#pragma unroll
    for (int sp = 0; sp < kMaxClusterSplits; ++sp)
      if (sp < active) acc += inbox[sp * per + (i - i0)] * wsplit[h * kDecodeMaxSplits + sp];
    p.out[static_cast<int64_t>(row) * p.hq * HD + (kvh * group + h) * HD + d] = __float2bfloat16_rn(acc);
  }
  stamp(p, 11);
}

// kCluster: the splits of one (sequence, kv head) are one cluster of p.splits consecutive
// blocks along x (rank = split), merged through distributed shared memory (see the header).
// Each block arrives at a cluster barrier on entry and waits on it just before its first remote
// store: every block of the cluster has then started and initialised its inbox's mbarrier.
// kTma: the key rounds through TMA (see the header and tma_issue).
template <int HD, bool kFp8, bool kCluster, bool kTma>
__global__ void __launch_bounds__(kThreads) decode_kernel(const __grid_constant__ DecodeParams p) {
  static_assert(1023 + kStages * tma_stage_bytes<HD>() <= stages_bytes<HD>(),
                "TMA stages fit where the padded stages lie, from the first 1024-aligned byte");
  constexpr int KS = HD / 16;  // k-steps of Q.K^T
  constexpr int MT = HD / 16;  // 16-dim tiles of O^T
  // The BF16 stages hold TMA boxes (a BF16 cache through TMA); an FP8 cache's boxes land in its
  // raw stages and are widened into the padded layout.
  constexpr bool kBoxes = kTma && !kFp8;
  constexpr int kStageBytes = stage_bytes<HD, kBoxes>();
  static_assert(stage_bytes<HD, false>() + 127 + 2 * raw_stage_bytes<HD>() <= stages_bytes<HD>(),
                "kFp8: one BF16 stage and two 128-aligned raw stages fit where the stages lie");
  extern __shared__ __align__(16) char smem[];
  // [stage][2 * kRound rows][pitch], or TMA stages from the first 1024-aligned byte; kFp8: one
  // BF16 stage, then two raw stages from the next 128-aligned byte (load_round, tma_issue).
  char* kv = kBoxes ? smem + ((1024 - (smem_u32(smem) & 1023)) & 1023) : smem;
  char* const raw0 =
      smem + stage_bytes<HD, false>() + ((128 - (smem_u32(smem + stage_bytes<HD, false>()) & 127)) & 127);
  auto raw_stage = [raw0](int s) { return raw0 + s * raw_stage_bytes<HD>(); };
  char* qs = smem + stages_bytes<HD>();                        // [8 heads][pitch]
  char* nbuf = qs + kMaxGroup * pitch<HD>();                   // [k, v][pitch]
  bf16* ps = reinterpret_cast<bf16*>(nbuf + 2 * pitch<HD>());  // [warp][8 heads][24]
  __shared__ bool s_last;
  __shared__ uint64_t s_inbox_bar;      // kCluster: counts the bytes the peers push into the inbox
  __shared__ uint64_t s_keys[kStages];  // kTma: a stage's boxes landed (parity: its use count)
  // The warps' running max and sum per head once their keys are done, over each warp's own P
  // buffer (idle by then): shared memory stays within three blocks per multiprocessor with the
  // cluster merge's inbox.
  float* sml = reinterpret_cast<float*>(ps);
  constexpr int kPwFloats = kMaxGroup * 24 / 2;
  auto s_m = [sml](int w, int h) -> float& { return sml[w * kPwFloats + h]; };
  auto s_l = [sml](int w, int h) -> float& { return sml[w * kPwFloats + kMaxGroup + h]; };
  // Head h's running max over the warps and its sum rescaled to that max.
  auto head_ml = [&](int h, float& mm, float& l) {
    mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, s_m(w, h));
    l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (s_m(w, h) != -INFINITY) l += s_l(w, h) * exp2f(s_m(w, h) - mm);
  };

  if constexpr (kCluster) {
    // The inbox barrier is initialised before this block's first cluster arrival; a block waits
    // on that barrier phase before its first push, so every peer's barrier is ready by then.
    if (threadIdx.x == 0) mbar_init_cluster(&s_inbox_bar);
    cluster_arrive_relaxed();
  }
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(&s_keys[s], 1);
      mbar_init_fence();
    }
    __syncthreads();
  }
  if (p.debug_exit == 8) {  // the stages that are never loaded hold zeros, not stale bits (NaN)
    for (int i = threadIdx.x; i < stages_bytes<HD>() / 16; i += kThreads)
      reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
    QVL_SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));  // before round 0's boxes
    __syncthreads();
  }
  stamp(p, 0);
  stamp_unit(p, kCluster ? static_cast<int>(blockIdx.x) / p.splits : static_cast<int>(blockIdx.x));
  if (p.debug_exit == 4) {
    grid_dep_wait();
    grid_dep_launch();
    return;
  }
  const int unit = kCluster ? static_cast<int>(blockIdx.x) / p.splits : static_cast<int>(blockIdx.x);
  const int seq = unit / p.hkv, kvh = unit % p.hkv;
  const int split = kCluster ? static_cast<int>(blockIdx.x) % p.splits : static_cast<int>(blockIdx.y);
  const int group = p.hq / p.hkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  // The step table's entry of this (sequence, split); read: its pages go to shared memory over
  // the P buffer (idle until the first key round is issued).
  int32_t* desc =
      p.step_mode != 0 ? p.step_keys + (static_cast<int64_t>(seq) * p.splits + split) * kDecodeStepKeyInts : nullptr;
  int32_t* s_desc = reinterpret_cast<int32_t*>(ps);
  if (p.step_mode == 2 && threadIdx.x < kDecodeStepKeyInts / 4)
    reinterpret_cast<int4*>(s_desc)[threadIdx.x] = __ldcg(reinterpret_cast<const int4*>(desc) + threadIdx.x);
  const int ctx = p.step_mode == 2 ? __ldcg(desc) : p.context_len[seq];
  const int len = split_len(ctx, p.splits);
  const int k_begin = split * len, k_end = min(ctx, k_begin + len);
  const int32_t* pt = p.page_table + static_cast<int64_t>(seq) * p.max_pages;
  if (p.step_mode == 1 && kvh == 0) {  // this step's entry, for the later layers
    if (threadIdx.x == 0) desc[0] = ctx;
    if (k_begin < k_end) {
      int off;
      const int pi0 = page_index(p.cache, k_begin, off);
      const int pi1 = page_index(p.cache, k_begin + min(kRound, k_end - k_begin) - 1, off);
      for (int q = threadIdx.x; q <= pi1 - pi0; q += kThreads) desc[1 + q] = pt[pi0 + q];
    }
  }
  if (p.debug_exit == 5) {
    grid_dep_wait();
    grid_dep_launch();
    return;
  }
  // An empty split returns (the merge never reads it), except split 0, which always reports
  // (an empty context yields m = -inf, l = 0 and a zero output). In a cluster it still takes
  // its slice of the merge.
  if (k_begin >= k_end && split != 0) {
    grid_dep_wait();
    grid_dep_launch();
    if (p.debug_exit != 0) return;
    if constexpr (kCluster) {
      cluster_wait();
      cluster_merge<HD>(p, smem, reinterpret_cast<const float*>(smem + inbox_offset<HD>()), &s_inbox_bar,
                        p.query_start[seq], kvh, group, split, active_splits(ctx, len, p.splits), warp, lane);
    }
    return;
  }
  const int nrounds = (k_end - k_begin + kRound - 1) / kRound;

  // Round 0 without the newest key (ctx - 1), before the wait; then q and the newest key.
  const int newest = ctx - 1;
  const bool own_newest = newest >= k_begin && newest < k_end;
  const int r0 = min(kRound, k_end - k_begin);
  // With the prepare fused, its inputs are gathered by the last warp while the others issue the
  // first keys: both chains are dependent loads, and a block that becomes resident late (as the
  // previous kernel's blocks leave) runs them after the wait, on the merge's critical path.
  const int issuers = p.fused ? kThreads - 32 : kThreads;
  // kFp8: round 1's bytes go in flight before the wait too (into the second raw stage); the loop
  // issues round r + 2 once round r is widened.
  const bool second = kFp8 && nrounds > 1 && p.debug_exit != 8 && p.debug_exit != 7;
  // kTma: thread 0 looks up the pages of the next round the loop issues (round 1, kFp8: 2) a round
  // ahead (tma_lookup). The cp.async rounds keep their lookups: each thread's share of them
  // measured slower a round ahead (bench/RESULTS.md run 45).
  constexpr int kAhead = kFp8 ? 2 : 1;
  RoundPages ahead;
  const bool look_ahead = kTma && nrounds > kAhead && p.debug_exit != 8;
  auto look_up = [&](int k) {  // the round from key k (< k_end)
    if (threadIdx.x == 0) tma_lookup(p, pt, k, min(kRound, k_end - k), ahead);
  };
  if constexpr (kTma) {
    // Thread 0 issues the round; the step table's pages were loaded by warp 0's first lanes.
    if (warp == 0) {
      __syncwarp();
      if (r0 > 0 && p.debug_exit != 7 && lane == 0) {
        const int32_t* pages = p.step_mode == 2 ? s_desc + 1 : nullptr;
        if constexpr (kFp8) {
          tma_round<HD, true>(p, raw_stage(0), pt, kvh, k_begin, r0, &s_keys[0], pages);
          const int k1 = k_begin + kRound;
          if (second) tma_round<HD, true>(p, raw_stage(1), pt, kvh, k1, min(kRound, k_end - k1), &s_keys[1]);
        } else {
          tma_round<HD, false>(p, kv, pt, kvh, k_begin, r0, &s_keys[0], pages);
        }
      }
      __syncwarp();
      // The prefetch after the keys, by the warp that issued them (see below).
      if (nrounds == 1) prefetch_l2(p, lane, 32);
    }
  } else if (r0 > 0 && p.debug_exit != 7 && static_cast<int>(threadIdx.x) < issuers) {
    const int32_t* pages = nullptr;
    if (p.step_mode == 2) {  // the pages are in shared memory once the issuers meet
      asm volatile("bar.sync 1, %0;" ::"r"(issuers) : "memory");
      pages = s_desc + 1;
    }
    if constexpr (kFp8) {
      if (p.fused)
        load_round<HD, kThreads - 32, true>(p, raw_stage(0), pt, kvh, k_begin, r0, newest, pages);
      else
        load_round<HD, kThreads, true>(p, raw_stage(0), pt, kvh, k_begin, r0, newest, pages);
      cp_async_commit();
    } else if (p.fused) {
      load_round<HD, kThreads - 32, false>(p, kv, pt, kvh, k_begin, r0, newest, pages);
    } else {
      load_round<HD, kThreads, false>(p, kv, pt, kvh, k_begin, r0, newest, pages);
    }
  }
  if (look_ahead) look_up(k_begin + kAhead * kRound);
  if constexpr (kFp8) {
    // Round 0 is widened before the wait (as its BF16 stage would have been filled), by the
    // threads that copied it (cp.async) or the same threads once its boxes landed (TMA).
    if constexpr (kTma) {
      if (r0 > 0 && p.debug_exit != 7 && static_cast<int>(threadIdx.x) < issuers) mbar_wait(&s_keys[0], 0);
    } else {
      if (second) {
        const int k1 = k_begin + kRound;
        load_round<HD, kThreads, true>(p, raw_stage(1), pt, kvh, k1, min(kRound, k_end - k1), newest);
      }
      cp_async_commit();
      cp_async_wait<1>();  // round 0's group
    }
    if (static_cast<int>(threadIdx.x) < issuers && p.debug_exit != 7) {
      if (p.fused)
        widen_fp8<HD, kThreads - 32>(raw_stage(0), kv, k_begin, r0, newest);
      else
        widen_fp8<HD, kThreads>(raw_stage(0), kv, k_begin, r0, newest);
    }
  }
  if constexpr (!kTma) {
    if constexpr (!kFp8) zero_tail<HD>(kv, max(0, r0));       // kFp8: widen_fp8 zeroes the tail
    if (nrounds == 1) prefetch_l2(p, threadIdx.x, kThreads);  // a later round's keys would queue behind it
  }
  stamp(p, 1);
  // kTma: a block never exits with its boxes in flight.
  auto keys_landed = [&] {
    if constexpr (kTma) {
      if (r0 > 0 && p.debug_exit != 7) mbar_wait(&s_keys[0], 0);
      if (second) mbar_wait(&s_keys[1], 0);
    } else {
      cp_async_wait<0>();
    }
  };
  if (p.debug_exit == 6) {
    grid_dep_wait();
    grid_dep_launch();
    keys_landed();
    return;
  }
  const int row = p.query_start[seq];
  __shared__ PrepLane<HD> s_prep[32];
  PrepLane<HD> prep;
  PrepNorm<HD> norms;
  if (p.fused) {
    decode_prepare::prepare_norms<HD>(p, norms);
    if (warp == kWarps - 1) {
      int32_t* entry = p.step_mode != 0 ? p.step_prep + static_cast<int64_t>(seq) * (HD + 2) : nullptr;
      if (p.step_mode == 2) {
        prep.slot = __ldcg(entry);
#pragma unroll
        for (int i = 0; i < PrepLane<HD>::kPairs; ++i) {
          const int j = min(lane + 32 * i, HD / 2 - 1);
          prep.cs[i] = __int_as_float(__ldcg(entry + 1 + j));
          prep.sn[i] = __int_as_float(__ldcg(entry + 1 + HD / 2 + j));
        }
      } else {
        decode_prepare::prepare_inputs<HD>(p, row, prep);
        if (p.step_mode == 1 && kvh == 0 && split == 0) {  // this step's entry, for the later layers
          if (lane == 0) entry[0] = prep.slot;
#pragma unroll
          for (int i = 0; i < PrepLane<HD>::kPairs; ++i) {
            const int j = lane + 32 * i;
            if (j < HD / 2) {
              entry[1 + j] = __float_as_int(prep.cs[i]);
              entry[1 + HD / 2 + j] = __float_as_int(prep.sn[i]);
            }
          }
        }
      }
      s_prep[lane] = prep;
    }
  }
  grid_dep_wait();
  if (p.trigger == 0) grid_dep_launch();
  stamp(p, 2);
  if (p.debug_exit == 1 || p.debug_exit == 7) {
    keys_landed();
    return;
  }
  if (p.fused) {
    __syncthreads();  // s_prep
    prep = s_prep[lane];
  }
  {
    const int64_t ld = static_cast<int64_t>(p.hq + 2 * p.hkv) * HD;
    const bf16* qkv_row = p.qkv + row * ld;
    if (p.fused) {
      // Tasks: q heads 0..group-1 (into qs), then the newest key's k and v (cache + nbuf).
      for (int task = warp; task < group + (own_newest ? 2 : 0); task += kWarps)
        decode_prepare::prepare_head<HD>(p, qkv_row, prep, norms, kvh, group, task, qs, nbuf);
    } else {
      const bf16* q = qkv_row + static_cast<int64_t>(kvh) * group * HD;
      for (int c = threadIdx.x; c < kMaxGroup * (HD / 8); c += kThreads) {
        const int h = c / (HD / 8), chunk = c % (HD / 8);
        const uint4 v = h < group ? *reinterpret_cast<const uint4*>(q + h * HD + chunk * 8) : make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(qs + h * pitch<HD>() + chunk * 16) = v;
      }
      if (own_newest) {
        for (int c = threadIdx.x; c < 2 * (HD / 8); c += kThreads) {
          const bool v = c >= HD / 8;
          const int chunk = c % (HD / 8);
          const char* src = cache_row(p.cache, pt[newest / p.cache.page_size], newest % p.cache.page_size, kvh, HD, v);
          *reinterpret_cast<uint4*>(nbuf + (v ? pitch<HD>() : 0) + chunk * 16) = load_kv_chunk<kFp8>(src, chunk);
        }
      }
    }
    if (p.fused) {  // q heads past the group are zero rows of the mma's B operand
      for (int c = threadIdx.x; c < (kMaxGroup - group) * (HD / 8); c += kThreads)
        *reinterpret_cast<uint4*>(qs + (group + c / (HD / 8)) * pitch<HD>() + (c % (HD / 8)) * 16) =
            make_uint4(0, 0, 0, 0);
    }
  }
  cp_async_commit();
  stamp(p, 3);

  float o[MT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[m][e] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // heads 2t, 2t+1
  uint32_t qf[KS][2];
  bf16* pw = ps + warp * kMaxGroup * 24;

  for (int r = 0; r < nrounds; ++r) {
    const int k0 = k_begin + r * kRound;
    char* const kst = kFp8 ? kv : kv + (r % kStages) * kStageBytes;
    const bool load = p.debug_exit != 8 || r == 0;  // debug_exit 8: round 0 only
    if (r + 1 < nrounds && p.debug_exit != 8) {
      const int k1 = k0 + kRound;
      char* next = kv + ((r + 1) % kStages) * kStageBytes;
      if constexpr (kBoxes) {
        if (threadIdx.x == 0) {
          // The block's reads and writes of this stage (two rounds ago) come before the boxes.
          QVL_SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));
          tma_issue<HD, false>(p, next, kvh, min(kRound, k_end - k1), ahead, &s_keys[(r + 1) % kStages]);
        }
        // The round after it: its pages' loads land while this round computes.
        if (r + 2 < nrounds) look_up(k1 + kRound);
      } else if constexpr (!kFp8) {  // kFp8: round r + 2 is issued once round r is widened (below)
        load_round<HD, kThreads, false>(p, next, pt, kvh, k1, min(kRound, k_end - k1), newest);
        zero_tail<HD>(next, min(kRound, k_end - k1));
      }
    }
    if constexpr (kFp8) {
      // Round r (r >= 1): through TMA, its boxes landed; by cp.async, it is every group but the
      // newest (round r + 1's, committed last round), and each thread widens its own copies. The
      // BF16 stage is free since the last round's barrier.
      if (r > 0) {
        if constexpr (kTma) {
          if (load) mbar_wait(&s_keys[r % 2], (r / 2) & 1);
        } else {
          cp_async_wait<1>();
        }
        widen_fp8<HD, kThreads>(raw_stage(r % 2), kst, k0, min(kRound, k_end - k0), newest);
      }
    } else if constexpr (kTma) {
      if (load) mbar_wait(&s_keys[r % kStages], (r / kStages) & 1);
      if (k_end - k0 < kRound) tma_zero_tail<HD>(kst, k_end - k0);
    } else {
      cp_async_commit();
      cp_async_wait<1>();
    }
    __syncthreads();
    if constexpr (kFp8) {
      // Round r + 2 into the raw stage just widened (by cp.async, each thread rewrites only the
      // columns it widened, and round 0's copiers passed a barrier since; its group is committed
      // even when empty, so that round r + 1's is always the newest but one).
      const int k2 = k0 + 2 * kRound;
      if (k2 < k_end && p.debug_exit != 8) {
        if constexpr (kTma) {
          if (threadIdx.x == 0) {
            QVL_SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));  // after the widening's reads
            tma_issue<HD, true>(p, raw_stage(r % 2), kvh, min(kRound, k_end - k2), ahead, &s_keys[r % 2]);
          }
          if (k2 + kRound < k_end) look_up(k2 + kRound);
        } else {
          load_round<HD, kThreads, true>(p, raw_stage(r % 2), pt, kvh, k2, min(kRound, k_end - k2), newest);
        }
      }
      if constexpr (!kTma) cp_async_commit();
    }
    if (r == 0) stamp(p, 4);
    if (r == 0) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        ldmatrix_x2(qf[ks], qs + (lane & 7) * pitch<HD>() + ks * 32 + ((lane >> 3) & 1) * 16);
        if constexpr (kFp8) {  // an FP8 cache's keys are read in f16: q too
          qf[ks][0] = bf16x2_to_f16x2(qf[ks][0]);
          qf[ks][1] = bf16x2_to_f16x2(qf[ks][1]);
        }
      }
    }
    const int kw = warp * 16;  // this warp's keys within the round
    const int valid = min(16, k_end - k0 - kw);
    if (valid > 0) {
      // S^T = K . q^T: rows = keys kw + (g, g + 8), cols = heads (2t, 2t + 1).
      // Two accumulators (even and odd k-steps), added at the end: two chains of KS / 2 dependent
      // mmas in place of one of KS.
      float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const int mi = lane >> 3;
      // This lane's ldmatrix rows: key kk of K (A of S^T), key kv_ of V (A of O^T, transposed).
      const int kk = kw + (lane & 7) + (mi & 1) * 8, kv_ = kw + (lane & 7) + (mi >> 1) * 8;
      const RowAddr krow = k0 + kk == newest ? RowAddr::padded(nbuf) : stage_row<HD, kBoxes>(kst, kk, false);
      const RowAddr vrow =
          k0 + kv_ == newest ? RowAddr::padded(nbuf + pitch<HD>()) : stage_row<HD, kBoxes>(kst, kv_, true);
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, krow.at(2 * ks + (mi >> 1)));
        mma_m16n8k16<kFp8>(ks % 2 ? s1 : s, a, qf[ks][0], qf[ks][1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] += s1[e];
      // Online softmax per head over this warp's keys (log2 domain).
      float mx[2];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = g + (e >> 1) * 8;
        s[e] = key < valid ? s[e] * p.scale_log2 : -INFINITY;
      }
      mx[0] = fmaxf(s[0], s[2]);
      mx[1] = fmaxf(s[1], s[3]);
      float alpha[2], base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 4));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 8));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 16));
        const float m_new = fmaxf(m_run[h], mx[h]);  // finite: this warp has >= 1 valid key
        alpha[h] = exp2f(m_run[h] - m_new);
        base[h] = m_new;
        m_run[h] = m_new;
      }
      float pv[4], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pv[e] = exp2f(s[e] - base[e & 1]);
        sum[e & 1] += pv[e];
      }
      // l_run is this lane's share of the sum (its keys g, g + 8); the lanes' shares are added
      // once, after the last round.
#pragma unroll
      for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + sum[h];
      // P^T to shared memory as [head][key] (B operand of O^T += V^T . P^T).
      // (kFp8: in f16, as V.)
      auto put = [&](int i, float v) {
        reinterpret_cast<uint16_t*>(pw)[i] =
            kFp8 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
      };
      put((2 * t) * 24 + g, pv[0]);
      put((2 * t + 1) * 24 + g, pv[1]);
      put((2 * t) * 24 + g + 8, pv[2]);
      put((2 * t + 1) * 24 + g + 8, pv[3]);
      __syncwarp();
      uint32_t pb[2];
      ldmatrix_x2(pb, pw + (lane & 7) * 24 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        o[m][0] *= alpha[0];
        o[m][1] *= alpha[1];
        o[m][2] *= alpha[0];
        o[m][3] *= alpha[1];
        uint32_t a[4];
        // A = V^T (dims 16m.., keys kw..): stored [key][dim], loaded transposed.
        ldmatrix_x4_trans(a, vrow.at(2 * m + (mi & 1)));
        mma_m16n8k16<kFp8>(o[m], a, pb[0], pb[1]);
      }
      __syncwarp();  // pw is rewritten next round
    }
    __syncthreads();  // this stage is refilled by the next round's prefetch
  }
  cp_async_wait<0>();
  stamp(p, 5);
  if (p.trigger == 1) grid_dep_launch();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 4);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 8);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 16);
  }
  // Merge the warps: O^T fragment o[m] = (dims 16m + g, 16m + g + 8) x (heads 2t, 2t + 1).
  if (g == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s_m(warp, 2 * t + h) = m_run[h];
      s_l(warp, 2 * t + h) = l_run[h];
    }
  }
  __syncthreads();
  stamp(p, 8);
  constexpr int RP = red_pitch<HD>();
  float* red = reinterpret_cast<float*>(smem);  // [warp][head][RP], over the (now idle) stages
  float f[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, s_m(w, 2 * t + h));
    f[h] = m_run[h] == -INFINITY ? 0.0f : exp2f(m_run[h] - mm);
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = 16 * m + g + (e >> 1) * 8, h = 2 * t + (e & 1);
      red[(warp * kMaxGroup + h) * RP + d] = o[m][e] * f[e & 1];
    }
  }
  __syncthreads();
  float* inbox = reinterpret_cast<float*>(smem + inbox_offset<HD>());
  const int per = kCluster ? merge_per(group, HD, p.splits) : 0;
  if constexpr (kCluster) {
    cluster_wait();  // every block of the cluster has started
    if (p.splits > 1) {
      // 4 consecutive outputs of one head per thread (their sums over the warps, unnormalised),
      // to the block that writes them in one st.async (per is a multiple of 4).
      for (int i = 4 * static_cast<int>(threadIdx.x); i < group * HD; i += 4 * kThreads) {
        const int h = i / HD, d = i % HD;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float4 r = *reinterpret_cast<const float4*>(&red[(w * kMaxGroup + h) * RP + d]);
          acc.x += r.x;
          acc.y += r.y;
          acc.z += r.z;
          acc.w += r.w;
        }
        const int dst = i / per;
        st_async_f32x4(cluster_peer_smem(smem_u32(inbox + split * per + (i - dst * per)), dst), acc,
                       cluster_peer_smem(smem_u32(&s_inbox_bar), dst));
      }
    }
  }
  // One split writes the output; the L2 merge's splits write their partials (a cluster's splits
  // pushed theirs above).
  if (!kCluster || p.splits == 1) {
    for (int i = threadIdx.x; i < group * HD; i += kThreads) {
      const int h = i / HD, d = i % HD;
      float mm, l, acc = 0.0f;
      head_ml(h, mm, l);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) acc += red[(w * kMaxGroup + h) * RP + d];
      const int head = kvh * group + h;
      if (p.splits == 1) {
        p.out[static_cast<int64_t>(row) * p.hq * HD + head * HD + d] = __float2bfloat16_rn(l > 0.0f ? acc / l : 0.0f);
      } else {
        float* part = p.partial + ((static_cast<int64_t>(seq) * p.hq + head) * p.splits + split) * (HD + 2);
        part[d] = acc;
        if (d == 0) {
          part[HD] = mm;
          part[HD + 1] = l;
        }
      }
    }
  }
  if constexpr (kCluster) {
    // (m, l) of head h to every block that writes some of head h's outputs, one thread each.
    for (int i = threadIdx.x; i < group * p.splits; i += kThreads) {
      const int h = i / p.splits, r = i % p.splits;
      if (h * HD >= (r + 1) * per || (h + 1) * HD <= r * per) continue;
      float mm, l;
      head_ml(h, mm, l);
      const uint32_t ml = cluster_peer_smem(smem_u32(inbox + p.splits * per + (split * group + h) * 2), r);
      const uint32_t bar = cluster_peer_smem(smem_u32(&s_inbox_bar), r);
      st_async_f32(ml, mm, bar);
      st_async_f32(ml + 4, l, bar);
    }
  }
  stamp(p, 6);
  if (p.trigger == 2) grid_dep_launch();
  if (p.splits == 1) return;
  if constexpr (kCluster) {
    cluster_merge<HD>(p, smem, inbox, &s_inbox_bar, row, kvh, group, split, active_splits(ctx, len, p.splits), warp,
                      lane);
    stamp(p, 7);
    return;
  }

  // The last of this (sequence, kv head)'s active splits to arrive merges them (threadfence
  // reduction): partials are made visible device-wide before the arrival is counted, and the
  // merger reads them from L2 (ld.cg), never from a stale L1 line.
  __threadfence();
  __syncthreads();
  const int active = active_splits(ctx, len, p.splits);
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(&p.counters[seq * p.hkv + kvh], 1u);
    s_last = arrived == static_cast<uint32_t>(active - 1);
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Warp h reads head h's (m, l) of every split (one per lane) and leaves each split's weight
  // exp2(m_s - M) / L in shared memory; then every output element sums its splits.
  float* wsplit = reinterpret_cast<float*>(smem);  // [head][kDecodeMaxSplits]
  for (int h = warp; h < group; h += kWarps) {
    const int head = kvh * group + h;
    const float* base = p.partial + (static_cast<int64_t>(seq) * p.hq + head) * p.splits * (HD + 2);
    const float m = lane < active ? __ldcg(base + lane * (HD + 2) + HD) : -INFINITY;
    const float l = lane < active ? __ldcg(base + lane * (HD + 2) + HD + 1) : 0.0f;
    const float mm = warp_max(m);
    const float w = m == -INFINITY ? 0.0f : exp2f(m - mm);
    const float total = warp_sum(l * w);
    wsplit[h * kDecodeMaxSplits + lane] = total > 0.0f ? w / total : 0.0f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < group * HD; i += kThreads) {
    const int h = i / HD, d = i % HD;
    const int head = kvh * group + h;
    const float* base = p.partial + (static_cast<int64_t>(seq) * p.hq + head) * p.splits * (HD + 2) + d;
    float acc = 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < active; ++sp) acc += __ldcg(base + sp * (HD + 2)) * wsplit[h * kDecodeMaxSplits + sp];
    p.out[static_cast<int64_t>(row) * p.hq * HD + head * HD + d] = __float2bfloat16_rn(acc);
  }
  if (threadIdx.x == 0) p.counters[seq * p.hkv + kvh] = 0;  // ready for the next step (and graph replay)
}

// The decode kernel for a head dim (64 or 128), cache dtype and key copies.
template <bool kCluster>
auto decode_kernel_for(int hd, bool fp8, bool tma) {
  if (hd == 64)
    return fp8 ? (tma ? decode_kernel<64, true, kCluster, true> : decode_kernel<64, true, kCluster, false>)
               : (tma ? decode_kernel<64, false, kCluster, true> : decode_kernel<64, false, kCluster, false>);
  return fp8 ? (tma ? decode_kernel<128, true, kCluster, true> : decode_kernel<128, true, kCluster, false>)
             : (tma ? decode_kernel<128, false, kCluster, true> : decode_kernel<128, false, kCluster, false>);
}

template <int HD, bool kFp8, bool kTma>
void configure_one() {
  QVL_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<HD, kFp8, false, kTma>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(decode_smem_bytes<HD>())));
  QVL_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<HD, kFp8, true, kTma>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(inbox_offset<HD>() + kMaxInboxBytes)));
}

// The layer's cache as TMA boxes of 16 rows of one kv head (DecodeParams::kv_map), or false
// where the cache does not allow them (pages not a multiple of 16 tokens, alignment) or the
// driver cannot encode them: the cp.async rounds then take the keys.
bool encode_kv_map(CUtensorMap* map, const KvCacheView& cache, const CacheGeometry& geo, int hd) {
  if ((cache.dtype != DType::kBF16 && cache.dtype != DType::kF8E4M3) || cache.head_dim != hd || hd % 64 != 0 ||
      cache.page_size % 16 != 0 || reinterpret_cast<uintptr_t>(geo.base + geo.layer_offset) % 16 != 0 ||
      geo.token_bytes % 16 != 0 || geo.page_bytes % 16 != 0 || cache.num_pages <= 0)
    return false;
  if (cache.dtype == DType::kF8E4M3) {
    // Unswizzled boxes of a whole head's row (HD bytes, seen as HD / 2 BF16 pairs) x 16 rows:
    // innermost first, the row's bytes, K rows then V rows of a page, kv heads, pages
    // (tma_issue).
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(hd / 2), static_cast<cuuint64_t>(2 * cache.page_size),
                                static_cast<cuuint64_t>(cache.num_kv_heads), static_cast<cuuint64_t>(cache.num_pages)};
    const cuuint64_t strides[3] = {static_cast<cuuint64_t>(geo.token_bytes), static_cast<cuuint64_t>(hd),
                                   static_cast<cuuint64_t>(geo.page_bytes)};
    const cuuint32_t box[4] = {static_cast<cuuint32_t>(hd / 2), 16, 1, 1};
    return wgmma::encode_bf16_tiles(map, 4, geo.base + geo.layer_offset, dims, strides, box, false,
                                    "decode attention (FP8 cache)");
  }
  // Innermost first: 64 values, K rows then V rows of a page (V's row j is row page_size + j at
  // the token stride), the head's halves, kv heads, pages.
  const cuuint64_t dims[5] = {64, static_cast<cuuint64_t>(2 * cache.page_size), static_cast<cuuint64_t>(hd / 64),
                              static_cast<cuuint64_t>(cache.num_kv_heads), static_cast<cuuint64_t>(cache.num_pages)};
  const cuuint64_t strides[4] = {static_cast<cuuint64_t>(geo.token_bytes), 128,
                                 static_cast<cuuint64_t>(hd) * sizeof(bf16), static_cast<cuuint64_t>(geo.page_bytes)};
  const cuuint32_t box[5] = {64, 16, static_cast<cuuint32_t>(hd / 64), 1, 1};
  return wgmma::encode_sw128(map, 5, geo.base + geo.layer_offset, dims, strides, box, "decode attention");
}

}  // namespace

void launch_text_attention_generic(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale);

bool decode_attention_fusable(const TextAttentionShape& shape) {
  return (shape.head_dim == 64 || shape.head_dim == 128) && shape.num_q_heads % shape.num_kv_heads == 0 &&
         shape.num_q_heads / shape.num_kv_heads <= kMaxGroup;
}

namespace {
// Whether one cluster of `size` decode blocks (head dim 128, the largest shared memory) fits the
// device at once.
bool decode_cluster_fits(int size) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(size));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = inbox_offset<128>() + kMaxInboxBytes;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(size);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  const bool fits =
      cudaOccupancyMaxActiveClusters(&n, decode_kernel<128, false, true, false>, &cfg) == cudaSuccess && n > 0;
  cudaGetLastError();  // a refused size is not an error here
  return fits;
}
}  // namespace

int configure_decode_attention(bool clusters, bool non_portable) {
  static_assert(kDecodeMaxSplits <= 32, "the split merge reads one split per lane");
  configure_one<64, false, false>();
  configure_one<128, false, false>();
  configure_one<64, true, false>();
  configure_one<128, true, false>();
  configure_one<64, false, true>();
  configure_one<128, false, true>();
  configure_one<64, true, true>();
  configure_one<128, true, true>();
  if (!clusters) return 0;
  // Clusters of up to kMaxClusterSplits splits where the device allows sizes past the portable
  // 8 and can hold one, else 8 where it can hold that, else none (the merge through L2).
  bool all = false;
  if (non_portable && cudaFuncSetAttribute(decode_kernel<128, false, true, false>,
                                           cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    all = decode_cluster_fits(kMaxClusterSplits);
    for (auto* k : {decode_kernel<64, false, true, false>, decode_kernel<64, true, true, false>,
                    decode_kernel<128, true, true, false>, decode_kernel<64, false, true, true>,
                    decode_kernel<128, false, true, true>, decode_kernel<64, true, true, true>,
                    decode_kernel<128, true, true, true>})
      all = all && cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  }
  cudaGetLastError();  // a refused non-portable size is not an error here
  return all ? kMaxClusterSplits : decode_cluster_fits(8) ? 8 : 0;
}

int launch_text_decode_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                 const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale,
                                 float* partial, size_t partial_bytes, uint32_t* counters, const FusedPrepare* prepare,
                                 const DecodeStepTable* step, int trigger, const DecodeL2Prefetch& l2) {
  check_batch(batch);
  QVL_CHECK_EQ(batch.num_tokens, batch.num_seqs) << "decode attention takes one row per sequence";
  QVL_CHECK(out.dtype == DType::kBF16 && qkv.dtype == DType::kBF16) << out.describe() << ", " << qkv.describe();
  QVL_CHECK_EQ(out.dim(0), batch.num_tokens);
  QVL_CHECK_EQ(out.row_numel(), int64_t{shape.num_q_heads} * shape.head_dim);
  QVL_CHECK_EQ(shape.num_q_heads % shape.num_kv_heads, 0);
  const int hd = shape.head_dim;
  QVL_CHECK(decode_attention_fusable(shape) || prepare == nullptr) << "fused prepare for head_dim " << hd;
  if (!decode_attention_fusable(shape)) {
    launch_text_attention_generic(ctx, out, qkv, batch, cache, layer, shape, scale);
    return 0;
  }
  const int split_blocks = ctx.decode_split_blocks > 0 ? ctx.decode_split_blocks : kDecodeSplitBlocks;
  int splits = split_blocks / std::max(1, batch.num_seqs * shape.num_kv_heads);
  // A cluster holds every split of a (sequence, kv head): at most ctx.decode_cluster of them.
  const bool cluster = ctx.decode_cluster > 1 && splits > 1;
  splits = std::clamp(splits, 1, cluster ? ctx.decode_cluster : kDecodeMaxSplits);
  if (splits > 1 && !cluster) {
    const size_t need = static_cast<size_t>(batch.num_seqs) * shape.num_q_heads * splits * (hd + 2) * sizeof(float);
    QVL_CHECK_LE(need, partial_bytes) << "decode attention scratch (raise CudaBackendOptions::max_gqa_group / "
                                         "max_head_dim)";
    QVL_CHECK_LE(batch.num_seqs * shape.num_kv_heads, kDecodeSplitBlocks);
  }
  DecodeParams p{};
  p.qkv = qkv.as<bf16>();
  p.out = out.as<bf16>();
  p.partial = partial;
  p.counters = counters;
  p.query_start = batch.query_start.as<int32_t>();
  p.context_len = batch.context_len.as<int32_t>();
  p.page_table = batch.page_table.as<int32_t>();
  p.cache = geometry(cache, layer);
  p.max_pages = batch.max_pages_per_seq;
  p.hq = shape.num_q_heads;
  p.hkv = shape.num_kv_heads;
  p.splits = splits;
  p.scale_log2 = scale * 1.4426950408889634f;
  p.debug_exit = ctx.decode_attention_exit;
  p.trace = ctx.decode_trace;
  p.trigger = trigger;
  p.layer = layer;
  for (int r = 0; r < 2; ++r) {
    if (l2.bytes[r] == 0) continue;
    QVL_CHECK(reinterpret_cast<uintptr_t>(l2.data[r]) % 16 == 0 && l2.bytes[r] % 16 == 0 && l2.bytes[r] < (1u << 31))
        << "decode attention L2 prefetch of " << l2.bytes[r] << " bytes";
    p.l2_data[r] = static_cast<const char*>(l2.data[r]);
    p.l2_bytes[r] = static_cast<uint32_t>(l2.bytes[r]);
  }
  if (prepare) {
    QVL_CHECK(prepare->q_norm.numel() == hd && prepare->k_norm.numel() == hd &&
              prepare->q_norm.dtype == prepare->k_norm.dtype &&
              (prepare->q_norm.dtype == DType::kF32 || prepare->q_norm.dtype == DType::kBF16))
        << "q_norm " << prepare->q_norm.describe() << ", k_norm " << prepare->k_norm.describe();
    QVL_CHECK_EQ(prepare->rope.half, hd / 2);
    QVL_CHECK(batch.positions.dtype == DType::kI32 && batch.positions.numel() == int64_t{batch.num_tokens} * 3)
        << "positions " << batch.positions.describe();
    QVL_CHECK(batch.slots.dtype == DType::kI32 && batch.slots.numel() == batch.num_tokens)
        << "slots " << batch.slots.describe();
    p.fused = true;
    p.q_norm = prepare->q_norm.data;
    p.k_norm = prepare->k_norm.data;
    p.norm_f32 = prepare->q_norm.dtype == DType::kF32;
    p.eps = prepare->eps;
    p.positions = batch.positions.as<int32_t>();
    p.slots = batch.slots.as<int32_t>();
    p.rope = prepare->rope;
    // The step table holds every (sequence, split) and a first key round's pages (page size >= 3).
    if (step && step->mode != 0 && batch.num_seqs <= kDecodeSplitBlocks &&
        batch.num_seqs * splits <= kDecodeSplitBlocks && hd <= step->max_head_dim &&
        (kRound + cache.page_size - 1) / cache.page_size + 1 <= kDecodeStepKeyInts - 1) {
      p.step_mode = step->mode;
      p.step_prep = step->prep;
      p.step_keys = step->keys;
    }
  }
  const unsigned units = static_cast<unsigned>(batch.num_seqs * shape.num_kv_heads);
  const bool fp8 = cache.dtype == DType::kF8E4M3;
  const bool tma = ctx.decode_tma && encode_kv_map(&p.kv_map, cache, p.cache, hd);
  if (tma && ctx.decode_tma_launches) ++*ctx.decode_tma_launches;
  const size_t smem = hd == 64 ? decode_smem_bytes<64>() : decode_smem_bytes<128>();
  const size_t inbox = (hd == 64 ? inbox_offset<64>() : inbox_offset<128>()) - smem +
                       inbox_bytes(shape.num_q_heads / shape.num_kv_heads, hd, splits);
  // A cluster takes the splits of a (sequence, kv head) as consecutive blocks along x.
  if (cluster)
    launch_clustered(ctx, "text_decode_attention", static_cast<unsigned>(splits), decode_kernel_for<true>(hd, fp8, tma),
                     dim3(units * static_cast<unsigned>(splits)), dim3(kThreads), smem + inbox, p);
  else
    launch(ctx, "text_decode_attention", decode_kernel_for<false>(hd, fp8, tma),
           dim3(units, static_cast<unsigned>(splits)), dim3(kThreads), smem, p);
  return p.step_mode;
}

}  // namespace qvl::cuda
