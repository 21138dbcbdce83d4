// The CUDA backend, part 2 of 3 (see cuda_backend_impl.h): weights and the Linear op. Weights
// are uploaded once (BF16, or FP8 E4M3 with F32 block scales; a Linear's parts merged into one
// [out, in] matrix); a Linear then runs as described in cuda_backend.h: skinny kernels for few
// rows (taking in a deferred RMSNorm / SiLU·mul as their prologue), cuBLASLt above, FP8 by W8A8
// or by chunks dequantised to BF16.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/parallel_copy.h"

namespace qvl::cuda {
namespace {

// Host-side conversion of n elements to BF16 or F32 (weights whose checkpoint dtype differs
// from what the model asks for; rare, small tensors).
bool host_convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  auto read = [&](int64_t i) -> float {
    switch (from) {
      case DType::kF32:
        return static_cast<const float*>(src)[i];
      case DType::kBF16:
        return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
      case DType::kF16:
        return f16_to_float(static_cast<const uint16_t*>(src)[i]);
      default:
        return 0.0f;
    }
  };
  if (from != DType::kF32 && from != DType::kBF16 && from != DType::kF16) return false;
  if (to == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = float_to_bf16(read(i));
  } else if (to == DType::kF32) {
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = read(i);
  } else {
    return false;
  }
  return true;
}

}  // namespace

// ---- weights ----
Result<Tensor> CudaBackend::load_tensor(const Tensor& host, DType as) {
  flush();
  Tensor out = host;
  out.dtype = as;
  out.device = Device::kCuda;
  QVL_ASSIGN_OR_RETURN(DeviceBuffer buf, weight_memory(out.nbytes(), "weight " + host.shape_string()));
  out.data = buf.data();
  QVL_RETURN_IF_ERROR(upload_converted(out.data, host, as));
  weights_.push_back(std::move(buf));
  return out;
}

Result<DeviceBuffer> CudaBackend::weight_memory(size_t bytes, const std::string& tag) {
  if (!placement_) return allocate(bytes, tag);
  void* p = placement_->take(bytes);
  if (!p)
    return resource_exhausted(tag + ": does not fit the offload staging buffer (" +
                              std::to_string(placement_->wanted()) + " bytes wanted of " +
                              std::to_string(placement_->capacity()) + ")");
  return DeviceBuffer(p, bytes, nullptr);
}

// Pageable cudaMemcpy from the checkpoint's map ran at ~7 GB/s on an H100 host (2B BF16: 730 ms
// of a 1.3 s one-shot `qvl run`); the staged copy overlaps the host copy (on several threads)
// with the DMA.
Status CudaBackend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes < kStagedUpload || staging_.unavailable || capturing()) {
    QVL_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return Status::ok();
  }
  if (!staging_.buf[0]) {
    for (int i = 0; i < 2; ++i) {
      if (cudaHostAlloc(&staging_.buf[i], kStagingChunk, cudaHostAllocDefault) != cudaSuccess ||
          cudaEventCreateWithFlags(&staging_.done[i], cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        release_staging();  // no pinned memory to spare: plain copies from now on
        staging_.unavailable = true;
        QVL_CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
        return Status::ok();
      }
      QVL_CUDA_OK(cudaEventRecord(staging_.done[i], stream_));
    }
  }
  for (size_t off = 0; off < bytes; off += kStagingChunk) {
    const size_t n = std::min(kStagingChunk, bytes - off);
    const int i = staging_.next;
    staging_.next ^= 1;
    QVL_CUDA_OK(cudaEventSynchronize(staging_.done[i]));  // its previous DMA is done
    char* buf = static_cast<char*>(staging_.buf[i]);
    parallel_copy(buf, static_cast<const char*>(src) + off, n);
    QVL_CUDA_OK(cudaMemcpyAsync(static_cast<char*>(dst) + off, buf, n, cudaMemcpyHostToDevice, stream_));
    QVL_CUDA_OK(cudaEventRecord(staging_.done[i], stream_));
  }
  return Status::ok();
}

void CudaBackend::release_staging() {
  for (int i = 0; i < 2; ++i) {
    if (staging_.done[i]) {
      cudaEventSynchronize(staging_.done[i]);
      cudaEventDestroy(staging_.done[i]);
    }
    if (staging_.buf[i]) cudaFreeHost(staging_.buf[i]);
    staging_.done[i] = nullptr;
    staging_.buf[i] = nullptr;
  }
  staging_.next = 0;
}

