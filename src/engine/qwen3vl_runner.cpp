#include "engine/qwen3vl_runner.h"

#include <algorithm>
#include <cstdio>

#include "core/arena.h"
#include "core/check.h"
#include "memory/activations.h"
#include "model/positions.h"

namespace qvl {

RunnerBuffers runner_buffer_sizes(const ModelConfig& config, const RunnerLimits& limits, DType act) {
  RunnerShape shape;
  shape.max_step_tokens = limits.max_step_tokens;
  shape.max_seqs = limits.max_seqs;
  shape.max_pages_per_seq = limits.max_pages_per_seq;
  shape.max_image_patches = limits.max_image_patches;
  return runner_buffers(config, shape, act);
}

namespace {

// The features of one image: rows of the arena's bottom, returned to the arena when destroyed.
class ArenaFeatures final : public ImageFeatures {
 public:
  ArenaFeatures(VisionOutput out, Arena* arena) : out_(std::move(out)), arena_(arena) {}
  ~ArenaFeatures() override { arena_->reset(0); }
  int64_t num_tokens() const override { return out_.embeds.dim(0); }
  const VisionOutput& output() const { return out_; }

 private:
  VisionOutput out_;
  Arena* arena_;
};

class Qwen3VLRunner final : public ModelRunner {
 public:
  Qwen3VLRunner(std::shared_ptr<Backend> backend, std::shared_ptr<const Qwen3VLModel> model,
                const Qwen3VLRunnerOptions& options)
      : backend_(std::move(backend)),
        model_(std::move(model)),
        limits_(options.limits),
        decode_graphs_(options.decode_graphs) {
    const ModelConfig& c = model_->config();
    info_.vocab_size = c.text.vocab_size;
    info_.image_token_id = c.tokens.image_token_id;
    info_.merge_unit = c.vision.merge_unit();
    info_.max_positions = c.text.max_position_embeddings;
    info_.kv_layout = KvLayout{options.kv_dtype, c.text.num_hidden_layers, c.text.num_key_value_heads, c.text.head_dim};
  }

  Status allocate() {
    const ModelConfig& c = model_->config();
    const DType act = backend_->activation_dtype();
    const Device dev = backend_->device();
    const RunnerBuffers sizes = runner_buffer_sizes(c, limits_, act);
    QVL_ASSIGN_OR_RETURN(arena_buffer_, backend_->allocate(static_cast<size_t>(sizes.arena), "activations"));
    arena_ = Arena(arena_buffer_.data(), arena_buffer_.size(), dev, "activation arena");
    QVL_ASSIGN_OR_RETURN(inputs_buffer_, backend_->allocate(static_cast<size_t>(sizes.step_inputs), "step inputs"));
    QVL_ASSIGN_OR_RETURN(logits_buffer_, backend_->allocate(static_cast<size_t>(sizes.logits), "logits"));
    // Written once now, so that host memory (the CPU backend) is resident from the start rather
    // than growing with the busiest step.
    const std::vector<uint8_t> zeros(static_cast<size_t>(sizes.logits), 0);
    backend_->copy_to_device(Tensor(logits_buffer_.data(), DType::kU8, {sizes.logits}, dev), zeros.data());
    if (act != DType::kF32) host_logits_.resize(static_cast<size_t>(limits_.max_seqs) * c.text.vocab_size);
    if (sizes.upload_staging > 0) {
      QVL_ASSIGN_OR_RETURN(staging_buffer_,
                           backend_->allocate_host(static_cast<size_t>(sizes.upload_staging), "vision upload staging"));
    }
    return Status::ok();
  }

  const ModelInfo& info() const override { return info_; }

  std::vector<int32_t> prompt_positions(std::span<const int32_t> prompt_ids, const std::vector<PreparedImage>& images,
                                        int64_t* rope_delta) const override {
    std::vector<ImageGrid> grids;
    for (const auto& img : images) grids.push_back(ImageGrid{img.grid_t, img.grid_h, img.grid_w});
    auto pos = qvl::prompt_positions(prompt_ids, grids, model_->config());
    // The engine validated pad runs against the grids at submit: a failure here is a bug.
    QVL_CHECK(pos.is_ok()) << pos.status().to_string();
    *rope_delta = pos->rope_delta;
    return std::move(pos->positions);
  }

