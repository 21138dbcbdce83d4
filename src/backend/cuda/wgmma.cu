// Host side of the warpgroup-MMA attention kernels (wgmma.cuh), built with them (sm_90a).
#include <mutex>
#include <string>

#include "backend/cuda/kernels.h"
#include "backend/cuda/wgmma.cuh"
#include "core/log.h"

namespace qvl::cuda {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled, or null where the driver lacks it.
EncodeTiledFn encode_tiled() {
  static EncodeTiledFn fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiledFn>(f);
    else
      cudaGetLastError();
  });
  return fn;
}

}  // namespace

bool wgmma_attention_available(int compute_capability) {
#if defined(QVL_WGMMA_SM90A)
  return compute_capability == 90 && encode_tiled() != nullptr;
#else
  (void)compute_capability;
  return false;
#endif
}

bool wgmma::encode_sw128(CUtensorMap* map, int rank, void* base, const cuuint64_t* dims, const cuuint64_t* strides,
                         const cuuint32_t* box, const char* what) {
  return encode_bf16_tiles(map, rank, base, dims, strides, box, true, what);
}

bool wgmma::encode_bf16_tiles(CUtensorMap* map, int rank, void* base, const cuuint64_t* dims, const cuuint64_t* strides,
                              const cuuint32_t* box, bool sw128, const char* what) {
  EncodeTiledFn encode = encode_tiled();
  if (!encode) return false;
  const cuuint32_t elem[5] = {1, 1, 1, 1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank), base, dims, strides, box, elem,
             CU_TENSOR_MAP_INTERLEAVE_NONE, sw128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return true;
  static std::once_flag warned;
  std::call_once(warned, [&] {
    log_warn(std::string(what) + ": cuTensorMapEncodeTiled failed (error " + std::to_string(static_cast<int>(r)) +
             "); the mma.sync kernels take the attention");
  });
  return false;
}

}  // namespace qvl::cuda