Status CudaBackend::upload_converted(void* dst, const Tensor& host, DType as) {
  const int64_t n = host.numel();
  if (host.dtype == as) return upload(dst, host.data, static_cast<size_t>(host.nbytes()));
  std::vector<char> tmp(static_cast<size_t>(n) * dtype_size(as));
  if (!host_convert(host.data, host.dtype, tmp.data(), as, n))
    return unimplemented("cannot convert a " + std::string(dtype_name(host.dtype)) + " tensor " + host.shape_string() +
                         " to " + std::string(dtype_name(as)) + " on the CUDA backend");
  QVL_CUDA_OK(cudaMemcpy(dst, tmp.data(), tmp.size(), cudaMemcpyHostToDevice));
  return Status::ok();
}

Result<LinearWeight> CudaBackend::load_linear(std::span<const LinearPart> parts, const Tensor& host_bias,
                                              int block_size) {
  if (parts.empty()) return invalid_argument("load_linear: no weight parts");
  const bool fp8 = parts[0].weight.dtype == DType::kF8E4M3;
  const int64_t in = parts[0].weight.dim(1);
  int64_t out = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& w = parts[i].weight;
    if (w.ndim != 2 || w.dim(1) != in)
      return invalid_argument("load_linear: part " + std::to_string(i) + " is " + w.describe() + ", expected [*, " +
                              std::to_string(in) + "]");
    if ((w.dtype == DType::kF8E4M3) != fp8)
      return invalid_argument("load_linear: part " + std::to_string(i) + " is " + w.describe() + " but part 0 is " +
                              parts[0].weight.describe());
    out += w.dim(0);
  }
  LinearWeight lw;
  lw.out_features = out;
  lw.in_features = in;
  lw.block_size = block_size;
  LinearPart merged;
  if (!fp8) {
    Tensor wt(nullptr, DType::kBF16, {out, in}, Device::kCuda);
    QVL_ASSIGN_OR_RETURN(DeviceBuffer buf, weight_memory(wt.nbytes(), "linear " + wt.shape_string()));
    wt.data = buf.data();
    int64_t row = 0;
    for (const LinearPart& p : parts) {
      QVL_RETURN_IF_ERROR(upload_converted(static_cast<char*>(wt.data) + row * in * 2, p.weight, DType::kBF16));
      row += p.weight.dim(0);
    }
    weights_.push_back(std::move(buf));
    merged.weight = wt;
  } else {
    if (block_size <= 0) return invalid_argument("load_linear: FP8 block size " + std::to_string(block_size));
    if (dequant_ws_.size() == 0) {  // the first FP8 Linear: its prefill GEMMs need the workspace
      QVL_ASSIGN_OR_RETURN(dequant_ws_, allocate(options_.dequant_workspace_bytes, "FP8 dequant workspace"));
    }
    const int64_t kb = (in + block_size - 1) / block_size;
    // Block scales stay one row per block when every part but the last starts on a block
    // boundary (all Qwen3-VL shapes); otherwise each weight row gets its own scale row.
    bool aligned = true;
    for (size_t i = 0; i + 1 < parts.size(); ++i) aligned &= parts[i].weight.dim(0) % block_size == 0;
    const int64_t scale_rows = aligned ? (out + block_size - 1) / block_size : out;
    Tensor wt(nullptr, DType::kF8E4M3, {out, in}, Device::kCuda);
    Tensor st(nullptr, DType::kF32, {scale_rows, kb}, Device::kCuda);
    QVL_ASSIGN_OR_RETURN(DeviceBuffer wbuf, weight_memory(wt.nbytes(), "fp8 linear " + wt.shape_string()));
    QVL_ASSIGN_OR_RETURN(DeviceBuffer sbuf, weight_memory(st.nbytes(), "fp8 scales " + st.shape_string()));
    wt.data = wbuf.data();
    st.data = sbuf.data();
    std::vector<float> scales(static_cast<size_t>(scale_rows * kb));
    int64_t row = 0, srow = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const LinearPart& p = parts[i];
      const int64_t rows = p.weight.dim(0), prow = (rows + block_size - 1) / block_size;
      const Tensor& s = p.scale_inv;
      if (s.ndim != 2 || s.dim(0) != prow || s.dim(1) != kb)
        return invalid_argument("load_linear: part " + std::to_string(i) + " scale_inv is " + s.describe() +
                                ", expected [" + std::to_string(prow) + ", " + std::to_string(kb) + "] for " +
                                p.weight.describe() + " with " + std::to_string(block_size) + "-blocks");
      std::vector<float> ps(static_cast<size_t>(prow * kb));
      if (!host_convert(s.data, s.dtype, ps.data(), DType::kF32, prow * kb))
        return invalid_argument("load_linear: scale_inv dtype " + std::string(dtype_name(s.dtype)));
      QVL_RETURN_IF_ERROR(upload(static_cast<char*>(wt.data) + row * in, p.weight.data, p.weight.nbytes()));
      if (aligned) {
        std::copy(ps.begin(), ps.end(), scales.begin() + srow * kb);
        srow += prow;
      } else {
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(ps.begin() + (r / block_size) * kb, kb, scales.begin() + (row + r) * kb);
      }
      row += rows;
    }
    QVL_CUDA_OK(cudaMemcpy(st.data, scales.data(), st.nbytes(), cudaMemcpyHostToDevice));
    weights_.push_back(std::move(wbuf));
    weights_.push_back(std::move(sbuf));
    merged.weight = wt;
    merged.scale_inv = st;
  }
  lw.parts.push_back(merged);
  if (!host_bias.empty()) {
    if (host_bias.numel() != out)
      return invalid_argument("load_linear: bias " + host_bias.describe() + " for " + std::to_string(out) + " outputs");
    QVL_ASSIGN_OR_RETURN(lw.bias, load_tensor(host_bias.reshape({out}), DType::kBF16));
  }
  return lw;
}

