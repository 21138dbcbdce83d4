// io/download.h's pull_model against the fake Hub, without the binary: what is in the cache
// already (a partial download whose bytes are wrong, a blob of the wrong size) is repaired,
// the progress callback's arithmetic (the inputs of the MB/s and ETA on screen) adds up, and a
// repository without weights or config is refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/download.h"
#include "io/download_sha256.h"
#include "unit/fake_hub.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

const std::string kCommit = "feed0123456789abcdef0123456789abcdef0123";

std::string pattern(size_t n, int seed) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += static_cast<char>((i * 131 + seed * 7) % 251);
  return s;
}

// config.json (git) and model.safetensors (LFS): pull_model does not parse either.
test::FakeHubRepo small_repo() {
  test::FakeHubRepo repo;
  repo.commit = kCommit;
  repo.files["config.json"] = test::git_file("{\"model_type\": \"x\"}", std::string(40, '1'));
  test::FakeHubFile w = test::git_file(pattern(300000, 1), std::string(40, '2'));
  w.sha256 = sha256_hex(w.bytes);
  repo.files["model.safetensors"] = w;
  repo.files["notes/README.md"] = test::git_file("notes", std::string(40, '3'));
  return repo;
}

PullOptions options_for(const test::FakeHub& hub, const std::string& repo, const std::string& hub_dir) {
  PullOptions o;
  o.endpoint = hub.url();
  o.repo_id = repo;
  o.hub_dir = hub_dir;
  o.http.backoff_initial_ms = 10;
  return o;
}

TEST(PullModel, RepairsWhatTheCacheHoldsAndReportsProgress) {
  test::FakeHub hub;
  test::FakeHubRepo repo = small_repo();
  hub.add("org/small", repo);
  const std::string hub_dir = test::temp_dir("pull_model");
  const std::string blobs = hub_dir + "/models--org--small/blobs/";
  fs::create_directories(blobs);
  const test::FakeHubFile& w = repo.files["model.safetensors"];
  test::spit(blobs + w.sha256 + ".incomplete", std::string(5000, 'Z'));  // wrong bytes: sha256 fails
  test::spit(blobs + std::string(40, '1'), "{}");                        // a blob of the wrong size

  std::vector<PullProgress> events;
  PullOptions o = options_for(hub, "org/small", hub_dir);
  o.include = {"notes/"};  // a folder, as huggingface_hub's allow_patterns
  o.on_progress = [&](const PullProgress& p) { events.push_back(p); };
  auto r = pull_model(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->commit, kCommit);
  EXPECT_EQ(r->files, (std::vector<std::string>{"config.json", "model.safetensors", "notes/README.md"}));
  EXPECT_EQ(r->files_fetched, 3);
  const uint64_t total = repo.files["config.json"].bytes.size() + w.bytes.size() + 5;
  EXPECT_EQ(r->bytes_total, total);
  // The weights came twice: 295000 bytes resumed after the bad prefix, then all 300000 again.
  EXPECT_EQ(r->bytes_fetched, total + (300000 - 5000));

  const std::string snapshot = hub_dir + "/models--org--small/snapshots/" + kCommit;
  EXPECT_TRUE(test::slurp(snapshot + "/model.safetensors") == w.bytes);
  EXPECT_EQ(test::slurp(snapshot + "/config.json"), repo.files["config.json"].bytes);
  EXPECT_EQ(fs::read_symlink(snapshot + "/notes/README.md").string(), "../../../blobs/" + std::string(40, '3'));
  EXPECT_EQ(test::slurp(snapshot + "/notes/README.md"), "notes");
  auto log = hub.requests_for("/model.safetensors");
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].range, "bytes=5000-");
  EXPECT_EQ(log[1].range, "");

  // Progress: per file a start, bytes, then done; `done` never passes `total` and ends on it.
  ASSERT_FALSE(events.empty());
  int done_events = 0;
  for (const auto& e : events) {
    EXPECT_LE(e.done, e.total) << e.file;
    EXPECT_LE(e.file_done, e.file_total) << e.file;
    done_events += e.event == PullProgress::Event::kDone;
  }
  EXPECT_EQ(done_events, 3);
  EXPECT_EQ(events.back().event, PullProgress::Event::kDone);
  EXPECT_EQ(events.back().done, total);
  EXPECT_EQ(events.back().total, total);
  EXPECT_EQ(events.back().fetched, r->bytes_fetched);

  // Again: everything is cached, nothing is fetched.
  events.clear();
  auto again = pull_model(o);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->files_cached, 3);
  EXPECT_EQ(again->bytes_fetched, 0u);
  ASSERT_EQ(events.size(), 3u);
  for (const auto& e : events) EXPECT_EQ(e.event, PullProgress::Event::kCached);
  EXPECT_EQ(hub.requests_for("/model.safetensors").size(), 2u);
}

TEST(PullModel, RefusesRepositoriesWithoutAModel) {
  test::FakeHub hub;
  test::FakeHubRepo no_config = small_repo();
  no_config.files.erase("config.json");
  hub.add("org/noconfig", no_config);
  test::FakeHubRepo no_weights = small_repo();
  no_weights.files.erase("model.safetensors");
  hub.add("org/noweights", no_weights);
  test::FakeHubRepo bad_index = small_repo();
  bad_index.files["model.safetensors.index.json"] =
      test::git_file(R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})", std::string(40, '4'));
  hub.add("org/badindex", bad_index);
  const std::string hub_dir = test::temp_dir("pull_refuse");

  auto r = pull_model(options_for(hub, "org/noconfig", hub_dir));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "'org/noconfig' at commit " + kCommit +
                                      " has no config.json: not a transformers model repository (it holds: "
                                      "model.safetensors, notes/README.md)");
  r = pull_model(options_for(hub, "org/noweights", hub_dir));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "'org/noweights' at commit " + kCommit +
                                      " has neither model.safetensors.index.json nor model.safetensors: qvl reads "
                                      "safetensors checkpoints only");
  r = pull_model(options_for(hub, "org/badindex", hub_dir));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "'org/badindex' at commit " + kCommit +
                                      ": model.safetensors.index.json maps tensors to "
                                      "'model-00001-of-00002.safetensors', which the repository does not have");
  for (const char* name : {"noconfig", "noweights", "badindex"})
    EXPECT_FALSE(fs::exists(hub_dir + "/models--org--" + std::string(name) + "/refs")) << name;

  PullOptions bad = options_for(hub, "org/small", hub_dir);
  bad.revision = "../main";
  r = pull_model(bad);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "--revision '../main' is not a branch, tag or commit name");
}

}  // namespace
}  // namespace qvl
