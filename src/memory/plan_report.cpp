#include "memory/plan_report.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace qvl {

namespace {

const char* kv_name(DType t) {
  return t == DType::kF8E4M3 ? "fp8" : "bf16";
}

std::string plural(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// One table row: label, MiB right-aligned, an optional remark.
void row(std::ostringstream& os, const std::string& label, int64_t bytes, const std::string& remark = "") {
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-60s %10s", label.c_str(), format_mib(bytes).c_str());
  os << buf;
  if (!remark.empty()) os << "  " << remark;
  os << "\n";
}

// 1234567 -> "1,234,567".
std::string thousands(int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out = v < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

void suggestion_lines(std::ostringstream& os, const MemoryPlan& p) {
  if (p.suggestions.empty()) {
    os << "  No single change helps; see the notes.\n";
    return;
  }
  for (const Suggestion& s : p.suggestions) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "    %-26s saves %9s MiB  %s  (%s)\n", s.flag.c_str(),
                  format_mib(s.saves_bytes).c_str(), s.description.c_str(),
                  s.fits_alone ? "fits alone" : "not enough alone");
    os << buf;
  }
}

}  // namespace

std::string plan_table(const MemoryPlan& p, const std::string& model_label) {
  const RuntimeOptions& o = p.options;
  const WeightBytes& w = p.weights;
  std::ostringstream os;
  os << "qvl plan: " << model_label << ", " << (p.config.quant.fp8 ? "FP8 text Linears" : "BF16 weights")
     << (p.quantized_at_load ? " (quantized at load)" : "") << "\n";
  os << "  context " << thousands(o.context_tokens) << " tokens × " << plural(o.concurrency, "sequence", "sequences")
     << ", images up to " << thousands(p.image_tokens) << " tokens (" << thousands(p.image_patches)
     << " patches), prefill chunk " << thousands(p.decoder.step_tokens) << " rows, KV " << kv_name(o.kv_dtype)
     << " in pages of " << o.kv_page_tokens << " tokens\n\n";

  os << "  " << std::string(60, ' ') << " "
     << "       MiB\n";
  row(os, "weights: vision tower", w.vision);
  row(os, "weights: text decoder (" + std::to_string(p.config.text.num_hidden_layers) + " layers + final norm)",
      w.decoder_layers + w.decoder_other);
  row(os, "weights: embeddings", w.embeddings);
  row(os, "weights: lm_head", w.lm_head, p.config.tie_word_embeddings ? "tied: the embedding table, counted once" : "");
  row(os, "weights: alignment and allocation rounding", p.weights_device + p.weights_offloaded - w.total());
  if (o.offload_layers > 0) {
    row(os, "weights: " + plural(o.offload_layers, "layer", "layers") + " offloaded to pinned host memory",
        -p.weights_offloaded);
    row(os, "offload staging buffers", p.offload_staging);
    row(os, "device page tables of the pinned host memory", p.offload_page_tables);
  }
  char ctx[160];
  std::snprintf(ctx, sizeof ctx, "CUDA context (%s, %d SMs)", p.arch ? p.arch->label : "?", p.sm_count);
  if (p.runtime_overridden) {
    row(os, "CUDA context and kernel modules (--cuda-overhead)", p.cuda_context);
  } else {
    const char* mark = p.arch && p.arch->provisional ? "provisional" : "";
    row(os, ctx, p.cuda_context, mark);
    row(os, "kernel modules, library handles, CUDA graphs", p.cuda_modules, mark);
  }
  row(os, "backend workspaces (cuBLASLt, FP8 dequant, decode splits)", p.backend_workspace - p.fp8_act_workspace);
  if (p.fp8_act_workspace > 0) row(os, "backend workspace: FP8 W8A8 activations (sm_90)", p.fp8_act_workspace);
  const bool vision_sets = p.vision.scratch() >= p.decoder.peak();
  row(os, "activation arena", p.activation_arena);
  row(os, "  held image features (merged + deepstack)", p.vision.features());
  row(os, "  vision encoder scratch (" + thousands(p.image_tokens) + "-token image)", p.vision.scratch(),
      vision_sets && p.image_tokens > 0 ? "the larger: sets the arena" : "");
  row(os,
      "  decoder step (" + thousands(p.decoder.step_tokens) + " rows, " +
          plural(p.decoder.logits_rows, "logits row", "logits rows") + ")",
      p.decoder.peak(), vision_sets ? "" : "the larger: sets the arena");
  row(os, "step inputs (ids, positions, page tables)", p.step_inputs);
  row(os, "logits (" + plural(p.max_seqs, "row", "rows") + " of " + thousands(p.config.text.vocab_size) + ")",
      p.logits_buffer);
  if (p.upload_staging > 0)
    row(os, "device page tables of the image upload staging", p.upload_staging_page_tables,
        format_bytes(p.upload_staging) + " pinned host memory");
  row(os,
      "KV cache: " + thousands(o.context_tokens) + " tokens × " + std::to_string(o.concurrency) + " (" +
          thousands(p.kv_required_pages) + " pages)",
      p.kv_required_bytes, format_bytes(p.kv_bytes_per_token) + "/token");
  os << "  " << std::string(71, '-') << "\n";
  row(os, "peak", p.peak_bytes);
  row(os, "margin", p.margin_bytes);
  if (p.has_budget) row(os, "budget", p.budget_bytes, p.budget_source);
  os << "\n";

  if (!p.has_budget) {
    os << "  No budget (" << p.budget_source << "). This configuration needs "
       << format_mib(p.peak_bytes + p.margin_bytes) << " MiB with the margin.\n";
  } else if (p.fits) {
    os << "  FITS with " << format_mib(p.budget_bytes - p.margin_bytes - p.peak_bytes) << " MiB to spare. KV capacity "
       << thousands(p.kv_capacity_tokens) << " tokens (" << thousands(p.kv_capacity_pages) << " pages): up to "
       << thousands(p.max_context) << " tokens of context for " << plural(o.concurrency, "sequence", "sequences")
       << ".\n";
  } else {
    os << "  DOES NOT FIT: short by " << format_mib(p.shortfall_bytes) << " MiB.\n";
    os << "  Suggestions, cheapest first (each alone):\n";
    suggestion_lines(os, p);
  }
  if (!p.notes.empty()) {
    os << "\n  Notes:\n";
    for (const std::string& n : p.notes) os << "    - " << n << "\n";
  }
  return os.str();
}

