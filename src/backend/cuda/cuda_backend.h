// The CUDA backend's public face: plain C++ (no CUDA header), so the CLI, the memory planner and
// tests can name it. The backend itself (cuda_backend_impl.h, cuda_backend*.cpp and the kernels beside them) implements
// backend.h with BF16 activations and fp32 accumulation; weights stay BF16 or FP8 E4M3 with
// their 128x128 block scales in device memory.
//
// Linear dispatch (what callers can rely on for numerics and memory):
// - FP8 rows <= kSkinnyMaxRows, BF16 rows <= CudaBackendOptions::skinny_bf16_max_rows (8):
//   tensor-core "skinny" kernels that stream the weight once, FP8 converted to BF16 in registers
//   and the block scale applied to each 128-wide K partial in fp32 (W8A16, no activation
//   quantisation); on sm_90, FP8 Linears of 16 or more rows take a wide variant where it measured
//   faster (skinny_wide.cu: 128 weight rows per block, K split over a cluster), the same math;
// - more rows, BF16: cuBLASLt (fp32 compute), bias fused;
// - more rows, FP8, CudaFp8Gemm::kW8A8 (opt-in; see below) where cuBLASLt has block-scaled FP8
//   (sm_90): W8A8 as transformers' native FP8 path: the activations are quantised per row and
//   128 columns (fp8_quant.cu: s = amax / 448, e4m3(x / s)) and multiplied with the weights and
//   their 128x128 block scales by cuBLASLt (fp32 accumulation, one BF16 rounding, bias and
//   residual fused); other shapes, architectures and kDequant (the default): chunks of output rows are
//   dequantised to BF16 exactly as transformers' FineGrainedFP8Config(dequantize=True) does
//   (bf16(float(w8) * scale)) into the dequant workspace and multiplied by cuBLASLt (W8A16);
// - FP8 rows up to kSkinnyFp8MaxRows use the skinny kernels in passes of kSkinnyWideMaxRows instead
//   (re-reading 1 byte per weight per pass beats writing and re-reading 2 bytes of BF16).
// Every workspace is allocated once, when the backend is made (the FP8 dequant workspace: with
// the first FP8 Linear loaded), so nothing is allocated while generating;
// cuda_backend_workspace_bytes() and dequant_workspace_bytes give the memory planner the totals.
//
// KV cache: BF16, or FP8 E4M3 (KvCacheView::dtype): K and V are rounded to BF16 as the model
// computes them, then cast to e4m3 with saturation at +-448 and no scale (the scale-free FP8
// KV of other engines); attention widens them back exactly.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace qvl {

inline constexpr int kSkinnyMaxRows = 32;
// Decode Linears of up to this many rows may take a SiLU·mul that follows as their epilogue.
inline constexpr int kSkinnyGluMaxRows = 8;
// Past two rows a decode Linear takes a prologue only where its blocks compute at most this many
// copies of it per multiprocessor, whatever CudaBackendOptions::fused_prologue_max_copies_per_sm
// allows. Decode step, H200 (bench/RESULTS.md run 41): 2B's gate_up at three rows (768 tiles, 17.5
// copies) measured -4.7% (FP8) and -0.4% (BF16) as its own kernel, while the qkv Linears at three
// and four rows (5.8-11.6 copies) keep it: 4B FP8 +4 to +5% out, 8B FP8 +1.6% at three rows.
inline constexpr int kFusedPrologueMaxCopiesPastTwoRows = 12;
// FP8 Linears take the skinny kernels in passes of this many rows: one launch of the wide kernel
// where it takes the shape (skinny_wide.cu, sm_90), else passes of kSkinnyMaxRows.
inline constexpr int kSkinnyWideMaxRows = 64;
// BF16 Linears over this many rows go to cuBLASLt by default. From 9 rows the skinny kernel
// carries two or more 8-token tiles per warp without the fused prologues, and cuBLASLt's
// small-M GEMMs stream the weights faster. Decode step on an H100 (bench/RESULTS.md run 18):
// 2B / 4B / 8B BF16 at 16 sequences -9 / -14 / -10%, at 32 -14 / -25 / -25%, at 9 (2B, 4B)
// -3 / -7%. At 8 sequences the skinny kernel is faster (2B 2.23 against 2.35 ms, 4B 4.50 against
// 4.75 with the fused prologues of then; run 20, 2B, with RMSNorm and SiLU·mul as their own
// kernels at 8 rows: 2.047 against 2.323). FP8 Linears keep the skinny kernels up
// to kSkinnyFp8MaxRows: cuBLASLt would need their BF16 copy written and read back every step.
inline constexpr int kSkinnyBf16MaxRows = 8;
inline constexpr int kSkinnyFp8MaxRows = 128;

