#include "io/gen_model.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

// ---- the generator: a counter-based hash, 16 random bits per element ----

uint64_t mix64(uint64_t z) {  // splitmix64's output function
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Keyed by the tensor's name, not its position, so the BF16 and FP8 checkpoints of a seed
// (and tied / untied variants) share every common tensor's values.
uint64_t tensor_key(uint64_t seed, const std::string& name) {
  return mix64(seed ^ mix64(fnv1a(name)));
}

// A signed 16-bit integer in [-32768, 32767], uniform.
inline int32_t random16(uint64_t key, int64_t index) {
  return static_cast<int32_t>(mix64(key + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull) >> 48) - 32768;
}

// value = random16 * step + offset. step is a BF16 number, so random16 * step has at most
// 16 + 8 significant bits and is exact in float: one rounding (the add) and then the BF16
// rounding, whatever the compiler contracts. All scale arithmetic is IEEE basic ops (division
// and sqrt are correctly rounded), so every machine computes the same bits.
struct ValueRule {
  float step = 0;
  float offset = 0;
};

// Uniform on (offset - half_width, offset + half_width).
ValueRule uniform(float half_width, float offset = 0.0f) {
  return {round_to_bf16(half_width / 32768.0f), offset};
}

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Why these scales: every block is pre-norm, so what matters is that each Linear maps unit-RMS
// inputs to O(1) outputs. Linear weights are uniform with std 1/sqrt(in_features) (half-width
// sqrt(3/in)), which keeps the RMS of a projection of a unit-RMS input near 1; the residual
// stream then grows only like sqrt(2 * layers), and attention logits q.k/sqrt(dh) (q and k
// RMS-normalised, norm weights ~1) have std ~1, so softmax neither saturates nor flattens.
// Norm weights are 1 +- 0.1 and biases +- 0.02, small perturbations that still make every
// element matter. The final RMSNorm output has unit RMS, so a logit is a sum of H products
// with an lm_head row: with lm_head (= embed_tokens when tied) std 3/sqrt(H) the logits have
// std ~3 whatever the width — a spread of a few units, neither flat nor one-hot. The image
// side matches: pixels in [-1, 1] through a patch embedding of std 1/sqrt(1536) give patch
// features of RMS ~0.6, and the learned position table (std 0.5) is of the same order.
ValueRule value_rule(const TensorSpec& spec) {
  const std::string& n = spec.name;
  const bool is_weight = ends_with(n, ".weight");
  if (n == "model.language_model.embed_tokens.weight" || n == "lm_head.weight") {
    const float h = static_cast<float>(spec.shape[1]);
    return uniform(std::sqrt(27.0f / h));  // std 3/sqrt(H): sqrt(3) * 3 / sqrt(H)
  }
  if (n == "model.visual.pos_embed.weight") return uniform(0.8660254f);  // std 0.5
  if (spec.shape.size() == 1) {
    // 1-D: norm weights (~1) or biases (~0).
    if (is_weight) return uniform(0.1f, 1.0f);
    return uniform(0.02f);
  }
  // Linear (and the Conv3d patch embedding, a Linear over C*T*P*P inputs) weights.
  int64_t in = 1;
  for (size_t i = 1; i < spec.shape.size(); ++i) in *= spec.shape[i];
  return uniform(std::sqrt(3.0f / static_cast<float>(in)));
}

inline bf16_bits make_bits(uint64_t key, int64_t index, const ValueRule& r) {
  return float_to_bf16(static_cast<float>(random16(key, index)) * r.step + r.offset);
}
inline float make_value(uint64_t key, int64_t index, const ValueRule& r) {
  return bf16_to_float(make_bits(key, index, r));
}

// float -> e4m3fn, round to nearest even, saturating at +-448: the same result as
// core's fp8_e4m3_from_float for every finite input (the gen-model test checks every FP8 byte
// against it), without its libm calls, because this runs once per FP8 weight element.
inline uint8_t encode_e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448
  if (a < 0x3c800000u) {                     // < 2^-6: subnormal steps of 2^-9
    float mag;
    std::memcpy(&mag, &a, 4);
    return sign | static_cast<uint8_t>(std::nearbyint(mag * 512.0f));  // exact scaling, RNE; 8 = min normal
  }
  int e = static_cast<int>(a >> 23) - 127;  // -6 .. 8
  uint32_t keep = (a >> 20) & 7, rest = a & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1))) ++keep;
  if (keep == 8) keep = 0, ++e;
  return sign | static_cast<uint8_t>(((e + 7) << 3) | keep);
}