  Result<std::unique_ptr<ImageFeatures>> encode_image(const PreparedImage& image) override {
    QVL_CHECK_EQ(arena_.used(), size_t{0}) << "an image was encoded while another image's features are alive";
    const VisionConfig& vc = model_->config().vision;
    if (image.num_patches() > limits_.max_image_patches)
      return out_of_range("image of " + std::to_string(image.num_patches()) + " patches exceeds the " +
                          std::to_string(limits_.max_image_patches) + " patches the memory plan holds");
    ImageInput input{nullptr, ImageGrid{image.grid_t, image.grid_h, image.grid_w}};
    if (!image.rgb.empty()) {
      const size_t want = static_cast<size_t>(image.num_patches()) * vc.patch_size * vc.patch_size * 3;
      if (image.rgb.size() != want || !image.pixel_values.empty())
        return invalid_argument("image rgb holds " + std::to_string(image.rgb.size()) + " bytes (and " +
                                std::to_string(image.pixel_values.size()) + " pixel values), the grid needs " +
                                std::to_string(want) + " bytes alone");
      input.rgb = image.rgb.data();
    } else {
      const size_t want = static_cast<size_t>(image.num_patches()) * vc.patch_dim();
      if (image.pixel_values.size() != want)
        return invalid_argument("image pixel_values hold " + std::to_string(image.pixel_values.size()) +
                                " floats, the grid needs " + std::to_string(want));
      input.pixel_values = image.pixel_values.data();
    }
    auto out = model_->encode_images(std::span<const ImageInput>(&input, 1), arena_,
                                     {staging_buffer_.data(), staging_buffer_.size()});
    if (!out.is_ok()) {
      arena_.reset(0);
      return out.status();
    }
    return std::unique_ptr<ImageFeatures>(new ArenaFeatures(std::move(out).value(), &arena_));
  }

  Status forward(const StepInput& step, const KvCacheView& cache, std::span<float> logits_out) override {
    const int64_t R = static_cast<int64_t>(step.logits_rows.size());
    const int vocab = info_.vocab_size;
    QVL_CHECK_EQ(static_cast<int64_t>(logits_out.size()), R * vocab);
    const Tensor logits = run(step, cache, Pick::kLogits, nullptr);
    if (R == 0) {
      backend_->synchronize();
      return Status::ok();
    }
    to_host(logits_out, logits);
    return Status::ok();
  }

  // The argmax of each logits row on the device (Backend::argmax_rows, recorded with the step in
  // a decode graph): R ids come back instead of R x vocab logits.
  Status forward_greedy(const StepInput& step, const KvCacheView& cache, std::span<int32_t> tokens) override {
    const int64_t R = static_cast<int64_t>(step.logits_rows.size());
    QVL_CHECK_EQ(static_cast<int64_t>(tokens.size()), R);
    if (R == 0) return forward(step, cache, {});
    Tensor ids;
    run(step, cache, Pick::kGreedy, &ids);
    backend_->copy_to_host(tokens.data(), ids);
    return Status::ok();
  }

  // The candidate keys of each logits row on the device (Backend::top_k_rows, recorded with the
  // step like the argmax): R x kSampleCandidates keys come back.
  Status forward_top_k(const StepInput& step, const KvCacheView& cache, std::span<uint64_t> keys) override {
    const int64_t R = static_cast<int64_t>(step.logits_rows.size());
    QVL_CHECK_EQ(static_cast<int64_t>(keys.size()), R * kSampleCandidates);
    if (R == 0) return forward(step, cache, {});
    Tensor keys_dev;
    run(step, cache, Pick::kTopK, &keys_dev);
    backend_->copy_to_host(keys.data(), keys_dev);
    return Status::ok();
  }

  Status logits_row(int64_t r, std::span<float> out) override {
    const int vocab = info_.vocab_size;
    QVL_CHECK(r >= 0 && r < last_rows_ && static_cast<int64_t>(out.size()) == vocab) << "logits row " << r;
    const DType act = backend_->activation_dtype();
    const Tensor all(logits_buffer_.data(), act, {last_rows_, vocab}, backend_->device());
    to_host(out, all.rows(r, r + 1));
    return Status::ok();
  }

