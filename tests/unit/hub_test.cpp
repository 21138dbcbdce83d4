// Model name resolution (io/hub.h) on a fake Hugging Face cache built in a scratch directory,
// and the built-in tiny models generated on first use.
#include "io/hub.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "unit/io_test_util.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

// hub/models--Qwen--Qwen3-VL-2B-Instruct with refs main -> abc123 and dev -> def456.
std::string make_hub() {
  std::string hub = test::temp_dir("hub");
  const std::string repo = hub + "/models--Qwen--Qwen3-VL-2B-Instruct";
  fs::create_directories(repo + "/refs");
  fs::create_directories(repo + "/snapshots/abc123");
  fs::create_directories(repo + "/snapshots/def456");
  test::spit(repo + "/refs/main", "abc123\n");  // huggingface_hub writes the hash, maybe a newline
  test::spit(repo + "/refs/dev", "def456");
  test::spit(repo + "/snapshots/abc123/config.json", "{}");
  return hub;
}

TEST(Hub, ResolvesRefsToSnapshots) {
  ModelSearch s;
  s.hub_dir = make_hub();
  auto m = resolve_model("Qwen/Qwen3-VL-2B-Instruct", s);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->origin, ModelOrigin::kHub);
  EXPECT_EQ(m->dir, s.hub_dir + "/models--Qwen--Qwen3-VL-2B-Instruct/snapshots/abc123");
  s.revision = "dev";
  m = resolve_model("Qwen/Qwen3-VL-2B-Instruct", s);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->dir, s.hub_dir + "/models--Qwen--Qwen3-VL-2B-Instruct/snapshots/def456");
  s.revision = "def456";  // a snapshot hash directly
  m = resolve_model("Qwen/Qwen3-VL-2B-Instruct", s);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->dir, s.hub_dir + "/models--Qwen--Qwen3-VL-2B-Instruct/snapshots/def456");
}

TEST(Hub, MissesSayWhereAndHow) {
  ModelSearch s;
  s.hub_dir = make_hub();
  auto m = resolve_model("Qwen/Qwen3-VL-8B-Instruct", s);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(m.status().message(), s.hub_dir + "/models--Qwen--Qwen3-VL-8B-Instruct");
  EXPECT_CONTAINS(m.status().message(), "huggingface-cli download Qwen/Qwen3-VL-8B-Instruct");
  EXPECT_CONTAINS(m.status().message(), "qvl pull Qwen/Qwen3-VL-8B-Instruct");
  s.revision = "v2";
  m = resolve_model("Qwen/Qwen3-VL-2B-Instruct", s);
  ASSERT_FALSE(m.is_ok());
  EXPECT_CONTAINS(m.status().message(),
                  "revision 'v2' not found: looked for " + s.hub_dir + "/models--Qwen--Qwen3-VL-2B-Instruct/refs/v2");
  m = resolve_model("not a model", s);
  ASSERT_FALSE(m.is_ok());
  EXPECT_CONTAINS(m.status().message(), "model 'not a model' not found: not a local directory, not a built-in");
}

TEST(Hub, LocalDirectoryWins) {
  std::string dir = test::temp_dir("local_model");
  ModelSearch s;
  s.hub_dir = make_hub();
  auto m = resolve_model(dir, s);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->origin, ModelOrigin::kLocal);
  EXPECT_EQ(m->dir, dir);
  // A relative directory spelled like a hub id or a built-in name is local too.
  std::string cwd = test::temp_dir("cwd");
  fs::create_directories(cwd + "/Qwen/Qwen3-VL-2B-Instruct");
  fs::create_directories(cwd + "/tiny");
  auto old = fs::current_path();
  fs::current_path(cwd);
  auto a = resolve_model("Qwen/Qwen3-VL-2B-Instruct", s);
  auto b = resolve_model("tiny", s);
  fs::current_path(old);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->dir, cwd + "/Qwen/Qwen3-VL-2B-Instruct");
  EXPECT_EQ(a->origin, ModelOrigin::kLocal);
  EXPECT_EQ(b->dir, cwd + "/tiny");
  test::spit(cwd + "/file", "x");
  auto f = resolve_model(cwd + "/file", s);
  ASSERT_FALSE(f.is_ok());
  EXPECT_CONTAINS(f.status().message(), "is a file");
}

TEST(Hub, BuiltinsAreGeneratedOnceIntoTheCache) {
  ModelSearch s;
  s.cache_dir = test::temp_dir("cache");
  s.tokenizer_dir = test::temp_dir("tok");
  test::spit(s.tokenizer_dir + "/tokenizer.json", "{}");
  test::spit(s.tokenizer_dir + "/tokenizer_config.json", "{}");
  auto m = resolve_model("tiny-untied", s);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->origin, ModelOrigin::kBuiltin);
  EXPECT_EQ(m->dir, s.cache_dir + "/qvl/builtin/tiny-untied-v1");
  EXPECT_TRUE(fs::exists(m->dir + "/config.json"));
  EXPECT_TRUE(fs::exists(m->dir + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(m->dir + "/model.safetensors.index.json"));
  // Nothing left behind from the temporary directory.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(s.cache_dir + "/qvl/builtin")) entries += e.is_directory();
  EXPECT_EQ(entries, 1);
  // The second use finds it (same files, not regenerated).
  auto stamp = fs::last_write_time(m->dir + "/config.json");
  auto again = resolve_model("tiny-untied", s);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(fs::last_write_time(again->dir + "/config.json"), stamp);
  // Built-ins are seed 0 of the preset: identical to gen-model's output.
  std::string ref = test::generate_preset("tiny-untied", 0);
  int shards = 0;
  for (const auto& e : fs::directory_iterator(ref)) {
    const std::string name = e.path().filename().string();
    if (name.find(".safetensors") == std::string::npos) continue;
    ++shards;
    ASSERT_TRUE(fs::exists(m->dir + "/" + name)) << name;
    EXPECT_TRUE(test::slurp(e.path().string()) == test::slurp(m->dir + "/" + name)) << name;
  }
  EXPECT_EQ(shards, 5);  // 4 shards (two 29 MB tables over a 16 MiB limit) + the index
}

}  // namespace
}  // namespace qvl
