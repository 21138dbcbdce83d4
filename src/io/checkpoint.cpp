#include "io/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

namespace qvl {
namespace fs = std::filesystem;

Tensor CheckpointTensor::view_as(const std::vector<int64_t>& dims) const {
  QVL_CHECK_LE(dims.size(), static_cast<size_t>(kMaxDims)) << name();
  Tensor t;
  t.data = const_cast<uint8_t*>(data);  // read-only map; Tensor has no const flavour
  t.dtype = dtype();
  t.ndim = static_cast<int>(dims.size());
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = dims[i];
  QVL_CHECK_EQ(t.numel(), entry->numel()) << name() << " viewed as " << t.shape_string();
  return t;
}

Tensor CheckpointTensor::view() const {
  return view_as(shape());
}

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  const std::string index_path = (fs::path(dir) / kSafetensorsIndexName).string();
  const std::string single_path = (fs::path(dir) / kSingleSafetensorsName).string();

  // Shard file name -> tensor names the index maps to it (empty map for a single file).
  std::map<std::string, std::vector<std::string>> mapped;
  std::vector<std::string> shard_names;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    QVL_ASSIGN_OR_RETURN(std::string text, read_file(index_path));
    auto root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object()) return data_loss(index_path + ": not a JSON object");
    auto wm = root.find("weight_map");
    if (wm == root.end() || !wm->is_object())
      return data_loss(index_path + ": missing \"weight_map\" object (tensor name -> shard file)");
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string())
        return data_loss(index_path + ": weight_map entry for tensor '" + it.key() + "' is not a file name");
      const std::string shard = it->get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        return data_loss(index_path + ": weight_map entry for tensor '" + it.key() + "' names \"" + shard +
                         "\", not a file in the model directory");
      if (!mapped.count(shard)) shard_names.push_back(shard);
      mapped[shard].push_back(it.key());
    }
    if (shard_names.empty()) return data_loss(index_path + ": weight_map is empty");
  } else if (fs::exists(single_path, ec)) {
    shard_names.push_back(kSingleSafetensorsName);
  } else {
    return not_found("no " + std::string(kSingleSafetensorsName) + " or " + kSafetensorsIndexName + " in " + dir);
  }

  for (const auto& shard : shard_names) {
    const std::string path = (fs::path(dir) / shard).string();
    auto file = SafetensorsFile::open(path);
    if (!file.is_ok()) {
      if (file.status().code() == StatusCode::kNotFound && !mapped.empty())
        return not_found(path + ": shard listed in " + std::string(kSafetensorsIndexName) + " (for tensor '" +
                         mapped[shard].front() + "') does not exist");
      return file.status();
    }
    ck.files_.push_back(std::make_unique<SafetensorsFile>(std::move(file).value()));
    const SafetensorsFile* f = ck.files_.back().get();
    for (const auto& e : f->tensors()) {
      auto [it, inserted] = ck.tensors_.emplace(e.name, CheckpointTensor{&e, f, f->data(e)});
      if (!inserted)
        return data_loss("tensor '" + e.name + "' appears in two shards: " + it->second.file_path() + " and " + path);
    }
    for (const auto& name : mapped[shard]) {
      if (!f->find(name))
        return data_loss(path + ": tensor '" + name + "' is mapped to this shard by " +
                         std::string(kSafetensorsIndexName) + " but is not in it");
    }
  }
  return ck;
}

const CheckpointTensor* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.entry->nbytes();
  return n;
}

std::vector<std::shared_ptr<void>> Checkpoint::keep_alive() const {
  std::vector<std::shared_ptr<void>> out;
  for (const auto& f : files_) out.push_back(f->mapping());
  return out;
}

}  // namespace qvl