// How FP8 Linears over more than kSkinnyFp8MaxRows rows multiply (see above).
enum class CudaFp8Gemm : uint8_t {
  kW8A8,     // quantised activations, block-scaled FP8 cuBLASLt; kDequant where cuBLASLt has none
  kDequant,  // weights dequantised to BF16, BF16 cuBLASLt (the numerics of the FP8 fixtures)
};
// The default is kDequant: measured on an H100 (4B FP8, 1024x768 image, 846 positions teacher-
// forced against transformers' dequantised model), W8A8 prefill gave a minimum logits cosine of
// 0.99843 (the acceptance bar is 0.999; dequant: 0.99985) for a 1.9x faster prefill.

// Which decode Linear kernel runs (skinny.cu), for benchmarks (qvl bench --cuda-skinny); 0 in a
// field = the default for the shape. variant 1 = one 16-row tile per block, K over the 8 warps
// (group = 128-column chunks a warp loads at once, prewait = groups loaded before the PDL wait,
// 1 or 2; warps below; split 2 = the tile's K over a cluster pair of blocks, FP8 up to 8 rows,
// sm_90+); 2 = streaming warps (depth = chunks in flight per warp, split = warps sharing one row
// tile's K); 3 = the bulk-copy ring, sm_90+, at most 8 rows, FP8 with 128-row scale blocks
// (depth = stages, split = 1 whole tiles / 2 row segments of 8 * group chunks, blocks per
// multiprocessor; skinny_common.cuh RingTuning); 4 = the wide kernel, FP8 on sm_90+ (split =
// blocks of a cluster sharing one 128-row tile's K: 1, 2, 4 or 8; a default on sm_90 for the FP8
// shapes skinny.cu's choose_skinny names).
struct SkinnyTuning {
  int variant = 0;
  int depth = 0;
  int split = 0;
  int group = 0;
  int prewait = 0;
  int blocks = 0;  // one-tile kernel: 3 = three blocks per multiprocessor (FP8, group 1, up to 8 rows)
  int only_n = 0;  // > 0: the fields above apply only to Linears of only_n outputs (others take the defaults)
  // SiLU·mul prologue: 1 = gate and up loaded per vector, 2 = at one row, copied into shared
  // memory by cp.async first (the default: 2B BF16 / 4B FP8 decode -2%).
  int stage = 0;
  // One-tile kernel up to 8 rows: warps per block, 8 or 16 (0: the default for the shape).
  int warps = 0;
};

