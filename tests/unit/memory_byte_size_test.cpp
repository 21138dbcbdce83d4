// Byte sizes as the CLI accepts them (--gpu-memory, --reserve, --margin, --cuda-overhead).
#include <gtest/gtest.h>

#include "memory/byte_size.h"

namespace qvl {
namespace {

int64_t parsed(const char* text) {
  Result<int64_t> r = parse_byte_size(text);
  EXPECT_TRUE(r.is_ok()) << text << ": " << r.status().to_string();
  return r.is_ok() ? r.value() : -1;
}

TEST(ByteSize, BinaryUnits) {
  EXPECT_EQ(parsed("8GiB"), 8LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parsed("8 GiB"), 8LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parsed("8gib"), 8LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parsed("8000MiB"), 8000LL * 1024 * 1024);
  EXPECT_EQ(parsed("8000M"), 8000LL * 1024 * 1024);
  EXPECT_EQ(parsed("512k"), 512LL * 1024);
  EXPECT_EQ(parsed("1T"), 1024LL * 1024 * 1024 * 1024);
}

TEST(ByteSize, FractionsRoundDown) {
  // 7.5 × 2^30 = 8053063680 exactly.
  EXPECT_EQ(parsed("7.5G"), 8053063680LL);
  EXPECT_EQ(parsed("7.5GiB"), 8053063680LL);
  // 0.1 KiB = 102.4 bytes -> 102.
  EXPECT_EQ(parsed("0.1K"), 102);
  EXPECT_EQ(parsed(".5M"), 512LL * 1024);
}

TEST(ByteSize, DecimalUnits) {
  EXPECT_EQ(parsed("8GB"), 8000000000LL);
  EXPECT_EQ(parsed("250MB"), 250000000LL);
  EXPECT_EQ(parsed("3kb"), 3000);
}

TEST(ByteSize, PlainBytes) {
  EXPECT_EQ(parsed("8589934592"), 8589934592LL);
  EXPECT_EQ(parsed("8589934592B"), 8589934592LL);
  EXPECT_EQ(parsed(" 42 "), 42);
  EXPECT_EQ(parsed("0"), 0);
}

TEST(ByteSize, RejectsGarbageWithTheText) {
  for (const char* bad :
       {"", "GiB", "-1G", "8 GiB extra", "8XB", "1.5", "1.2.3G", "99999999999999999999", "5000000000G", "8 G B"}) {
    Result<int64_t> r = parse_byte_size(bad);
    ASSERT_FALSE(r.is_ok()) << "accepted '" << bad << "'";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    std::string quoted = std::string("'").append(bad).append("'");
    EXPECT_NE(r.status().message().find(quoted), std::string::npos) << r.status().message();
  }
}

TEST(ByteSize, Formats) {
  EXPECT_EQ(format_bytes(7LL * 1024 * 1024 * 1024), "7.00 GiB");
  EXPECT_EQ(format_bytes(1536LL * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(format_bytes(512LL * 1024 * 1024), "512.0 MiB");
  EXPECT_EQ(format_bytes(147456), "144.0 KiB");
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(-3LL * 1024 * 1024), "-3.0 MiB");
  EXPECT_EQ(format_mib(1234LL * 1024 * 1024 + 512 * 1024), "1234.5");
}

TEST(ByteSize, Rounding) {
  EXPECT_EQ(round_up(1, 2 * kMiB), 2 * kMiB);
  EXPECT_EQ(round_up(2 * kMiB, 2 * kMiB), 2 * kMiB);
  EXPECT_EQ(round_up(0, 2 * kMiB), 0);
  EXPECT_EQ(round_down(2 * kMiB - 1, 2 * kMiB), 0);
}

}  // namespace
}  // namespace qvl
