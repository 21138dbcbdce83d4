// `qvl pull` through the binary against a fake Hub (unit/fake_hub.h) serving a gen-model tiny
// checkpoint: the cache layout huggingface_hub writes (blobs named by sha256 / git id, relative
// symlinks, refs/main), resume (a shard cut off half way, a partial .incomplete left by an
// earlier run), a retried 503, --include, a second pull that downloads nothing, and then
// `--model org/tiny` resolving and `qvl check-model` passing on it. Then the failures: a size
// or sha256 that disagrees with the listing, 401 (no or wrong token), 403 (gated), 404
// (repository, revision), no network.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "unit/fake_hub.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "output: " << (haystack)

const std::string kCommit = "c0ffee0123456789abcdef0123456789abcdef01";

std::string sha256sum(const std::string& path) {
  auto r = test::run_command("sha256sum '" + path + "'");
  return r.exit_code == 0 ? r.out.substr(0, 64) : "";
}

// The tiny checkpoint's files as a Hub repository: safetensors are LFS (sha256 from coreutils),
// the rest git files; plus files qvl must leave alone unless --include asks for them.
test::FakeHubRepo tiny_repo() {
  const std::string& dir = test::shared_preset("tiny");
  test::FakeHubRepo repo;
  repo.commit = kCommit;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    test::FakeHubFile f;
    f.bytes = test::slurp(e.path().string());
    const std::string sha = sha256sum(e.path().string());
    if (name.find(".safetensors") != std::string::npos && name.find(".json") == std::string::npos) f.sha256 = sha;
    char id[16];
    std::snprintf(id, sizeof(id), "%08x", ++n);
    f.blob_id = sha.substr(0, 32) + id;  // any 40 hex digits: qvl names git blobs by them
    repo.files[name] = f;
  }
  repo.files["README.md"] = test::git_file("# tiny\n", std::string(39, 'a') + "1");
  repo.files[".gitattributes"] = test::git_file("*.safetensors filter=lfs\n", std::string(39, 'a') + "2");
  repo.files["extra/notes.txt"] = test::git_file("notes\n", std::string(39, 'a') + "3");
  return repo;
}

struct Pull {
  test::CommandResult r;
  std::string hf_home, hub, repo_dir, snapshot;
};