struct CudaBackendOptions {
  int device = 0;
  // cuBLASLt workspace (NVIDIA recommends 32 MiB on Hopper; graph capture needs a fixed one).
  size_t gemm_workspace_bytes = size_t{32} << 20;
  // BF16 copy of FP8 weight rows for Linears over more than kSkinnyFp8MaxRows rows (prefill),
  // allocated with the first FP8 Linear the backend loads (a BF16 model has none). A Linear is
  // dequantised in equal chunks of whole 128-row blocks that fit. 48 MiB puts the 4B down_proj
  // (2560 x 9728) in one chunk and every Qwen3-VL 2B / 4B / 8B FP8 Linear in chunks of at least
  // 2048 rows. At 32 MiB that down_proj took two (1664 + 896 rows) whose GEMMs ran at 280 instead
  // of 700 TFLOP/s: 4B FP8 prefill Linears 15.2 -> 13.0 ms on an H100 (CUDA_PERF_NOTES.md).
  size_t dequant_workspace_bytes = size_t{48} << 20;
  CudaFp8Gemm fp8_gemm = CudaFp8Gemm::kDequant;
  // W8A8: the quantised activations of one cuBLASLt call (K bytes + ceil(K / 128) fp32 scales per
  // row) and the last rows' output; more rows than fit run as several calls (16 MiB: 1600 rows
  // of the 4B down_proj, K = 9728). Allocated only with kW8A8 where it can run (sm_90): see
  // cuda_fp8_act_workspace_bytes().
  size_t fp8_act_workspace_bytes = size_t{16} << 20;
  // Split-K decode attention keeps fp32 partial outputs per (sequence, q head, split); the
  // scratch is sized for these bounds (a model beyond them fails a check at its first step).
  int max_gqa_group = 8;  // q heads per kv head
  int max_head_dim = 128;
  // Programmatic dependent launch on sm_90+: a kernel may start (and stream its weights)
  // while the previous one finishes.
  bool programmatic_launch = true;
  // BF16 Linears of at most this many rows (0..kSkinnyMaxRows) take the skinny kernels, more
  // take cuBLASLt (kSkinnyBf16MaxRows above; kSkinnyMaxRows for A/B and the kernels' tests).
  int skinny_bf16_max_rows = kSkinnyBf16MaxRows;
  // Vision and text-prefill attention split each query tile's keys over a thread-block cluster
  // on sm_90+ (flash.cuh; same results up to fp32 reassociation). Off: one block per query
  // tile, as on older GPUs (tests compare both; benchmarks can A/B). Off also leaves FP8 Linears
  // to the one-tile kernel (the wide kernel's splits are clusters).
  bool cluster_attention = true;
  // text_qkv_prepare for head dims 64 / 128 with 16-byte accesses, 4 tokens per block (cos/sin
  // once per token). Off: the one-block-per-8-heads kernel every head dim can use. Both write
  // the same bits (the GPU test compares them).
  bool token_qkv_prepare = true;
  // Vision attention: 16-row m-tiles per warp, 2 (4 warps per 128-row block, each K/V fragment
  // feeding two mmas) or 1 (8 warps). The same bits either way: a row's arithmetic does not
  // depend on which warp does it (the GPU test compares them).
  int vision_attention_mt = 2;
  // Vision attention through flash.cuh: Q comes through the two K stages into registers instead
  // of a region of its own (a third less shared memory, two blocks per multiprocessor on 100 KB
  // GPUs, sm_86 / 89 / 120, where the other layout fits one). -1: where that is so; 0 off; 1 on.
  // The same bits either way.
  int vision_q_through_k = -1;
  // Vision attention at head dim 64 (2B, 4B) and 72 (8B: its last 8 columns in unswizzled tiles) on sm_90
  // through the warpgroup-MMA kernel (attention_vision_wgmma.cu: a TMA producer, three consumer
  // warpgroups, the softmax of one key tile beside the P·V of the previous one): 2B's vision
  // attention 157 -> 93 us per layer in one call on an H100, vision encoder 8.44 -> 6.83 ms.
  // Off, or elsewhere: the mma.sync flash kernel.
  bool vision_wgmma = true;
  // Text prefill attention at head dim 128 over a BF16 cache on sm_90 through the warpgroup-MMA
  // kernel (attention_prefill_wgmma.cu: K and V pages by TMA): 2B's prefill of 802 rows 36.8 ->
  // 24.3 us per layer on an H100. Off, or elsewhere (FP8 caches, other shapes): flash.cuh.
  bool prefill_wgmma = true;
  // Text prefill attention keeps Q in the K stage the first key tile does not use (a quarter
  // less shared memory: 3 blocks per SM instead of 2 at head dim 128). Same bits either way.
  bool prefill_q_alias = true;
  // Text prefill attention through flash.cuh in key tiles of 32, Q through the K stages (a BF16
  // cache) or in the K/V stage (FP8): half the shared memory, two blocks per multiprocessor on 100
  // KB GPUs (sm_86 / 89 / 120) where 64-key tiles fit one. -1: where that is so; 0 off; 1 on. The
  // same arithmetic in another order of keys per tile: not the same bits.
  int prefill_small_tiles = -1;
  // Text prefill attention: a query tile's keys are split over a cluster of 2 or 4 blocks
  // (sm_90+) once they span more than this many 64-key tiles (twice as many: 4 blocks).
  int prefill_key_tiles = 8;
  // Decode attention: blocks a step's splits may take, (sequences x kv heads x splits); 0 =
  // kDecodeSplitBlocks, the most the scratch holds.
  int decode_split_blocks = 0;
  // Decode attention (sm_90+, with cluster_attention): a (sequence, kv head)'s splits are one
  // thread-block cluster (at most 16) and merge through distributed shared memory, instead of
  // the last block to arrive merging them through L2. The same arithmetic: the same bits for
  // the same number of splits (the cluster caps it at 16, the L2 merge at 32).
  bool decode_cluster_merge = true;
  // Decode attention (sm_90+): the key rounds of a BF16 cache whose pages hold a multiple of 16
  // tokens come through TMA, a box of 16 keys per request issued by one thread, instead of
  // 16-byte cp.async from every thread (attention_decode.cu). The same bits either way.
  bool decode_attention_tma = true;
  // Decode Linears through the bulk-copy ring (sm_90+) with an RMSNorm or SiLU·mul prologue: one
  // stage of weights per block goes out before the PDL wait and the others once the prologue is
  // done, instead of all of them before the wait. The prologue's row is then not read behind the
  // block's whole ring (skinny_ring.cu). The same bits either way.
  bool ring_prologue_first = true;
  // Testing only: the backend makes every choice (kernel paths, their shared memory, cluster
  // merges) as on a GPU of this compute capability with at most this much opt-in shared memory
  // per block, e.g. 120 and 101376 for an RTX 5060, while the device runs its own code. A
  // profile the device could not run is refused (make_cuda_backend): sm_90 only on sm_90 (its
  // warpgroup-MMA kernels), sm_90+ on sm_90+, at most the device's shared memory. 0: the
  // device's own. The GPU tests run the consumer GPUs' profiles on an H100 / H200.
  int emulate_compute_capability = 0;
  int emulate_smem_per_block = 0;
  // Testing only, with a profile: every launch asks for enough shared memory that the device holds
  // no more of its blocks per multiprocessor than the emulated GPU would (by its shared memory
  // and threads per multiprocessor), so that latency hiding is roughly that GPU's. The device's
  // multiprocessor count, clocks and bandwidth stay its own: times compare between variants, not
  // with the emulated GPU's.
  bool emulate_occupancy = false;
  // Measurement only (qvl bench --skip-kernels, --decode-attention-exit; every result is wrong
  // while either is set): launches left out, "name[@grid_x],..."; and where the decode attention
  // kernel stops (attention_decode.cu, DecodeParams::debug_exit).
  std::string skip_kernels;
  int decode_attention_exit = 0;
  // Measurement only (qvl bench --decode-attention-trace): the decode attention kernel stamps
  // %globaltimer at its stages, block by block, for the last step (cuda_decode_attention_trace).
  bool decode_attention_trace = false;
  // When a decode attention block lets the next kernel (o_proj) launch and start loading its
  // weights: 0 right after its PDL wait, 1 once its keys are done, 2 once its partial is written,
  // 3 when it exits; -1 (default): 1 or 3, chosen per launch.
  // - Not 0: o_proj's weight loads then delay the attention's key loads (3 us per key round at
  //   3000 tokens); 1 measured -0.7% / +0.2% / -0.9% per decode step against 0 for 2B / 2B FP8 /
  //   4B FP8 at 840 tokens of context, -1.4% for 2B at 3000 (H100, bench/RESULTS.md run 8).
  // - 3 against 1: o_proj's blocks issuing their weight loads beside the attention's blocks slow
  //   the attention's merge (its shared-memory work queues behind the loads), while launching
  //   o_proj later leaves its weight stream on the critical path. Measured (H100, 840 tokens):
  //   batch 1 2B BF16 -5.2%, 2B FP8 -2.6%, 4B FP8 +2.9%, 4B BF16 +0.9%, 8B FP8 +1.8%, 8B BF16
  //   +0.9%; batch 8 -0.6 to -4.4% for all six (run 9).
  // So: 3 for batches, and at batch 1 unless o_proj's weights are over 9.4 MB (2B's 8 and 4 MiB
  // are not, 4B FP8's 10 MiB is: on an H200 too, where 1 measured -2.6% against 3), else 1.
  // Since gate_up takes its RMSNorm as a prologue in 8B (run 36), 8B FP8's o_proj (256 tiles,
  // 16.8 MB) measured 3 better at batch 1 (-4.1%; 8B BF16 +0.8%, 4B FP8 +3.8%, 4B BF16 +0.4%):
  // 3 also where o_proj's grid is over 1.5 blocks per multiprocessor and its weights are at most
  // 24 MB (cuda_backend_impl.h, kLateLaunchMaxBytes).
  int decode_attention_trigger = -1;
  // Whether a one-tile decode Linear without a prologue that does not read the decode attention's
  // output (down_proj) lets the next kernel (the next layer's qkv) launch before its own PDL wait
  // rather than right after it. The next kernel's blocks then take the multiprocessors this grid
  // leaves idle and issue their weight loads while it runs; their wait still waits for this grid.
  // It is safe because every kernel reads only weights before its wait, apart from the decode
  // attention, whose launch still implies the previous layer's attention has completed: the
  // Linears after the attention (o_proj, gate_up) trigger after their waits.
  // -1 (default): at one row where the grid is over one block per multiprocessor and at most 1.5
  // (4B's down_proj: 160 tiles on 132). Decode step, batch 1, H100 (bench/RESULTS.md run 35),
  // against 0 in one call: 4B FP8 -2.0%, 4B BF16 -1.7%. In the experiment before it, 2B (128
  // tiles), 8B (256) and batch 8 (4B FP8 +0.5%) gained nothing, nor did o_proj before gate_up or
  // gate_up's ring before down.
  // 0: never; 1: every such Linear (tests).
  int decode_early_launch = -1;
  // While the decode attention runs DRAM is mostly idle, and the Linears after it read weights
  // in L2 faster than from DRAM (tools/bench/gemv_sweep --l2, H100: 2B FP8 gate_up 11.35 ->
  // 7.65 us, down 6.72 -> 4.51). So the attention's blocks ask L2 for the first part of its
  // layer's gate_up and down_proj weights (the layers the model passed to decoder_stack; none
  // where it did not), once their first keys are issued, and only where a block's keys are one
  // round (64; at batch 1 with 16 splits a context of up to 1024: a later round's keys would wait
  // behind the prefetch, which measured +3% at 1214 tokens, 2B FP8).
  // -1 (default): at batch 1 on compute capability 9.x, half of each weight and at most 16 MB
  // of it (kDecodeL2PrefetchBytes), else none. Decode step, batch 1, 838 tokens, H100, against
  // none, medians of three in one call (bench/RESULTS.md run 37): 2B FP8 -1.6%, 2B BF16 -2.6%,
  // 4B FP8 -0.6%, 4B BF16 -1.4%; at 994 tokens 2B FP8 -1.3%, 2B BF16 -1.8%. 16 MB of each
  // without the halving: 2B FP8 +0.3 to -1.1% between calls, the others alike. At 2 and 4
  // sequences it measured up to +7% (the attention reads more keys, the Linears more rows), at 8
  // +4 to +10%. Where DRAM peaks above 4 TB/s (an H200; cuda_peak_dram_gbps) at most 8 MB of
  // each: there, against 16, 2B BF16 -2.2%, 2B FP8 -0.6%, 4B BF16 -0.8%, 4B FP8 -1.1%, 8B -0.3 /
  // -0.7% (RESULTS run 42). 0: never; > 0: that many bytes of each at every batch (tests).
  int64_t decode_l2_prefetch_bytes = -1;
  // RMSNorm and SiLU·mul over few rows (below) are computed inside the Linear that reads them,
  // and a decode batch's text_qkv_prepare inside the attention kernel (up to three launches fewer
  // per layer); results are the same either way up to the fp32 summation order of RMSNorm.
  bool fuse_prologues = true;
  // The most rows whose RMSNorm (SiLU·mul) a Linear takes as its prologue (0..8); more rows run
  // the separate kernel. Every block of the Linear computes the prologue of all its rows again,
  // which pays at one row (the launch it saves) and stops paying with more. Decode step, H100,
  // medians of three (bench/RESULTS.md run 20), against 8 and 8: SiLU·mul at one row only, 2B
  // FP8 batch 2 / 3 -9.4 / -14.2%, 4B FP8 batch 2 -12% (it was fused up to 3 and 2 rows, where
  // its bytes fit); RMSNorm up to 4 rows, then as its own kernel: 2B FP8 batch 8 -14.3%, 4B FP8
  // -1.1%, while 4B FP8 at 2..4 rows lost 2.8..4.9% without it.
  int fused_rms_norm_max_rows = 4;
  int fused_silu_mul_max_rows = 1;
  // Every block of a Linear with a prologue (one per 16-row output tile) computes the prologue of
  // every row again: it is fused only where tiles x rows is at most this many per multiprocessor.
  // 20 takes in 4B's gate_up (1216 tiles on an H100's or H200's 132 multiprocessors) at one and
  // two rows and 8B's (1536) at one. A limit of 8 tiles per multiprocessor at any row count (the
  // rule before run 36) left them a separate one-block RMSNorm kernel: gate_up's blocks launched
  // on its trigger and issued ~13 MB of weights, and the norm's read of its row queued behind them
  // (10.75 us from o_proj's end to gate_up's wait in 4B FP8, RESULTS run 35). Decode step, H100,
  // against that rule in one call (run 36): batch 1 4B FP8 -6.3%, 4B BF16 -5.3%, 8B FP8 -3.1%;
  // batch 2 4B FP8 -5.0%, 4B BF16 +0.4%; fusing at 4 rows too lost 3.5% (FP8) and 4.3% (BF16).
  // lm_head (9496 tiles) stays out: fusing it measured no change on an H100 (run 36) and 172
  // against 140 us on an H200 (earlier).
  // 20, not run 36's 24, since run 41 (H200, medians of three): the copies of 2B's gate_up at four
  // rows (768 tiles) and 8B's at two, 23.3 per multiprocessor each, cost more than the norm's own
  // kernel: out, 2B FP8 b4 -6.3 to -7.2% (three calls), 2B BF16 b4 -0.9 to -1.0%, 8B FP8 b2 -6.3 /
  // -6.5%, 8B BF16 b2 -1.0 / -1.1%. 4B's gate_up at two rows (18.4) measured +1.1% out (4B FP8)
  // and stays in. Copies alone do not draw the whole line: 2B FP8's gate_up at three rows (17.5)
  // measured -4.7% out, which kFusedPrologueMaxCopiesPastTwoRows (12) takes, and 2B's qkv at
  // three and four rows (5.8, 7.8) -1.1 to -2.9% out, where 4B FP8's and 8B's qkv measured +1.6 to
  // +5.1% out. Not re-measured on an H100.
  int fused_prologue_max_copies_per_sm = 20;
  // The most rows (0..kSkinnyGluMaxRows) whose SiLU·mul the gate_up Linear before it computes in
  // its epilogue (each tile pairs 8 gate rows with their 8 up rows), ahead of the prologue above:
  // no launch and no prologue for it, and the same bits. Decode step on an H100 against 0
  // (bench/RESULTS.md run 32), b1 / b2 / b8: 2B BF16 -1.3 / -5.6 / -0.8%, 2B FP8 -4.6 / -5.1 /
  // -3.8%, 4B FP8 -3.2 / -2.4 / -2.0%, 4B BF16 +0.3 (inside the spread) / -0.9 / -0.7%.
  int silu_mul_epilogue_max_rows = kSkinnyGluMaxRows;
  // GELU (tanh) Linears over many rows without a residual (the vision MLP's fc1) through
  // cuBLASLt's GELU_BIAS epilogue: GELU of the fp32 result, then one BF16 rounding (the reference
  // rounds the Linear's output first). cuBLASLt's GELU is the tanh form (an fp32 probe,
  // tools/bench/gelu_epilogue_probe.cu: within 5.2e-6 of it, 4.7e-4 from the erf form). Off: a
  // separate pass after the rounded output. 2B vision encoder on an H100: fc1 62.0 -> 47.2 us per
  // layer, vision 8.70 -> 8.49 ms (RESULTS run 15).
  bool cublas_gelu = true;
  // Decode Linear kernel override for benchmarks (qvl bench --cuda-skinny); all 0: the per-shape
  // defaults.
  SkinnyTuning skinny;
  // Experimental, off: a decode step of one sequence runs the whole decoder stack as one
  // persistent kernel (decode_stack.cu, sm_90+) instead of layer by layer. Correct (GPU tests),
  // but slower so far on an H100 (2B BF16 2.15 against 2.0 ms per step; see
  // tools/bench/CUDA_PERF_NOTES.md). decode_stack_splits: its attention splits per kv head (0 =
  // multiprocessors / kv heads; tests set it to force several key rounds).
  bool fused_decode = false;
  int decode_stack_splits = 0;
  // Diagnostics (qvl bench --decode-stack-debug): bits that switch parts of the fused stack off
  // (1: dependency waits, 2: Linear math, 4: attention, 8: L2 prefetch) to time the rest. Results
  // are wrong (except with 8).
  int decode_stack_debug = 0;
};

