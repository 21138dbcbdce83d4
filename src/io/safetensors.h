// safetensors: the checkpoint file format (8-byte little-endian header length N, N bytes of
// JSON, then the raw tensor data). This module validates a header completely before anything
// reads tensor bytes, so every later view is in bounds:
//   - the length field is present, N <= kMaxSafetensorsHeaderBytes and N <= file size - 8;
//   - the header is a JSON object; "__metadata__" (string -> string) is allowed;
//   - every tensor has a dtype qvl knows (core/dtype.h), 0..kMaxSafetensorsDims non-negative
//     dims, data_offsets [begin, end] with begin <= end inside the data region,
//     numel x element size == end - begin (computed without overflow), a begin aligned to the
//     element size for non-empty tensors (so typed loads through a view are aligned), and no
//     two tensors overlap.
// Every error names the file and, where there is one, the tensor.
//
// SafetensorsFile maps a file read-only (core/mmap.h) and hands out views into the map; the
// views stay valid as long as the SafetensorsFile (or a copy of mapping()) is alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"
#include "core/status.h"
#include "core/tensor.h"

namespace qvl {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;  // 100 MiB, as the reference reader
inline constexpr int kMaxSafetensorsDims = 8;

// One tensor as the header describes it. Offsets are relative to the start of the data
// region (byte 8 + N of the file).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  // "BF16 [128, 64]"
  std::string describe() const;
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;              // N
  uint64_t data_offset = 0;               // 8 + N: where the data region starts in the file
  std::vector<SafetensorsEntry> tensors;  // in data-offset order
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a whole safetensors file held in memory. `file_name`
// only labels error messages. Never reads past `file`, never throws.
Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> file,
                                                   const std::string& file_name = "<memory>");

// "BF16 [2, 3]"-style description of a dtype and shape.
std::string describe_dtype_shape(DType dtype, const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Maps `path` and validates its header.
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return mapping_->path(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
  // The entry named `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  // Pointer to the first byte of `entry`'s data inside the map.
  const uint8_t* data(const SafetensorsEntry& entry) const;
  // A host view of an entry with at most kMaxDims dims (a check: callers test ndim first).
  Tensor view(const SafetensorsEntry& entry) const;
  const std::shared_ptr<MappedFile>& mapping() const { return mapping_; }

 private:
  SafetensorsFile(std::shared_ptr<MappedFile> mapping, SafetensorsHeader header);
  std::shared_ptr<MappedFile> mapping_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
};

// Serialises a header for the given entries (offsets already assigned, data-region
// relative), padded with spaces so the data region starts at a multiple of 8 bytes. Returns
// the 8-byte length prefix followed by the JSON. Used by gen-model and by tests.
std::string build_safetensors_header(const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata);

}  // namespace qvl
