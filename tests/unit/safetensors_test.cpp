// safetensors header validation and sharded checkpoints (io/safetensors.h, io/checkpoint.h).
// Files are built in memory from a JSON header so every validation rule is hit by name.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/checkpoint.h"
#include "support/test_support.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

// 8-byte little-endian length + `header` + `data_bytes` bytes of 0..255 ramp.
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> f(8 + header.size() + data_bytes);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(f.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) f[8 + header.size() + i] = static_cast<uint8_t>(i);
  return f;
}

std::string parse_error(const std::string& header, size_t data_bytes) {
  auto file = make_file(header, data_bytes);
  auto r = parse_safetensors_header(file, "x.safetensors");
  EXPECT_FALSE(r.is_ok()) << header;
  return r.is_ok() ? "" : r.status().message();
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(Safetensors, ParsesValidHeader) {
  // Padded with spaces (as writers do); tensors listed out of offset order.
  std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"I64","shape":[0,5],"data_offsets":[20,20]}}   )";
  while ((8 + h.size()) % 8) h += ' ';  // keep the data region aligned
  auto file = make_file(h, 20);
  auto r = parse_safetensors_header(file, "x.safetensors");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto& hd = *r;
  EXPECT_EQ(hd.header_bytes, h.size());
  EXPECT_EQ(hd.data_offset, 8 + h.size());
  EXPECT_EQ(hd.metadata.at("format"), "pt");
  ASSERT_EQ(hd.tensors.size(), 3u);
  EXPECT_EQ(hd.tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(hd.tensors[1].name, "b");
  EXPECT_EQ(hd.tensors[1].dtype, DType::kBF16);
  EXPECT_EQ(hd.tensors[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(hd.tensors[1].nbytes(), 12u);  // 2*3 elements * 2 bytes
  EXPECT_EQ(hd.tensors[2].numel(), 0);
}

TEST(Safetensors, RejectsShortFileAndBadLength) {
  std::vector<uint8_t> tiny{1, 2, 3};
  auto r = parse_safetensors_header(tiny, "t.safetensors");
  ASSERT_FALSE(r.is_ok());
  EXPECT_CONTAINS(r.status().message(), "t.safetensors: 3 bytes is too short");

  std::vector<uint8_t> huge(16, 0);
  huge[4] = 0x80;  // length 2^39 > 100 MiB
  r = parse_safetensors_header(huge, "h.safetensors");
  ASSERT_FALSE(r.is_ok());
  EXPECT_CONTAINS(r.status().message(), "header length 549755813888 exceeds the 104857600-byte limit");

  auto f = make_file("{}", 0);
  f[0] = 50;  // claims 50 header bytes, the file has 2 after the length
  r = parse_safetensors_header(f, "p.safetensors");
  ASSERT_FALSE(r.is_ok());
  EXPECT_CONTAINS(r.status().message(), "header length 50 runs past the end of the 10-byte file");
}

TEST(Safetensors, RejectsBadJson) {
  EXPECT_CONTAINS(parse_error("{\"a\":", 0), "x.safetensors: header is not valid JSON");
  EXPECT_CONTAINS(parse_error("[1,2]", 0), "header is not a JSON object");
  EXPECT_CONTAINS(parse_error(R"({"__metadata__":{"k":1}})", 0), "\"__metadata__\" value for \"k\" is not a string");
  EXPECT_CONTAINS(parse_error(R"({"w":[1]})", 0), "tensor 'w': header entry is not a JSON object");
}

TEST(Safetensors, RejectsBadTensorEntries) {
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
                  "tensor 'w': unsupported dtype \"F64\"");
  EXPECT_CONTAINS(parse_error(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), "tensor 'w': missing");
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                  "tensor 'w': shape entry -1 is not a non-negative integer");
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
                  "shape entry 1.5 is not a non-negative integer");
  // 2 * 3 F32 = 24 bytes, offsets span 20.
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
                  "tensor 'w': F32 [2, 3] needs 24 bytes but data_offsets [0, 20] span 20");
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})", 8), "end before they begin");
  // 2^62 * 4 elements overflows 64 bits.
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"U8","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", 4),
                  "overflows");
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0]}})", 4),
                  "\"data_offsets\" must be an array of two integers");
}