// Decode attention splits each (sequence, kv head) over at most kDecodeMaxSplits blocks, and
// only while sequences x kv heads x splits <= kDecodeSplitBlocks (about two blocks per
// multiprocessor); larger batches run unsplit and need no scratch. Measured on an H200 with
// the fused q/k prepare, 2B, context ~900: 256 gives 28 us per layer at 8 sequences against
// 38 us with 1024, and the same 74 us at 32.
inline constexpr int kDecodeMaxSplits = 32;
inline constexpr int kDecodeSplitBlocks = 256;
// Ints per (sequence, split) entry of the decode attention's per-step table: the context
// length and up to 23 pages of the split's first key round (attention_decode.cu).
inline constexpr int kDecodeStepKeyInts = 24;
inline size_t cuda_decode_step_table_bytes(const CudaBackendOptions& o) {
  return static_cast<size_t>(kDecodeSplitBlocks) * (o.max_head_dim + 2 + kDecodeStepKeyInts) * sizeof(int32_t);
}

// Greedy sampling on the device (Backend::argmax_rows) keeps a 64-bit key and an arrival
// counter per row, zero between launches, for up to kArgmaxMaxRows rows per launch (more rows
// take several launches); they live in the decode scratch.
inline constexpr int64_t kArgmaxMaxRows = 1024;
inline constexpr size_t kArgmaxRowScratchBytes = sizeof(uint64_t) + sizeof(uint32_t);

