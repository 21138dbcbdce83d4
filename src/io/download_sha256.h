// SHA-256 (FIPS 180-4), streaming: `qvl pull` hashes every LFS file while it arrives and
// compares the digest with the sha256 the Hub lists for it (which is also the blob's name in the
// cache). Written from the standard; checked against its published test vectors. Plain
// portable C++ at a few hundred MB/s, faster than the downloads it verifies.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace qvl {

class Sha256 {
 public:
  Sha256();
  // Feeds `n` more bytes of the message.
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The digest of everything fed so far; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();
  // finish() as 64 lowercase hex digits.
  std::string finish_hex();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

// The hex digest of `data`.
std::string sha256_hex(std::string_view data);

// Feeds the first `n` bytes of the file at `path` into `hash` (resuming a partial download
// means hashing what is already on disk). Fails when the file is shorter or unreadable.
Status sha256_update_from_file(Sha256& hash, const std::string& path, uint64_t n);

}  // namespace qvl
