// CUDA vs CPU: an RMSNorm or SiLU·mul over few rows computed inside the decode Linear that reads
// it (CudaBackendOptions::fused_rms_norm_max_rows, fused_silu_mul_max_rows and
// fused_prologue_max_copies_per_sm), the Linear's output and the intermediate it also writes, and
// which Linears took the prologue (CudaFp8GemmCounts::skinny_prologue).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "gpu/gpu_linear_util.h"
#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

// Whether a Linear of `out` outputs takes a prologue of `rows` rows under the copy limits: its
// 16-row tiles x rows at most `limit` (fused_prologue_max_copies_per_sm) per multiprocessor, and
// past two rows at most kFusedPrologueMaxCopiesPastTwoRows (12).
bool within_copy_limits(int64_t out, int64_t rows, int limit, int64_t sms) {
  const int64_t copies = rows > 2 ? std::min(limit, kFusedPrologueMaxCopiesPastTwoRows) : limit;
  return (out + 15) / 16 * rows <= copies * sms;
}

// rms_norm -> linear (with a separate residual where `residual`) on `gpu` against the CPU oracle:
// the Linear's output and the norm it also writes, and whether the Linear took the norm as its
// prologue (CudaFp8GemmCounts::skinny_prologue).
void check_rms_norm_linear(Backend* gpu, const LinearWeight& wc, const LinearWeight& wg, int64_t n, int64_t K,
                           int64_t N, bool residual, bool fused, const std::string& shape) {
  Scratch s;
  std::vector<float> nw = random_values(K, 0.2f);
  for (auto& v : nw) v += 1.0f;
  Pair norm_w = same_bytes(s, DType::kF32, {K}, nw.data());
  Pair x = activation(s, {n, K}, random_values(n * K, 3.0f));
  Pair h = activation(s, {n, K}, std::vector<float>(static_cast<size_t>(n * K), -1.0f));
  Pair res;
  if (residual) res = activation(s, {n, N}, random_values(n * N));
  Pair out = activation(s, {n, N}, std::vector<float>(static_cast<size_t>(n * N), 5.0f));
  cuda()->synchronize();  // the uploads above went through cuda()'s stream
  cpu().rms_norm(h.c, x.c, norm_w.c, 1e-6f);
  cpu().linear(out.c, h.c, wc, {Activation::kNone, res.c});
  const int64_t before = cuda_fp8_gemm_counts(*gpu).skinny_prologue;
  gpu->rms_norm(h.g, x.g, norm_w.g, 1e-6f);
  gpu->linear(out.g, h.g, wg, {Activation::kNone, res.g});
  gpu->synchronize();  // read back through cuda()'s stream below
  EXPECT_EQ(cuda_fp8_gemm_counts(*gpu).skinny_prologue - before, fused ? 1 : 0) << shape << " K" << K << " N" << N;
  const std::string k = " K" + std::to_string(K);
  EXPECT_TRUE(compare_pair("rms_norm+linear: linear", shape + k + " N" + std::to_string(N) + (residual ? " +res" : ""),
                           out, tol::kGpuLinear));
  EXPECT_TRUE(compare_pair("rms_norm+linear: norm", shape + k, h, tol::kGpuElementwise));
}

