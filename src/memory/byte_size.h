// Byte sizes as people write them ("8GiB", "7.5G", "8000MiB", "8589934592") and as qvl prints
// them. Units: a bare number is bytes; K/M/G/T and KiB/MiB/GiB/TiB are binary (powers of 1024),
// KB/MB/GB/TB are decimal (powers of 1000), as nvidia-smi and `free -h` readers expect. Case and
// a space before the unit do not matter; a trailing "B" alone means bytes. Fractions are allowed
// for units ("7.5G") and rounded down to whole bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace qvl {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;

// Parses a byte size; InvalidArgument naming the text when it is malformed, negative or larger
// than 2^62 bytes.
Result<int64_t> parse_byte_size(std::string_view text);

// "6.73 GiB", "512.0 MiB", "12.5 KiB", "100 B" (binary units, 2 decimals above MiB).
std::string format_bytes(int64_t bytes);
// Bytes in MiB with one decimal, no unit: "1234.5". Negative values keep their sign.
std::string format_mib(int64_t bytes);

// Round up / down to a multiple of `granularity` (> 0).
constexpr int64_t round_up(int64_t bytes, int64_t granularity) {
  return (bytes + granularity - 1) / granularity * granularity;
}
constexpr int64_t round_down(int64_t bytes, int64_t granularity) {
  return bytes / granularity * granularity;
}

}  // namespace qvl