// ---- file writing ----

class OutFile {
 public:
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return invalid_argument("cannot create " + path + ": " + std::strerror(errno));
    return Status::ok();
  }
  Status write_at(const void* data, size_t bytes, uint64_t offset) const {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return resource_exhausted("cannot write " + path_ + ": " + std::strerror(errno));
      p += n, bytes -= static_cast<size_t>(n), offset += static_cast<uint64_t>(n);
    }
    return Status::ok();
  }
  Status close() {
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return resource_exhausted("cannot write " + path_ + ": " + std::strerror(errno));
    return Status::ok();
  }

 private:
  std::string path_;
  int fd_ = -1;
};

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return resource_exhausted("cannot write " + path);
  return Status::ok();
}

Status copy_file(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) return invalid_argument("cannot copy " + from + " to " + to + ": " + ec.message());
  return Status::ok();
}

// One unit of parallel work on one tensor: elements [begin, end) of a plain tensor, or row
// blocks [begin, end) of an FP8 weight or of its scale grid.
struct WorkItem {
  const TensorSpec* spec = nullptr;    // the tensor written
  const TensorSpec* weight = nullptr;  // FP8 only: the quantised weight (spec itself, or its weight)
  uint64_t file_offset = 0;            // of the tensor's first byte
  int64_t begin = 0, end = 0;
};

constexpr int64_t kChunkElements = 1 << 20;

void store(DType dtype, float v, uint8_t* dst) {
  switch (dtype) {
    case DType::kBF16: {
      bf16_bits b = float_to_bf16(v);
      std::memcpy(dst, &b, 2);
      return;
    }
    case DType::kF16: {
      uint16_t h = float_to_f16(v);
      std::memcpy(dst, &h, 2);
      return;
    }
    case DType::kF32:
      std::memcpy(dst, &v, 4);
      return;
    default:
      QVL_CHECK(false) << "gen-model cannot store " << dtype_name(dtype);
  }
}

// Rows [r0, r1) of an FP8 weight as their BF16 values, and the dequantisation scale of each
// 128-column block of that row block: amax / 448 rounded to the stored scale dtype (1 for an
// all-zero block, which dequantises to zero with any scale).
void fp8_row_block(const TensorSpec& w, uint64_t key, const ValueRule& rule, int block, int64_t r0, int64_t r1,
                   std::vector<float>* values, std::vector<float>* scales) {
  const int64_t cols = w.shape[1], nb = (cols + block - 1) / block;
  values->resize(static_cast<size_t>((r1 - r0) * cols));
  for (int64_t i = 0; i < (r1 - r0) * cols; ++i) (*values)[i] = make_value(key, r0 * cols + i, rule);
  scales->assign(static_cast<size_t>(nb), 0.0f);
  for (int64_t r = 0; r < r1 - r0; ++r) {
    const float* row = values->data() + r * cols;
    for (int64_t b = 0; b < nb; ++b) {
      float m = (*scales)[b];
      for (int64_t c = b * block; c < std::min(cols, (b + 1) * block); ++c) m = std::max(m, std::fabs(row[c]));
      (*scales)[b] = m;
    }
  }
  for (float& s : *scales) {
    float scale = s / kFp8E4M3Max;
    if (kFp8ScaleDType == DType::kBF16) scale = round_to_bf16(scale);
    s = scale > 0 ? scale : 1.0f;
  }
}

