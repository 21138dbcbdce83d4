// Internal to the CUDA backend: the kernel launchers, as plain C++ declarations so that the
// backend class (cuda_backend_impl.h, cuda_backend*.cpp) is ordinary C++ and only the .cu files see device code.
// Each launcher checks the shapes it relies on (QVL_CHECK), launches on ctx.stream, and checks
// the launch. Tensors are device tensors; activations are BF16.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace qvl::cuda {

using KernelTime = CudaKernelTime;

// Times launches with CUDA event pairs while `qvl bench --profile` runs (profile.cu). The
// backend names the op (and the bytes / FLOPs it must move) before launching; every launch
// through launch() (and each cuBLASLt call and copy) becomes one record.
class OpProfiler {
 public:
  explicit OpProfiler(cudaStream_t stream);
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  void set_op(std::string label, double bytes, double flops);
  void before(const char* kernel);
  void after();
  // Spins the stream for `ms` so the host can queue what follows ahead of the device.
  void hold(double ms);
  // Waits for the stream, returns the records (in launch order) and forgets them.
  std::vector<KernelTime> collect();

 private:
  struct Record {
    std::string op;
    const char* kernel = "";
    double bytes = 0, flops = 0;
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  cudaEvent_t event();

  cudaStream_t stream_;
  std::vector<Record> records_;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::string op_;
  double bytes_ = 0, flops_ = 0;
};

// Measurement only (CudaBackendOptions::skip_kernels): launches to leave out, by kernel name and,
// where grid_x > 0, grid.x. Every result is wrong while any is set.
struct SkipRule {
  std::string name;
  unsigned grid_x = 0;
};
// Throws a CheckFailure naming the launch when `smem` bytes of dynamic shared memory beside the
// kernel's static ones exceed ctx.emulated_smem, or its cluster ctx.emulated_max_cluster. Returns
// the dynamic shared memory to launch with: `smem`, or with ctx.emulated_threads_per_sm set, more,
// so that the device holds no more of these blocks per multiprocessor than the emulated one would.
struct LaunchContext;
size_t check_emulated_launch(const LaunchContext& ctx, const char* name, const void* kernel, size_t smem,
                             unsigned cluster_x, unsigned threads);

// A flash.cuh layout choice (LaunchContext::vision_q_through_k, prefill_small_tiles): 1 takes the
// compact layout of `compact` bytes a block, 0 the usual one of `usual`, and -1 the compact one
// where smem_per_sm holds one block of the usual layout but two of it.
inline bool take_compact_layout(int setting, int smem_per_sm, size_t usual, size_t compact) {
  return setting > 0 ||
         (setting < 0 && blocks_by_smem(smem_per_sm, usual) < 2 && blocks_by_smem(smem_per_sm, compact) >= 2);
}
// Parses "name[@grid_x],..." (empty: none).
std::vector<SkipRule> parse_skip_rules(const std::string& spec);
bool skip_launch(const std::vector<SkipRule>& rules, const char* name, unsigned grid_x);

// Launch settings shared by every kernel launch of one backend.
struct LaunchContext {
  cudaStream_t stream = nullptr;
  bool pdl = false;               // programmatic dependent launch (sm_90+ and enabled)
  bool clusters = false;          // thread-block clusters for the attention key split (sm_90+ and enabled)
  bool token_prepare = true;      // text_qkv_prepare: the vectorised kernel for head dims 64 / 128
  int vision_mt = 2;              // vision attention: 16-row m-tiles per warp (1 or 2)
  bool vision_wgmma = false;      // vision attention at head dim 64 / 72: the sm_90a warpgroup-MMA kernel
  bool prefill_wgmma = false;     // text prefill attention at head dim 128, BF16 cache: the sm_90a warpgroup-MMA kernel
  bool prefill_q_alias = true;    // text prefill attention: Q in a K stage, 3 blocks per SM
  int prefill_key_tiles = 8;      // text prefill attention: key tiles per block before a cluster split
  int decode_split_blocks = 0;    // decode attention: at most this many split blocks (0: kDecodeSplitBlocks)
  int decode_cluster = 0;         // decode attention: splits merged in a cluster of up to this many (< 2: off)
  bool decode_tma = false;        // decode attention: key rounds through TMA where the cache allows (sm_90+)
  int decode_attention_exit = 0;  // measurement only: CudaBackendOptions::decode_attention_exit
  unsigned long long* decode_trace = nullptr;   // measurement only: CudaBackendOptions::decode_attention_trace
  const std::vector<SkipRule>* skip = nullptr;  // measurement only: launches left out (null: none)
  int num_sms = 1;
  // Vision attention through flash.cuh: Q through the K stages (1), not (0), or by smem_per_sm
  // (-1). Text prefill attention through flash.cuh: key tiles of 32 (1), 64 (0), or by
  // smem_per_sm (-1). smem_per_sm: shared memory per multiprocessor, the device's or the emulated
  // one's.
  int vision_q_through_k = -1;
  int prefill_small_tiles = -1;
  int smem_per_sm = 0;
  // Testing only (CudaBackendOptions::emulate_*): the emulated device's opt-in shared memory per
  // block and largest cluster; every launch checks that its dynamic and static shared memory and
  // its cluster fit them (check_emulated_launch). 0: no check.
  int emulated_smem = 0;
  int emulated_max_cluster = 0;
  // Testing only (CudaBackendOptions::emulate_occupancy): the emulated device's threads per
  // multiprocessor (0: launches take the shared memory they ask for), and the device's own
  // shared memory per multiprocessor, which check_emulated_launch pads each block's to fill.
  int emulated_threads_per_sm = 0;
  int device_smem_per_sm = 0;
  int ring_smem = 0;          // dynamic shared memory the bulk-copy ring decode Linear may take (0: sm < 90, none)
  bool wide_fp8 = false;      // FP8 decode Linears of 16+ rows may take the wide kernel by default (sm_90, measured)
  bool fp8_glu_ring = false;  // FP8 gate_up at one row may take the ring by default (sm_9x, measured)
  bool ring_prologue_first = false;        // ring Linears with a prologue: one stage before the PDL wait
  int64_t* wide_launches = nullptr;        // counts the wide kernel's launches (CudaFp8GemmCounts::skinny_wide)
  int64_t* warps16_launches = nullptr;     // the one-tile kernel's 16-warp launches (CudaFp8GemmCounts)
  int64_t* pair_launches = nullptr;        // its launches as cluster pairs (CudaFp8GemmCounts::skinny_pairs)
  int64_t* glu_launches = nullptr;         // decode Linears with the SwiGLU epilogue (CudaFp8GemmCounts::skinny_glu)
  int64_t* prologue_launches = nullptr;    // decode Linears with a fused prologue (CudaFp8GemmCounts::skinny_prologue)
  int64_t* early_launches = nullptr;       // decode Linears launching the next kernel early (CudaFp8GemmCounts)
  int64_t* decode_tma_launches = nullptr;  // decode attentions whose keys came through TMA (CudaFp8GemmCounts)
  int64_t* prefill_wgmma_fp8_launches = nullptr;    // prefill attentions over an FP8 cache by warpgroup MMA
  int64_t* ring_prologue_first_launches = nullptr;  // ring Linears holding stages back (CudaFp8GemmCounts)
  int early_launch = -1;                            // CudaBackendOptions::decode_early_launch
  OpProfiler* profiler = nullptr;                   // non-null while profiling
  SkinnyTuning skinny;
};

// Brackets work that does not go through launch() (cuBLASLt, copies) when profiling.
class ProfileRange {
 public:
  ProfileRange(const LaunchContext& ctx, const char* what) : prof_(ctx.profiler) {
    if (prof_) prof_->before(what);
  }
  ~ProfileRange() {
    if (prof_) prof_->after();
  }
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  OpProfiler* prof_;
};

// ---- elementwise.cu ----
void launch_embedding(const LaunchContext& ctx, Tensor out, const Tensor& table, const Tensor& ids);
void launch_scatter_rows(const LaunchContext& ctx, Tensor x, const Tensor& rows, const Tensor& src, bool accumulate);
void launch_gather_rows(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& rows);
void launch_silu_mul(const LaunchContext& ctx, Tensor out, const Tensor& gate_up);
void launch_add_interpolated(const LaunchContext& ctx, Tensor x, const Tensor& table, const Tensor& idx,
                             const Tensor& w);
void launch_vision_rope(const LaunchContext& ctx, Tensor qkv, const Tensor& rope, int num_heads, int head_dim);
void launch_vision_rope_table(const LaunchContext& ctx, Tensor rope, const Tensor& row_col, const Tensor& angles);
// In place on out [n, N]: out = bf16(act(out)); then, with a residual, out = bf16(residual + out).
void launch_epilogue(const LaunchContext& ctx, Tensor out, Activation act, const Tensor& residual);
// out = x in out's dtype (F32 -> BF16 rounding like core/dtype.h float_to_bf16, or BF16 -> F32).
void launch_convert(const LaunchContext& ctx, Tensor out, const Tensor& x);
void launch_patchify_rgb(const LaunchContext& ctx, Tensor out, const Tensor& rgb, int grid_h, int grid_w, int patch,
                         int merge, int temporal);
// dst rows [0, r1 - r0) = bf16(float(w8[r0 + i, k]) * scale[(r0 + i) / rows_per_scale, k / block]).
void launch_dequant_fp8(const LaunchContext& ctx, void* dst_bf16, const Tensor& w8, const Tensor& scale,
                        int rows_per_scale, int block, int64_t r0, int64_t r1);

// ---- fp8_quant.cu: the W8A8 prefill GEMM's activation quantisation ----
// Activations are quantised per row in groups of kFp8ActGroup columns (one fp32 scale each: the
// granularity of cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F), and every block-scaled
// cuBLASLt call covers a multiple of kFp8GemmRowMultiple rows (cuBLASLt asks for multiples of 4
// in the docs; TransformerEngine observed 8 for 1-D-scaled operands).
inline constexpr int kFp8ActGroup = 128;
inline constexpr int kFp8GemmRowMultiple = 8;
// x [n, K] BF16 (K % 16 == 0) -> q [n, K] E4M3 (row stride K) with s = amax / 448 per (row,
// group) and q = e4m3(x / max(s, 1e-12)) (IEEE divisions, round to nearest even, saturating).
// The scale of row r < main_rows and group g goes to scales[g * main_rows + r]; with
// tail_scales non-null, that of each of the last kFp8GemmRowMultiple rows also goes to
// tail_scales[g * kFp8GemmRowMultiple + (r - (n - kFp8GemmRowMultiple))]. All pointers 16-byte
// aligned.
void launch_quantize_fp8_rows(const LaunchContext& ctx, void* q, float* scales, int64_t main_rows, float* tail_scales,
                              const Tensor& x);

// ---- norm.cu ----
void launch_rms_norm(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, float eps);
void launch_layer_norm(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       float eps);

// ---- skinny.cu: out = epilogue(x · Wᵀ) for x with at most kSkinnyMaxRows rows ----
// `w` is a device LinearWeight with one merged part (BF16, or F8E4M3 with F32 scales whose
// first dimension is ceil(out / block) or out: rows_per_scale = block or 1).
//
// An optional prologue computes x itself from the op that produced it (the backend defers
// RMSNorm and SiLU·mul into the Linear that consumes them, saving a launch and a round trip
// of x): every block recomputes the rows it needs in registers, and the blocks together also
// write x (so x holds exactly what the unfused op would have written).
struct SkinnyPrologue {
  enum Kind { kNone, kRmsNorm, kSiluMul } kind = kNone;
  Tensor src;     // RMSNorm: the input [n, K]; SiLU·mul: gate_up [n, 2K]
  Tensor weight;  // RMSNorm weight [K] (F32 or BF16)
  float eps = 0;
};
// The most rows a prologue takes (CudaBackendOptions::fused_rms_norm_max_rows and
// fused_silu_mul_max_rows choose fewer by default).
inline constexpr int kFusedPrologueMaxRows = 8;
// The prologue's x lives in shared memory (n x K BF16, beside the kernel's own 4.6 KiB).
inline constexpr size_t kFusedPrologueMaxBytes = 40 << 10;
// The decode Linears (launch_skinny_linear) run one block per 16-row tile of their output.
inline constexpr int kSkinnyTileRows = 16;
inline int64_t skinny_tiles(int64_t out_features) {
  return (out_features + kSkinnyTileRows - 1) / kSkinnyTileRows;
}
// Whether a grid is over 1.5 blocks per multiprocessor: where the decode launch rules stop
// treating it as one uneven wave (decode_early_launch, decode_attention_trigger).
inline bool over_one_and_a_half_blocks_per_sm(int64_t blocks, int num_sms) {
  return 2 * blocks > 3 * static_cast<int64_t>(num_sms);
}
// Every block of the Linear computes the prologue of every row again, so it pays up to
// copies_per_sm of those per multiprocessor (CudaBackendOptions::fused_prologue_max_copies_per_sm),
// and past two rows up to kFusedPrologueMaxCopiesPastTwoRows (cuda_backend.h).
inline bool fused_prologue_pays(int64_t out_features, int64_t rows, int num_sms, int copies_per_sm) {
  const int64_t limit = rows > 2 ? std::min(copies_per_sm, kFusedPrologueMaxCopiesPastTwoRows) : copies_per_sm;
  return skinny_tiles(out_features) * rows <= limit * num_sms;
}
// With glu_out (the SwiGLU epilogue; at most kSkinnyMaxRows rows, no bias, activation or
// residual): w = [gate; up] of 2 I rows (I % 8 == 0), out [n, 2 I] as without it, and glu_out
// [n, I] = SiLU·mul of out exactly as launch_silu_mul writes it: in the Linear's epilogue where the
// chosen kernel takes it (one-tile, ring), else by a launch_silu_mul after it.
// follows_attention: x is the decode attention's output (o_proj), which never launches the next
// kernel early (CudaBackendOptions::decode_early_launch).
void launch_skinny_linear(const LaunchContext& ctx, Tensor out, const Tensor& x, const LinearWeight& w,
                          const Epilogue& ep, const SkinnyPrologue& pro = {}, const Tensor& glu_out = {},
                          bool follows_attention = false);
// Lets the one-tile kernels with a SiLU·mul prologue stage gate and up in up to twice
// kFusedPrologueMaxBytes of shared memory, and the ring and wide kernels take up to ring_smem
// (ring_smem_budget of the device's opt-in limit; 0: none), per backend, before any launch.
void configure_skinny(int ring_smem);
// The shared memory the ring kernels may take beside their own static shared memory on a device
// of `smem_optin` bytes per block (at most 200 KB): what LaunchContext::ring_smem holds on sm_90+.
int ring_smem_budget(int smem_optin);

// ---- argmax.cu ----
// ids[r] = the first index of row r's largest logit (NaN skipped). `scratch` holds
// kArgmaxMaxRows keys and counters, zero (and left zero).
void launch_argmax_rows(const LaunchContext& ctx, Tensor ids, const Tensor& logits, void* scratch,
                        size_t scratch_bytes);
// keys[r] = row r's k largest keys, descending (Backend::top_k_rows, backend/top_k.h); k <= kTopKMaxKeys.
inline constexpr int kTopKMaxKeys = 1024;
void launch_top_k_rows(const LaunchContext& ctx, Tensor keys, const Tensor& logits);

// ---- decode_stack.cu: Backend::decoder_stack for one sequence (sm_90+) ----
inline constexpr int kStackMaxLayers = 40;
struct DecodeStackArgs {
  const DecoderStack* stack = nullptr;
  Tensor x;  // [1, H], in place
  DecoderStackBuffers buffers;
  const TextBatch* batch = nullptr;
  KvCacheView cache;
  float* partial = nullptr;  // split partials (the decode attention scratch)
  size_t partial_bytes = 0;
  uint32_t* counters = nullptr;  // decode_stack_counter_count() counters, zero (and left zero)
  int max_smem = 0;              // opt-in shared memory per block
  int max_splits = 0;            // attention splits per kv head; 0 = multiprocessors / kv heads
  long long* trace = nullptr;    // diagnostics: [layers][blocks][kDecodeStackStamps] clock64() stamps
  int debug = 0;                 // diagnostics: parts switched off (CudaBackendOptions::decode_stack_debug)
};
// Stamps per block and layer of a traced launch: layer start, qkv ready, qkv done, attention
// start, attention done, o ready, o done, gate_up ready, gate_up done, down ready, down done.
inline constexpr int kDecodeStackStamps = 11;
size_t decode_stack_counter_count();
// Launches the fused stack, or returns false (nothing launched) for a shape, dtype or device it
// does not handle; the caller then runs the layers op by op.
bool launch_decode_stack(const LaunchContext& ctx, const DecodeStackArgs& args);

// Sets the kernels' shared-memory limits; call once per device before the first launch.
void configure_vision_attention();
// Returns the largest decode-attention cluster (LaunchContext::decode_cluster; 0 without clusters,
// or where the device cannot hold a cluster of 8): up to 16 where non_portable_clusters (sm_90 /
// sm_100 allow sizes past 8) and the device can hold one.
int configure_text_attention(bool clusters, bool non_portable_clusters);

// ---- attention_vision.cu ----
void launch_vision_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                             int num_heads, int head_dim, float scale);
// ---- wgmma.cu, attention_vision_wgmma.cu (sm_90a) ----
// Whether the warpgroup-MMA attention kernels are built and usable on a device of this compute
// capability (sm_90 exactly, and the driver's tensor-map encoder found).
bool wgmma_attention_available(int compute_capability);
void configure_vision_wgmma();
// Launches it for head dim 64 or 72 when ctx.vision_wgmma, or returns false (nothing launched).
bool launch_vision_attention_wgmma(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                                   int num_heads, int head_dim, float scale);
// ---- attention_prefill_wgmma.cu (sm_90a) ----
void configure_prefill_wgmma();
// Causal prefill attention at head dim 128 over a BF16 cache with pages of a power of two >= 8
// tokens when ctx.prefill_wgmma, or returns false (nothing launched).
bool launch_text_prefill_attention_wgmma(const LaunchContext& ctx, Tensor out, const Tensor& qkv,
                                         const TextBatch& batch, const KvCacheView& cache, int layer,
                                         const TextAttentionShape& shape, float scale);

