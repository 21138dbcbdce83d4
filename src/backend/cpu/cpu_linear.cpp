// CPU Linear: out = act(x · Wᵀ + b) + residual with W in its stored dtype.
//
// Blocking: the output is cut into tasks of kTileW weight rows × kTileX input rows; a task walks
// K in chunks of kChunkK, converts its weight tile chunk to fp32 in a small buffer (BF16: a
// shift; FP8: table decode × the block's scale_inv), and accumulates 4×4 register blocks of
// dot products in fp32. Each output element is owned by one task, so the result is independent
// of the thread count and the residual may alias the output.
//
// FP8 numerics: we match transformers' *dequantized* FP8 path (FineGrainedFP8Config(
// dequantize=True)): W[i,j] = float(w8[i,j]) · scale_inv[i/B, j/B] in fp32 (one rounding, the
// same product Fp8Dequantize computes) and an fp32 GEMM with unquantized activations. The
// checkpoint's native W8A8-dynamic path (spec §8) additionally rounds each activation to
// e4m3 per 128-column group (relative error up to 2^-4 per element, ~1e-2 relative on a
// Linear's output); qvl does not reproduce that rounding on the CPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"

// The vector helpers below are always inlined into the multiversioned kernel, so the ABI of
// passing 32-byte vectors by value never matters.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace qvl::cpu {
namespace {

constexpr int kTileW = 16;    // weight rows per task
constexpr int kTileX = 64;    // input rows per task
constexpr int kChunkK = 256;  // K per conversion chunk; a multiple of every FP8 block edge we accept (128)
constexpr int kVec = 8;

typedef float v8sf __attribute__((vector_size(32), aligned(4)));
typedef uint32_t v8su __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8si __attribute__((vector_size(32), aligned(4)));
typedef uint16_t v8hu __attribute__((vector_size(16), aligned(2)));
typedef uint8_t v8qu __attribute__((vector_size(8), aligned(1)));

struct Tile {
  const LinearPart* part;
  int64_t part_row0;  // first weight row of the tile inside the part
  int64_t out_col0;   // first output column of the tile
  int rows;           // <= kTileW
};

struct LinearArgs {
  const float* x;
  float* out;
  const float* residual;
  const float* bias;
  int64_t n, K, O;
  int block;
  Activation act;
};

inline float activate(float v, Activation act) {
  switch (act) {
    case Activation::kNone:
      return v;
    case Activation::kGeluTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
    }
    case Activation::kGeluErf:
      return 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
  }
  return v;
}