// Device bytes the backend allocates for itself when made (all workspaces and scratch; not the
// CUDA context and module code, which the planner measures as a constant).
inline size_t cuda_decode_scratch_bytes(const CudaBackendOptions& o) {
  // per (seq, q head, split): head_dim fp32 partial outputs + running max + sum
  size_t per = static_cast<size_t>(o.max_head_dim + 2) * sizeof(float);
  // + the per-step table, + the argmax keys and counters, + one arrival counter per (sequence,
  // kv head) of a split decode (the last split merges)
  return per * static_cast<size_t>(kDecodeSplitBlocks) * o.max_gqa_group + cuda_decode_step_table_bytes(o) +
         kArgmaxMaxRows * kArgmaxRowScratchBytes + kDecodeSplitBlocks * sizeof(uint32_t);
}
// The W8A8 scratch exists only when fp8_gemm asks for W8A8 and cuBLASLt has 128-element
// block-scaled FP8 there (compute capability 9.x, its documented support); the memory plan
// passes the same option (RuntimeOptions::fp8_w8a8). compute_capability 0 (unknown: a plan made
// without a device) counts it, the safe side.
inline size_t cuda_fp8_act_workspace_bytes(const CudaBackendOptions& o, int compute_capability) {
  const bool can_run = compute_capability == 0 || compute_capability / 10 == 9;
  return o.fp8_gemm == CudaFp8Gemm::kW8A8 && can_run ? o.fp8_act_workspace_bytes : 0;
}
// What make_cuda_backend allocates; the dequant workspace comes later, with the first FP8 Linear.
inline size_t cuda_backend_workspace_bytes(const CudaBackendOptions& o, int compute_capability) {
  return o.gemm_workspace_bytes + cuda_fp8_act_workspace_bytes(o, compute_capability) + cuda_decode_scratch_bytes(o);
}

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_capability = 0;  // major * 10 + minor
  int multiprocessors = 0;
  int max_smem_per_block = 0;  // opt-in shared memory per block (bytes)
  size_t total_memory = 0;
  size_t free_memory = 0;
  size_t l2_bytes = 0;
  double memory_clock_khz = 0;
  int memory_bus_bits = 0;
  bool emulated = false;  // compute_capability and max_smem_per_block are a profile's (apply_emulated_profile)
};

