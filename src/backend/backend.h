// The backend op interface: everything the model computes goes through these calls, and the
// model is written once against them (model/). Two implementations: backend/cpu (the oracle:
// plain loops, fp32 activations and accumulation, OpenMP) and backend/cuda (kernels, cuBLASLt,
// graphs). Performance tricks live inside the ops; the op set is chosen so that the fusions a
// fast backend wants (stacked q|k|v and gate|up Linears, bias/activation/residual epilogues,
// q/k-norm + M-RoPE + KV store in one pass) are expressible without the model knowing.
//
// Conventions:
// - Tensors are contiguous row-major views on this backend's device (core/tensor.h).
// - Activations have dtype activation_dtype() (F32 on CPU, BF16 on CUDA); weights keep their
//   checkpoint dtype (BF16, or FP8 E4M3 + block scales); reductions accumulate in fp32.
// - Ops are asynchronous on the backend's stream; copy_to_host and synchronize() wait.
// - Shapes are checked with QVL_CHECK: a mismatch is a bug in the caller, not user input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/status.h"
#include "core/tensor.h"

namespace qvl {

// One checkpoint Linear: weight [out, in] (BF16/F32, or F8E4M3 with scale_inv
// [ceil(out/B), ceil(in/B)] F32/BF16, the dequantisation multiplier of each B x B block).
struct LinearPart {
  Tensor weight;
  Tensor scale_inv;  // empty unless weight is F8E4M3
};

// A Linear as the model uses it: out = x · Wᵀ + bias, where W is the parts stacked along the
// output dimension (q|k|v, gate|up). A backend may merge the parts into one buffer.
struct LinearWeight {
  std::vector<LinearPart> parts;
  Tensor bias;  // [out_features] or empty
  int64_t out_features = 0;
  int64_t in_features = 0;
  int block_size = 128;  // FP8 block edge (weight_block_size), both dims

  bool is_fp8() const { return !parts.empty() && parts[0].weight.dtype == DType::kF8E4M3; }
};

enum class Activation : uint8_t {
  kNone,
  kGeluTanh,  // gelu_pytorch_tanh: 0.5z(1 + tanh(sqrt(2/pi)(z + 0.044715 z^3)))
  kGeluErf,   // nn.GELU(): 0.5z(1 + erf(z / sqrt 2))
};

// out = act(x · Wᵀ + bias) + residual   (residual may alias out; empty = none)
struct Epilogue {
  Activation act = Activation::kNone;
  Tensor residual;
};

// Shape of the text attention (grouped-query: q head i reads kv head i / (Hq/Hkv)).
struct TextAttentionShape {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// M-RoPE parameters: inv_freq[j] = 1 / theta^(2j/head_dim), and axis(j) in {0:T, 1:H, 2:W}.
struct MropeSpec {
  std::vector<float> inv_freq;  // head_dim / 2 entries
  std::vector<uint8_t> axis;    // head_dim / 2 entries
};

// The paged KV cache: one region of `num_pages` pages; a page holds `page_size` tokens of
// every layer: page p, layer l, K then V, each [page_size, Hkv, head_dim].
struct KvCacheView {
  void* base = nullptr;
  DType dtype = DType::kBF16;
  int64_t num_pages = 0;
  int page_size = 16;
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;

