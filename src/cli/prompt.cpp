#include "cli/prompt.h"

#include <algorithm>

#include "core/mmap.h"
#include "image/image.h"

namespace qvl::cli {

namespace {

// Qwen3-VL answers grounding requests natively with JSON boxes on a 0..1000 grid relative to the
// image (QwenLM/Qwen3-VL cookbooks, "2d_grounding"); spelling the schema out keeps small models
// on it.
constexpr const char* kDetectSchema =
    "Report bbox coordinates in JSON format: a list of {\"bbox_2d\": [x1, y1, x2, y2], \"label\": \"<name>\"}, "
    "with coordinates relative to the image on a 0 to 1000 scale.";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

size_t count_markers(const std::string& text) {
  size_t n = 0;
  for (size_t at = text.find(kImageMarker); at != std::string::npos; at = text.find(kImageMarker, at + 1)) ++n;
  return n;
}

}  // namespace

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names{"caption", "vqa", "scene", "detect"};
  return names;
}

Result<std::string> task_text(const std::string& task, const std::string& prompt, size_t num_images) {
  const std::string p = trim(prompt);
  if (task.empty()) {
    if (p.empty())
      return invalid_argument("--prompt is empty (give a prompt, or a --task: caption, vqa, scene, detect)");
    return prompt;
  }
  if (std::find(task_names().begin(), task_names().end(), task) == task_names().end())
    return invalid_argument("--task " + task + " is not one of caption, vqa, scene, detect");
  if (num_images == 0) return invalid_argument("--task " + task + " needs an --image");
  if (task == "caption") {
    if (!p.empty()) return invalid_argument("--task caption takes no --prompt (use --task vqa to ask a question)");
    return std::string("Describe this image in one sentence.");
  }
  if (task == "scene") {
    if (!p.empty()) return invalid_argument("--task scene takes no --prompt (use --task vqa to ask a question)");
    return std::string(
        "Describe the scene in this image in detail: the setting, the main objects and people, what is "
        "happening, where things are relative to each other, and any text that is visible.");
  }
  if (task == "vqa") {
    if (p.empty()) return invalid_argument("--task vqa needs the question in --prompt");
    return prompt;
  }
  // detect: every object, or the categories given in --prompt.
  if (p.empty()) return std::string("Locate every object in the image. ") + kDetectSchema;
  return "Locate every instance that belongs to the following categories: \"" + p + "\". " + kDetectSchema;
}

Result<std::vector<ContentPart>> user_parts(const std::string& text, const std::vector<ImageGrid>& grids,
                                            std::vector<size_t>* order) {
  const size_t markers = count_markers(text);
  if (markers > grids.size())
    return invalid_argument("the prompt has " + std::to_string(markers) + " " + kImageMarker + " markers but only " +
                            std::to_string(grids.size()) + " --image " + (grids.size() == 1 ? "was" : "were") +
                            " given");
  std::vector<ContentPart> parts;
  order->clear();
  auto add_image = [&](size_t i) {
    ContentPart part;
    part.kind = ContentPart::Kind::kImage;
    part.grid = grids[i];
    parts.push_back(part);
    order->push_back(i);
  };
  for (size_t i = markers; i < grids.size(); ++i) add_image(i);  // unmarked images first
  size_t begin = 0, next_image = 0;
  while (true) {
    const size_t at = text.find(kImageMarker, begin);
    const std::string piece = text.substr(begin, at == std::string::npos ? std::string::npos : at - begin);
    if (!piece.empty()) {
      ContentPart part;
      part.kind = ContentPart::Kind::kText;
      part.text = piece;
      parts.push_back(part);
    }
    if (at == std::string::npos) break;
    add_image(next_image++);
    begin = at + std::string(kImageMarker).size();
  }
  return parts;
}

Result<CliRequest> build_cli_request(const PromptInput& input, const LoadedModel& model,
                                     const SamplingParams& sampling) {
  QVL_ASSIGN_OR_RETURN(std::string text, task_text(input.task, input.prompt, input.images.size()));

  // Images: read, decode and preprocess each file with the model's processor settings.
  std::vector<PreparedImage> prepared;
  std::vector<ImageGrid> grids;
  for (const std::string& path : input.images) {
    auto bytes = read_file(path);
    if (!bytes.is_ok()) return bytes.status().with_context("--image " + path);
    auto data = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
    auto img = image::prepare_image(data, image::DecodeLimits{}, model.image_options);
    if (!img.is_ok()) return img.status().with_context("--image " + path);
    grids.push_back(ImageGrid{img->grid_t, img->grid_h, img->grid_w});
    prepared.push_back(std::move(img).value());
  }

  std::vector<size_t> order;
  QVL_ASSIGN_OR_RETURN(std::vector<ContentPart> parts, user_parts(text, grids, &order));
  std::vector<ChatMessage> messages;
  if (!input.system.empty()) messages.push_back(ChatMessage{ChatRole::kSystem, input.system, {}});
  messages.push_back(ChatMessage{ChatRole::kUser, std::move(parts), {}});
  ChatTemplateOptions opts;
  opts.merge_size = model.config.vision.spatial_merge_size;
  QVL_ASSIGN_OR_RETURN(ChatPrompt chat, build_chat_prompt(*model.tokenizer, messages, opts));

  CliRequest out;
  out.prompt_text = std::move(chat.text);
  out.request.prompt_ids = std::move(chat.ids);
  for (size_t i : order) out.request.images.push_back(std::move(prepared[i]));
  out.request.sampling = sampling;
  out.request.request_id = "run";
  return out;
}

}  // namespace qvl::cli