// The device as a backend made with o treats it (CudaBackendOptions::emulate_compute_capability,
// emulate_smem_per_block), written into info; invalid-argument, info unchanged, for a profile
// the device could not run: under sm_80, sm_90 anywhere but on sm_90 (the warpgroup-MMA kernels
// exist for sm_90a only), sm_90+ on an older device (TMA, clusters, PDL), or more shared memory
// than the device has.
inline Status apply_emulated_profile(const CudaBackendOptions& o, CudaDeviceInfo& info) {
  const int cc = o.emulate_compute_capability, smem = o.emulate_smem_per_block;
  if (cc == 0 && smem == 0)
    return o.emulate_occupancy && !info.emulated
               ? invalid_argument(
                     "emulate_occupancy (qvl bench --emulate-occupancy) needs an emulated GPU (--emulate-gpu)")
               : Status::ok();
  const std::string device = info.name + " (sm_" + std::to_string(info.compute_capability) + ")";
  if (cc != 0) {
    if (cc < 80) return invalid_argument("emulated sm_" + std::to_string(cc) + ": qvl needs sm_80 or newer");
    if (cc / 10 == 9 && info.compute_capability != 90)
      return invalid_argument("emulated sm_" + std::to_string(cc) + " on " + device +
                              ": sm_90's warpgroup-MMA kernels run on sm_90 only");
    if (cc >= 90 && info.compute_capability < 90)
      return invalid_argument("emulated sm_" + std::to_string(cc) + " on " + device +
                              ": its TMA, cluster and PDL paths need sm_90 or newer");
  }
  if (smem < 0 || smem > info.max_smem_per_block)
    return invalid_argument("emulated " + std::to_string(smem) + " bytes of shared memory per block on " + device +
                            ", which has " + std::to_string(info.max_smem_per_block));
  if (cc != 0) info.compute_capability = cc;
  if (smem != 0) info.max_smem_per_block = smem;
  if (info.emulated) info.name.resize(info.name.find(" as sm_"));  // the profile's own again
  info.name += " as sm_" + std::to_string(info.compute_capability) + " with " +
               std::to_string(info.max_smem_per_block) + " B of shared memory per block (emulated)";
  info.emulated = true;
  return Status::ok();
}