// qvl pull with HF_HOME=<fresh dir> and no token or endpoint from the caller's environment.
Pull pull(const test::FakeHub& hub, const std::string& args, const std::string& hf_home = "",
          const std::string& env = "") {
  Pull p;
  p.hf_home = hf_home.empty() ? test::temp_dir("pull_home") : hf_home;
  p.hub = p.hf_home + "/hub";
  p.r = test::run_command("env -u HF_TOKEN -u HF_ENDPOINT -u HF_TOKEN_PATH HF_HOME=" + p.hf_home + " " + env + " " +
                          test::qvl_binary() + " pull --endpoint " + hub.url() + " " + args);
  return p;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (!fs::is_directory(e.symlink_status())) out.push_back(e.path().lexically_relative(dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PullCli, PullsResumesAndResolves) {
  test::FakeHub hub;
  test::FakeHubRepo repo = tiny_repo();
  repo.files["model-00002-of-00003.safetensors"].cut_first = true;  // resume inside one run
  repo.files["config.json"].fail_first = true;                      // a 503, retried
  hub.add("org/tiny", repo);

  // An earlier run stopped 1000 bytes into shard 1: its .incomplete is resumed.
  const std::string home = test::temp_dir("pull_home");
  const test::FakeHubFile& shard1 = repo.files["model-00001-of-00003.safetensors"];
  const std::string blobs = home + "/hub/models--org--tiny/blobs";
  fs::create_directories(blobs);
  test::spit(blobs + "/" + shard1.sha256 + ".incomplete", shard1.bytes.substr(0, 1000));

  Pull p = pull(hub, "org/tiny --include '*.md'", home);
  ASSERT_EQ(p.r.exit_code, 0) << p.r.err;
  const std::string repo_dir = p.hub + "/models--org--tiny";
  const std::string snapshot = repo_dir + "/snapshots/" + kCommit;
  EXPECT_CONTAINS(p.r.out, "pulled org/tiny revision main (commit " + kCommit + ") into " + snapshot + "\n");
  EXPECT_CONTAINS(p.r.out, "check-model: OK");
  EXPECT_CONTAINS(p.r.out, "use it:\n  qvl run --model org/tiny --image photo.jpg --task caption\n");  // HF_HOME is set
  EXPECT_CONTAINS(p.r.err, "fetched  model-00002-of-00003.safetensors");
  EXPECT_CONTAINS(p.r.err, "MB/s");

  // Exactly the files qvl needs, the shards the index names, and the --include match.
  EXPECT_EQ(names_in(snapshot),
            (std::vector<std::string>{"README.md", "config.json", "generation_config.json",
                                      "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors", "model.safetensors.index.json",
                                      "preprocessor_config.json"}));
  for (const std::string& name : names_in(snapshot)) {
    const test::FakeHubFile& f = repo.files.at(name);
    const std::string link = snapshot + "/" + name;
    ASSERT_TRUE(fs::is_symlink(link)) << name;
    EXPECT_EQ(fs::read_symlink(link).string(), "../../blobs/" + (f.sha256.empty() ? f.blob_id : f.sha256)) << name;
    EXPECT_TRUE(test::slurp(link) == f.bytes) << name;
  }
  EXPECT_EQ(test::slurp(repo_dir + "/refs/main"), kCommit);  // no newline, as huggingface_hub
  for (const std::string& name : names_in(repo_dir + "/blobs"))
    EXPECT_EQ(name.find(".incomplete"), std::string::npos) << name;

  // What was asked for: the 503 retried, shard 1 resumed at byte 1000, shard 2 at its half.
  EXPECT_EQ(hub.requests_for("/config.json").size(), 2u);
  auto s1 = hub.requests_for("/model-00001-of-00003.safetensors");
  ASSERT_EQ(s1.size(), 1u);
  EXPECT_EQ(s1[0].range, "bytes=1000-");
  auto s2 = hub.requests_for("/model-00002-of-00003.safetensors");
  ASSERT_EQ(s2.size(), 2u);
  EXPECT_EQ(s2[1].range,
            "bytes=" + std::to_string(repo.files["model-00002-of-00003.safetensors"].bytes.size() / 2) + "-");
  EXPECT_TRUE(hub.requests_for("/video_preprocessor_config.json").empty());
  EXPECT_TRUE(hub.requests_for("/notes.txt").empty());

  // --model org/tiny resolves through HF_HOME, and check-model passes on it.
  auto c = test::run_command("HF_HOME=" + home + " " + test::qvl_binary() + " check-model org/tiny");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_CONTAINS(c.out, "model        " + snapshot);
  EXPECT_CONTAINS(c.out, "OK");

  // Pulling again downloads nothing.
  const size_t before = hub.requests().size();
  Pull again = pull(hub, "org/tiny --include '*.md'", home);
  ASSERT_EQ(again.r.exit_code, 0) << again.r.err;
  EXPECT_CONTAINS(again.r.out, "8 files, ");
  EXPECT_CONTAINS(again.r.out, ": 0 downloaded (0 B received), 8 already in the cache");
  auto after = hub.requests();
  ASSERT_EQ(after.size(), before + 1);
  EXPECT_EQ(after.back().path, "/api/models/org/tiny/revision/main");
}

// The listing's size or sha256 is not what the server sends: nothing reaches the snapshot,
// no ref is written, no partial file is kept.
TEST(PullCli, SizeAndSha256MismatchesAreRefused) {
  test::FakeHub hub;
  test::FakeHubRepo bad_size = tiny_repo();
  const uint64_t config_size = bad_size.files["config.json"].bytes.size();
  bad_size.files["config.json"].listed_size = static_cast<int64_t>(config_size + 7);
  hub.add("org/badsize", bad_size);
  test::FakeHubRepo bad_sha = tiny_repo();
  const std::string shard = "model-00003-of-00003.safetensors";
  const std::string real = bad_sha.files[shard].sha256;
  bad_sha.files[shard].listed_sha256 = std::string(64, 'f');
  hub.add("org/badsha", bad_sha);

  Pull p = pull(hub, "org/badsize");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err, "qvl pull: 'org/badsize' file 'config.json': " + hub.url() + "/org/badsize/resolve/" +
                               kCommit + "/config.json: the server announces " + std::to_string(config_size) +
                               " bytes, the listing says " + std::to_string(config_size + 7));
  const std::string dir = p.hub + "/models--org--badsize";
  EXPECT_FALSE(fs::exists(dir + "/snapshots/" + kCommit + "/config.json"));
  EXPECT_FALSE(fs::exists(dir + "/refs/main"));
  EXPECT_TRUE(names_in(dir + "/blobs").empty());

  p = pull(hub, "org/badsha");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err, "'org/badsha' file '" + shard + "': sha256 " + real + " does not match the listed " +
                               std::string(64, 'f'));
  EXPECT_CONTAINS(p.r.err, "the download was discarded");
  const std::string sha_dir = p.hub + "/models--org--badsha";
  EXPECT_FALSE(fs::exists(sha_dir + "/snapshots/" + kCommit + "/" + shard));
  EXPECT_FALSE(fs::exists(sha_dir + "/blobs/" + real + ".incomplete"));
  EXPECT_FALSE(fs::exists(sha_dir + "/refs/main"));
}