// ---- Linear ----
void CudaBackend::linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) {
  if (lin_.active) launch_pending_linear({});
  const bool follows_attention = attn_.active && x.data == attn_.out.data;
  if (attn_.active) launch_decode_attention(follows_attention ? &w : nullptr);
  if (pending_.kind != Pending::kNone) {
    const Pending& p = pending_;
    const bool fp8 = w.is_fp8();
    const bool fusable =
        x.data == p.out.data && x.same_shape(p.out) && x.dim(0) <= cuda::kFusedPrologueMaxRows &&
        static_cast<size_t>(x.nbytes()) <= cuda::kFusedPrologueMaxBytes &&
        cuda::fused_prologue_pays(w.out_features, x.dim(0), ctx_.num_sms, options_.fused_prologue_max_copies_per_sm) &&
        w.parts.size() == 1 && x.row_numel() == w.in_features && x.row_numel() % (fp8 ? 16 : 8) == 0 &&
        (!fp8 || w.block_size == 128) && out.data != p.src.data && out.data != x.data &&
        (ep.residual.empty() || (ep.residual.data != x.data && ep.residual.data != p.src.data));
    if (fusable) {
      cuda::SkinnyPrologue pro;
      pro.kind = p.kind == Pending::kRmsNorm ? cuda::SkinnyPrologue::kRmsNorm : cuda::SkinnyPrologue::kSiluMul;
      pro.src = p.src;
      pro.weight = p.weight;
      pro.eps = p.eps;
      pending_ = {};
      skinny_linear(out, x, w, ep, pro, follows_attention);
      return;
    }
    flush();
  }
  QVL_CHECK_EQ(w.parts.size(), 1u) << "linear: weight was not loaded by the CUDA backend";
  const int64_t n = x.dim(0);
  QVL_CHECK_EQ(out.dim(0), n);
  QVL_CHECK_EQ(x.row_numel(), w.in_features);
  QVL_CHECK_EQ(out.row_numel(), w.out_features);
  if (n == 0) return;
  const bool fp8 = w.is_fp8();
  const int64_t k = w.in_features;
  const bool skinny_ok = k % (fp8 ? 16 : 8) == 0 && (!fp8 || w.block_size == 128);
  if (skinny_ok && n <= (fp8 ? kSkinnyMaxRows : skinny_bf16_rows_)) {
    skinny_linear(out, x, w, ep, {}, follows_attention);
    return;
  }
  if (ctx_.profiler) note_linear(out, x, w, ep, "");
  if (skinny_ok && fp8 && n <= kSkinnyFp8MaxRows) {
    for (int64_t r = 0; r < n; r += kSkinnyWideMaxRows) {
      const int64_t e = std::min(n, r + kSkinnyWideMaxRows);
      Epilogue part{ep.act, ep.residual.empty() ? Tensor() : ep.residual.rows(r, e)};
      cuda::launch_skinny_linear(ctx_, out.rows(r, e), x.rows(r, e), w, part);
    }
    return;
  }
  gemm_linear(out, x, w, ep);
}