// The CUDA backend computes an RMSNorm or SiLU·mul over few rows inside the Linear that reads it
// (decode: by default RMSNorm up to 4 rows, SiLU·mul at 1; up to 8 where the options ask); both the
// Linear's output and the intermediate it also writes must match, with the default limits and
// with both at 8 (every case fused); the launch counter (CudaFp8GemmCounts::skinny_prologue) shows
// which Linears took the prologue.
TEST(GpuOps, LinearFusedPrologues) {
  QVL_REQUIRE_CUDA();
  const int64_t sms = cuda_device_info(0).value().multiprocessors;
  const int limit = CudaBackendOptions{}.fused_prologue_max_copies_per_sm;
  CudaBackendOptions all;
  all.fused_rms_norm_max_rows = all.fused_silu_mul_max_rows = 8;
  auto fused = make_cuda_backend(all);
  ASSERT_TRUE(fused.is_ok()) << fused.status().to_string();
  for (Backend* gpu : {cuda(), fused->get()}) {
    for (bool fp8 : {false, true}) {
      for (int64_t n : {1, 3, 5, 8}) {
        Scratch s;
        const int64_t K = 2048, N = 1000, I = 1536, D = 512;
        auto load = [&](int64_t rows, int64_t cols, std::vector<HostPart>& keep) {
          keep.push_back(make_part(rows, cols, fp8, 1.0f / std::sqrt(static_cast<float>(cols))));
          const LinearPart lp = part_view(keep.back(), cols, fp8);
          return std::make_pair(cpu().load_linear({&lp, 1}, Tensor(), 128).value(),
                                gpu->load_linear({&lp, 1}, Tensor(), 128).value());
        };
        std::vector<HostPart> keep;
        keep.reserve(2);
        auto [w1c, w1g] = load(N, K, keep);
        auto [w2c, w2g] = load(D, I, keep);
        const std::string shape =
            std::string(gpu == cuda() ? "" : "all fused, ") + (fp8 ? "fp8 " : "bf16 ") + "n" + std::to_string(n);

        // rms_norm -> linear (+ separate residual), fused up to CudaBackendOptions::
        // fused_rms_norm_max_rows rows (default 4), and either prologue only within the copy
        // limits: always on an H100's 132 multiprocessors; N 1000 at 8 rows (63 x 8 = 504 copies)
        // not on a GPU of under 42.
        const bool all_fused = gpu != cuda();
        const auto within = [&](int64_t out) { return within_copy_limits(out, n, limit, sms); };
        check_rms_norm_linear(gpu, w1c, w1g, n, K, N, true, n <= (all_fused ? 8 : 4) && within(N), shape);

        // silu_mul -> linear (+ residual in place)
        Pair gu = activation(s, {n, 2 * I}, random_values(n * 2 * I, 2.0f));
        Pair a = activation(s, {n, I}, std::vector<float>(static_cast<size_t>(n * I), -1.0f));
        Pair xr = activation(s, {n, D}, random_values(n * D));
        cuda()->synchronize();
        cpu().silu_mul(a.c, gu.c);
        cpu().linear(xr.c, a.c, w2c, {Activation::kNone, xr.c});
        const int64_t before = cuda_fp8_gemm_counts(*gpu).skinny_prologue;
        gpu->silu_mul(a.g, gu.g);
        gpu->linear(xr.g, a.g, w2g, {Activation::kNone, xr.g});
        gpu->synchronize();
        // Fused up to CudaBackendOptions::fused_silu_mul_max_rows rows (default 1).
        EXPECT_EQ(cuda_fp8_gemm_counts(*gpu).skinny_prologue - before, n <= (all_fused ? 8 : 1) && within(D) ? 1 : 0)
            << shape;
        EXPECT_TRUE(compare_pair("silu_mul+linear: linear", shape + " I1536 N512 +res", xr, tol::kGpuLinear));
        EXPECT_TRUE(compare_pair("silu_mul+linear: silu_mul", shape + " I1536", a, tol::kGpuElementwise));
      }
    }
  }
}

// An RMSNorm is fused only into a Linear whose blocks (one per 16-row tile) compute at most
// fused_prologue_max_copies_per_sm copies of it per multiprocessor (tiles x rows), and past two
// rows at most 12. With the default limit (20) and with 8, the counter says whether the norm was
// fused, and either way the Linear and the norm it writes match the oracle:
// - 4B's gate_up (K 2560, N 2 x 9728 = 19456: 1216 tiles) at one, two and four rows: fused at one
//   and two rows on an H100's or H200's 132 multiprocessors with the default;
// - 2B's gate_up (K 2048, N 12288: 768 tiles) at two and three rows: 2304 copies at three rows fit
//   20 x 132 but not 12 x 132, so it is not fused;
// - 2B's qkv (K 2048, N 4096: 256 tiles) at three rows: 768 copies, fused under both limits.
TEST(GpuOps, LinearFusedPrologueCopyLimit) {
  QVL_REQUIRE_CUDA();
  const int64_t sms = cuda_device_info(0).value().multiprocessors;
  std::vector<int> limits = {CudaBackendOptions{}.fused_prologue_max_copies_per_sm, 8};
  std::vector<std::unique_ptr<Backend>> gpus;
  for (int limit : limits) {
    CudaBackendOptions o;
    o.fused_prologue_max_copies_per_sm = limit;
    auto be = make_cuda_backend(o);
    ASSERT_TRUE(be.is_ok()) << be.status().to_string();
    gpus.push_back(std::move(be).value());
  }
  struct Shape {
    int64_t K, N;
    std::vector<int64_t> rows;
  };
  const Shape shapes[] = {{2560, 19456, {1, 2, 4}}, {2048, 12288, {2, 3}}, {2048, 4096, {3}}};
  for (const Shape& sh : shapes) {
    const int64_t K = sh.K, N = sh.N;
    for (bool fp8 : {false, true}) {
      HostPart part = make_part(N, K, fp8, 1.0f / std::sqrt(static_cast<float>(K)));
      const LinearPart lp = part_view(part, K, fp8);
      const LinearWeight wc = cpu().load_linear({&lp, 1}, Tensor(), 128).value();
      for (size_t g = 0; g < gpus.size(); ++g) {
        Backend* gpu = gpus[g].get();
        const LinearWeight wg = gpu->load_linear({&lp, 1}, Tensor(), 128).value();
        for (int64_t n : sh.rows) {
          const std::string shape = std::string(fp8 ? "fp8" : "bf16") + " n" + std::to_string(n) + ", " +
                                    std::to_string(limits[g]) + " copies/SM, " + std::to_string(sms) + " SMs,";
          check_rms_norm_linear(gpu, wc, wg, n, K, N, false, within_copy_limits(N, n, limits[g], sms), shape);
        }
      }
    }
  }
}

}  // namespace
}  // namespace qvl::test::gpu