Status run_item(const WorkItem& it, int block, uint64_t seed, const OutFile& file) {
  const TensorSpec& s = *it.spec;
  std::vector<uint8_t> out;
  if (!it.weight) {
    const uint64_t key = tensor_key(seed, s.name);
    const ValueRule rule = value_rule(s);
    const int size = dtype_size(s.dtype);
    out.resize(static_cast<size_t>((it.end - it.begin) * size));
    if (s.dtype == DType::kBF16) {
      bf16_bits* dst = reinterpret_cast<bf16_bits*>(out.data());
      for (int64_t i = it.begin; i < it.end; ++i) dst[i - it.begin] = make_bits(key, i, rule);
    } else {
      for (int64_t i = it.begin; i < it.end; ++i) store(s.dtype, make_value(key, i, rule), &out[(i - it.begin) * size]);
    }
    return file.write_at(out.data(), out.size(), it.file_offset + static_cast<uint64_t>(it.begin * size));
  }
  const TensorSpec& w = *it.weight;
  const uint64_t key = tensor_key(seed, w.name);
  const ValueRule rule = value_rule(w);
  const int64_t rows = w.shape[0], cols = w.shape[1], nb = (cols + block - 1) / block;
  std::vector<float> values, scales;
  for (int64_t rb = it.begin; rb < it.end; ++rb) {
    const int64_t r0 = rb * block, r1 = std::min(rows, r0 + block);
    fp8_row_block(w, key, rule, block, r0, r1, &values, &scales);
    if (&s == &w) {
      out.resize(values.size());
      for (int64_t r = 0; r < r1 - r0; ++r)
        for (int64_t b = 0; b < nb; ++b) {
          const float scale = scales[b];
          for (int64_t c = b * block; c < std::min(cols, (b + 1) * block); ++c)
            out[r * cols + c] = encode_e4m3(values[r * cols + c] / scale);  // saturates at 448
        }
      QVL_RETURN_IF_ERROR(file.write_at(out.data(), out.size(), it.file_offset + static_cast<uint64_t>(r0 * cols)));
    } else {
      const int size = dtype_size(s.dtype);
      out.resize(static_cast<size_t>(nb * size));
      for (int64_t b = 0; b < nb; ++b) store(s.dtype, scales[b], &out[b * size]);
      QVL_RETURN_IF_ERROR(
          file.write_at(out.data(), out.size(), it.file_offset + static_cast<uint64_t>(rb * nb * size)));
    }
  }
  return Status::ok();
}

struct Shard {
  std::string file_name;
  std::vector<const TensorSpec*> tensors;
  uint64_t bytes = 0;
};

// Greedy, in model order, like transformers' save_pretrained: a tensor that does not fit
// starts a new shard (a tensor larger than the limit gets a shard of its own).
std::vector<Shard> plan_shards(const std::vector<TensorSpec>& specs, uint64_t max_bytes) {
  std::vector<Shard> shards(1);
  for (const auto& s : specs) {
    if (!shards.back().tensors.empty() && shards.back().bytes + s.nbytes() > max_bytes) shards.emplace_back();
    shards.back().tensors.push_back(&s);
    shards.back().bytes += s.nbytes();
  }
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, n);
    shards[i].file_name = n == 1 ? kSingleSafetensorsName : name;
  }
  return shards;
}

Status write_shard(const Shard& shard, const std::map<std::string, const TensorSpec*>& weight_of_scale,
                   const ModelConfig& config, const GenModelOptions& options, const std::string& out_dir) {
  // Widest elements first, so every tensor starts aligned to its element size.
  std::vector<const TensorSpec*> order = shard.tensors;
  std::stable_sort(order.begin(), order.end(), [](const TensorSpec* a, const TensorSpec* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const TensorSpec* s : order) {
    entries.push_back({s->name, s->dtype, s->shape, offset, offset + s->nbytes()});
    offset += s->nbytes();
  }
  const std::string header = build_safetensors_header(entries, {{"format", "pt"}});
  const std::string path = (fs::path(out_dir) / shard.file_name).string();
  OutFile file;
  QVL_RETURN_IF_ERROR(file.open(path));
  QVL_RETURN_IF_ERROR(file.write_at(header.data(), header.size(), 0));

  const int block = config.quant.weight_block_size[0];
  std::vector<WorkItem> items;
  for (size_t t = 0; t < order.size(); ++t) {
    const TensorSpec* s = order[t];
    const uint64_t base = header.size() + entries[t].begin;
    const TensorSpec* weight = s->dtype == DType::kF8E4M3 ? s : nullptr;
    if (auto it = weight_of_scale.find(s->name); it != weight_of_scale.end()) weight = it->second;
    if (weight) {
      const int64_t blocks = fp8_scale_blocks(weight->shape[0], block);
      for (int64_t rb = 0; rb < blocks; ++rb) items.push_back({s, weight, base, rb, rb + 1});
    } else {
      for (int64_t i = 0; i < s->numel(); i += kChunkElements)
        items.push_back({s, nullptr, base, i, std::min(s->numel(), i + kChunkElements)});
    }
  }
  Status first_error;
  std::mutex mu;
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t i = 0; i < items.size(); ++i) {
    Status st;
    try {
      st = run_item(items[i], block, options.seed, file);
    } catch (const std::exception& e) {  // bad_alloc must not leave the parallel region
      st = resource_exhausted(std::string("gen-model: ") + e.what());
    }
    if (!st.is_ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.is_ok()) first_error = st;
    }
  }
  QVL_RETURN_IF_ERROR(first_error);
  return file.close();
}