  size_t token_bytes_per_layer() const { return static_cast<size_t>(num_kv_heads) * head_dim * dtype_size(dtype); }
  size_t layer_bytes() const { return 2 * token_bytes_per_layer() * page_size; }  // K and V
  size_t page_bytes() const { return layer_bytes() * num_layers; }
};

// One forward step over a batch of sequences (prefill chunks and decode tokens mixed). Every
// tensor is a device tensor the caller filled; the CUDA backend captures graphs over them, so
// their addresses stay fixed across steps of one bucket.
struct TextBatch {
  int num_seqs = 0;
  int num_tokens = 0;         // rows of this step, all sequences together
  int max_pages_per_seq = 0;  // columns of page_table
  int max_context = 0;        // host-side bound on context_len, for work partitioning
  Tensor query_start;         // I32 [num_seqs + 1]: rows of sequence s are [qs[s], qs[s+1])
  Tensor context_len;         // I32 [num_seqs]: tokens in the cache after this step's writes
  Tensor page_table;          // I32 [num_seqs, max_pages_per_seq]
  Tensor slots;               // I32 [num_tokens]: page * page_size + offset for each new token
  Tensor positions;           // I32 [num_tokens, 3]: M-RoPE (T, H, W) positions
};

// Non-causal attention over independent segments (one per image / temporal slice).
struct VisionSegments {
  Tensor cu_seqlens;                     // I32 [num_segments + 1] on device
  std::vector<int32_t> host_cu_seqlens;  // same values, for work partitioning
  int max_seqlen = 0;
};

// Owned device memory. Freed by the backend that made it when the last copy goes away.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t size, std::shared_ptr<void> owner)
      : data_(data), size_(size), owner_(std::move(owner)) {}
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<void> owner_;
};

// A device address range reserved up front and backed by memory on demand, so that what lives
// in it (the KV page pool) can grow without moving: [base(), base() + committed_bytes()) is
// usable, and base() never changes.
class DeviceRegion {
 public:
  virtual ~DeviceRegion() = default;
  virtual void* base() const = 0;
  virtual size_t reserved_bytes() const = 0;   // the most it can ever hold
  virtual size_t committed_bytes() const = 0;  // backed by memory now
  // Backs at least [base, base + bytes) with memory (rounded up to the backend's granularity).
  // A resource-exhausted Status naming the sizes when the device has no memory left, out-of-range
  // past reserved_bytes(). Never shrinks; a smaller `bytes` is a no-op.
  virtual Status grow_to(size_t bytes) = 0;
};

// Device memory the caller owns, handed out front to back (kAlignment-aligned) to the weights a
// backend loads while it is set (Backend::set_weight_placement): how layer offload lays one
// decoder layer out in a staging buffer exactly as the backend would hold it.
class WeightPlacement {
 public:
  static constexpr size_t kAlignment = 256;

  WeightPlacement(void* base, size_t capacity) : base_(static_cast<char*>(base)), capacity_(capacity) {}

  // The next `bytes`, or null when they do not fit (then `wanted()` says how much would have).
  void* take(size_t bytes) {
    const size_t start = (wanted_ + kAlignment - 1) / kAlignment * kAlignment;
    wanted_ = start + bytes;
    if (wanted_ > capacity_) return nullptr;
    used_ = wanted_;
    return base_ + start;
  }
  void* base() const { return base_; }
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }      // bytes handed out (end of the last piece that fit)
  size_t wanted() const { return wanted_; }  // bytes asked for, fitting or not

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t wanted_ = 0;
};

// Prefetch slots: an offloaded layer streams into one of this many staging buffers while the
// layer before it computes out of the other (memory/offload.h).
inline constexpr int kPrefetchSlots = 2;

// One decoder layer's weights, by reference, for Backend::decoder_stack (model/weights.h's
// DecoderLayerWeights, which the backend does not know).
struct DecoderLayerRefs {
  const Tensor* input_norm = nullptr;
  const Tensor* post_attention_norm = nullptr;
  const Tensor* q_norm = nullptr;
  const Tensor* k_norm = nullptr;
  const LinearWeight* qkv = nullptr;
  const LinearWeight* o = nullptr;
  const LinearWeight* gate_up = nullptr;
  const LinearWeight* down = nullptr;
};

// The text decoder's layers as one unit (Backend::decoder_stack): what decoder_layer computes,
// for every layer in order.
struct DecoderStack {
  std::vector<DecoderLayerRefs> layers;
  TextAttentionShape shape;
  const MropeSpec* rope = nullptr;
  float eps = 1e-6f;
  float scale = 1.0f;  // attention softmax scale
  int64_t hidden = 0, intermediate = 0;
};

// Step buffers decoder_stack may use (arena tensors of the caller, one row each):
// qkv [1, (Hq + 2·Hkv)·dh], attn [1, Hq·dh], gate_up [1, 2I].
struct DecoderStackBuffers {
  Tensor qkv, attn, gate_up;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  virtual DType activation_dtype() const = 0;

