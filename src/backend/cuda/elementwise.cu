// Row copies (embedding, gather, scatter), SiLU·mul, the interpolated position embedding,
// vision RoPE, the standalone Linear epilogue and FP8 dequantisation. All are memory-bound and
// simple: 16-byte vectors where rows allow it, scalar loops otherwise. Rounding follows the
// reference (transformers on BF16 tensors): each PyTorch op computes in fp32 and rounds its
// output to BF16 once, so a fused kernel rounds where the reference's op boundaries were.
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "core/vision_rope.h"

namespace qvl::cuda {
namespace {

// ---- row copies ----
// dst row dst_idx[i] (or i) = src row src_idx[i] (or i); accumulate: dst = bf16(dst + src).
// Rows with an index outside [0, limit) are skipped (embedding: written as zeros).
struct RowCopy {
  const void* src;
  void* dst;
  const int32_t* src_idx;
  const int32_t* dst_idx;
  int64_t src_rows, dst_rows;
  int64_t row_elems;
  int rows;
  bool accumulate;
  bool zero_bad_src;  // embedding: an out-of-range id yields a zero row
};

template <typename Src>
__global__ void row_copy_kernel(const RowCopy p) {
  grid_dep_wait();
  grid_dep_launch();
  const int i = blockIdx.x;
  int64_t s = p.src_idx ? p.src_idx[i] : i;
  int64_t d = p.dst_idx ? p.dst_idx[i] : i;
  if (d < 0 || d >= p.dst_rows) return;
  bf16* dst = static_cast<bf16*>(p.dst) + d * p.row_elems;
  const bool bad = s < 0 || s >= p.src_rows;
  if (bad && !p.zero_bad_src) return;
  const Src* src = static_cast<const Src*>(p.src) + (bad ? 0 : s) * p.row_elems;
  const bool vec = sizeof(Src) == 2 && (p.row_elems % 8) == 0;
  if (vec) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int64_t v = threadIdx.x; v < p.row_elems / 8; v += blockDim.x) {
      uint4 val = bad ? make_uint4(0, 0, 0, 0) : s4[v];
      if (p.accumulate) {
        float a[8], b[8];
        unpack8(d4[v], a);
        unpack8(val, b);
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] += b[e];
        val = pack8(a);
      }
      d4[v] = val;
    }
  } else {
    for (int64_t e = threadIdx.x; e < p.row_elems; e += blockDim.x) {
      float v = bad ? 0.0f : static_cast<float>(src[e]);
      if (p.accumulate) v += __bfloat162float(dst[e]);
      dst[e] = __float2bfloat16_rn(v);
    }
  }
}

void run_row_copy(const LaunchContext& ctx, const RowCopy& p, DType src_dtype) {
  if (p.rows == 0) return;
  int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (p.row_elems / 8 + 31) / 32 * 32)));
  if (src_dtype == DType::kBF16) {
    launch(ctx, "row_copy", row_copy_kernel<bf16>, dim3(p.rows), dim3(threads), 0, p);
  } else {
    QVL_CHECK(src_dtype == DType::kF32) << "row copy from " << dtype_name(src_dtype);
    launch(ctx, "row_copy", row_copy_kernel<float>, dim3(p.rows), dim3(threads), 0, p);
  }
}

// ---- SiLU · mul ----
// out[r, j] = bf16(bf16(silu(g)) * u), g = gate_up[r, j], u = gate_up[r, I + j]
__global__ void silu_mul_kernel(bf16* out, const bf16* gate_up, int64_t rows, int64_t inter) {
  grid_dep_wait();
  grid_dep_launch();
  const int64_t per_row = inter / 8;
  const int64_t total = rows * per_row;
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < total; v += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = v / per_row, c = v % per_row;
    const uint4* g4 = reinterpret_cast<const uint4*>(gate_up + r * 2 * inter);
    const uint4* u4 = reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + inter);
    float g[8], u[8], o[8];
    unpack8(g4[c], g);
    unpack8(u4[c], u);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = bf16_round(silu(g[e])) * u[e];
    reinterpret_cast<uint4*>(out + r * inter)[c] = pack8(o);
  }
}
__global__ void silu_mul_scalar_kernel(bf16* out, const bf16* gate_up, int64_t rows, int64_t inter) {
  grid_dep_wait();
  grid_dep_launch();
  const int64_t total = rows * inter;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / inter, c = i % inter;
    float g = __bfloat162float(gate_up[r * 2 * inter + c]);
    float u = __bfloat162float(gate_up[r * 2 * inter + inter + c]);
    out[i] = __float2bfloat16_rn(bf16_round(silu(g)) * u);
  }
}