std::string video_preprocessor_json(const PreprocessorConfig& p) {
  // Qwen3VLVideoProcessor as the official checkpoints configure it (spec §9).
  nlohmann::json j = {
      {"do_convert_rgb", true},
      {"do_normalize", true},
      {"do_rescale", true},
      {"do_resize", true},
      {"do_sample_frames", true},
      {"fps", 2},
      {"image_mean", {0.5, 0.5, 0.5}},
      {"image_std", {0.5, 0.5, 0.5}},
      {"max_frames", 768},
      {"merge_size", p.merge_size},
      {"min_frames", 4},
      {"patch_size", p.patch_size},
      {"processor_class", "Qwen3VLProcessor"},
      {"resample", 3},
      {"rescale_factor", p.rescale_factor},
      {"size", {{"longest_edge", 25165824}, {"shortest_edge", 4096}}},
      {"temporal_patch_size", p.temporal_patch_size},
      {"video_processor_type", "Qwen3VLVideoProcessor"},
  };
  return j.dump(2) + "\n";
}

}  // namespace

float gen_model_value(const TensorSpec& spec, uint64_t seed, int64_t index) {
  return make_value(tensor_key(seed, spec.name), index, value_rule(spec));
}

Status generate_model(const ModelConfig& config, const GenModelOptions& options, const std::string& out_dir) {
  QVL_RETURN_IF_ERROR(validate_model_config(config));
  if (options.max_shard_bytes == 0) return invalid_argument("gen-model: --max-shard-size must be positive");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return invalid_argument("cannot create " + out_dir + ": " + ec.message());
  // A previous checkpoint's shards or index would be picked up with the new files.
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kSafetensorsIndexName || (name.rfind("model", 0) == 0 && ends_with(name, ".safetensors")))
      fs::remove(entry.path(), ec);
  }

  const std::vector<TensorSpec> specs = checkpoint_tensor_specs(config);
  std::map<std::string, const TensorSpec*> by_name, weight_of_scale;
  for (const auto& s : specs) by_name[s.name] = &s;
  for (const auto& s : specs) {
    if (!ends_with(s.name, ".weight_scale_inv")) continue;
    auto w = by_name.find(s.name.substr(0, s.name.size() - std::strlen("_scale_inv")));
    QVL_CHECK(w != by_name.end()) << s.name;
    weight_of_scale[s.name] = w->second;
  }
  const std::vector<Shard> shards = plan_shards(specs, options.max_shard_bytes);
  for (const auto& shard : shards) QVL_RETURN_IF_ERROR(write_shard(shard, weight_of_scale, config, options, out_dir));

  if (shards.size() > 1) {
    nlohmann::json index;
    uint64_t total = 0;
    int64_t params = 0;
    for (const auto& shard : shards)
      for (const TensorSpec* s : shard.tensors) {
        index["weight_map"][s->name] = shard.file_name;
        total += s->nbytes();
        params += s->numel();
      }
    index["metadata"] = {{"total_parameters", params}, {"total_size", total}};
    QVL_RETURN_IF_ERROR(write_text((fs::path(out_dir) / kSafetensorsIndexName).string(), index.dump(2) + "\n"));
  }
  const auto path = [&](const char* name) { return (fs::path(out_dir) / name).string(); };
  QVL_RETURN_IF_ERROR(write_text(path(kConfigFileName), model_config_to_json(config)));
  QVL_RETURN_IF_ERROR(write_text(path(kGenerationConfigFileName),
                                 generation_config_to_json(config.generation, config.tokens.bos_token_id)));
  QVL_RETURN_IF_ERROR(write_text(path(kPreprocessorConfigFileName), preprocessor_config_to_json(config.preprocessor)));
  QVL_RETURN_IF_ERROR(write_text(path("video_preprocessor_config.json"), video_preprocessor_json(config.preprocessor)));
  if (!options.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      const std::string from = (fs::path(options.tokenizer_dir) / f).string();
      if (!fs::exists(from, ec)) return not_found("gen-model: " + from + " not found (tokenizer directory)");
      QVL_RETURN_IF_ERROR(copy_file(from, path(f)));
    }
  }
  if (!options.chat_template_path.empty() && fs::exists(options.chat_template_path, ec))
    QVL_RETURN_IF_ERROR(copy_file(options.chat_template_path, path("chat_template.json")));
  return Status::ok();
}

}  // namespace qvl
