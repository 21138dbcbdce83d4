// qvl check-model: loads and validates a checkpoint without running it (config, every shard
// header, every tensor's name, dtype and shape) and prints what it holds: parameters and bytes
// by part, dtypes, FP8 modules, tied or not. Exit 0 when the model can be loaded, 1 otherwise
// with the problems (each naming its file and tensor or field) on stderr.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_args.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "model/bind.h"
#include "model/tensor_specs.h"

namespace qvl::cli {
namespace {

struct Totals {
  int64_t params = 0;
  uint64_t bytes = 0;
  int64_t tensors = 0;
};

struct Summary {
  std::map<WeightPart, Totals> parts;
  std::map<std::string, Totals> dtypes;
  Totals total;
};

bool is_scale(const std::string& name) {
  const std::string suffix = ".weight_scale_inv";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Counts the tensors the model uses (scales add bytes, not parameters).
Summary summarize(const Checkpoint& ck, const ModelConfig& config) {
  Summary s;
  for (const auto& spec : checkpoint_tensor_specs(config)) {
    const CheckpointTensor* t = ck.find(spec.name);
    if (!t) continue;
    const int64_t params = is_scale(spec.name) ? 0 : t->entry->numel();
    for (Totals* x : {&s.parts[spec.part], &s.dtypes[std::string(dtype_name(t->dtype()))], &s.total}) {
      x->params += params;
      x->bytes += t->entry->nbytes();
      x->tensors += 1;
    }
  }
  return s;
}

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s%s", v, prefixes[i], unit);
  return buf;
}

int run(const ModelArgs& args, bool as_json) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "qvl check-model: %s\n", s.message().c_str());
    return 1;
  };
  auto dir = resolve_model_dir(args);
  if (!dir.is_ok()) return fail(dir.status());
  auto config = load_model_config(*dir);
  if (!config.is_ok()) return fail(config.status());
  auto ck = Checkpoint::open(*dir);
  if (!ck.is_ok()) return fail(ck.status());
  BindReport report;
  auto weights = bind_host_weights(*ck, *config, &report);
  if (!weights.is_ok()) return fail(weights.status());
  const Summary s = summarize(*ck, *config);
  const ModelConfig& c = *config;

  if (as_json) {
    nlohmann::ordered_json j;
    j["model_dir"] = *dir;
    j["architecture"] = c.architecture;
    j["text"] = {
        {"layers", c.text.num_hidden_layers}, {"hidden_size", c.text.hidden_size}, {"vocab_size", c.text.vocab_size}};
    j["vision"] = {{"depth", c.vision.depth}, {"hidden_size", c.vision.hidden_size}};
    j["tied"] = c.tie_word_embeddings;
    j["fp8"] = c.quant.fp8;
    j["fp8_linears"] = report.fp8_linears;
    j["bf16_linears"] = report.bf16_linears;
    for (const auto& [part, t] : s.parts)
      j["parts"][weight_part_name(part)] = {{"params", t.params}, {"bytes", t.bytes}, {"tensors", t.tensors}};
    for (const auto& [dtype, t] : s.dtypes) j["dtypes"][dtype] = {{"tensors", t.tensors}, {"bytes", t.bytes}};
    j["total"] = {{"params", s.total.params}, {"bytes", s.total.bytes}, {"tensors", s.total.tensors}};
    j["shards"] = ck->files().size();
    j["lm_head_ignored"] = report.lm_head_ignored;
    j["unexpected"] = report.unexpected;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model        %s\n", dir->c_str());
  std::printf("architecture %s: text %d layers x %d, vision %d blocks x %d, vocab %d\n", c.architecture.c_str(),
              c.text.num_hidden_layers, c.text.hidden_size, c.vision.depth, c.vision.hidden_size, c.text.vocab_size);
  std::printf("lm_head      %s\n", c.tie_word_embeddings ? "tied to embed_tokens" : "separate (untied)");
  if (c.quant.fp8)
    std::printf("weights      block-FP8 %dx%d: %d FP8 Linears, %d BF16 Linears\n", c.quant.weight_block_size[0],
                c.quant.weight_block_size[1], report.fp8_linears, report.bf16_linears);
  else
    std::printf("weights      %d BF16 Linears, no FP8\n", report.bf16_linears);
  std::printf("\n%-14s %14s %12s %8s\n", "part", "parameters", "bytes", "tensors");
  for (const auto& [part, t] : s.parts)
    std::printf("%-14s %14s %12s %8lld\n", weight_part_name(part), human(static_cast<double>(t.params), "").c_str(),
                human(static_cast<double>(t.bytes), "B").c_str(), static_cast<long long>(t.tensors));
  std::printf("%-14s %14s %12s %8lld\n", "total", human(static_cast<double>(s.total.params), "").c_str(),
              human(static_cast<double>(s.total.bytes), "B").c_str(), static_cast<long long>(s.total.tensors));
  std::printf("\ndtypes      ");
  for (const auto& [dtype, t] : s.dtypes)
    std::printf(" %s: %lld tensors (%s)", dtype.c_str(), static_cast<long long>(t.tensors),
                human(static_cast<double>(t.bytes), "B").c_str());
  std::printf("\nshards       %zu file%s\n", ck->files().size(), ck->files().size() == 1 ? "" : "s");
  if (report.lm_head_ignored)
    std::printf("note         lm_head.weight is stored but ignored (tied, as transformers)\n");
  if (!report.unexpected.empty()) {
    std::printf("warning      %zu unexpected tensor%s (ignored):", report.unexpected.size(),
                report.unexpected.size() == 1 ? "" : "s");
    for (size_t i = 0; i < report.unexpected.size() && i < 10; ++i) std::printf(" %s", report.unexpected[i].c_str());
    std::printf("%s\n", report.unexpected.size() > 10 ? " ..." : "");
  }
  std::printf("OK\n");
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto args = std::make_shared<ModelArgs>();
  auto as_json = std::make_shared<bool>(false);
  add_model_args(app, args.get());
  app.add_flag("--json", *as_json, "Print the summary as JSON");
  return [args, as_json] { return run(*args, *as_json); };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("check-model", "Load and validate a checkpoint without running it; print a summary",
                     qvl::cli::setup);
