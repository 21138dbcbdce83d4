#include "model/runner.h"

#include <algorithm>
#include <string>

#include "memory/activations.h"

namespace qvl {
namespace {

// Logits rows of the device tensor `t` ([r, V], F32 or BF16) appended to `out` as float.
void append_host_logits(Backend& backend, const Tensor& t, std::vector<float>* out) {
  const size_t n = static_cast<size_t>(t.numel());
  const size_t old = out->size();
  out->resize(old + n);
  if (t.dtype == DType::kF32) {
    backend.copy_to_host(out->data() + old, t);
  } else {
    QVL_CHECK(t.dtype == DType::kBF16) << "logits dtype " << dtype_name(t.dtype);
    std::vector<uint16_t> tmp(n);
    backend.copy_to_host(tmp.data(), t);
    for (size_t i = 0; i < n; ++i) (*out)[old + i] = bf16_to_float(tmp[i]);
  }
}

}  // namespace

Result<std::unique_ptr<SequenceRunner>> SequenceRunner::create(const Qwen3VLModel& model, const Options& options) {
  if (options.max_tokens < 1 || options.page_size < 1 || options.prefill_chunk < 0)
    return invalid_argument("runner: max_tokens " + std::to_string(options.max_tokens) + ", page_size " +
                            std::to_string(options.page_size) + ", prefill_chunk " +
                            std::to_string(options.prefill_chunk) + " must be positive (chunk 0 = whole prompt)");
  std::unique_ptr<SequenceRunner> r(new SequenceRunner(model, options));
  const TextConfig& tc = model.config().text;
  Backend& be = model.backend();
  KvCacheView& c = r->cache_;
  c.dtype = be.activation_dtype();
  c.page_size = options.page_size;
  c.num_pages = (options.max_tokens + options.page_size - 1) / options.page_size;
  c.num_layers = tc.num_hidden_layers;
  c.num_kv_heads = tc.num_key_value_heads;
  c.head_dim = tc.head_dim;
  QVL_ASSIGN_OR_RETURN(r->kv_buffer_, be.allocate(c.page_bytes() * c.num_pages, "runner KV cache"));
  c.base = r->kv_buffer_.data();
  r->page_table_.resize(c.num_pages);
  for (int64_t p = 0; p < c.num_pages; ++p) r->page_table_[p] = static_cast<int32_t>(p);  // identity: slot = index
  return r;
}

Result<std::vector<float>> SequenceRunner::prefill(std::span<const int32_t> ids, std::span<const ImageInput> images,
                                                   int logits_last) {
  if (prefilled_) return failed_precondition("runner: the sequence is already prefilled");
  const ModelConfig& cfg = model_.config();
  const int64_t L = static_cast<int64_t>(ids.size());
  if (L > options_.max_tokens)
    return out_of_range("prompt of " + std::to_string(L) + " tokens exceeds the runner's " +
                        std::to_string(options_.max_tokens));
  if (logits_last < 1 || logits_last > L)
    return invalid_argument("logits for the last " + std::to_string(logits_last) + " of " + std::to_string(L) +
                            " prompt tokens");
  std::vector<ImageGrid> grids;
  for (const ImageInput& img : images) grids.push_back(img.grid);
  QVL_ASSIGN_OR_RETURN(positions_, qvl::prompt_positions(ids, grids, cfg));

  // One arena for the whole sequence, sized by the planner's terms: the vision features stay at
  // its bottom through the prefill, each step's inputs and scratch go above them.
  Backend& be = model_.backend();
  const DType act = be.activation_dtype();
  const int64_t chunk = options_.prefill_chunk > 0 ? std::min<int64_t>(options_.prefill_chunk, L) : L;
  const int64_t rows = std::min<int64_t>(logits_last, chunk);
  int64_t patches = 0, segments = 0;
  for (const ImageGrid& g : grids) {
    patches += g.num_patches();
    segments += g.t;
  }
  const VisionActivationTerms vision = vision_activation_terms(cfg, patches, act, std::max<int64_t>(segments, 1));
  const int64_t text = decoder_activation_terms(cfg, chunk, rows, act).peak() +
                       arena_bytes(rows * cfg.text.vocab_size, act) + arena_bytes(rows, DType::kI32) +
                       step_input_bytes(chunk, 1, cache_.num_pages);
  const size_t bytes = static_cast<size_t>(std::max(vision.peak(), vision.features() + text));
  QVL_ASSIGN_OR_RETURN(arena_buffer_, be.allocate(bytes, "runner arena"));
  arena_ = Arena(arena_buffer_.data(), bytes, be.device(), "runner arena");

  VisionOutput vis;
  if (!images.empty()) {
    QVL_ASSIGN_OR_RETURN(staging_buffer_,
                         be.allocate_host(static_cast<size_t>(vision.upload_staging), "runner vision upload staging"));
    QVL_ASSIGN_OR_RETURN(vis, model_.encode_images(images, arena_, {staging_buffer_.data(), staging_buffer_.size()}));
  }
  // Prompt index range of each image's pad run (prompt_positions checked them against grids).
  std::vector<int64_t> run_start;
  for (int64_t i = 0; i < L; ++i)
    if (ids[i] == cfg.tokens.image_token_id && (i == 0 || ids[i - 1] != cfg.tokens.image_token_id))
      run_start.push_back(i);
  QVL_CHECK_EQ(run_start.size(), images.size());

  std::vector<float> logits;
  for (int64_t c = 0; c < L; c += chunk) {
    const int64_t end = std::min(L, c + chunk);
    std::vector<VisualRows> visual;
    for (size_t i = 0; i < run_start.size(); ++i) {
      const int64_t a = run_start[i], b = a + (vis.token_offsets[i + 1] - vis.token_offsets[i]);
      const int64_t lo = std::max(a, c), hi = std::min(b, end);
      if (lo >= hi) continue;
      VisionOutput::Slice s = vis.rows(vis.token_offsets[i] + (lo - a), vis.token_offsets[i] + (hi - a));
      visual.push_back({static_cast<int32_t>(lo - c), s.embeds, s.deepstack});
    }
    // Logits of the prompt's last `logits_last` tokens that fall in this chunk; otherwise the
    // chunk's last row, which is computed and dropped (the step always has a logits row).
    std::vector<int32_t> logit_rows;
    for (int64_t i = std::max(c, L - logits_last); i < end; ++i) logit_rows.push_back(static_cast<int32_t>(i - c));
    const bool keep = !logit_rows.empty();
    if (!keep) logit_rows.push_back(static_cast<int32_t>(end - c - 1));
    std::vector<float> dropped;
    step(ids.subspan(c, end - c), std::span(positions_.positions).subspan(c * 3, (end - c) * 3), c, visual, logit_rows,
         keep ? &logits : &dropped);
  }
  length_ = L;
  prefilled_ = true;
  arena_.reset();  // the vision features are no longer needed
  return logits;
}

Result<std::vector<float>> SequenceRunner::decode(int32_t token) {
  if (!prefilled_) return failed_precondition("runner: decode before prefill");
  if (length_ >= options_.max_tokens)
    return out_of_range("sequence is full: " + std::to_string(length_) + " tokens of " +
                        std::to_string(options_.max_tokens));
  if (token < 0 || token >= model_.config().text.vocab_size)
    return invalid_argument("token id " + std::to_string(token) + " outside the vocabulary");
  const int32_t p = static_cast<int32_t>(decode_position(length_, positions_.rope_delta));
  const int32_t pos[3] = {p, p, p};
  std::vector<float> logits;
  step(std::span(&token, 1), pos, length_, {}, {0}, &logits);
  ++length_;
  return logits;
}

void SequenceRunner::step(std::span<const int32_t> ids, std::span<const int32_t> positions, int64_t start,
                          const std::vector<VisualRows>& visual, const std::vector<int32_t>& logit_rows,
                          std::vector<float>* logits_out) {
  Backend& be = model_.backend();
  const int64_t m = static_cast<int64_t>(ids.size()), r = static_cast<int64_t>(logit_rows.size());
  const size_t mark = arena_.used();
  auto upload = [&](std::initializer_list<int64_t> dims, const int32_t* host) {
    Tensor t = arena_.alloc(DType::kI32, dims);
    be.copy_to_device(t, host);
    return t;
  };
  std::vector<int32_t> slots(m);
  for (int64_t i = 0; i < m; ++i) slots[i] = static_cast<int32_t>(start + i);
  const int32_t query_start[2] = {0, static_cast<int32_t>(m)};
  const int32_t context = static_cast<int32_t>(start + m);

  TextBatch batch;
  batch.num_seqs = 1;
  batch.num_tokens = static_cast<int>(m);
  batch.max_pages_per_seq = static_cast<int>(cache_.num_pages);
  batch.max_context = context;
  TextStepInputs in;
  in.token_ids = upload({m}, ids.data());
  batch.positions = upload({m, 3}, positions.data());
  batch.slots = upload({m}, slots.data());
  batch.query_start = upload({2}, query_start);
  batch.context_len = upload({1}, &context);
  batch.page_table = upload({1, cache_.num_pages}, page_table_.data());
  in.logits_rows = upload({r}, logit_rows.data());
  in.visual = visual;
  Tensor logits = arena_.alloc(be.activation_dtype(), {r, model_.config().text.vocab_size});
  model_.forward(batch, in, cache_, logits, arena_);
  append_host_logits(be, logits, logits_out);
  arena_.reset(mark);
}

}  // namespace qvl