// ---- interpolated position embedding ----
// x[r] = bf16(x[r] + bf16(Σ_k w[r,k] · table[idx[r,k]]))   (v5.17: the 4-tap sum in fp32)
__global__ void add_interpolated_kernel(bf16* x, const bf16* table, const int32_t* idx, const float* w, int64_t dim,
                                        int64_t table_rows) {
  grid_dep_wait();
  grid_dep_launch();
  const int64_t r = blockIdx.x;
  int32_t id[4];
  float wt[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    id[k] = idx[r * 4 + k];
    wt[k] = w[r * 4 + k];
    if (id[k] < 0 || id[k] >= table_rows) {  // never for valid grids; keep reads in bounds
      id[k] = 0;
      wt[k] = 0.0f;
    }
  }
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float pos = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) pos += wt[k] * __bfloat162float(table[id[k] * dim + c]);
    float v = __bfloat162float(x[r * dim + c]) + bf16_round(pos);
    x[r * dim + c] = __float2bfloat16_rn(v);
  }
}

// ---- vision RoPE ----
// For each row, q and k of every head: out[d] = x[d]·cos[d] − x[d+h]·sin[d],
// out[d+h] = x[d+h]·cos[d+h] + x[d]·sin[d+h] (h = dh/2), fp32, rounded once.
__global__ void vision_rope_kernel(bf16* qkv, const float* rope, int64_t rows, int heads, int head_dim) {
  grid_dep_wait();
  grid_dep_launch();
  const int half = head_dim / 2;
  const int64_t row_width = 3LL * heads * head_dim;
  const int64_t per_row = 2LL * heads * half;  // (q|k) x heads x pairs
  const int64_t total = rows * per_row;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / per_row;
    const int64_t rem = i % per_row;
    const int d = static_cast<int>(rem % half);
    const int64_t head = rem / half;  // 0 .. 2*heads-1: q heads then k heads
    bf16* base = qkv + r * row_width + head * head_dim;
    const float* cs = rope + r * 2 * head_dim;  // cos[dh] then sin[dh]
    const float x1 = __bfloat162float(base[d]), x2 = __bfloat162float(base[d + half]);
    const float o1 = x1 * cs[d] - x2 * cs[head_dim + d];
    const float o2 = x2 * cs[d + half] + x1 * cs[head_dim + d + half];
    base[d] = __float2bfloat16_rn(o1);
    base[d + half] = __float2bfloat16_rn(o2);
  }
}

// The same, V pairs per thread (half % V == 0): V = 8 (2B / 4B) loads 16 bytes of x and two float4
// of each of the table's four slices; V = 4 (8B's head dim 72, whose half of 36 is no multiple of
// 8) loads 8 bytes and one float4 of each.
template <int V>
__global__ void vision_rope_vec_kernel(bf16* qkv, const float* rope, int64_t rows, int heads, int head_dim) {
  static_assert(V == 4 || V == 8, "pairs per thread");
  using Chunk = std::conditional_t<V == 8, uint4, uint2>;  // V BF16
  grid_dep_wait();
  grid_dep_launch();
  const int half = head_dim / 2, chunks = half / V;
  const int64_t row_width = 3LL * heads * head_dim;
  const int64_t per_row = 2LL * heads * chunks;
  const int64_t total = rows * per_row;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / per_row;
    const int rem = static_cast<int>(i % per_row);
    const int d = (rem % chunks) * V, head = rem / chunks;
    bf16* base = qkv + r * row_width + static_cast<int64_t>(head) * head_dim;
    const float* cs = rope + r * 2 * head_dim;
    float x1[V], x2[V], c1[V], c2[V], s1[V], s2[V], o1[V], o2[V];
    unpack_bf16<V>(*reinterpret_cast<const Chunk*>(base + d), x1);
    unpack_bf16<V>(*reinterpret_cast<const Chunk*>(base + d + half), x2);
    auto load = [](const float* p, float(&f)[V]) {
#pragma unroll
      for (int e = 0; e < V; e += 4) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(p + e));
        f[e] = a.x, f[e + 1] = a.y, f[e + 2] = a.z, f[e + 3] = a.w;
      }
    };
    load(cs + d, c1);
    load(cs + d + half, c2);
    load(cs + head_dim + d, s1);
    load(cs + head_dim + d + half, s2);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      o1[e] = x1[e] * c1[e] - x2[e] * s1[e];
      o2[e] = x2[e] * c2[e] + x1[e] * s2[e];
    }
    *reinterpret_cast<Chunk*>(base + d) = pack_bf16<Chunk>(o1);
    *reinterpret_cast<Chunk*>(base + d + half) = pack_bf16<Chunk>(o2);
  }
}