 private:
  // What a step brings back besides its logits on the device.
  enum class Pick { kLogits, kGreedy, kTopK };

  // logits [rows, vocab] on the device -> f32 on the host.
  void to_host(std::span<float> out, const Tensor& logits) {
    QVL_CHECK_EQ(static_cast<int64_t>(out.size()), logits.numel());
    const DType act = backend_->activation_dtype();
    if (act == DType::kF32) {
      backend_->copy_to_host(out.data(), logits);
      return;
    }
    QVL_CHECK(act == DType::kBF16) << "logits in " << dtype_name(act);
    auto* host = reinterpret_cast<bf16_bits*>(host_logits_.data());
    backend_->copy_to_host(host, logits);
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(host[i]);
  }

  // Runs one step and returns its logits rows [max(R, 1), vocab] on the device; for kGreedy
  // also their argmax (i32 [R]), for kTopK their candidate keys (i64 [R, kSampleCandidates]),
  // into a tensor of the step inputs buffer returned in `picked`.
  Tensor run(const StepInput& step, const KvCacheView& cache, Pick pick, Tensor* picked) {
    const int64_t S = step.num_tokens(), B = step.num_seqs();
    int64_t P = step.max_pages_per_seq;
    const int64_t R = static_cast<int64_t>(step.logits_rows.size());
    QVL_CHECK(S > 0 && S <= limits_.max_step_tokens) << "step of " << S << " rows";
    QVL_CHECK(B > 0 && B <= limits_.max_seqs) << "step of " << B << " sequences";
    QVL_CHECK(P > 0 && P <= limits_.max_pages_per_seq) << "page table of " << P << " columns";
    QVL_CHECK_LE(R, B);
    const int vocab = info_.vocab_size;
    last_rows_ = pick == Pick::kTopK ? R : 0;

    // A decode-only step (one row per sequence, no image rows) may replay a recording: give it
    // the bucketed shape the recording was made with.
    const bool graph = decode_graphs_ && step.images.empty() && S == B && R == B;
    const std::vector<int32_t>* page_table = &step.page_table;
    int64_t max_context = step.max_context;
    if (graph) {
      const int64_t full = limits_.max_pages_per_seq;
      wide_page_table_.assign(static_cast<size_t>(B * full), 0);
      for (int64_t b = 0; b < B; ++b)
        std::copy_n(step.page_table.begin() + b * P, P, wide_page_table_.begin() + b * full);
      page_table = &wide_page_table_;
      P = full;
      max_context = 256;
      while (max_context < step.max_context) max_context *= 2;
      max_context = std::min<int64_t>(max_context, full * cache.page_size);
    }

    // The step's tables into their fixed device buffer: laid out in a host mirror of it, then
    // sent in one copy.
    Arena in(inputs_buffer_.data(), inputs_buffer_.size(), backend_->device(), "step inputs");
    if (staging_.size() < inputs_buffer_.size()) staging_.resize(inputs_buffer_.size());
    auto upload = [&](std::initializer_list<int64_t> dims, const std::vector<int32_t>& host) {
      Tensor t = in.alloc(DType::kI32, dims);
      QVL_CHECK_EQ(t.numel(), static_cast<int64_t>(host.size()));
      const size_t offset = static_cast<char*>(t.data) - static_cast<char*>(inputs_buffer_.data());
      std::copy(host.begin(), host.end(), reinterpret_cast<int32_t*>(staging_.data() + offset));
      return t;
    };
    TextBatch batch;
    batch.num_seqs = static_cast<int>(B);
    batch.num_tokens = static_cast<int>(S);
    batch.max_pages_per_seq = static_cast<int>(P);
    batch.max_context = static_cast<int>(max_context);
    Tensor token_ids = upload({S}, step.token_ids);
    batch.positions = upload({S, 3}, step.positions);
    batch.slots = upload({S}, step.slots);
    batch.query_start = upload({B + 1}, step.query_start);
    batch.context_len = upload({B}, step.context_len);
    batch.page_table = upload({B, P}, *page_table);
    // A step that only advances prompts still computes one logits row (discarded): the model's
    // lm_head stage takes at least one row.
    const std::vector<int32_t> last_row{static_cast<int32_t>(S - 1)};
    Tensor logits_rows = R > 0 ? upload({R}, step.logits_rows) : upload({1}, last_row);

    backend_->copy_to_device(
        Tensor(inputs_buffer_.data(), DType::kU8, {static_cast<int64_t>(in.used())}, backend_->device()),
        staging_.data());
    // The greedy ids or candidate keys: written on the device, after the inputs
    // (step_input_bytes counts both).
    if (pick == Pick::kGreedy) *picked = in.alloc(DType::kI32, {R});
    if (pick == Pick::kTopK) *picked = in.alloc(DType::kI64, {R, kSampleCandidates});

    TextStepInputs inputs;
    inputs.token_ids = token_ids;
    inputs.logits_rows = logits_rows;
    for (const ImageRows& rows : step.images) {
      const auto* f = static_cast<const ArenaFeatures*>(rows.features);
      VisionOutput::Slice slice = f->output().rows(rows.feature_row, rows.feature_row + rows.count);
      inputs.visual.push_back({static_cast<int32_t>(rows.step_row), slice.embeds, slice.deepstack});
    }

    const DType act = backend_->activation_dtype();
    Tensor logits(logits_buffer_.data(), act, {std::max<int64_t>(R, 1), vocab}, backend_->device());
    auto step_ops = [&] {
      model_->forward(batch, inputs, cache, logits, arena_);
      if (pick == Pick::kGreedy) backend_->argmax_rows(*picked, logits);
      if (pick == Pick::kTopK) backend_->top_k_rows(*picked, logits);
    };
    if (graph) {
      // Recordings bind the cache's page count: a grown pool starts a new set.
      if (cache.num_pages != graph_cache_pages_) {
        backend_->clear_graphs();
        graph_cache_pages_ = cache.num_pages;
      }
      char key[176];
      std::snprintf(key, sizeof key, "decode b=%lld p=%lld ctx=%lld kv=%p/%lld arena=%zu%s", static_cast<long long>(B),
                    static_cast<long long>(P), static_cast<long long>(max_context), cache.base,
                    static_cast<long long>(cache.num_pages), arena_.used(),
                    pick == Pick::kGreedy ? " greedy"
                    : pick == Pick::kTopK ? " top-k"
                                          : "");
      backend_->run_graph(key, step_ops);
    } else {
      step_ops();
    }
    return logits;
  }