  // ---- memory ----
  // Allocates `bytes` of device memory; a resource-exhausted Status when it cannot.
  virtual Result<DeviceBuffer> allocate(size_t bytes, const std::string& tag) = 0;
  virtual void copy_to_device(Tensor dst, const void* host_src) = 0;
  virtual void copy_to_host(void* host_dst, const Tensor& src) = 0;  // waits for the copy
  virtual void copy(Tensor dst, const Tensor& src) = 0;              // device to device
  virtual void synchronize() = 0;
  // copy_to_device from memory allocate_host returned, without waiting for the copy: it is
  // ordered with the ops around it, and `host_src` must stay unchanged until the next
  // synchronize() (or copy_to_host). The default is copy_to_device.
  virtual void copy_to_device_async(Tensor dst, const void* host_src) { copy_to_device(dst, host_src); }

  // ---- weights ----
  // Makes a host tensor (e.g. a view into an mmap'd checkpoint) usable by this backend,
  // converted to `as` (the CPU backend returns the view itself when no conversion is needed).
  virtual Result<Tensor> load_tensor(const Tensor& host, DType as) = 0;
  // Makes host Linear parts (+ optional bias) usable by this backend; weights keep their dtype.
  virtual Result<LinearWeight> load_linear(std::span<const LinearPart> host_parts, const Tensor& host_bias,
                                           int block_size) = 0;