namespace {
// The profiler's note of what a decode Linear computes besides itself: its fused prologue, and
// SiLU·mul in its epilogue.
std::string fused_note(const cuda::SkinnyPrologue& pro, bool glu_epilogue) {
  std::string s = pro.kind == cuda::SkinnyPrologue::kRmsNorm   ? " +rms_norm"
                  : pro.kind == cuda::SkinnyPrologue::kSiluMul ? " +silu_mul"
                                                               : "";
  if (glu_epilogue) s += " +silu_mul epilogue";
  return s;
}
}  // namespace

void CudaBackend::skinny_linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep,
                                const cuda::SkinnyPrologue& pro, bool follows_attention) {
  // A SiLU·mul may follow where the output could be gate_up: out [n, 2 I], I % 8 == 0, nothing
  // added to it.
  if (fusion_ && x.dim(0) <= glu_rows_ && w.out_features % 16 == 0 && w.bias.empty() && ep.act == Activation::kNone &&
      ep.residual.empty() && out.ndim == 2) {
    lin_ = {true, out, x, w, pro};
    return;
  }
  if (ctx_.profiler) note_linear(out, x, w, ep, fused_note(pro, false).c_str());
  cuda::launch_skinny_linear(ctx_, out, x, w, ep, pro, {}, follows_attention);
}

void CudaBackend::launch_pending_linear(const Tensor& glu_out) {
  const PendingLinear l = std::move(lin_);
  lin_ = {};
  if (ctx_.profiler) note_linear(l.out, l.x, l.w, {}, fused_note(l.pro, !glu_out.empty()).c_str());
  cuda::launch_skinny_linear(ctx_, l.out, l.x, l.w, {}, l.pro, glu_out);
}

