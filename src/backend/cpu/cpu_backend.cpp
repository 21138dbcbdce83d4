// The CPU backend: the oracle every other backend is compared with. Device memory is host
// memory; activations are F32; weights stay views into the checkpoint (mmap) in their stored
// dtype, and only small tensors the ops want in F32 (biases, norm weights, FP8 scales when
// stored as BF16) are converted and owned by the backend. The elementwise and row ops live
// here; Linear and attention kernels in cpu_linear.cpp / cpu_attention.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/top_k.h"
#include "core/vision_rope.h"
#include "image/image.h"

namespace qvl {
namespace cpu {

bool is_plain_float(DType dt) {
  return dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16;
}

void to_f32(const void* src, DType dt, int64_t offset, int64_t n, float* dst) {
  switch (dt) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(src) + offset, n * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(s[i]);
      return;
    }
    default:
      QVL_CHECK(false) << "to_f32: " << dtype_name(dt) << " is not a plain float dtype";
  }
}

}  // namespace cpu

namespace {

using cpu::check_f32;

std::string shape_of(const Tensor& t) {
  return t.describe();
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {}

  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::kF32; }

  // ---- memory ----
  Result<DeviceBuffer> allocate(size_t bytes, const std::string& tag) override {
    size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) return resource_exhausted("cpu: cannot allocate " + std::to_string(bytes) + " bytes for " + tag);
    return DeviceBuffer(p, bytes, std::shared_ptr<void>(p, [](void* q) { std::free(q); }));
  }
  void copy_to_device(Tensor dst, const void* host_src) override { std::memcpy(dst.data, host_src, dst.nbytes()); }
  void copy_to_host(void* host_dst, const Tensor& src) override { std::memcpy(host_dst, src.data, src.nbytes()); }
  void copy(Tensor dst, const Tensor& src) override {
    QVL_CHECK_EQ(dst.nbytes(), src.nbytes()) << "copy " << src.describe() << " -> " << dst.describe();
    std::memmove(dst.data, src.data, src.nbytes());
  }
  void synchronize() override {}
  void argmax_rows(Tensor ids, const Tensor& logits) override {
    QVL_CHECK(ids.dtype == DType::kI32 && logits.ndim == 2 && ids.numel() == logits.dim(0))
        << "argmax_rows " << ids.describe() << " of " << logits.describe();
    QVL_CHECK(logits.dtype == DType::kF32 || logits.dtype == DType::kBF16) << "argmax over " << logits.describe();
    const int64_t V = logits.dim(1);
    std::vector<float> row(static_cast<size_t>(V));
    for (int64_t r = 0; r < logits.dim(0); ++r) {
      cpu::to_f32(logits.data, logits.dtype, r * V, V, row.data());
      int64_t best = -1;
      for (int64_t i = 0; i < V; ++i) {
        if (best < 0 ? !std::isnan(row[i]) : row[i] > row[best]) best = i;
      }
      ids.as<int32_t>()[r] = static_cast<int32_t>(std::max<int64_t>(best, 0));
    }
  }
  void top_k_rows(Tensor keys, const Tensor& logits) override {
    QVL_CHECK(keys.dtype == DType::kI64 && keys.ndim == 2 && logits.ndim == 2 && keys.dim(0) == logits.dim(0))
        << "top_k_rows " << keys.describe() << " of " << logits.describe();
    QVL_CHECK(logits.dtype == DType::kF32 || logits.dtype == DType::kBF16) << "top_k over " << logits.describe();
    const int64_t V = logits.dim(1), k = keys.dim(1);
    std::vector<float> row(static_cast<size_t>(V));
    for (int64_t r = 0; r < logits.dim(0); ++r) {
      cpu::to_f32(logits.data, logits.dtype, r * V, V, row.data());
      top_k_keys(row, std::span(reinterpret_cast<uint64_t*>(keys.as<int64_t>()) + r * k, static_cast<size_t>(k)));
    }
  }
  void convert(Tensor out, const Tensor& x) override {
    QVL_CHECK_EQ(out.numel(), x.numel()) << "convert " << x.describe() << " -> " << out.describe();
    const int64_t n = x.numel();
    if (out.dtype == x.dtype) {
      copy(out, x);
    } else if (x.dtype == DType::kF32 && out.dtype == DType::kBF16) {
      const float* s = x.as<const float>();
      uint16_t* d = out.as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
    } else if (x.dtype == DType::kBF16 && out.dtype == DType::kF32) {
      cpu::to_f32(x.data, x.dtype, 0, n, out.as<float>());
    } else {
      QVL_CHECK(false) << "convert " << x.describe() << " -> " << out.describe() << ": F32 <-> BF16 only";
    }
  }

  void patchify_rgb(Tensor out, const Tensor& rgb, int grid_h, int grid_w, int patch, int merge,
                    int temporal) override {
    const int64_t rows = int64_t{grid_h} * grid_w, cols = 3LL * temporal * patch * patch;
    QVL_CHECK(rgb.dtype == DType::kU8 && rgb.numel() == rows * patch * patch * 3)
        << "patchify_rgb: " << rgb.describe() << " for a " << grid_h << "x" << grid_w << " grid of patch " << patch;
    QVL_CHECK(out.ndim == 2 && out.dim(0) == rows && out.dim(1) == cols) << "patchify_rgb into " << out.describe();
    if (out.dtype == DType::kF32) {
      image::patchify_into(rgb.as<const uint8_t>(), grid_h * patch, grid_w * patch, patch, merge, temporal,
                           out.as<float>());
      return;
    }
    std::vector<float> f32(static_cast<size_t>(rows * cols));
    image::patchify_into(rgb.as<const uint8_t>(), grid_h * patch, grid_w * patch, patch, merge, temporal, f32.data());
    convert(out, Tensor(f32.data(), DType::kF32, {rows, cols}, Device::kCpu));
  }

  // ---- weights ----
  Result<Tensor> load_tensor(const Tensor& host, DType as) override {
    if (host.dtype == as && !placement_) return host;
    if (host.dtype == as) {  // a weight placement wants its own copy
      Tensor t = host;
      QVL_ASSIGN_OR_RETURN(t.data, store(t.nbytes(), "tensor " + shape_of(host)));
      std::memcpy(t.data, host.data, t.nbytes());
      return t;
    }
    if (!cpu::is_plain_float(host.dtype) || !(as == DType::kF32 || as == DType::kBF16)) {
      return unimplemented("cpu: cannot convert a " + std::string(dtype_name(host.dtype)) + " tensor " +
                           shape_of(host) + " to " + std::string(dtype_name(as)));
    }
    Tensor t = host;
    t.dtype = as;
    QVL_ASSIGN_OR_RETURN(t.data, store(t.nbytes(), "tensor " + shape_of(host)));
    const int64_t n = host.numel();
    if (as == DType::kF32) {
      cpu::to_f32(host.data, host.dtype, 0, n, t.as<float>());
    } else {
      std::vector<float> tmp(n);
      cpu::to_f32(host.data, host.dtype, 0, n, tmp.data());
      uint16_t* d = t.as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(tmp[i]);
    }
    return t;
  }

  Result<LinearWeight> load_linear(std::span<const LinearPart> host_parts, const Tensor& host_bias,
                                   int block_size) override {
    if (host_parts.empty()) return invalid_argument("cpu: a Linear needs at least one weight part");
    LinearWeight w;
    w.block_size = block_size;
    const DType dt = host_parts[0].weight.dtype;
    w.in_features = host_parts[0].weight.ndim == 2 ? host_parts[0].weight.dim(1) : -1;
    for (size_t i = 0; i < host_parts.size(); ++i) {
      const LinearPart& p = host_parts[i];
      const std::string what = "Linear part " + std::to_string(i) + " " + shape_of(p.weight);
      if (p.weight.ndim != 2 || p.weight.dim(1) != w.in_features)
        return invalid_argument(what + ": expected [out, " + std::to_string(w.in_features) + "]");
      if (p.weight.dtype != dt) return invalid_argument(what + ": parts of one Linear must share a dtype");
      LinearPart q;
      QVL_ASSIGN_OR_RETURN(q.weight, load_tensor(p.weight, p.weight.dtype));  // the view itself, unless placed
      if (dt == DType::kF8E4M3) {
        if (block_size <= 0 || 256 % block_size != 0)
          return unimplemented(what + ": FP8 block size " + std::to_string(block_size) +
                               " (the CPU backend takes block edges that divide 256)");
        const int64_t sr = (p.weight.dim(0) + block_size - 1) / block_size;
        const int64_t sc = (w.in_features + block_size - 1) / block_size;
        if (p.scale_inv.empty() || p.scale_inv.ndim != 2 || p.scale_inv.dim(0) != sr || p.scale_inv.dim(1) != sc ||
            !cpu::is_plain_float(p.scale_inv.dtype)) {
          return invalid_argument(what + ": FP8 weight needs scale_inv [" + std::to_string(sr) + ", " +
                                  std::to_string(sc) + "] F32/BF16, got " +
                                  (p.scale_inv.empty() ? std::string("none") : shape_of(p.scale_inv)));
        }
        QVL_ASSIGN_OR_RETURN(q.scale_inv, load_tensor(p.scale_inv, DType::kF32));
      } else if (cpu::is_plain_float(dt)) {
        if (!p.scale_inv.empty()) return invalid_argument(what + ": scale_inv given for a non-FP8 weight");
      } else {
        return unimplemented(what + ": weight dtype " + std::string(dtype_name(dt)) + " is not supported");
      }
      w.out_features += p.weight.dim(0);
      w.parts.push_back(q);
    }
    if (!host_bias.empty()) {
      if (host_bias.numel() != w.out_features)
        return invalid_argument("Linear bias " + shape_of(host_bias) + ": expected " + std::to_string(w.out_features) +
                                " elements");
      QVL_ASSIGN_OR_RETURN(w.bias, load_tensor(host_bias, DType::kF32));
    }
    return w;
  }

  // ---- layer offload: "host" memory is ordinary memory and a prefetch is a plain copy ----
  bool can_stream_weights() const override { return true; }
  Result<DeviceBuffer> allocate_host(size_t bytes, const std::string& tag) override { return allocate(bytes, tag); }
  void set_weight_placement(WeightPlacement* placement) override { placement_ = placement; }
  void prefetch(int slot, void* dst, const void* host_src, size_t bytes) override {
    QVL_CHECK(slot >= 0 && slot < kPrefetchSlots) << "prefetch slot " << slot;
    std::memcpy(dst, host_src, bytes);
  }
  void wait_prefetch(int slot) override { QVL_CHECK(slot >= 0 && slot < kPrefetchSlots) << "prefetch slot " << slot; }

  // ---- ops ----
  void embedding(Tensor out, const Tensor& table, const Tensor& ids) override {
    check_f32(out, "embedding out");
    const int64_t n = ids.numel(), H = table.dim(1), V = table.dim(0);
    QVL_CHECK(out.dim(0) == n && out.row_numel() == H) << "embedding out " << out.describe();
    QVL_CHECK(cpu::is_plain_float(table.dtype)) << "embedding table " << table.describe();
    const int32_t* id = ids.as<const int32_t>();
    for (int64_t i = 0; i < n; ++i) QVL_CHECK(id[i] >= 0 && id[i] < V) << "token id " << id[i] << " vocab " << V;
    float* o = out.as<float>();
#pragma omp parallel for schedule(static) num_threads(threads_) if (n * H >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) cpu::to_f32(table.data, table.dtype, id[i] * H, H, o + i * H);
  }

  void scatter_rows(Tensor x, const Tensor& rows, const Tensor& src, bool accumulate) override {
    check_f32(x, "scatter_rows x");
    check_f32(src, "scatter_rows src");
    const int64_t m = rows.numel(), H = x.row_numel();
    QVL_CHECK(src.dim(0) == m && src.row_numel() == H) << "scatter_rows src " << src.describe();
    const int32_t* r = rows.as<const int32_t>();
    for (int64_t i = 0; i < m; ++i) QVL_CHECK(r[i] >= 0 && r[i] < x.dim(0)) << "scatter row " << r[i];
    float* xd = x.as<float>();
    const float* s = src.as<const float>();
#pragma omp parallel for schedule(static) num_threads(threads_) if (m * H >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < m; ++i) {
      float* dst = xd + r[i] * H;
      if (accumulate)
        for (int64_t j = 0; j < H; ++j) dst[j] += s[i * H + j];
      else
        std::memcpy(dst, s + i * H, H * sizeof(float));
    }
  }

  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override {
    check_f32(x, "gather_rows x");
    check_f32(out, "gather_rows out");
    const int64_t m = rows.numel(), H = x.row_numel();
    QVL_CHECK(out.dim(0) == m && out.row_numel() == H) << "gather_rows out " << out.describe();
    const int32_t* r = rows.as<const int32_t>();
    for (int64_t i = 0; i < m; ++i) QVL_CHECK(r[i] >= 0 && r[i] < x.dim(0)) << "gather row " << r[i];
    for (int64_t i = 0; i < m; ++i) std::memcpy(out.as<float>() + i * H, x.as<const float>() + r[i] * H, H * 4);
  }

  void rms_norm(Tensor out, const Tensor& x, const Tensor& weight, float eps) override {
    check_f32(x, "rms_norm x");
    check_f32(out, "rms_norm out");
    const int64_t H = weight.numel(), n = x.numel() / H;
    QVL_CHECK(x.numel() == n * H && out.numel() == x.numel()) << "rms_norm " << x.describe();
    std::vector<float> w(H);
    cpu::to_f32(weight.data, weight.dtype, 0, H, w.data());
    const float* xd = x.as<const float>();
    float* od = out.as<float>();
#pragma omp parallel for schedule(static) num_threads(threads_) if (n * H >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
      const float* r = xd + i * H;
      double ss = 0;
      for (int64_t j = 0; j < H; ++j) ss += static_cast<double>(r[j]) * r[j];
      // As transformers: x · rsqrt(mean(x²) + eps), then × weight.
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / H) + eps);
      for (int64_t j = 0; j < H; ++j) od[i * H + j] = w[j] * (r[j] * inv);
    }
  }

  void layer_norm(Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) override {
    check_f32(x, "layer_norm x");
    check_f32(out, "layer_norm out");
    const int64_t H = weight.numel(), n = x.numel() / H;
    QVL_CHECK(x.numel() == n * H && out.numel() == x.numel() && bias.numel() == H) << "layer_norm " << x.describe();
    std::vector<float> w(H), b(H);
    cpu::to_f32(weight.data, weight.dtype, 0, H, w.data());
    cpu::to_f32(bias.data, bias.dtype, 0, H, b.data());
    const float* xd = x.as<const float>();
    float* od = out.as<float>();
#pragma omp parallel for schedule(static) num_threads(threads_) if (n * H >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
      const float* r = xd + i * H;
      double sum = 0;
      for (int64_t j = 0; j < H; ++j) sum += r[j];
      const double mean = sum / H;
      double var = 0;
      for (int64_t j = 0; j < H; ++j) var += (r[j] - mean) * (r[j] - mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(var / H + eps));
      const float m = static_cast<float>(mean);
      for (int64_t j = 0; j < H; ++j) od[i * H + j] = (r[j] - m) * rstd * w[j] + b[j];
    }
  }

  void linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) override {
    cpu::linear(threads_, out, x, w, ep);
  }

  void silu_mul(Tensor out, const Tensor& gate_up) override {
    check_f32(out, "silu_mul out");
    check_f32(gate_up, "silu_mul gate_up");
    const int64_t n = out.dim(0), I = out.row_numel();
    QVL_CHECK(gate_up.dim(0) == n && gate_up.row_numel() == 2 * I) << "silu_mul " << gate_up.describe();
    const float* g = gate_up.as<const float>();
    float* o = out.as<float>();
#pragma omp parallel for schedule(static) num_threads(threads_) if (n * I >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < I; ++j) {
        const float a = g[i * 2 * I + j];
        o[i * I + j] = a / (1.0f + std::exp(-a)) * g[i * 2 * I + I + j];
      }
    }
  }

  void add_interpolated(Tensor x, const Tensor& table, const Tensor& idx, const Tensor& w) override {
    check_f32(x, "add_interpolated x");
    const int64_t n = x.dim(0), D = x.row_numel(), P = table.dim(0);
    QVL_CHECK(table.row_numel() == D && idx.numel() == n * 4 && w.numel() == n * 4 && w.dtype == DType::kF32)
        << "add_interpolated table " << table.describe() << " idx " << idx.describe();
    QVL_CHECK(cpu::is_plain_float(table.dtype)) << "position table " << table.describe();
    const int32_t* id = idx.as<const int32_t>();
    for (int64_t i = 0; i < n * 4; ++i) QVL_CHECK(id[i] >= 0 && id[i] < P) << "position index " << id[i];
    const float* wt = w.as<const float>();
    float* xd = x.as<float>();
#pragma omp parallel for schedule(static) num_threads(threads_) if (n * D >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> row(D), pe(D, 0.0f);
      for (int k = 0; k < 4; ++k) {
        cpu::to_f32(table.data, table.dtype, id[i * 4 + k] * D, D, row.data());
        for (int64_t j = 0; j < D; ++j) pe[j] += row[j] * wt[i * 4 + k];
      }
      for (int64_t j = 0; j < D; ++j) xd[i * D + j] += pe[j];
    }
  }

  void vision_rope(Tensor qkv, const Tensor& rope, int num_heads, int head_dim) override {
    cpu::vision_rope(threads_, qkv, rope, num_heads, head_dim);
  }
  void vision_rope_table(Tensor rope, const Tensor& row_col, const Tensor& angles) override {
    check_vision_rope_table(rope, row_col, angles);
    expand_vision_rope(rope.as<float>(), row_col.as<const int32_t>(), angles.as<const float>(), rope.dim(0),
                       angles.dim(0), static_cast<int>(angles.dim(2)));
  }
  void vision_attention(Tensor out, const Tensor& qkv, const VisionSegments& seg, int num_heads, int head_dim,
                        float scale) override {
    cpu::vision_attention(threads_, out, qkv, seg, num_heads, head_dim, scale);
  }
  void text_qkv_prepare(Tensor qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, const MropeSpec& rope,
                        const TextBatch& batch, const KvCacheView& cache, int layer,
                        const TextAttentionShape& shape) override {
    cpu::text_qkv_prepare(threads_, qkv, q_norm, k_norm, eps, rope, batch, cache, layer, shape);
  }
  void text_attention(Tensor out, const Tensor& qkv, const TextBatch& batch, const KvCacheView& cache, int layer,
                      const TextAttentionShape& shape, float scale) override {
    cpu::text_attention(threads_, out, qkv, batch, cache, layer, shape, scale);
  }

 private:
  // Memory for a loaded weight: the placement's while one is set, else backend-owned.
  Result<void*> store(size_t bytes, const std::string& what) {
    if (!placement_) return own(bytes);
    void* p = placement_->take(bytes);
    if (!p)
      return resource_exhausted("cpu: " + what + " does not fit the weight placement (" +
                                std::to_string(placement_->wanted()) + " bytes wanted of " +
                                std::to_string(placement_->capacity()) + ")");
    return p;
  }
  // Backend-owned storage for converted weights; lives as long as the backend.
  void* own(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    owned_.emplace_back(new uint8_t[std::max<size_t>(bytes, 1)]);
    return owned_.back().get();
  }

  int threads_;
  WeightPlacement* placement_ = nullptr;
  std::mutex mu_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace qvl
