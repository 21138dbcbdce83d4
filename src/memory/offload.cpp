#include "memory/offload.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "memory/byte_size.h"
#include "memory/planner.h"
#include "model/load.h"

namespace qvl {
namespace {

// The streaming schedule (offload.h): begin_step() starts the copies of the first offloaded
// layers, one per slot; before an offloaded layer runs, the compute stream waits for its copy;
// after it ran, its slot is refilled with the offloaded layer `slots` further on.
class StreamedLayers final : public LayerStream {
 public:
  struct HostLayer {
    DeviceBuffer memory;  // host memory: the layer's device bytes
    size_t bytes = 0;
  };

  StreamedLayers(Backend& backend, int first_layer, DeviceBuffer staging, size_t slot_bytes, int slots,
                 std::vector<HostLayer> layers)
      : backend_(backend),
        first_(first_layer),
        staging_(std::move(staging)),
        slot_bytes_(slot_bytes),
        slots_(slots),
        layers_(std::move(layers)) {}

  void begin_step() const override {
    for (int k = 0; k < std::min(slots_, num_streamed()); ++k) issue(k);
  }
  void before_layer(int layer) const override {
    const int k = layer - first_;
    if (k >= 0) backend_.wait_prefetch(k % slots_);
  }
  void after_layer(int layer) const override {
    const int k = layer - first_;
    if (k >= 0 && k + slots_ < num_streamed()) issue(k + slots_);
  }
  int num_streamed() const override { return static_cast<int>(layers_.size()); }

 private:
  void issue(int k) const {
    const int slot = k % slots_;
    backend_.prefetch(slot, static_cast<char*>(staging_.data()) + slot * slot_bytes_, layers_[k].memory.data(),
                      layers_[k].bytes);
  }

  Backend& backend_;
  int first_;
  DeviceBuffer staging_;
  size_t slot_bytes_;
  int slots_;
  std::vector<HostLayer> layers_;
};

// Every tensor of a decoder layer, for moving it from one staging slot to another.
std::vector<Tensor*> layer_tensors(DecoderLayerWeights& w) {
  std::vector<Tensor*> out = {&w.input_norm, &w.post_attention_norm, &w.q_norm, &w.k_norm};
  for (LinearWeight* lin : {&w.qkv, &w.o, &w.gate_up, &w.down}) {
    for (LinearPart& p : lin->parts) {
      out.push_back(&p.weight);
      out.push_back(&p.scale_inv);
    }
    out.push_back(&lin->bias);
  }
  return out;
}

}  // namespace

Result<ModelWeights> load_weights_offloaded(Backend& backend, const ModelConfig& config, const ModelWeights& host,
                                            int offload_layers, OffloadStats* stats) {
  const int L = static_cast<int>(host.text.layers.size());
  if (offload_layers < 0 || offload_layers > L)
    return invalid_argument("--offload-layers " + std::to_string(offload_layers) + ": the model has " +
                            std::to_string(L) + " decoder layers");
  if (stats) *stats = OffloadStats{};
  if (offload_layers == 0) return load_weights(backend, host);
  if (!backend.can_stream_weights())
    return unimplemented("--offload-layers " + std::to_string(offload_layers) + ": the " + backend.name() +
                         " backend cannot stream weights from host memory");
  QVL_CHECK_EQ(config.text.num_hidden_layers, L) << "config and host weights disagree on the decoder layers";

  const int first = L - offload_layers;
  QVL_ASSIGN_OR_RETURN(ModelWeights out, load_weights(backend, host, [first](int l) { return l < first; }));

  // The staging buffers: the plan's largest aligned layer, one per slot, in one allocation.
  const size_t slot_bytes = static_cast<size_t>(weight_bytes(config).largest_layer);
  const int slots = std::min(offload_layers, kPrefetchSlots);
  QVL_ASSIGN_OR_RETURN(DeviceBuffer staging,
                       backend.allocate(slot_bytes * static_cast<size_t>(slots), "offload staging buffers"));
  char* const slot0 = static_cast<char*>(staging.data());

  std::vector<StreamedLayers::HostLayer> layers;
  int64_t host_bytes = 0;
  for (int k = 0; k < offload_layers; ++k) {
    const int l = first + k;
    // The backend lays the layer out in slot 0 as it would for a resident layer...
    WeightPlacement placement(slot0, slot_bytes);
    backend.set_weight_placement(&placement);
    Result<DecoderLayerWeights> loaded = load_decoder_layer(backend, host, l, &out.keep_alive);
    backend.set_weight_placement(nullptr);
    if (!loaded.is_ok()) return loaded.status().with_context("offloading decoder layer " + std::to_string(l));
    if (placement.wanted() > slot_bytes)
      return internal_error("offloading decoder layer " + std::to_string(l) + ": it needs " +
                            std::to_string(placement.wanted()) + " bytes on the device, the staging buffer planned " +
                            std::to_string(slot_bytes));
    // ...whose bytes then go to host memory, to come back for every step.
    const size_t used = placement.used();
    StreamedLayers::HostLayer h;
    h.bytes = used;
    QVL_ASSIGN_OR_RETURN(h.memory, backend.allocate_host(used, "decoder layer " + std::to_string(l) + " (offloaded)"));
    backend.copy_to_host(h.memory.data(), Tensor(slot0, DType::kU8, {static_cast<int64_t>(used)}, backend.device()));
    host_bytes += static_cast<int64_t>(used);
    layers.push_back(std::move(h));

    // The layer's tensors move to its own slot; each must have come from the placement.
    DecoderLayerWeights w = std::move(loaded).value();
    char* const base = slot0 + static_cast<size_t>(k % slots) * slot_bytes;
    for (Tensor* t : layer_tensors(w)) {
      if (t->empty()) continue;
      char* p = static_cast<char*>(t->data);
      QVL_CHECK(p >= slot0 && p + t->nbytes() <= slot0 + used)
          << "decoder layer " << l << ": " << t->describe() << " was not placed in the staging buffer";
      t->data = base + (p - slot0);
    }
    out.text.layers[l] = std::move(w);
  }
  if (stats) {
    stats->layers = offload_layers;
    stats->slot_bytes = static_cast<int64_t>(slot_bytes);
    stats->staging_bytes = static_cast<int64_t>(staging.size());
    stats->host_bytes = host_bytes;
  }
  out.layer_stream =
      std::make_shared<StreamedLayers>(backend, first, std::move(staging), slot_bytes, slots, std::move(layers));
  return out;
}

}  // namespace qvl
