#include "server/model_prompt_builder.h"

#include <limits>
#include <span>

namespace qvl::server {

ModelPromptBuilder::ModelPromptBuilder(std::shared_ptr<const Tokenizer> tokenizer, image::DecodeLimits decode_limits,
                                       image::PreprocessOptions preprocess, ChatTemplateOptions template_options,
                                       ImageLimitFlags flags)
    : tokenizer_(std::move(tokenizer)),
      decode_limits_(decode_limits),
      preprocess_(preprocess),
      template_options_(std::move(template_options)),
      flags_(std::move(flags)),
      image_lane_(std::make_unique<WorkLane>()) {
  QVL_CHECK(tokenizer_) << "ModelPromptBuilder needs a tokenizer";
}

Result<std::vector<PreparedImage>> ModelPromptBuilder::prepare_all(const std::vector<ImageBytes>& images) const {
  std::vector<PreparedImage> out;
  out.reserve(images.size());
  for (const ImageBytes& img : images) {
    QVL_ASSIGN_OR_RETURN(PreparedImage prepared, prepare_one(img));
    out.push_back(std::move(prepared));
  }
  return out;
}

Result<PreparedImage> ModelPromptBuilder::prepare_one(const ImageBytes& image) const {
  std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(image.bytes.data()), image.bytes.size());
  if (static_cast<int64_t>(data.size()) > decode_limits_.max_file_bytes)
    return out_of_range(image.param + ": image data is " + std::to_string(data.size()) + " bytes; the limit is " +
                        std::to_string(decode_limits_.max_file_bytes) + " (" + flags_.bytes_flag + ")");
  // Read the header with the pixel limit lifted, so the refusal can name our flag; the decode
  // below applies every limit again.
  image::DecodeLimits header_limits = decode_limits_;
  header_limits.max_pixels = std::numeric_limits<int64_t>::max();
  Result<image::ImageInfo> info = image::probe_image(data, header_limits);
  if (!info.is_ok()) return info.status().with_context(image.param);
  const int64_t pixels = static_cast<int64_t>(info->width) * info->height;
  if (pixels > decode_limits_.max_pixels)
    return out_of_range(image.param + ": image is " + std::to_string(info->width) + "x" + std::to_string(info->height) +
                        " = " + std::to_string(pixels) + " pixels; the limit is " +
                        std::to_string(decode_limits_.max_pixels) + " (" + flags_.input_pixels_flag + ")");
  Result<PreparedImage> prepared = image::prepare_image(data, decode_limits_, preprocess_);
  if (!prepared.is_ok()) return prepared.status().with_context(image.param);
  return prepared;
}

Result<BuiltPrompt> ModelPromptBuilder::build(const std::vector<ChatMessage>& messages,
                                              const std::vector<ImageBytes>& images) const {
  BuiltPrompt out;
  if (!images.empty()) {
    QVL_ASSIGN_OR_RETURN(out.images, image_lane_->run([&] { return prepare_all(images); }));
  }

  std::vector<qvl::ChatMessage> chat;
  chat.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    qvl::ChatMessage cm;
    cm.role = m.role == Role::kSystem ? ChatRole::kSystem
              : m.role == Role::kUser ? ChatRole::kUser
                                      : ChatRole::kAssistant;
    if (m.string_content) {
      QVL_CHECK_EQ(m.parts.size(), 1u);
      cm.content = m.parts[0].text;
      chat.push_back(std::move(cm));
      continue;
    }
    std::vector<ContentPart> parts;
    parts.reserve(m.parts.size());
    for (const ChatPart& p : m.parts) {
      ContentPart cp;
      if (p.kind == ChatPart::Kind::kText) {
        cp.kind = ContentPart::Kind::kText;
        cp.text = p.text;
      } else {
        QVL_CHECK(p.image_index >= 0 && p.image_index < static_cast<int>(out.images.size()))
            << "image part index " << p.image_index << " of " << out.images.size();
        const PreparedImage& pi = out.images[static_cast<size_t>(p.image_index)];
        cp.kind = ContentPart::Kind::kImage;
        cp.grid = {pi.grid_t, pi.grid_h, pi.grid_w};
      }
      parts.push_back(std::move(cp));
    }
    cm.content = std::move(parts);
    chat.push_back(std::move(cm));
  }

  Result<ChatPrompt> prompt = build_chat_prompt(*tokenizer_, chat, template_options_);
  if (!prompt.is_ok()) return prompt.status();
  out.prompt_ids = std::move(prompt->ids);
  for (const PreparedImage& pi : out.images)
    out.image_tokens += static_cast<int>(image::image_token_count(pi, template_options_.merge_size));
  return out;
}

}  // namespace qvl::server