  // Declared first so that it is destroyed last: every buffer below belongs to it.
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const Qwen3VLModel> model_;
  RunnerLimits limits_;
  ModelInfo info_;
  DeviceBuffer arena_buffer_, inputs_buffer_, logits_buffer_;
  DeviceBuffer staging_buffer_;  // host memory for the vision uploads (Backend::allocate_host)
  Arena arena_;
  std::vector<uint16_t> host_logits_;
  int64_t last_rows_ = 0;  // logits rows of the last step if it was a kTopK one (logits_row reads them)
  bool decode_graphs_ = false;
  std::vector<int32_t> wide_page_table_;
  std::vector<uint8_t> staging_;  // host mirror of the step inputs buffer
  int64_t graph_cache_pages_ = -1;
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> make_qwen3vl_runner(std::shared_ptr<Backend> backend,
                                                         std::shared_ptr<const Qwen3VLModel> model,
                                                         const Qwen3VLRunnerOptions& options) {
  QVL_CHECK(backend != nullptr && model != nullptr);
  QVL_CHECK(&model->backend() == backend.get()) << "the model was made on another backend";
  const RunnerLimits& l = options.limits;
  if (l.max_step_tokens < 1 || l.max_seqs < 1 || l.max_pages_per_seq < 1 || l.max_image_patches < 0)
    return invalid_argument("runner limits: step tokens " + std::to_string(l.max_step_tokens) + ", sequences " +
                            std::to_string(l.max_seqs) + ", pages per sequence " + std::to_string(l.max_pages_per_seq) +
                            " must be positive");
  auto runner = std::make_unique<Qwen3VLRunner>(std::move(backend), std::move(model), options);
  QVL_RETURN_IF_ERROR(runner->allocate());
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace qvl