// Shared memory a multiprocessor keeps per resident block (sm_80 and newer): its capacity is
// the opt-in limit per block plus this (H100 / H200 233,472 B, A100 167,936, sm_86 / 89 / 120
// 102,400).
inline constexpr int kReservedSmemPerBlock = 1024;

// Blocks of `smem` bytes of shared memory (dynamic and static) that `smem_per_sm` holds.
inline int blocks_by_smem(int smem_per_sm, size_t smem) {
  return static_cast<int>(static_cast<size_t>(smem_per_sm) / (smem + kReservedSmemPerBlock));
}

// Threads a multiprocessor holds at compute capability cc (sm_80 and newer).
inline int threads_per_sm(int cc) {
  return cc == 80 || cc == 90 || cc / 10 == 10 ? 2048 : 1536;
}

// CudaBackendOptions::emulate_occupancy: the dynamic shared memory a launch of `smem` dynamic and
// `static_smem` static bytes a block, `threads` threads, asks for on a device whose
// multiprocessors have device_smem_per_sm bytes, so that they hold no more of its blocks than an
// emulated one of emulated_smem_per_sm bytes and emulated_threads_per_sm threads would: a
// 1/blocks share of the device's, less the reserve, where the device would hold more of them
// (else `smem`). 0 where the emulated device holds no such block at all.
inline size_t emulated_occupancy_smem(size_t smem, size_t static_smem, int threads, int emulated_smem_per_sm,
                                      int emulated_threads_per_sm, int device_smem_per_sm) {
  const int by_threads = threads > 0 ? emulated_threads_per_sm / threads : 0;
  const int fit = std::min(blocks_by_smem(emulated_smem_per_sm, smem + static_smem), by_threads);
  if (fit <= 0) return 0;
  if (blocks_by_smem(device_smem_per_sm, smem + static_smem) <= fit) return smem;  // no more of them there anyway
  return static_cast<size_t>(device_smem_per_sm / fit - kReservedSmemPerBlock) - static_smem;
}

// Peak DRAM bandwidth in GB/s from the device's memory clock and bus width (double data rate;
// 0 where they are unknown): an H100 SXM 3352, an H200 4814.
inline double cuda_peak_dram_gbps(const CudaDeviceInfo& info) {
  return 2.0 * info.memory_clock_khz * 1e3 * info.memory_bus_bits / 8 / 1e9;
}

// Number of CUDA devices (0 when there is no driver or no device; never an error).
int cuda_device_count();
// Facts about one device; a not-found Status when it does not exist.
Result<CudaDeviceInfo> cuda_device_info(int ordinal);