// Exact e4m3fn decode of 8 bytes (widened to u32 lanes): the 7 magnitude bits placed at the top
// of a float's exponent/mantissa fields give 2^(e−127)·1.m (or the float subnormal m·2^−129 for
// e = 0), and × 2^120 rebiases that to e4m3's 2^(e−7)·1.m (m/512 for subnormals), both exact;
// magnitude 0x7f is NaN. The unit test checks all 256 bytes against the decode table.
__attribute__((always_inline)) inline v8sf fp8_values(v8su b) {
  const v8su u = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
  v8sf f;
  std::memcpy(&f, &u, sizeof(f));
  f *= 0x1p120f;
  const v8si nan_lanes = (b & 0x7fu) == 0x7fu;  // all ones where NaN
  v8su bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits = (bits & ~reinterpret_cast<const v8su&>(nan_lanes)) | (0x7fc00000u & reinterpret_cast<const v8su&>(nan_lanes));
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Weight rows [r0, r0+rows) × columns [k0, k0+kc) of `part` as fp32 into w[rows_padded][ld],
// zero-filling the padding so the micro-kernel can run full 4-row × 8-column blocks.
__attribute__((always_inline)) inline void convert_tile(const LinearPart& part, int64_t K, int block, int64_t r0,
                                                        int rows, int rows_padded, int64_t k0, int kc, int ld,
                                                        float* w) {
  const DType dt = part.weight.dtype;
  for (int r = 0; r < rows; ++r) {
    float* dst = w + static_cast<int64_t>(r) * ld;
    const int64_t src_off = (r0 + r) * K + k0;
    if (dt == DType::kF32) {
      std::memcpy(dst, part.weight.as<const float>() + src_off, sizeof(float) * kc);
    } else if (dt == DType::kBF16) {
      const uint16_t* s = part.weight.as<const uint16_t>() + src_off;
      int k = 0;
      for (; k + kVec <= kc; k += kVec) {  // 8 at a time: widen, shift into the high half
        v8hu h;
        std::memcpy(&h, s + k, sizeof(h));
        v8su u = __builtin_convertvector(h, v8su) << 16;
        std::memcpy(dst + k, &u, sizeof(u));
      }
      for (; k < kc; ++k) dst[k] = bf16_to_float(s[k]);
    } else if (dt == DType::kF8E4M3) {
      const uint8_t* s = part.weight.as<const uint8_t>() + src_off;
      const float* scales = part.scale_inv.as<const float>();
      const int64_t scale_cols = part.scale_inv.dim(1);
      const float* srow = scales + ((r0 + r) / block) * scale_cols;
      for (int k = 0; k < kc;) {
        const int64_t col = k0 + k;
        const int end = static_cast<int>(std::min<int64_t>(kc, k + block - col % block));
        const float scale = srow[col / block];
        for (; k + kVec <= end; k += kVec) {
          v8qu b;
          std::memcpy(&b, s + k, sizeof(b));
          v8sf f = fp8_values(__builtin_convertvector(b, v8su)) * scale;
          std::memcpy(dst + k, &f, sizeof(f));
        }
        for (; k < end; ++k) dst[k] = kFp8E4M3Table.v[s[k]] * scale;
      }
    } else {
      to_f32(part.weight.data, dt, src_off, kc, dst);
    }
    for (int k = kc; k < ld; ++k) dst[k] = 0.0f;
  }
  for (int r = rows; r < rows_padded; ++r) std::memset(w + static_cast<int64_t>(r) * ld, 0, sizeof(float) * ld);
}

inline float hsum(v8sf v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// acc[i][j] += dot(x_i, w_j) over `len` (a multiple of 8) for MR input rows and 4 weight rows.
template <int MR>
__attribute__((always_inline)) inline void micro_kernel(const float* const* x, const float* w, int ld, int len,
                                                        float* acc, int acc_ld) {
  v8sf s[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) s[i][j] = v8sf{0, 0, 0, 0, 0, 0, 0, 0};
  for (int k = 0; k < len; k += kVec) {
    v8sf wv[4];
    for (int j = 0; j < 4; ++j) std::memcpy(&wv[j], w + j * ld + k, sizeof(v8sf));
    for (int i = 0; i < MR; ++i) {
      v8sf xv;
      std::memcpy(&xv, x[i] + k, sizeof(v8sf));
      for (int j = 0; j < 4; ++j) s[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i * acc_ld + j] += hsum(s[i][j]);
}

QVL_CPU_MULTIVERSION void run_tile(const LinearArgs& a, const Tile& t, int64_t x0, int xrows) {
  alignas(64) float w[kTileW * kChunkK];
  alignas(64) float xpad[kTileX * kChunkK];
  alignas(64) float acc[kTileX * kTileW];
  std::memset(acc, 0, sizeof(acc));
  const int rows_padded = (t.rows + 3) / 4 * 4;
  const float* xptr[kTileX];

  for (int64_t k0 = 0; k0 < a.K; k0 += kChunkK) {
    const int kc = static_cast<int>(std::min<int64_t>(kChunkK, a.K - k0));
    const int ld = (kc + kVec - 1) / kVec * kVec;
    convert_tile(*t.part, a.K, a.block, t.part_row0, t.rows, rows_padded, k0, kc, ld, w);
    for (int i = 0; i < xrows; ++i) {
      const float* src = a.x + (x0 + i) * a.K + k0;
      if (kc == ld) {
        xptr[i] = src;
      } else {  // ragged last chunk: zero-pad so the vector loop never reads past the row
        float* dst = xpad + static_cast<int64_t>(i) * ld;
        std::memcpy(dst, src, sizeof(float) * kc);
        for (int k = kc; k < ld; ++k) dst[k] = 0.0f;
        xptr[i] = dst;
      }
    }
    for (int i = 0; i < xrows; i += 4) {
      const int mr = std::min(4, xrows - i);
      for (int j = 0; j < rows_padded; j += 4) {
        float* acc_ij = acc + i * kTileW + j;
        const float* wj = w + static_cast<int64_t>(j) * ld;
        switch (mr) {
          case 4:
            micro_kernel<4>(xptr + i, wj, ld, ld, acc_ij, kTileW);
            break;
          case 3:
            micro_kernel<3>(xptr + i, wj, ld, ld, acc_ij, kTileW);
            break;
          case 2:
            micro_kernel<2>(xptr + i, wj, ld, ld, acc_ij, kTileW);
            break;
          default:
            micro_kernel<1>(xptr + i, wj, ld, ld, acc_ij, kTileW);
            break;
        }
      }
    }
  }
  // Epilogue: bias, activation, residual.
  for (int i = 0; i < xrows; ++i) {
    const int64_t row = x0 + i;
    for (int j = 0; j < t.rows; ++j) {
      const int64_t col = t.out_col0 + j;
      float v = acc[i * kTileW + j];
      if (a.bias) v += a.bias[col];
      v = activate(v, a.act);
      if (a.residual) v += a.residual[row * a.O + col];
      a.out[row * a.O + col] = v;
    }
  }
}

}  // namespace

void linear(int threads, Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep) {
  check_f32(x, "linear x");
  check_f32(out, "linear out");
  QVL_CHECK(!w.parts.empty()) << "linear with no weight parts";
  const int64_t n = x.dim(0), K = x.row_numel(), O = w.out_features;
  QVL_CHECK_EQ(K, w.in_features) << "linear x " << x.describe();
  QVL_CHECK_EQ(out.dim(0), n);
  QVL_CHECK_EQ(out.row_numel(), O) << "linear out " << out.describe();
  QVL_CHECK(out.data != x.data) << "linear out must not alias x";
  if (!ep.residual.empty()) {
    check_f32(ep.residual, "linear residual");
    QVL_CHECK_EQ(ep.residual.numel(), out.numel()) << "residual " << ep.residual.describe();
  }
  if (!w.bias.empty()) {
    QVL_CHECK(w.bias.dtype == DType::kF32 && w.bias.numel() == O) << "bias " << w.bias.describe();
  }

  std::vector<Tile> tiles;
  int64_t col = 0;
  for (const LinearPart& p : w.parts) {
    QVL_CHECK_EQ(p.weight.dim(1), K) << "linear part " << p.weight.describe();
    if (p.weight.dtype == DType::kF8E4M3) {
      QVL_CHECK(p.scale_inv.dtype == DType::kF32) << "FP8 scale_inv must be F32 on the CPU (load_linear converts)";
      QVL_CHECK(kChunkK % w.block_size == 0) << "FP8 block size " << w.block_size;
    }
    const int64_t rows = p.weight.dim(0);
    for (int64_t r = 0; r < rows; r += kTileW)
      tiles.push_back({&p, r, col + r, static_cast<int>(std::min<int64_t>(kTileW, rows - r))});
    col += rows;
  }
  QVL_CHECK_EQ(col, O) << "stacked parts do not add up to out_features";

  const LinearArgs args{x.as<const float>(),
                        out.as<float>(),
                        ep.residual.empty() ? nullptr : ep.residual.as<const float>(),
                        w.bias.empty() ? nullptr : w.bias.as<const float>(),
                        n,
                        K,
                        O,
                        w.block_size,
                        ep.act};
  const int64_t xblocks = (n + kTileX - 1) / kTileX;
  const int64_t tasks = static_cast<int64_t>(tiles.size()) * xblocks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (n * O * K >= 64 * kParallelMinWork)
  for (int64_t task = 0; task < tasks; ++task) {
    const Tile& t = tiles[task / xblocks];
    const int64_t x0 = (task % xblocks) * kTileX;
    run_tile(args, t, x0, static_cast<int>(std::min<int64_t>(kTileX, n - x0)));
  }
}

}  // namespace qvl::cpu