// The rotary table from its per-position factors (core/vision_rope.h expand_vision_rope): one
// thread per float of rope [n, 2, 4q]; positions outside [0, angle_rows) (never for the tables the
// host writes) give zeros rather than reads out of bounds.
__global__ void vision_rope_table_kernel(float* rope, const int32_t* row_col, const float* angles, int64_t n,
                                         int64_t angle_rows, int q) {
  grid_dep_wait();
  grid_dep_launch();
  const int dh = 4 * q;
  const int64_t total = n * 2 * dh;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / (2 * dh);
    const int rem = static_cast<int>(i % (2 * dh));
    const int s = rem / dh, seg = (rem % dh) / q, e = rem % q;  // cos|sin, [row|col|row|col], frequency
    const int32_t pos = row_col[r * 2 + (seg & 1)];
    rope[i] = pos >= 0 && pos < angle_rows ? angles[(static_cast<int64_t>(pos) * 2 + s) * q + e] : 0.0f;
  }
}

// ---- Linear epilogue (for the cuBLASLt path) ----
__device__ __forceinline__ float apply_act(float v, int act) {
  if (act == static_cast<int>(Activation::kGeluTanh)) return gelu_tanh(v);
  if (act == static_cast<int>(Activation::kGeluErf)) return gelu_erf(v);
  return v;
}
// 8 elements per thread-iteration (16-byte loads and stores) when every pointer is 16-byte
// aligned; the same per-element arithmetic either way.
__device__ __forceinline__ float epilogue_value(float v, float r, int act, bool has_res) {
  if (act != 0) v = bf16_round(apply_act(v, act));
  return has_res ? r + v : v;
}
__global__ void epilogue_kernel(bf16* out, const bf16* residual, int64_t total, int act, bool vec) {
  grid_dep_wait();
  grid_dep_launch();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const bool has_res = residual != nullptr;
  const int64_t vecs = vec ? total / 8 : 0;
  for (int64_t v = first; v < vecs; v += stride) {
    float x[8], r[8] = {};
    unpack8(reinterpret_cast<const uint4*>(out)[v], x);
    if (has_res) unpack8(reinterpret_cast<const uint4*>(residual)[v], r);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = epilogue_value(x[e], r[e], act, has_res);
    reinterpret_cast<uint4*>(out)[v] = pack8(x);
  }
  for (int64_t i = vecs * 8 + first; i < total; i += stride)
    out[i] = __float2bfloat16_rn(
        epilogue_value(__bfloat162float(out[i]), has_res ? __bfloat162float(residual[i]) : 0.0f, act, has_res));
}