void CudaBackend::gemm_linear(Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) {
  QVL_CHECK(x.dtype == DType::kBF16 && out.dtype == DType::kBF16) << x.describe() << " -> " << out.describe();
  QVL_CHECK(x.data != out.data) << "linear: x aliases out";
  const int64_t n = x.dim(0), k = w.in_features, m = w.out_features;
  const bool act = ep.act != Activation::kNone;
  const bool res = !ep.residual.empty();
  if (res) {
    QVL_CHECK(ep.residual.dtype == DType::kBF16 && ep.residual.same_shape(out))
        << "residual " << ep.residual.describe() << " vs out " << out.describe();
    QVL_CHECK(!act || ep.residual.data != out.data) << "linear: an activation with a residual that aliases out";
  }
  // cuBLASLt adds the bias (and, without an activation, the residual through beta = 1). GELU
  // (tanh) without a residual goes through cuBLASLt's epilogue too (CudaBackendOptions::
  // cublas_gelu); other activations are applied afterwards, to the rounded Linear output, as in
  // the reference.
  const void* bias = w.bias.empty() ? nullptr : w.bias.data;
  const void* gemm_res = res && !act ? ep.residual.data : nullptr;
  const Tensor& weight = w.parts[0].weight;
  bool act_done = false;  // by the GEMM's epilogue
  if (!w.is_fp8()) {
    const bool gelu = options_.cublas_gelu && ep.act == Activation::kGeluTanh && !res;
    cuda::ProfileRange range(ctx_, gelu ? "cublasLt bf16 gemm +gelu" : "cublasLt bf16 gemm");
    act_done = gelu && gemm_->bf16_gemm(out.data, m, x.data, weight.data, m, n, k, bias, nullptr, true);
    if (!act_done) gemm_->bf16_gemm(out.data, m, x.data, weight.data, m, n, k, bias, gemm_res);
  } else if (options_.fp8_gemm == CudaFp8Gemm::kW8A8 &&
             cuda::w8a8_linear(ctx_, *gemm_, fp8_act_ws_.data(), fp8_act_ws_.size(), out, x, w, bias, gemm_res)) {
    ++fp8_counts_.w8a8;
  } else {
    ++fp8_counts_.dequant;
    const Tensor& scale = w.parts[0].scale_inv;
    const int bs = w.block_size;
    const int rows_per_scale = scale.dim(0) == (m + bs - 1) / bs ? bs : 1;
    // As few chunks as the workspace allows, of equal size in whole bs-row blocks (one short
    // chunk would make a GEMM too narrow to fill the GPU).
    const int64_t cap = static_cast<int64_t>(dequant_ws_.size() / (static_cast<size_t>(k) * 2));
    QVL_CHECK_GT(cap, 0) << "FP8 dequant workspace of " << dequant_ws_.size() << " bytes holds no row of " << k;
    int64_t chunk = cap;
    if (cap >= bs) {
      const int64_t blocks = (m + bs - 1) / bs, cap_blocks = cap / bs;
      const int64_t chunks = (blocks + cap_blocks - 1) / cap_blocks;
      chunk = (blocks + chunks - 1) / chunks * bs;
    }
    for (int64_t r0 = 0; r0 < m; r0 += chunk) {
      const int64_t r1 = std::min(m, r0 + chunk);
      cuda::launch_dequant_fp8(ctx_, dequant_ws_.data(), weight, scale, rows_per_scale, bs, r0, r1);
      cuda::ProfileRange range(ctx_, "cublasLt bf16 gemm");
      gemm_->bf16_gemm(static_cast<uint16_t*>(out.data) + r0, m, x.data, dequant_ws_.data(), r1 - r0, n, k,
                       bias ? static_cast<const uint16_t*>(bias) + r0 : nullptr,
                       gemm_res ? static_cast<const uint16_t*>(gemm_res) + r0 : nullptr);
    }
  }
  if (act && !act_done) cuda::launch_epilogue(ctx_, out, ep.act, ep.residual);
}

void CudaBackend::quantize_fp8_rows(Tensor q, Tensor scales, Tensor tail_scales, const Tensor& x) {
  flush();
  QVL_CHECK(q.dtype == DType::kF8E4M3 && q.same_shape(x)) << "q " << q.describe() << " for x " << x.describe();
  const int64_t groups = (x.row_numel() + cuda::kFp8ActGroup - 1) / cuda::kFp8ActGroup;
  QVL_CHECK(scales.dtype == DType::kF32 && scales.ndim == 2 && scales.dim(0) == groups)
      << "scales " << scales.describe() << " for x " << x.describe();
  QVL_CHECK(tail_scales.empty() ||
            (tail_scales.dtype == DType::kF32 && tail_scales.numel() == groups * cuda::kFp8GemmRowMultiple))
      << "tail scales " << tail_scales.describe() << " for x " << x.describe();
  cuda::launch_quantize_fp8_rows(ctx_, q.data, scales.as<float>(), scales.dim(1),
                                 tail_scales.empty() ? nullptr : tail_scales.as<float>(), x);
}

void CudaBackend::note_linear(const Tensor& out, const Tensor& x, const LinearWeight& w, const Epilogue& ep,
                              const char* extra) {
  double bytes = static_cast<double>(x.nbytes() + out.nbytes() + w.bias.nbytes());
  for (const LinearPart& p : w.parts) bytes += static_cast<double>(p.weight.nbytes() + p.scale_inv.nbytes());
  if (!ep.residual.empty()) bytes += static_cast<double>(ep.residual.nbytes());
  std::string label = "linear " + std::to_string(x.dim(0)) + "x" + std::to_string(w.in_features) + "->" +
                      std::to_string(w.out_features) + (w.is_fp8() ? " fp8" : " bf16");
  if (!w.bias.empty()) label += " +bias";
  if (ep.act == Activation::kGeluTanh) label += " +gelu_tanh";
  if (ep.act == Activation::kGeluErf) label += " +gelu_erf";
  if (!ep.residual.empty()) label += " +res";
  label += extra;
  note(std::move(label), bytes, 2.0 * x.dim(0) * w.in_features * w.out_features);
}

}  // namespace qvl::cuda