// ---- attention_text.cu (prefill, q/k norm + RoPE) and attention_decode.cu ----
int configure_decode_attention(bool clusters, bool non_portable);
struct MropeParams {
  float inv_freq[128];
  uint8_t axis[128];
  int half = 0;  // head_dim / 2
};
void launch_text_qkv_prepare(const LaunchContext& ctx, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm,
                             float eps, const MropeParams& rope, const TextBatch& batch, const KvCacheView& cache,
                             int layer, const TextAttentionShape& shape);
void launch_text_prefill_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale);
// Split-K over the cache: `partial` holds the splits' fp32 partials, `counters` (zero, and left
// zero) one arrival counter per (sequence, kv head); the last split to finish merges.
// `prepare` non-null: the kernel also does text_qkv_prepare's work for the step's rows (q/k
// RMSNorm + M-RoPE, K/V into the cache at batch.slots; q is not written back to qkv), which
// requires decode_attention_fusable(shape).
struct FusedPrepare {
  Tensor q_norm, k_norm;  // [head_dim] F32 or BF16
  float eps = 0;
  MropeParams rope;
};
bool decode_attention_fusable(const TextAttentionShape& shape);
// The decode attention's per-step table (cuda_decode_step_table_bytes): layer 0's launch of a
// step writes it (mode 1), the later layers' launches of the same step read it (mode 2), so that
// their blocks gather the step's context lengths, first pages and rotary angles with one load.
struct DecodeStepTable {
  int32_t* prep = nullptr;  // [kDecodeSplitBlocks][max_head_dim + 2]
  int32_t* keys = nullptr;  // [kDecodeSplitBlocks][kDecodeStepKeyInts]
  int max_head_dim = 0;
  int mode = 0;
};
// Device memory the decode attention's blocks ask L2 for (CudaBackendOptions::decode_l2_prefetch_
// bytes), where a block's split takes one round of keys: up to two regions, 16-byte aligned, sizes
// multiples of 16 (0: none). Only a hint: the results do not depend on it.
struct DecodeL2Prefetch {
  const void* data[2] = {nullptr, nullptr};
  size_t bytes[2] = {0, 0};
};
// trigger: when a block lets the next kernel launch (CudaBackendOptions::decode_attention_
// trigger, 0..3). Returns the step table mode it used (0 where the table does not apply: no
// fused prepare, too many sequences or splits, pages under 3 tokens).
int launch_text_decode_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                 const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale,
                                 float* partial, size_t partial_bytes, uint32_t* counters,
                                 const FusedPrepare* prepare = nullptr, const DecodeStepTable* step = nullptr,
                                 int trigger = 1, const DecodeL2Prefetch& l2 = {});

}  // namespace qvl::cuda