// ---- FP8 dequantisation (transformers' dequantize=True: bf16(float(w8) * scale)) ----
// 16 weights per thread-iteration (one 16-byte load, two 16-byte stores, one scale: 16 divides
// the 128-wide scale blocks) with 32-bit index math inside the chunk; the scalar kernel below
// takes shapes this one cannot (columns or block not a multiple of 16, unaligned pointers).
__global__ void dequant_fp8_vec_kernel(bf16* dst, const uint8_t* w8, const float* scale, int64_t r0, int rows, int cols,
                                       int scale_cols, int rows_per_scale, int block) {
  grid_dep_wait();
  grid_dep_launch();
  const int vpr = cols / 16, total = rows * vpr;
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < total; v += gridDim.x * blockDim.x) {
    const int r = v / vpr, c = (v - r * vpr) * 16;
    const int64_t gr = r0 + r;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w8 + gr * cols + c));
    const float s = scale[(gr / rows_per_scale) * scale_cols + c / block];
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    float f[2][8];
#pragma unroll
    for (int e = 0; e < 16; ++e)
      f[e / 8][e % 8] = fp8_e4m3_to_float_dev(static_cast<uint8_t>(words[e / 4] >> (8 * (e % 4)))) * s;
    uint4* out = reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * cols + c);
    out[0] = pack8(f[0]);
    out[1] = pack8(f[1]);
  }
}
__global__ void dequant_fp8_kernel(bf16* dst, const uint8_t* w8, const float* scale, int64_t r0, int64_t rows,
                                   int64_t cols, int scale_cols, int rows_per_scale, int block) {
  grid_dep_wait();
  grid_dep_launch();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = r0 + i / cols, c = i % cols;
    const float s = scale[(r / rows_per_scale) * scale_cols + c / block];
    dst[i] = __float2bfloat16_rn(fp8_e4m3_to_float_dev(w8[r * cols + c]) * s);
  }
}

// ---- dtype conversion ----
// float -> bf16 bits exactly as core/dtype.h float_to_bf16 (round to nearest even; a NaN keeps
// its upper bits and is made quiet), so that device and host conversions agree bit for bit.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// dst[i] = bf16(src[i]); 8 elements per thread-iteration (two 16-byte loads, one store) and a
// scalar tail. Both pointers are 16-byte aligned (the launcher checks).
__global__ void f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  grid_dep_wait();
  grid_dep_launch();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t vecs = n / 8;
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < vecs; v += stride) {
    const float4 a = reinterpret_cast<const float4*>(src)[2 * v];
    const float4 b = reinterpret_cast<const float4*>(src)[2 * v + 1];
    uint4 o;
    o.x = f32_to_bf16_bits(a.x) | (uint32_t{f32_to_bf16_bits(a.y)} << 16);
    o.y = f32_to_bf16_bits(a.z) | (uint32_t{f32_to_bf16_bits(a.w)} << 16);
    o.z = f32_to_bf16_bits(b.x) | (uint32_t{f32_to_bf16_bits(b.y)} << 16);
    o.w = f32_to_bf16_bits(b.z) | (uint32_t{f32_to_bf16_bits(b.w)} << 16);
    reinterpret_cast<uint4*>(dst)[v] = o;
  }
  for (int64_t i = vecs * 8 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = f32_to_bf16_bits(src[i]);
}
__global__ void bf16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  grid_dep_wait();
  grid_dep_launch();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __uint_as_float(uint32_t{src[i]} << 16);
}

unsigned grid_for(int64_t work, int threads, int num_sms) {
  int64_t blocks = (work + threads - 1) / threads;
  int64_t cap = static_cast<int64_t>(num_sms) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, cap)));
}

void check_bf16(const Tensor& t, const char* what) {
  QVL_CHECK(t.dtype == DType::kBF16) << what << " must be bf16, is " << t.describe();
  QVL_CHECK(t.device == Device::kCuda) << what << " is not a CUDA tensor";
}

}  // namespace

void launch_embedding(const LaunchContext& ctx, Tensor out, const Tensor& table, const Tensor& ids) {
  check_bf16(out, "embedding out");
  QVL_CHECK(ids.dtype == DType::kI32) << ids.describe();
  QVL_CHECK_EQ(out.dim(0), ids.numel());
  QVL_CHECK_EQ(out.row_numel(), table.row_numel());
  RowCopy p{table.data,   out.data,   ids.as<int32_t>(), nullptr,
            table.dim(0), out.dim(0), out.row_numel(),   static_cast<int>(out.dim(0)),
            false,        true};
  run_row_copy(ctx, p, table.dtype);
}