  // ---- ops ----
  // out[i] = table[ids[i]]                    out [n, H], table [V, H], ids I32 [n]
  virtual void embedding(Tensor out, const Tensor& table, const Tensor& ids) = 0;
  // x[rows[i]] = src[i] (accumulate: +=)       x [n, H], rows I32 [m], src [m, H]
  virtual void scatter_rows(Tensor x, const Tensor& rows, const Tensor& src, bool accumulate) = 0;
  // RMSNorm over the last dim (= weight size), per row: w * (x / sqrt(mean(x^2) + eps)).
  virtual void rms_norm(Tensor out, const Tensor& x, const Tensor& weight, float eps) = 0;
  // LayerNorm over the last dim with affine weight and bias, biased variance.
  virtual void layer_norm(Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) = 0;
  // out = act(x · Wᵀ + b) + residual          out [n, out_features], x [n, in_features]
  virtual void linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) = 0;
  // out = silu(gate_up[:, :I]) * gate_up[:, I:]   out [n, I], gate_up [n, 2I]
  virtual void silu_mul(Tensor out, const Tensor& gate_up) = 0;
  // out = x in out's dtype, element by element (same element count): F32 -> BF16 rounds to
  // nearest even (core/dtype.h float_to_bf16), BF16 -> F32 is exact, equal dtypes copy.
  virtual void convert(Tensor out, const Tensor& x);
  // Vision input from a resized RGB8 image: rgb U8 [grid_h·patch · grid_w·patch · 3] (rows of
  // interleaved RGB) -> out [grid_h·grid_w, 3·temporal·patch²] in out's dtype (F32, or BF16
  // rounded to nearest even): (u8 − 127.5f) / 127.5f in float32, rows in the processor's merge
  // order, the temporal copies identical: image/image.h patchify_into, bit for bit.
  virtual void patchify_rgb(Tensor out, const Tensor& rgb, int grid_h, int grid_w, int patch, int merge, int temporal);
  // x += Σ_k w[i,k] · table[idx[i,k]]          x [n, D], table [P, D], idx I32 [n, 4], w F32 [n, 4]
  virtual void add_interpolated(Tensor x, const Tensor& table, const Tensor& idx, const Tensor& w) = 0;

  // Vision: rotate q and k of packed qkv [N, 3·nh·dh] in place with the 2-D rotary table
  // rope [N, 2, dh] (F32: cos then sin); x' = x·cos + rotate_half(x)·sin.
  virtual void vision_rope(Tensor qkv, const Tensor& rope, int num_heads, int head_dim) = 0;
  // Vision: the rotary table from its per-position factors (core/vision_rope.h
  // expand_vision_rope, bit for bit): rope F32 [N, 2, 4q] from row_col I32 [N, 2] and
  // angles F32 [L, 2, q] (cos, sin of p·inv[e] for positions p < L).
  virtual void vision_rope_table(Tensor rope, const Tensor& row_col, const Tensor& angles);
  // Vision: softmax(q·kᵀ·scale)·v inside each segment (non-causal), from packed qkv.
  // out [N, nh·dh]
  virtual void vision_attention(Tensor out, const Tensor& qkv, const VisionSegments& seg, int num_heads, int head_dim,
                                float scale) = 0;

  // Text: for packed qkv [n, (Hq + 2·Hkv)·dh]: RMSNorm each q and k head (q_norm, k_norm
  // [dh]), apply interleaved M-RoPE at batch.positions, store k and v into the cache at
  // batch.slots. q is left normalised and rotated in place.
  virtual void text_qkv_prepare(Tensor qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                const MropeSpec& rope, const TextBatch& batch, const KvCacheView& cache, int layer,
                                const TextAttentionShape& shape) = 0;
  // Text: causal attention of each new row over its sequence's cached tokens
  // (row at absolute position p sees cache tokens [0, p]). out [n, Hq·dh].
  virtual void text_attention(Tensor out, const Tensor& qkv, const TextBatch& batch, const KvCacheView& cache,
                              int layer, const TextAttentionShape& shape, float scale) = 0;
  // out[i] = x[rows[i]]                        out [m, H], rows I32 [m]
  virtual void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) = 0;
  // Greedy sampling: ids[i] = the index of the largest entry of logits row i, the first one on
  // ties (torch.argmax, std::max_element); NaN entries are skipped (a row of NaN gives 0), -0
  // equals +0.                                 ids I32 [r], logits [r, V] (F32 or BF16)
  virtual void argmax_rows(Tensor ids, const Tensor& logits);
  // Candidate sampling: keys[i] = the k largest entries of logits row i as 64-bit keys (value,
  // then index: backend/top_k.h), descending, 0 past the row's last entry; kTopKFallback when
  // the row holds a NaN or the backend could not hold its candidates (the caller then takes
  // the whole row).                           keys I64 [r, k], logits [r, V] (F32 or BF16)
  virtual void top_k_rows(Tensor keys, const Tensor& logits);
  // Optional fused path: every decoder layer of a step, x [n, H] in place, computing what the
  // per-layer ops (rms_norm, linear, text_qkv_prepare, text_attention, silu_mul) compute, K/V
  // into the cache as text_qkv_prepare stores them. Returns false, having done nothing, when the
  // backend has no fused path for this step (the caller then runs the layers op by op).
  virtual bool decoder_stack(Tensor x, const DecoderStack& stack, const TextBatch& batch, const KvCacheView& cache,
                             const DecoderStackBuffers& buffers) {
    (void)x, (void)stack, (void)batch, (void)cache, (void)buffers;
    return false;
  }

  // ---- growable memory ----
  // Reserves `max_bytes` of address space for a region that grows in place (the KV pool);
  // nothing need be committed yet. The default allocates all of it at once with allocate().
  virtual Result<std::unique_ptr<DeviceRegion>> reserve_region(size_t max_bytes, const std::string& tag);

  // ---- recorded op sequences (the decode step as a CUDA graph) ----
  // Runs `record`, a sequence of this backend's ops, as one replayable unit named `key`. The
  // first call with a key runs `record` and keeps a recording of what it launched; later calls
  // with that key replay the recording and do not call `record`. A recording binds every tensor
  // address and every host-side value the ops saw (shapes, num_seqs, max_pages_per_seq,
  // max_context, ...), so the key must name all of them; between replays only the contents of
  // device memory may change. `record` must not copy to or from the host, allocate, or
  // synchronize. The default (and the CPU backend) just runs `record` every time.
  virtual void run_graph(const std::string& key, const std::function<void()>& record) { record(); }
  // Forgets every recording (before freeing memory that a recording uses).
  virtual void clear_graphs() {}

  // ---- loading ----
  // Called once the model's weights are loaded: a backend may release what it kept to upload
  // them (CUDA: its pinned staging buffers). Loading more afterwards still works.
  virtual void end_loading() {}

  // ---- layer offload (memory/offload.h) ----
  // Whether the four calls below work (the defaults fail).
  virtual bool can_stream_weights() const { return false; }
  // Host memory this backend can copy from asynchronously (CUDA: pinned, cudaHostAlloc); the
  // DeviceBuffer holds a host address. A resource-exhausted Status naming the size when it fails.
  virtual Result<DeviceBuffer> allocate_host(size_t bytes, const std::string& tag);
  // While `placement` is set, load_tensor and load_linear put every byte they keep in it (in call
  // order) instead of allocating, copying even where they would otherwise keep a view of the host
  // tensor; a resource-exhausted Status from them when it is full. nullptr: allocate again.
  virtual void set_weight_placement(WeightPlacement* placement);
  // Copies `bytes` from `host_src` (from allocate_host) to device memory `dst` on a second
  // stream, overlapping the ops that follow: the copy starts once every op issued before this
  // call has finished (so it may overwrite what they read), and ops issued after
  // wait_prefetch(slot) see the data. slot < kPrefetchSlots; one copy in flight per slot.
  // Both may be recorded by run_graph (the copy becomes part of the recording).
  virtual void prefetch(int slot, void* dst, const void* host_src, size_t bytes);
  virtual void wait_prefetch(int slot);
};

