// The typed weight tree of Qwen3-VL: exactly the tensors the forward pass reads, with their
// shapes in comments. model/bind.cpp is the one place that knows checkpoint tensor names; it
// fills a host tree (views into the mmap'd shards, stacked Linears still as separate parts)
// and reports every missing or misshapen tensor together. load_weights() then turns the host
// tree into a backend tree through Backend::load_tensor / load_linear.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace qvl {

struct VisionBlockWeights {
  Tensor norm1_w, norm1_b;  // [D]
  Tensor norm2_w, norm2_b;  // [D]
  LinearWeight qkv;         // [3D, D] + bias [3D]   (rows: q, k, v)
  LinearWeight proj;        // [D, D] + bias
  LinearWeight fc1;         // [F, D] + bias
  LinearWeight fc2;         // [D, F] + bias
};

// Patch merger. The final merger normalises each patch over D before the 2x2 concat
// (postshuffle_norm = false); the deepstack mergers normalise the concatenated 4D vector.
struct MergerWeights {
  bool postshuffle_norm = false;
  Tensor norm_w, norm_b;  // [D] or [4D]
  LinearWeight fc1;       // [4D, 4D] + bias
  LinearWeight fc2;       // [O, 4D] + bias
};

struct VisionWeights {
  LinearWeight patch_embed;  // Conv3d as a Linear: [D, C·T·P·P] + bias [D]
  Tensor pos_embed;          // [num_position_embeddings, D]
  std::vector<VisionBlockWeights> blocks;
  MergerWeights merger;
  std::vector<MergerWeights> deepstack_mergers;  // one per deepstack_visual_indexes entry
};

struct DecoderLayerWeights {
  Tensor input_norm;           // [H]
  Tensor post_attention_norm;  // [H]
  Tensor q_norm, k_norm;       // [head_dim]
  LinearWeight qkv;            // parts q [Hq·dh, H], k [Hkv·dh, H], v [Hkv·dh, H]
  LinearWeight o;              // [H, Hq·dh]
  LinearWeight gate_up;        // parts gate [I, H], up [I, H]
  LinearWeight down;           // [H, I]
};

struct TextWeights {
  Tensor embed_tokens;  // [V, H]
  std::vector<DecoderLayerWeights> layers;
  Tensor final_norm;     // [H]
  LinearWeight lm_head;  // [V, H]; the embedding table itself when tied
  bool lm_head_tied = true;
};

// Decoder layers whose weights live in host memory and are streamed into device staging buffers
// for every step (memory/offload.h makes it). Their DecoderLayerWeights point into the staging
// buffers; the forward pass calls begin_step() before the first decoder layer, before_layer(l)
// before layer l reads a weight and after_layer(l) after its last read, and the stream makes
// the right layer's bytes be there in between.
class LayerStream {
 public:
  virtual ~LayerStream() = default;
  virtual void begin_step() const = 0;
  virtual void before_layer(int layer) const = 0;
  virtual void after_layer(int layer) const = 0;
  virtual int num_streamed() const = 0;  // layers that are not resident
};

struct ModelWeights {
  VisionWeights vision;
  TextWeights text;
  // Null when every decoder layer is resident on the device.
  std::shared_ptr<const LayerStream> layer_stream;
  // Keeps the memory the tensors point into alive (mmap'd shards, backend buffers).
  std::vector<std::shared_ptr<void>> keep_alive;
};

}  // namespace qvl