void launch_scatter_rows(const LaunchContext& ctx, Tensor x, const Tensor& rows, const Tensor& src, bool accumulate) {
  check_bf16(x, "scatter_rows x");
  QVL_CHECK(rows.dtype == DType::kI32) << rows.describe();
  QVL_CHECK_EQ(src.dim(0), rows.numel());
  QVL_CHECK_EQ(x.row_numel(), src.row_numel());
  RowCopy p{src.data,   x.data,   nullptr,       rows.as<int32_t>(),
            src.dim(0), x.dim(0), x.row_numel(), static_cast<int>(src.dim(0)),
            accumulate, false};
  run_row_copy(ctx, p, src.dtype);
}

void launch_gather_rows(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& rows) {
  check_bf16(out, "gather_rows out");
  QVL_CHECK(rows.dtype == DType::kI32) << rows.describe();
  QVL_CHECK_EQ(out.dim(0), rows.numel());
  QVL_CHECK_EQ(out.row_numel(), x.row_numel());
  RowCopy p{x.data,     out.data,        rows.as<int32_t>(),           nullptr, x.dim(0),
            out.dim(0), out.row_numel(), static_cast<int>(out.dim(0)), false,   false};
  run_row_copy(ctx, p, x.dtype);
}

void launch_silu_mul(const LaunchContext& ctx, Tensor out, const Tensor& gate_up) {
  check_bf16(out, "silu_mul out");
  check_bf16(gate_up, "silu_mul gate_up");
  const int64_t rows = out.dim(0), inter = out.row_numel();
  QVL_CHECK_EQ(gate_up.dim(0), rows);
  QVL_CHECK_EQ(gate_up.row_numel(), 2 * inter);
  if (inter % 8 == 0) {
    launch(ctx, "silu_mul", silu_mul_kernel, dim3(grid_for(rows * inter / 8, 256, ctx.num_sms)), dim3(256), 0,
           out.as<bf16>(), gate_up.as<bf16>(), rows, inter);
  } else {
    launch(ctx, "silu_mul", silu_mul_scalar_kernel, dim3(grid_for(rows * inter, 256, ctx.num_sms)), dim3(256), 0,
           out.as<bf16>(), gate_up.as<bf16>(), rows, inter);
  }
}

void launch_add_interpolated(const LaunchContext& ctx, Tensor x, const Tensor& table, const Tensor& idx,
                             const Tensor& w) {
  check_bf16(x, "add_interpolated x");
  check_bf16(table, "add_interpolated table");
  QVL_CHECK(idx.dtype == DType::kI32) << idx.describe();
  QVL_CHECK(w.dtype == DType::kF32) << w.describe();
  QVL_CHECK_EQ(idx.numel(), x.dim(0) * 4);
  QVL_CHECK_EQ(w.numel(), x.dim(0) * 4);
  QVL_CHECK_EQ(table.row_numel(), x.row_numel());
  launch(ctx, "add_interpolated", add_interpolated_kernel, dim3(static_cast<unsigned>(x.dim(0))), dim3(256), 0,
         x.as<bf16>(), table.as<bf16>(), idx.as<int32_t>(), w.as<float>(), x.row_numel(), table.dim(0));
}

