// Checkpoint: every tensor of a model directory, across shards. A directory holds either one
// `model.safetensors` or shards listed by `model.safetensors.index.json` ("weight_map": tensor
// name -> shard file). Opening validates every shard header (io/safetensors.h), checks that
// each tensor the index maps exists in the shard it names, and rejects a tensor that appears
// in two shards. Lookups return host views into the read-only maps, which the Checkpoint keeps
// alive (keep_alive() hands the maps to a weight tree that outlives the Checkpoint).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace qvl {

inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr const char* kSingleSafetensorsName = "model.safetensors";

// One tensor found in a checkpoint.
struct CheckpointTensor {
  const SafetensorsEntry* entry = nullptr;  // name, dtype, shape, offsets
  const SafetensorsFile* file = nullptr;    // the shard holding it
  const uint8_t* data = nullptr;            // first byte inside the map

  const std::string& name() const { return entry->name; }
  DType dtype() const { return entry->dtype; }
  const std::vector<int64_t>& shape() const { return entry->shape; }
  const std::string& file_path() const { return file->path(); }
  // A view with exactly `dims` (their product must equal the entry's numel: a check).
  Tensor view_as(const std::vector<int64_t>& dims) const;
  // A view with the entry's own shape (at most kMaxDims dims: a check).
  Tensor view() const;
};

class Checkpoint {
 public:
  // Opens the safetensors of `dir` (index or single file).
  static Result<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // The tensor named `name`, or nullptr.
  const CheckpointTensor* find(const std::string& name) const;
  // All tensors, by name.
  const std::map<std::string, CheckpointTensor>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // Sum of every tensor's byte length.
  uint64_t total_bytes() const;
  // Shared ownership of the maps, for views that outlive this object.
  std::vector<std::shared_ptr<void>> keep_alive() const;

  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

 private:
  Checkpoint() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;  // stable addresses for CheckpointTensor
  std::map<std::string, CheckpointTensor> tensors_;
};

}  // namespace qvl
