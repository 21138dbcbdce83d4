// Shared by the tokenizer tests: the real Qwen tokenizer (loaded once), the corpus fixture, and
// the internal BPE model for algorithm-level tests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace qvl::test {

// The pinned Qwen tokenizer, or nullptr when scripts/fetch_npm.sh has not run.
std::shared_ptr<const Tokenizer> qwen_tokenizer();
// The BPE model behind the Qwen tokenizer (same file, loaded through the internal loader).
std::shared_ptr<const tok::BpeModel> bpe_model_of(const Tokenizer& tokenizer);
// tests/fixtures/tokenizer/corpus.jsonl, decoded (fails the test if it cannot be read).
const std::vector<std::string>& corpus_strings();
// Lines of a JSONL fixture file, or empty when the file does not exist.
std::vector<std::string> read_lines(const std::string& path);

}  // namespace qvl::test