void launch_vision_rope(const LaunchContext& ctx, Tensor qkv, const Tensor& rope, int num_heads, int head_dim) {
  check_bf16(qkv, "vision_rope qkv");
  QVL_CHECK(rope.dtype == DType::kF32) << rope.describe();
  QVL_CHECK_EQ(head_dim % 2, 0);
  QVL_CHECK_EQ(qkv.row_numel(), 3LL * num_heads * head_dim);
  QVL_CHECK_EQ(rope.numel(), qkv.dim(0) * 2 * head_dim);
  // V pairs per thread where the row, every head and both halves stay V-element aligned.
  const bool aligned =
      reinterpret_cast<uintptr_t>(qkv.data) % 16 == 0 && reinterpret_cast<uintptr_t>(rope.data) % 16 == 0;
  if (aligned && head_dim % 16 == 0) {
    const int64_t work = qkv.dim(0) * 2 * num_heads * (head_dim / 16);
    launch(ctx, "vision_rope", vision_rope_vec_kernel<8>, dim3(grid_for(work, 256, ctx.num_sms)), dim3(256), 0,
           qkv.as<bf16>(), rope.as<float>(), qkv.dim(0), num_heads, head_dim);
    return;
  }
  if (aligned && head_dim % 8 == 0) {
    const int64_t work = qkv.dim(0) * 2 * num_heads * (head_dim / 8);
    launch(ctx, "vision_rope", vision_rope_vec_kernel<4>, dim3(grid_for(work, 256, ctx.num_sms)), dim3(256), 0,
           qkv.as<bf16>(), rope.as<float>(), qkv.dim(0), num_heads, head_dim);
    return;
  }
  const int64_t work = qkv.dim(0) * 2 * num_heads * (head_dim / 2);
  launch(ctx, "vision_rope", vision_rope_kernel, dim3(grid_for(work, 256, ctx.num_sms)), dim3(256), 0, qkv.as<bf16>(),
         rope.as<float>(), qkv.dim(0), num_heads, head_dim);
}

void launch_vision_rope_table(const LaunchContext& ctx, Tensor rope, const Tensor& row_col, const Tensor& angles) {
  check_vision_rope_table(rope, row_col, angles);
  const int64_t work = rope.numel();
  if (work == 0) return;
  launch(ctx, "vision_rope_table", vision_rope_table_kernel, dim3(grid_for(work, 256, ctx.num_sms)), dim3(256), 0,
         rope.as<float>(), row_col.as<int32_t>(), angles.as<float>(), rope.dim(0), angles.dim(0),
         static_cast<int>(angles.dim(2)));
}

void launch_epilogue(const LaunchContext& ctx, Tensor out, Activation act, const Tensor& residual) {
  check_bf16(out, "epilogue out");
  if (!residual.empty()) {
    check_bf16(residual, "epilogue residual");
    QVL_CHECK(residual.same_shape(out)) << residual.describe() << " vs " << out.describe();
  }
  if (act == Activation::kNone && residual.empty()) return;
  const bool vec = reinterpret_cast<uintptr_t>(out.data) % 16 == 0 &&
                   (residual.empty() || reinterpret_cast<uintptr_t>(residual.data) % 16 == 0);
  launch(ctx, "epilogue", epilogue_kernel, dim3(grid_for(vec ? out.numel() / 8 + 1 : out.numel(), 256, ctx.num_sms)),
         dim3(256), 0, out.as<bf16>(), residual.empty() ? nullptr : residual.as<bf16>(), out.numel(),
         static_cast<int>(act), vec);
}

void launch_dequant_fp8(const LaunchContext& ctx, void* dst_bf16, const Tensor& w8, const Tensor& scale,
                        int rows_per_scale, int block, int64_t r0, int64_t r1) {
  QVL_CHECK(w8.dtype == DType::kF8E4M3) << w8.describe();
  QVL_CHECK(scale.dtype == DType::kF32) << scale.describe();
  QVL_CHECK(r0 >= 0 && r0 <= r1 && r1 <= w8.dim(0)) << r0 << ".." << r1 << " of " << w8.describe();
  const int64_t cols = w8.dim(1);
  const bool vec = cols % 16 == 0 && block % 16 == 0 && (r1 - r0) * cols < (int64_t{1} << 31) &&
                   reinterpret_cast<uintptr_t>(w8.data) % 16 == 0 && reinterpret_cast<uintptr_t>(dst_bf16) % 16 == 0;
  if (vec) {
    // One thread per 16-byte vector, no cap on the grid: blocks that end and are replaced keep
    // more loads in flight than a capped grid's strided loop. Measured on the 4B FP8 Linears of a
    // prefill (H100, tools/bench/fp8_prefill_probe.cu): 4.43 ms against 5.03 with the usual cap
    // of 16 blocks per multiprocessor; 2 or 4 vectors per thread were slower (5.5-6.1 ms).
    const int64_t vectors = (r1 - r0) * cols / 16;
    launch(ctx, "dequant_fp8", dequant_fp8_vec_kernel,
           dim3(static_cast<unsigned>(std::max<int64_t>(1, (vectors + 255) / 256))), dim3(256), 0,
           static_cast<bf16*>(dst_bf16), w8.as<uint8_t>(), scale.as<float>(), r0, static_cast<int>(r1 - r0),
           static_cast<int>(cols), static_cast<int>(scale.dim(1)), rows_per_scale, block);
    return;
  }
  launch(ctx, "dequant_fp8", dequant_fp8_kernel, dim3(grid_for((r1 - r0) * cols, 256, ctx.num_sms)), dim3(256), 0,
         static_cast<bf16*>(dst_bf16), w8.as<uint8_t>(), scale.as<float>(), r0, r1 - r0, cols,
         static_cast<int>(scale.dim(1)), rows_per_scale, block);
}