TEST(Safetensors, RejectsOutOfBoundsMisalignedAndOverlapping) {
  EXPECT_CONTAINS(parse_error(R"({"w":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 10),
                  "tensor 'w': data_offsets [0, 16] run past the 10-byte data region");
  // Header of 56 bytes -> data at file offset 64; begin 2 puts an F32 at 66.
  std::string h = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})";
  h.resize(56, ' ');
  EXPECT_CONTAINS(parse_error(h, 8), "tensor 'w': data at file offset 66 is not aligned to its 4-byte elements");
  EXPECT_CONTAINS(parse_error(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                              10),
                  "tensors 'a' [0, 8) and 'b' [6, 10) overlap");
}

TEST(Safetensors, BuildHeaderRoundTrips) {
  std::vector<SafetensorsEntry> entries = {{"x.weight", DType::kBF16, {3, 2}, 0, 12},
                                           {"x.scale", DType::kF32, {1}, 12, 16}};
  std::string prefix = build_safetensors_header(entries, {{"format", "pt"}});
  EXPECT_EQ(prefix.size() % 8, 0u);  // data region 8-byte aligned
  std::vector<uint8_t> file(prefix.begin(), prefix.end());
  file.resize(file.size() + 16, 7);
  auto r = parse_safetensors_header(file, "rt");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].name, "x.weight");
  EXPECT_EQ(r->tensors[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(r->tensors[1].dtype, DType::kF32);
  EXPECT_EQ(r->data_offset, prefix.size());
}

// ---- files and shards ----

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}
// A shard holding U8 tensors of 4 bytes each, values start, start+1, ...
std::vector<uint8_t> shard(const std::vector<std::string>& names) {
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < names.size(); ++i) entries.push_back({names[i], DType::kU8, {4}, 4 * i, 4 * i + 4});
  std::string prefix = build_safetensors_header(entries, {{"format", "pt"}});
  std::vector<uint8_t> f(prefix.begin(), prefix.end());
  for (size_t i = 0; i < 4 * names.size(); ++i) f.push_back(static_cast<uint8_t>(i));
  return f;
}

TEST(Checkpoint, OpensSingleFileAndViews) {
  std::string dir = test::temp_dir("ckpt_single");
  write_bytes(dir + "/model.safetensors", shard({"a", "b"}));
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  ASSERT_EQ(ck->tensors().size(), 2u);
  const CheckpointTensor* b = ck->find("b");
  ASSERT_NE(b, nullptr);
  Tensor v = b->view();
  EXPECT_EQ(v.dtype, DType::kU8);
  EXPECT_EQ(v.as<uint8_t>()[0], 4);  // second tensor starts at data byte 4
  EXPECT_EQ(b->view_as({2, 2}).shape[1], 2);
  EXPECT_EQ(ck->total_bytes(), 8u);
  EXPECT_EQ(ck->find("zzz"), nullptr);
}

TEST(Checkpoint, OpensShardsThroughIndex) {
  std::string dir = test::temp_dir("ckpt_shards");
  write_bytes(dir + "/s1.safetensors", shard({"a", "b"}));
  write_bytes(dir + "/s2.safetensors", shard({"c"}));
  write_text(
      dir + "/model.safetensors.index.json",
      R"({"metadata":{"total_size":12},"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})");
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ(ck->tensors().size(), 3u);
  EXPECT_EQ(ck->files().size(), 2u);
  EXPECT_NE(ck->find("c")->file_path().find("s2.safetensors"), std::string::npos);
}

TEST(Checkpoint, ReportsIndexProblemsByFileAndTensor) {
  std::string dir = test::temp_dir("ckpt_bad");
  write_bytes(dir + "/s1.safetensors", shard({"a"}));
  write_bytes(dir + "/s2.safetensors", shard({"a", "c"}));
  // 'b' mapped to s1 but absent there.
  write_text(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  auto ck = Checkpoint::open(dir);
  ASSERT_FALSE(ck.is_ok());
  EXPECT_CONTAINS(ck.status().message(), "s1.safetensors: tensor 'b' is mapped to this shard");

  // 'a' in two shards.
  write_text(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})");
  ck = Checkpoint::open(dir);
  ASSERT_FALSE(ck.is_ok());
  EXPECT_CONTAINS(ck.status().message(), "tensor 'a' appears in two shards");

  // A shard that does not exist.
  write_text(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"s9.safetensors"}})");
  ck = Checkpoint::open(dir);
  ASSERT_FALSE(ck.is_ok());
  EXPECT_CONTAINS(ck.status().message(),
                  "s9.safetensors: shard listed in model.safetensors.index.json (for tensor 'a')");

  std::string empty = test::temp_dir("ckpt_empty");
  ck = Checkpoint::open(empty);
  ASSERT_FALSE(ck.is_ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(ck.status().message(), "no model.safetensors or model.safetensors.index.json in " + empty);
}

}  // namespace
}  // namespace qvl
