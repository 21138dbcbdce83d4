// Fuzz target for the safetensors header parser (io/safetensors.h): any byte string must
// either be rejected with a Status or yield a header whose every tensor lies inside the input
// with a byte length matching its dtype and shape, non-overlapping; and re-serialising an
// accepted header whose tensors sit at element-aligned offsets in the data region must parse
// back to the same entries.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "io/safetensors.h"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qvl;
  std::span<const uint8_t> file(data, size);
  Result<SafetensorsHeader> r = parse_safetensors_header(file, "fuzz");
  if (!r.is_ok()) {
    require(!r.status().message().empty());
    return 0;
  }
  const SafetensorsHeader& h = *r;
  require(h.data_offset == 8 + h.header_bytes && h.data_offset <= size);
  uint64_t prev_end = 0;
  for (const SafetensorsEntry& e : h.tensors) {
    require(e.begin <= e.end && e.end <= size - h.data_offset);
    uint64_t n = 1;
    for (int64_t d : e.shape) {
      require(d >= 0);
      n *= static_cast<uint64_t>(d);
    }
    require(n * static_cast<uint64_t>(dtype_size(e.dtype)) == e.nbytes());
    if (e.end > e.begin) {
      require(e.begin >= prev_end);
      prev_end = e.end;
      // Touch the first and last byte: in bounds under ASan.
      volatile uint8_t first = data[h.data_offset + e.begin], last = data[h.data_offset + e.end - 1];
      (void)first, (void)last;
    }
  }
  // Round trip through the writer, which pads the header so the data region starts 8-byte
  // aligned. A tensor whose element alignment came from an unaligned data region (its offset in
  // the region not a multiple of its element size) moves off alignment there and is rightly
  // refused, so only headers without such tensors must survive the trip.
  for (const SafetensorsEntry& e : h.tensors)
    if (e.end > e.begin && e.begin % static_cast<uint64_t>(dtype_size(e.dtype)) != 0) return 0;
  std::string prefix = build_safetensors_header(h.tensors, h.metadata);
  std::vector<uint8_t> again(prefix.begin(), prefix.end());
  again.insert(again.end(), data + h.data_offset, data + size);
  Result<SafetensorsHeader> r2 = parse_safetensors_header(again, "fuzz-roundtrip");
  require(r2.is_ok());
  require(r2->tensors.size() == h.tensors.size() && r2->metadata == h.metadata);
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const SafetensorsEntry &a = h.tensors[i], &b = r2->tensors[i];
    require(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes());
  }
  return 0;
}