// ---------------------------------------------------------------- patchify RGB8
// One thread per 8 consecutive outputs (patch row, channel, pixel row, 8 pixels): 8 bytes in
// (stride 3, through L1/L2), one 16-byte store (BF16; two for F32) per temporal copy, so a
// warp's stores are contiguous. Needs patch % 8 == 0 (Qwen-VL's 14 and 16: 16 only; 14 takes
// the generic path, one element per thread). 32-bit indexing (launch_patchify_rgb checks the
// sizes). The value is image/preprocess.cpp's normalize_table entry: an exact subtraction, then
// a correctly rounded division (explicit _rn intrinsics: nothing may contract or approximate).
__device__ __forceinline__ float normalize_u8(uint8_t v) {
  return __fdiv_rn(__fsub_rn(static_cast<float>(v), 127.5f), 127.5f);
}
__device__ __forceinline__ void patch_origin(int row, int grid_w, int p, int m, int& y0, int& x0) {
  const int wi = row % m, hi = row / m % m, block = row / (m * m), blocks_w = grid_w / m;
  y0 = (block / blocks_w * m + hi) * p;
  x0 = (block % blocks_w * m + wi) * p;
}
template <typename T>
__global__ void patchify_rgb8_kernel(T* out, const uint8_t* rgb, int grid_w, int p, int m, int tps, int work) {
  grid_dep_wait();
  grid_dep_launch();
  const int row_stride = grid_w * p * 3, pp = p * p, groups = p / 8;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < work; i += gridDim.x * blockDim.x) {
    const int g = i % groups, py = i / groups % p, c = i / (groups * p) % 3, row = i / (groups * p * 3);
    int y0, x0;
    patch_origin(row, grid_w, p, m, y0, x0);
    const uint8_t* src = rgb + (y0 + py) * row_stride + (x0 + 8 * g) * 3 + c;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = normalize_u8(src[3 * e]);
    T* dst = out + static_cast<int64_t>(row) * 3 * tps * pp + c * tps * pp + py * p + 8 * g;
    for (int t = 0; t < tps; ++t) {
      if constexpr (std::is_same_v<T, float>) {
        reinterpret_cast<float4*>(dst + t * pp)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(dst + t * pp)[1] = make_float4(v[4], v[5], v[6], v[7]);
      } else {
        uint4 o;
        o.x = f32_to_bf16_bits(v[0]) | (uint32_t{f32_to_bf16_bits(v[1])} << 16);
        o.y = f32_to_bf16_bits(v[2]) | (uint32_t{f32_to_bf16_bits(v[3])} << 16);
        o.z = f32_to_bf16_bits(v[4]) | (uint32_t{f32_to_bf16_bits(v[5])} << 16);
        o.w = f32_to_bf16_bits(v[6]) | (uint32_t{f32_to_bf16_bits(v[7])} << 16);
        *reinterpret_cast<uint4*>(dst + t * pp) = o;
      }
    }
  }
}
// Any patch size: one thread per output element.
template <typename T>
__global__ void patchify_rgb_kernel(T* out, const uint8_t* rgb, int grid_w, int p, int m, int tps, int n) {
  grid_dep_wait();
  grid_dep_launch();
  const int pp = p * p, cols = 3 * tps * pp, row_stride = grid_w * p * 3;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int row = i / cols, col = i % cols;
    const int c = col / (tps * pp), in_plane = col % pp;  // the temporal copy (col / pp % tps) is the same
    int y0, x0;
    patch_origin(row, grid_w, p, m, y0, x0);
    const float v = normalize_u8(rgb[(y0 + in_plane / p) * row_stride + (x0 + in_plane % p) * 3 + c]);
    if constexpr (std::is_same_v<T, float>)
      out[i] = v;
    else
      out[i] = f32_to_bf16_bits(v);
  }
}

