// The real PromptBuilder (model_session.h): decodes and preprocesses each image with the image
// pipeline (image/image.h), then renders the Qwen3-VL chat template with each image's grid and
// tokenizes it (tokenizer/chat_template.h). Image limits are enforced here, per image and before
// any pixel is decoded:
//   DecodeLimits          what may be decoded at all (bytes, width, height, input pixels); over
//                         them the request is refused with a 400 naming the image and the limit
//   PreprocessOptions     how images are resized (the model's preprocessor_config plus qvl's
//                         --max-image-pixels / --max-image-tokens caps, which downscale, as the
//                         reference's max_pixels does, and never refuse)
// Decoding and preprocessing run on one WorkLane (work_lane.h says why), one request's images at
// a time; templating and tokenizing run on the calling thread. Immutable after construction;
// safe to call from every HTTP worker at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "image/image.h"
#include "server/model_session.h"
#include "server/work_lane.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace qvl::server {

struct ImageLimitFlags {
  // The flag names quoted in error messages, so a user knows what to change.
  std::string input_pixels_flag = "--max-image-input-pixels";
  std::string bytes_flag = "--max-image-bytes";
};

class ModelPromptBuilder : public PromptBuilder {
 public:
  ModelPromptBuilder(std::shared_ptr<const Tokenizer> tokenizer, image::DecodeLimits decode_limits,
                     image::PreprocessOptions preprocess, ChatTemplateOptions template_options,
                     ImageLimitFlags flags = {});

  Result<BuiltPrompt> build(const std::vector<ChatMessage>& messages,
                            const std::vector<ImageBytes>& images) const override;

 private:
  Result<PreparedImage> prepare_one(const ImageBytes& image) const;
  Result<std::vector<PreparedImage>> prepare_all(const std::vector<ImageBytes>& images) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  image::DecodeLimits decode_limits_;
  image::PreprocessOptions preprocess_;
  ChatTemplateOptions template_options_;
  ImageLimitFlags flags_;
  std::unique_ptr<WorkLane> image_lane_;
};

}  // namespace qvl::server