std::string auto_fit_summary(const AutoFit& fit) {
  std::ostringstream os;
  if (fit.applied.empty()) {
    os << "auto-fit: nothing to change, the plan fits as asked\n";
    return os.str();
  }
  for (const Suggestion& s : fit.applied)
    os << "auto-fit: " << s.flag << " (saves " << format_mib(s.saves_bytes) << " MiB: " << s.description << ")\n";
  return os.str();
}

std::string plan_refusal(const MemoryPlan& p) {
  std::ostringstream os;
  os << "the model does not fit: it needs " << format_mib(p.peak_bytes + p.margin_bytes) << " MiB (peak "
     << format_mib(p.peak_bytes) << " + margin " << format_mib(p.margin_bytes) << ") of a "
     << format_mib(p.budget_bytes) << " MiB budget (" << p.budget_source << "): short by "
     << format_mib(p.shortfall_bytes) << " MiB.\n";
  os << "Cheapest changes (each alone; --auto-fit applies the cheapest set that fits):\n";
  suggestion_lines(os, p);
  return os.str();
}

std::string plan_json(const MemoryPlan& p, const std::string& model_label, const AutoFit* fit) {
  using nlohmann::json;
  const RuntimeOptions& o = p.options;
  auto suggestions = [](const std::vector<Suggestion>& list) {
    json a = json::array();
    for (const Suggestion& s : list)
      a.push_back({{"change", fit_change_name(s.change)},
                   {"flag", s.flag},
                   {"description", s.description},
                   {"value", s.value},
                   {"saves_bytes", s.saves_bytes},
                   {"fits_alone", s.fits_alone}});
    return a;
  };
  json j;
  j["model"] = model_label;
  j["fp8_weights"] = p.config.quant.fp8;
  j["kv_dtype"] = kv_name(o.kv_dtype);
  j["context_tokens"] = o.context_tokens;
  j["concurrency"] = o.concurrency;
  j["prefill_chunk"] = p.decoder.step_tokens;
  j["image_pixels_cap"] = p.image_pixels;
  j["image_tokens"] = p.image_tokens;
  j["image_patches"] = p.image_patches;
  j["offload_layers"] = o.offload_layers;

  j["weights_bytes"] = p.weights.total();
  j["weights"] = {{"vision", p.weights.vision},
                  {"decoder_layers", p.weights.decoder_layers},
                  {"decoder_other", p.weights.decoder_other},
                  {"embeddings", p.weights.embeddings},
                  {"lm_head", p.weights.lm_head},
                  {"largest_layer", p.weights.largest_layer},
                  {"tensors", p.weights.tensor_count},
                  {"alignment_padding", p.weights.alignment_padding},
                  {"offloaded", p.weights_offloaded},
                  {"offload_staging", p.offload_staging},
                  {"offload_page_tables", p.offload_page_tables},
                  {"device_allocation", p.weights_device}};
  j["cuda"] = {{"arch", p.arch ? p.arch->label : ""},
               {"sm_count", p.sm_count},
               {"context_bytes", p.cuda_context},
               {"modules_bytes", p.cuda_modules},
               {"backend_workspace_bytes", p.backend_workspace},
               {"fp8_act_workspace_bytes", p.fp8_act_workspace},
               {"provisional", !p.runtime_overridden && p.arch && p.arch->provisional},
               {"overridden", p.runtime_overridden}};
  j["activations"] = {{"arena_bytes", p.activation_arena},
                      {"image_features_bytes", p.vision.features()},
                      {"vision_scratch_bytes", p.vision.scratch()},
                      {"vision_peak_bytes", p.vision.peak()},
                      {"decoder_step_bytes", p.decoder.peak()},
                      {"step_inputs_bytes", p.step_inputs},
                      {"logits_buffer_bytes", p.logits_buffer},
                      {"upload_staging_bytes", p.upload_staging},
                      {"upload_staging_page_tables_bytes", p.upload_staging_page_tables},
                      {"max_seqs", p.max_seqs},
                      {"vision_terms",
                       {{"patches", p.vision.num_patches},
                        {"merged_features", p.vision.merged_features},
                        {"deepstack_features", p.vision.deepstack_features},
                        {"hidden", p.vision.hidden},
                        {"rope_table", p.vision.rope_table},
                        {"cu_seqlens", p.vision.cu_seqlens},
                        {"patch_stage", p.vision.patch_stage},
                        {"attention_stage", p.vision.attention_stage},
                        {"mlp_stage", p.vision.mlp_stage},
                        {"deepstack_stage", p.vision.deepstack_stage},
                        {"merger_stage", p.vision.merger_stage}}},
                      {"decoder_terms",
                       {{"rows", p.decoder.step_tokens},
                        {"logits_rows", p.decoder.logits_rows},
                        {"logits", p.decoder.logits},
                        {"hidden", p.decoder.hidden},
                        {"deepstack_stage", p.decoder.deepstack_stage},
                        {"attention_stage", p.decoder.attention_stage},
                        {"mlp_stage", p.decoder.mlp_stage},
                        {"final_norm_stage", p.decoder.final_norm_stage}}}};
  j["kv_bytes_per_token"] = p.kv_bytes_per_token;
  j["kv_page_tokens"] = o.kv_page_tokens;
  j["kv_page_bytes"] = p.kv_page_bytes;
  j["kv_required_pages"] = p.kv_required_pages;
  j["kv_required_bytes"] = p.kv_required_bytes;
  j["kv_capacity_pages"] = p.kv_capacity_pages;
  j["kv_capacity_tokens"] = p.kv_capacity_tokens;
  j["max_context"] = p.max_context;
  j["fixed_bytes"] = p.fixed_bytes;
  j["peak_bytes"] = p.peak_bytes;
  j["margin_bytes"] = p.margin_bytes;
  j["budget_bytes"] = p.has_budget ? json(p.budget_bytes) : json(nullptr);
  j["budget_source"] = p.budget_source;
  j["fits"] = p.has_budget && p.fits;
  j["shortfall_bytes"] = p.shortfall_bytes;
  j["suggestions"] = suggestions(p.suggestions);
  j["notes"] = p.notes;
  if (fit) j["auto_fit"] = {{"applied", suggestions(fit->applied)}};
  return j.dump(2) + "\n";
}

}  // namespace qvl