void launch_patchify_rgb(const LaunchContext& ctx, Tensor out, const Tensor& rgb, int grid_h, int grid_w, int patch,
                         int merge, int temporal) {
  const int64_t rows = int64_t{grid_h} * grid_w, cols = 3LL * temporal * patch * patch;
  QVL_CHECK(out.device == Device::kCuda && rgb.device == Device::kCuda) << rgb.describe() << " -> " << out.describe();
  QVL_CHECK(patch > 0 && merge > 0 && temporal > 0 && grid_h % merge == 0 && grid_w % merge == 0)
      << "patchify_rgb: grid " << grid_h << "x" << grid_w << ", patch " << patch << ", merge " << merge;
  QVL_CHECK(rgb.dtype == DType::kU8 && rgb.numel() == rows * patch * patch * 3)
      << "patchify_rgb: " << rgb.describe() << " for a " << grid_h << "x" << grid_w << " grid of patch " << patch;
  QVL_CHECK(out.ndim == 2 && out.dim(0) == rows && out.dim(1) == cols) << "patchify_rgb into " << out.describe();
  QVL_CHECK(rows * cols < (int64_t{1} << 31) && rgb.numel() < (int64_t{1} << 31))
      << "patchify_rgb: " << rows << " patches of " << cols << " values is over the kernel's 32-bit indexing";
  const bool vec = patch % 8 == 0 && reinterpret_cast<uintptr_t>(out.data) % 16 == 0;
  const int work = static_cast<int>(vec ? rows * 3 * patch * (patch / 8) : rows * cols);
  const dim3 grid(grid_for(work, 256, ctx.num_sms));
  if (out.dtype == DType::kBF16)
    launch(ctx, "patchify_rgb", vec ? patchify_rgb8_kernel<uint16_t> : patchify_rgb_kernel<uint16_t>, grid, dim3(256),
           0, out.as<uint16_t>(), rgb.as<const uint8_t>(), grid_w, patch, merge, temporal, work);
  else if (out.dtype == DType::kF32)
    launch(ctx, "patchify_rgb", vec ? patchify_rgb8_kernel<float> : patchify_rgb_kernel<float>, grid, dim3(256), 0,
           out.as<float>(), rgb.as<const uint8_t>(), grid_w, patch, merge, temporal, work);
  else
    QVL_CHECK(false) << "patchify_rgb into " << out.describe() << ": F32 or BF16 only";
}

void launch_convert(const LaunchContext& ctx, Tensor out, const Tensor& x) {
  QVL_CHECK(out.device == Device::kCuda && x.device == Device::kCuda) << x.describe() << " -> " << out.describe();
  QVL_CHECK_EQ(out.numel(), x.numel()) << "convert " << x.describe() << " -> " << out.describe();
  const int64_t n = x.numel();
  if (x.dtype == DType::kF32 && out.dtype == DType::kBF16) {
    QVL_CHECK(reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && reinterpret_cast<uintptr_t>(out.data) % 16 == 0)
        << "convert: unaligned " << x.describe() << " -> " << out.describe();
    launch(ctx, "convert", f32_to_bf16_kernel, dim3(grid_for(std::max<int64_t>(n / 8, 1), 256, ctx.num_sms)), dim3(256),
           0, out.as<uint16_t>(), x.as<const float>(), n);
  } else if (x.dtype == DType::kBF16 && out.dtype == DType::kF32) {
    launch(ctx, "convert", bf16_to_f32_kernel, dim3(grid_for(n, 256, ctx.num_sms)), dim3(256), 0, out.as<float>(),
           x.as<const uint16_t>(), n);
  } else {
    QVL_CHECK(false) << "convert " << x.describe() << " -> " << out.describe() << ": F32 <-> BF16 only";
  }
}

}  // namespace qvl::cuda