// Makes the CUDA backend on options.device; failed-precondition when there is no usable
// device, resource-exhausted when the workspaces do not fit.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options);

// Testing only: from now on, cuda_device_info reports every device as this profile makes it
// (apply_emulated_profile), and make_cuda_backend gives it to every backend whose options name
// none, with the launch checks. The GPU tests set it from QVL_GPU_TEST_PROFILE to run a build of
// another architecture's PTX (e.g. only compute_80: the sm_80 code JIT-compiled) on an H100 /
// H200 as that GPU. Invalid-argument, nothing set, for a profile the devices could not run.
Status set_cuda_test_profile(int compute_capability, int smem_per_block);

// Memory accounting of a CUDA backend (for `qvl bench` and the planner's checks).
struct CudaMemoryStats {
  size_t allocated_bytes = 0;       // live allocations made through the backend (incl. workspaces)
  size_t peak_allocated_bytes = 0;  // high-water mark of the above
  size_t device_used_bytes = 0;     // total - free of the whole device, now
  size_t context_bytes = 0;         // device used before the backend allocated anything
};
// Stats of `backend`, which must have been made by make_cuda_backend.
CudaMemoryStats cuda_memory_stats(const Backend& backend);
// Restarts the high-water mark at what is allocated now (a benchmark's own scratch before the
// work it measures does not count).
void cuda_memory_reset_peak(Backend& backend);

// How many FP8 Linears over more than kSkinnyFp8MaxRows rows each path ran since the backend
// was made, and how many launches the wide FP8 decode kernel (skinny_wide.cu), the one-tile
// kernel's 16-warp blocks (BF16 Linears included) and its cluster pairs had, and how many decode
// Linears (BF16 included) took SiLU·mul as their SwiGLU epilogue or a fused RMSNorm / SiLU·mul
// prologue, those recorded into graphs included (tests and benchmarks check which one did).
struct CudaFp8GemmCounts {
  int64_t w8a8 = 0;
  int64_t dequant = 0;
  int64_t skinny_wide = 0;
  int64_t skinny_16_warps = 0;
  int64_t skinny_pairs = 0;
  int64_t skinny_glu = 0;
  int64_t skinny_prologue = 0;
  int64_t skinny_early = 0;         // decode Linears that let the next kernel launch before their wait
  int64_t decode_l2_prefetch = 0;   // decode attentions launched with weights to ask L2 for
  int64_t decode_tma = 0;           // decode attentions whose key rounds came through TMA
  int64_t prefill_wgmma_fp8 = 0;    // prefill attentions over an FP8 cache through warpgroup MMA
  int64_t ring_prologue_first = 0;  // ring Linears that held stages back until their prologue was done
};
CudaFp8GemmCounts cuda_fp8_gemm_counts(const Backend& backend);
// The decode attention's stage stamps of the latest launch per layer (empty unless
// CudaBackendOptions::decode_attention_trace): [layer][block][kDecodeTraceStamps] %globaltimer
// ns, 0 where a block did not reach a stage; kDecodeTraceLayers x kDecodeSplitBlocks blocks.
inline constexpr int kDecodeTraceStamps = 13;
inline constexpr int kDecodeTraceUnit = 12;  // the slot holding the block's unit + 1, not a time
inline constexpr int kDecodeTraceLayers = 64;
std::vector<uint64_t> cuda_decode_attention_trace(Backend& backend);

// Test hook: the W8A8 activation quantisation (fp8_quant.cu) of x [n, K] BF16 on the backend's
// stream into q [n, K] F8E4M3 and scales [ceil(K / 128), main_rows] F32 (cuBLASLt's VEC128_32F
// layout for the rows [0, main_rows)), and, when tail_scales is not empty, tail_scales
// [ceil(K / 128), 8] for the last 8 rows.
void cuda_quantize_fp8_rows(Backend& backend, Tensor q, Tensor scales, Tensor tail_scales, const Tensor& x);

// Per-launch device times (`qvl bench --profile`). Between start and stop every kernel launch,
// cuBLASLt call and device copy of the backend is bracketed by CUDA events, run_graph runs its
// ops eagerly (no capture: events and graphs do not mix), and each record carries the backend
// op that launched it ("linear 1x2048->4096 bf16 +rms_norm"), with the bytes that op must move
// and the FLOPs it must compute on its first launch (0 where not counted). hold_ms first spins
// the stream so the host queues the profiled launches ahead of the device: the times are then
// device times, including no host launch cost (but no launch overlap either).
struct CudaKernelTime {
  std::string op;       // the backend op and its shapes
  std::string kernel;   // the launch's name
  double us = 0;        // device time of the launch
  double start_us = 0;  // since the first record's start
  double bytes = 0;     // the op's minimum device-memory traffic (first launch of the op only)
  double flops = 0;     // the op's arithmetic (first launch of the op only)
};
void cuda_profile_start(Backend& backend, double hold_ms);
std::vector<CudaKernelTime> cuda_profile_stop(Backend& backend);

}  // namespace qvl