namespace detail {
// reserve_region's default: one allocation of the whole range, all of it committed.
class WholeRegion final : public DeviceRegion {
 public:
  explicit WholeRegion(DeviceBuffer buffer) : buffer_(std::move(buffer)) {}
  void* base() const override { return buffer_.data(); }
  size_t reserved_bytes() const override { return buffer_.size(); }
  size_t committed_bytes() const override { return buffer_.size(); }
  Status grow_to(size_t bytes) override {
    if (bytes > buffer_.size())
      return out_of_range("region: " + std::to_string(bytes) + " bytes asked, " + std::to_string(buffer_.size()) +
                          " reserved");
    return Status::ok();
  }

 private:
  DeviceBuffer buffer_;
};
}  // namespace detail

inline Result<std::unique_ptr<DeviceRegion>> Backend::reserve_region(size_t max_bytes, const std::string& tag) {
  Result<DeviceBuffer> buffer = allocate(max_bytes, tag);
  if (!buffer.is_ok()) return buffer.status();
  return std::unique_ptr<DeviceRegion>(new detail::WholeRegion(std::move(buffer).value()));
}

inline void Backend::argmax_rows(Tensor, const Tensor&) {
  QVL_CHECK(false) << name() << ": argmax_rows is not implemented";
}

inline void Backend::top_k_rows(Tensor, const Tensor&) {
  QVL_CHECK(false) << name() << ": top_k_rows is not implemented";
}

inline void Backend::patchify_rgb(Tensor, const Tensor&, int, int, int, int, int) {
  QVL_CHECK(false) << name() << ": patchify_rgb is not implemented";
}

inline void Backend::vision_rope_table(Tensor, const Tensor&, const Tensor&) {
  QVL_CHECK(false) << name() << ": vision_rope_table is not implemented";
}

inline void Backend::convert(Tensor out, const Tensor& x) {
  QVL_CHECK(out.dtype == x.dtype) << name() << ": convert " << x.describe() << " -> " << out.describe();
  copy(out, x);
}

inline Result<DeviceBuffer> Backend::allocate_host(size_t bytes, const std::string& tag) {
  return unimplemented(tag + ": the " + name() + " backend cannot stream weights from host memory");
}
inline void Backend::set_weight_placement(WeightPlacement*) {
  QVL_CHECK(false) << name() << ": set_weight_placement on a backend that cannot stream weights";
}
inline void Backend::prefetch(int, void*, const void*, size_t) {
  QVL_CHECK(false) << name() << ": prefetch on a backend that cannot stream weights";
}
inline void Backend::wait_prefetch(int) {
  QVL_CHECK(false) << name() << ": wait_prefetch on a backend that cannot stream weights";
}

// Makes the CPU backend (always available).
std::unique_ptr<Backend> make_cpu_backend(int num_threads);

}  // namespace qvl
