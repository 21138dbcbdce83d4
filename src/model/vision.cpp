// The vision tower (spec §5): patch embedding + interpolated learned positions, pre-norm ViT
// blocks with 2-D RoPE and per-image attention, the 2×2 patch merger and the deepstack mergers.
// Arena layout (memory/activations.h): outputs first (they outlive the call), then x, the rope
// table and cu_seqlens for the whole pass, then one stage at a time above them. Host data goes
// up through the caller's staging buffer when there is one (same layout: vision_upload_terms).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel_copy.h"
#include "model/model.h"

namespace qvl {

Result<VisionOutput> Qwen3VLModel::encode_images(std::span<const ImageInput> images, Arena& arena,
                                                 const HostStaging& staging) const {
  const VisionConfig& vc = config_.vision;
  const VisionWeights& w = weights_.vision;
  if (images.empty()) return invalid_argument("encode_images: no images");
  std::vector<ImageGrid> grids;
  const bool from_rgb = images[0].rgb != nullptr;
  for (size_t i = 0; i < images.size(); ++i) {
    const ImageInput& img = images[i];
    const std::string name = "image " + std::to_string(i);
    QVL_RETURN_IF_ERROR(validate_grid(img.grid, vc, static_cast<int>(i)));
    if (!img.pixel_values == !img.rgb)
      return invalid_argument(name + ": give either pixel values or RGB bytes, not " + (img.rgb ? "both" : "neither"));
    if ((img.rgb != nullptr) != from_rgb)
      return invalid_argument(name + ": images of one call must all be pixel values or all RGB bytes");
    if (img.rgb && (img.grid.t != 1 || vc.in_channels != 3))
      return invalid_argument(name + ": RGB bytes need grid t = 1 and 3 input channels (grid t " +
                              std::to_string(img.grid.t) + ", " + std::to_string(vc.in_channels) + " channels)");
    grids.push_back(img.grid);
  }
  const bool staged = staging.data != nullptr;
  const VisionLayout layout = vision_layout(vc, grids);
  const int64_t N = layout.num_patches, M = layout.num_tokens;
  const int64_t D = vc.hidden_size, O = vc.out_hidden_size, P = vc.patch_dim();
  const int dh = vc.head_dim();
  const DType act = backend_.activation_dtype();
  const int64_t num_segments = static_cast<int64_t>(layout.cu_seqlens.size());
  // The host side of every upload below: the staging buffer (its previous uploads finished
  // reading it once the stream is idle), else the caller's pixels and vectors of our own, copied
  // synchronously.
  if (staged) backend_.synchronize();
  Arena host(staging.data, staging.bytes, Device::kCpu, "vision upload staging");
  auto send = [&](Tensor dst, const void* src) {
    if (staged)
      backend_.copy_to_device_async(dst, src);
    else
      backend_.copy_to_device(dst, src);
  };

  // Outputs: merged embeddings and deepstack features, [M, O] each; held by the caller.
  VisionOutput out;
  out.embeds = arena.alloc(act, {M, O});
  for (int j = 0; j < num_deepstack(); ++j) out.deepstack.push_back(arena.alloc(act, {M, O}));
  out.token_offsets = layout.token_offsets;
  const size_t outputs_end = arena.used();

  // Live through the pass: hidden state, rotary table, attention segments.
  Tensor x = arena.alloc(act, {N, D});                 // [N, D]
  Tensor rope = arena.alloc(DType::kF32, {N, 2, dh});  // [N, 2, dh] cos | sin
  Tensor cu_seqlens = arena.alloc(DType::kI32, {num_segments});
  VisionSegments seg{cu_seqlens, layout.cu_seqlens, layout.max_seqlen};
  const size_t stage = arena.used();

  {
    // The tables first: the host writes their factors (a few KB) and the device expands the
    // rotary table while the host copies the pixels. The angle rows are allocated for the most
    // that N patches can need (the plan's term), and only the used ones travel.
    const int64_t angle_rows = vision_angle_rows(grids), max_angle_rows = vc.max_grid_side(N);
    Tensor idx = arena.alloc(DType::kI32, {N, 4});
    Tensor wts = arena.alloc(DType::kF32, {N, 4});
    Tensor row_col = arena.alloc(DType::kI32, {N, 2});
    Tensor angles = arena.alloc(DType::kF32, {max_angle_rows, 2, dh / 4});
    std::vector<std::vector<uint8_t>> unstaged;  // the tables' host side without a staging buffer
    auto host_table = [&](const Tensor& like) {  // like's shape and dtype, in host memory
      Tensor t = like;
      t.device = Device::kCpu;
      if (staged) {
        t.data = host.alloc_bytes(like.nbytes());
      } else {
        unstaged.emplace_back(like.nbytes());  // moving the vectors keeps their buffers
        t.data = unstaged.back().data();
      }
      return t;
    };
    Tensor h_cu = host_table(cu_seqlens), h_idx = host_table(idx), h_wts = host_table(wts);
    Tensor h_row_col = host_table(row_col), h_angles = host_table(angles);
    std::memcpy(h_cu.data, layout.cu_seqlens.data(), static_cast<size_t>(h_cu.nbytes()));
    write_vision_factors(vc, grids, h_idx.as<int32_t>(), h_wts.as<float>(), h_row_col.as<int32_t>(),
                         h_angles.as<float>());
    send(cu_seqlens, h_cu.data);
    send(idx, h_idx.data);
    send(wts, h_wts.data);
    send(row_col, h_row_col.data);
    send(angles.rows(0, angle_rows), h_angles.data);
    backend_.vision_rope_table(rope, row_col, angles.rows(0, angle_rows));

    // Patch embedding: the Conv3d with kernel = stride is a Linear over flattened patches. The
    // input goes up either as RGB bytes (patchified and normalised on the device, in the tower's
    // dtype) or as F32 pixel values, cast on the device as the reference casts pixel_values to
    // the tower's dtype. Staged, uploads go in chunks so that the copy into the staging buffer of
    // one chunk overlaps the transfer of the one before.
    auto upload = [&](Tensor dst, Tensor host_dst, const void* src) {  // dst, host_dst: 1-D, same bytes
      if (!staged) return backend_.copy_to_device(dst, src);
      const int64_t chunk = std::max<int64_t>(1, kStagingChunkBytes / dtype_size(dst.dtype));
      for (int64_t r = 0; r < dst.numel(); r += chunk) {
        const int64_t e = std::min(dst.numel(), r + chunk);
        Tensor h = host_dst.rows(r, e);
        parallel_copy(h.data, static_cast<const char*>(src) + r * dtype_size(dst.dtype),
                      static_cast<size_t>(h.nbytes()));
        backend_.copy_to_device_async(dst.rows(r, e), h.data);
      }
    };
    Tensor input;
    if (from_rgb) {
      const int64_t pp3 = 3LL * vc.patch_size * vc.patch_size;  // RGB bytes per patch
      Tensor rgb = arena.alloc(DType::kU8, {N * pp3});
      Tensor host_rgb = staged ? host.alloc(DType::kU8, {N * pp3}) : Tensor();
      input = arena.alloc(act, {N, P});
      int64_t row = 0;
      for (const ImageInput& img : images) {
        const int64_t n = img.grid.num_patches();
        upload(rgb.rows(row * pp3, (row + n) * pp3), staged ? host_rgb.rows(row * pp3, (row + n) * pp3) : Tensor(),
               img.rgb);
        backend_.patchify_rgb(input.rows(row, row + n), rgb.rows(row * pp3, (row + n) * pp3), img.grid.h, img.grid.w,
                              vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
        row += n;
      }
    } else {
      Tensor pixels = arena.alloc(DType::kF32, {N, P});  // [N, C·T·P·P]
      Tensor host_pixels = staged ? host.alloc(DType::kF32, {N * P}) : Tensor();
      int64_t row = 0;
      for (const ImageInput& img : images) {
        const int64_t n = img.grid.num_patches();
        upload(pixels.rows(row, row + n).reshape({n * P}), staged ? host_pixels.rows(row * P, (row + n) * P) : Tensor(),
               img.pixel_values);
        row += n;
      }
      input = pixels;
      if (act != DType::kF32) {  // the reference casts pixel_values to the tower's dtype before the Conv3d
        input = arena.alloc(act, {N, P});
        backend_.convert(input, pixels);
      }
    }
    backend_.linear(x, input, w.patch_embed, {});
    // + learned positions, bilinearly resampled to each image's grid.
    backend_.add_interpolated(x, w.pos_embed, idx, wts);
    arena.reset(stage);
  }
  dump(kStagePatchEmbed, -1, x);

  for (int b = 0; b < vc.depth; ++b) {
    vision_block(w.blocks[b], x, rope, seg, arena);
    dump(kStageVisionBlock, b, x);
    for (int j = 0; j < num_deepstack(); ++j) {
      if (vc.deepstack_visual_indexes[j] != b) continue;
      patch_merger(w.deepstack_mergers[j], out.deepstack[j], x, arena);
      dump(kStageDeepstack, j, out.deepstack[j]);
    }
  }
  patch_merger(w.merger, out.embeds, x, arena);
  dump(kStageMerger, -1, out.embeds);
  arena.reset(outputs_end);
  return out;
}

// x += proj(attention(rope(qkv(LN1(x))))); x += fc2(gelu_tanh(fc1(LN2(x)))).
void Qwen3VLModel::vision_block(const VisionBlockWeights& w, Tensor x, const Tensor& rope, const VisionSegments& seg,
                                Arena& arena) const {
  const VisionConfig& vc = config_.vision;
  const int64_t N = x.dim(0), D = vc.hidden_size, F = vc.intermediate_size;
  const int nh = vc.num_heads, dh = vc.head_dim();
  const float eps = static_cast<float>(vc.layer_norm_eps);
  const DType act = backend_.activation_dtype();
  const size_t mark = arena.used();

  // Attention: full (non-causal) inside each image's segment.
  Tensor h = arena.alloc(act, {N, D});
  backend_.layer_norm(h, x, w.norm1_w, w.norm1_b, eps);
  Tensor qkv = arena.alloc(act, {N, 3 * D});  // [N, 3, nh, dh]
  backend_.linear(qkv, h, w.qkv, {});
  backend_.vision_rope(qkv, rope, nh, dh);
  Tensor attn = arena.alloc(act, {N, D});  // [N, nh·dh]
  backend_.vision_attention(attn, qkv, seg, nh, dh, 1.0f / std::sqrt(static_cast<float>(dh)));
  backend_.linear(x, attn, w.proj, {Activation::kNone, x});
  arena.reset(mark);

  // MLP.
  h = arena.alloc(act, {N, D});
  backend_.layer_norm(h, x, w.norm2_w, w.norm2_b, eps);
  Tensor f = arena.alloc(act, {N, F});
  backend_.linear(f, h, w.fc1, {Activation::kGeluTanh, {}});
  backend_.linear(x, f, w.fc2, {Activation::kNone, x});
  arena.reset(mark);
}

// 2×2 patch merger: 4 consecutive rows (one merge block) become one [4D] row, then
// fc2(gelu_erf(fc1(.))). The final merger normalises each patch over D before the shuffle;
// deepstack mergers normalise the shuffled 4D row.
void Qwen3VLModel::patch_merger(const MergerWeights& w, Tensor out, const Tensor& x, Arena& arena) const {
  const VisionConfig& vc = config_.vision;
  const int64_t N = x.dim(0), D = vc.hidden_size, U = vc.merge_unit(), M = N / U;
  const float eps = static_cast<float>(vc.layer_norm_eps);
  const DType act = backend_.activation_dtype();
  const size_t mark = arena.used();

  Tensor ln;
  if (w.postshuffle_norm) {
    ln = arena.alloc(act, {M, U * D});
    backend_.layer_norm(ln, x.reshape({M, U * D}), w.norm_w, w.norm_b, eps);
  } else {
    ln = arena.alloc(act, {N, D});
    backend_.layer_norm(ln, x, w.norm_w, w.norm_b, eps);
    ln = ln.reshape({M, U * D});
  }
  Tensor f = arena.alloc(act, {M, U * D});
  backend_.linear(f, ln, w.fc1, {Activation::kGeluErf, {}});
  backend_.linear(out, f, w.fc2, {});
  arena.reset(mark);
}

}  // namespace qvl