TEST(PullCli, TokensAndHttpErrors) {
  test::FakeHub hub;
  test::FakeHubRepo priv = tiny_repo();
  priv.token = "hf_private_secret";
  hub.add("org/private", priv);
  test::FakeHubRepo gated = tiny_repo();
  gated.gated_token = "hf_granted";
  hub.add("org/gated", gated);
  hub.add("org/tiny", tiny_repo());

  Pull p = pull(hub, "org/private");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err, "qvl pull: GET " + hub.url() +
                               "/api/models/org/private/revision/main?blobs=true (the file listing): HTTP 401 "
                               "'Invalid username or password.': 'org/private' does not exist or needs a token; no "
                               "token was sent: pass --token or set HF_TOKEN");
  p = pull(hub, "org/private --token hf_wrong");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err, "'org/private' does not exist or needs a token; the token was refused");
  EXPECT_EQ(p.r.err.find("hf_wrong"), std::string::npos) << "the token must not be printed";
  // $HF_TOKEN is sent as a Bearer token on every request.
  const size_t before = hub.requests().size();
  p = pull(hub, "org/private --quiet", "", "HF_TOKEN=hf_private_secret");
  ASSERT_EQ(p.r.exit_code, 0) << p.r.err;
  auto log = hub.requests();
  ASSERT_GT(log.size(), before);
  for (size_t i = before; i < log.size(); ++i) EXPECT_EQ(log[i].authorization, "Bearer hf_private_secret");
  EXPECT_TRUE(p.r.err.empty()) << p.r.err;  // --quiet

  p = pull(hub, "org/gated");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err, "/org/gated/resolve/" + kCommit +
                               "/config.json (file 'config.json'): HTTP 403 'Access to this model is restricted': "
                               "'org/gated' is a gated model: accept its terms at " +
                               hub.url() + "/org/gated while logged in");

  p = pull(hub, "org/nope");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err, "HTTP 404 'Repository not found': repository 'org/nope' not found");
  p = pull(hub, "org/tiny --revision v9");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err,
                  "/api/models/org/tiny/revision/v9?blobs=true (the file listing): HTTP 404 'Invalid rev id: "
                  "v9': revision 'v9' does not exist in 'org/tiny'");
  p = pull(hub, "not-a-repo-id");
  EXPECT_EQ(p.r.exit_code, 1);
  EXPECT_CONTAINS(p.r.err, "'not-a-repo-id' is not a hub model id (org/name");
}

TEST(PullCli, RevisionByCommitAndNetworkFailure) {
  test::FakeHub hub;
  hub.add("org/tiny", tiny_repo());
  // A commit as the revision: no ref is written; the snapshot resolves by its name. The
  // cache is not $HF_HOME's: the command to use it says which HF_HOME.
  const std::string other = test::temp_dir("pull_other");
  Pull p = pull(hub, "org/tiny --quiet --revision " + kCommit + " --hub-dir " + other + "/hub");
  ASSERT_EQ(p.r.exit_code, 0) << p.r.err;
  EXPECT_FALSE(fs::exists(other + "/hub/models--org--tiny/refs"));
  EXPECT_TRUE(fs::is_symlink(other + "/hub/models--org--tiny/snapshots/" + kCommit + "/config.json"));
  EXPECT_CONTAINS(p.r.out, "  HF_HOME=" + other + " qvl serve org/tiny --revision " + kCommit + "\n");
  auto c =
      test::run_command("HF_HOME=" + other + " " + test::qvl_binary() + " check-model org/tiny --revision " + kCommit);
  EXPECT_EQ(c.exit_code, 0) << c.err;

  // Nothing listens on a port that was just closed.
  int port = 0;
  {
    test::FakeHub gone;
    port = gone.port();
  }
  auto r = test::run_command("env -u HF_TOKEN " + test::qvl_binary() + " pull org/tiny --max-retries 1 --hub-dir " +
                             test::temp_dir("pull_net") + " --endpoint http://127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_CONTAINS(r.err, "qvl pull: GET http://127.0.0.1:" + std::to_string(port) +
                             "/api/models/org/tiny/revision/main?blobs=true: ");
  EXPECT_CONTAINS(r.err, "(gave up after 2 tries; check the network");
}

}  // namespace
}  // namespace qvl
