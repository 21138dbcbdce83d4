#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace qvl {
namespace {

using json = nlohmann::json;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Reads a JSON integer that must fit in [0, max]; false otherwise.
bool read_unsigned(const json& v, uint64_t max, uint64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    if (x > max) return false;
    *out = x;
    return true;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0 || static_cast<uint64_t>(x) > max) return false;
    *out = static_cast<uint64_t>(x);
    return true;
  }
  return false;
}

Status parse_entry(const std::string& file_name, const std::string& name, const json& v, SafetensorsEntry* e) {
  auto bad = [&](const std::string& what) { return data_loss(file_name + ": tensor '" + name + "': " + what); };
  if (!v.is_object()) return bad("header entry is not a JSON object");
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return bad("missing or non-string \"dtype\"");
  auto dtype = dtype_from_name(dt->get_ref<const std::string&>());
  if (!dtype)
    return bad("unsupported dtype \"" + dt->get<std::string>() +
               "\" (qvl reads F32, F16, BF16, F8_E4M3, I64, I32, U8, BOOL)");
  e->name = name;
  e->dtype = *dtype;

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) return bad("missing or non-array \"shape\"");
  if (sh->size() > static_cast<size_t>(kMaxSafetensorsDims))
    return bad("shape has " + std::to_string(sh->size()) + " dims (at most " + std::to_string(kMaxSafetensorsDims) +
               " supported)");
  e->shape.clear();
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : *sh) {
    uint64_t dim = 0;
    if (!read_unsigned(d, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), &dim))
      return bad("shape entry " + d.dump() + " is not a non-negative integer");
    e->shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, dim, &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e->dtype)), &nbytes) ||
      nbytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return bad("shape " + shape_string(e->shape) + " overflows 64-bit byte counts");

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2)
    return bad("\"data_offsets\" must be an array of two integers");
  if (!read_unsigned((*off)[0], std::numeric_limits<uint64_t>::max(), &e->begin) ||
      !read_unsigned((*off)[1], std::numeric_limits<uint64_t>::max(), &e->end))
    return bad("\"data_offsets\" " + off->dump() + " are not non-negative integers");
  if (e->begin > e->end)
    return bad("data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) + "] end before they begin");
  if (e->end - e->begin != nbytes)
    return bad(describe_dtype_shape(e->dtype, e->shape) + " needs " + std::to_string(nbytes) +
               " bytes but data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) + "] span " +
               std::to_string(e->end - e->begin));
  return Status::ok();
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsEntry::describe() const {
  return describe_dtype_shape(dtype, shape);
}

std::string describe_dtype_shape(DType dtype, const std::vector<int64_t>& shape) {
  return std::string(dtype_name(dtype)) + " " + shape_string(shape);
}

Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> file, const std::string& file_name) {
  if (file.size() < 8)
    return data_loss(file_name + ": " + std::to_string(file.size()) +
                     " bytes is too short for a safetensors file (needs an 8-byte header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[i];  // little-endian
  if (n > kMaxSafetensorsHeaderBytes)
    return data_loss(file_name + ": header length " + std::to_string(n) + " exceeds the " +
                     std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit (corrupt length field?)");
  if (n > file.size() - 8)
    return data_loss(file_name + ": header length " + std::to_string(n) + " runs past the end of the " +
                     std::to_string(file.size()) + "-byte file (truncated or corrupt)");
  const char* begin = reinterpret_cast<const char*>(file.data() + 8);
  json root = json::parse(begin, begin + n, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return data_loss(file_name + ": header is not valid JSON");
  if (!root.is_object()) return data_loss(file_name + ": header is not a JSON object");

  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_offset = 8 + n;
  const uint64_t data_len = file.size() - h.data_offset;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return data_loss(file_name + ": \"__metadata__\" is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return data_loss(file_name + ": \"__metadata__\" value for \"" + m.key() + "\" is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    QVL_RETURN_IF_ERROR(parse_entry(file_name, it.key(), it.value(), &e));
    if (e.end > data_len)
      return data_loss(file_name + ": tensor '" + e.name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                       std::to_string(e.end) + "] run past the " + std::to_string(data_len) +
                       "-byte data region (file truncated?)");
    if (e.end > e.begin && (h.data_offset + e.begin) % static_cast<uint64_t>(dtype_size(e.dtype)) != 0)
      return data_loss(file_name + ": tensor '" + e.name + "': data at file offset " +
                       std::to_string(h.data_offset + e.begin) + " is not aligned to its " +
                       std::to_string(dtype_size(e.dtype)) + "-byte elements");
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Empty tensors occupy no bytes and can share an offset with anything.
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : h.tensors) {
    if (e.begin == e.end) continue;
    if (prev && prev->end > e.begin)
      return data_loss(file_name + ": tensors '" + prev->name + "' [" + std::to_string(prev->begin) + ", " +
                       std::to_string(prev->end) + ") and '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                       std::to_string(e.end) + ") overlap");
    prev = &e;
  }
  return h;
}

SafetensorsFile::SafetensorsFile(std::shared_ptr<MappedFile> mapping, SafetensorsHeader header)
    : mapping_(std::move(mapping)), header_(std::move(header)) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  QVL_ASSIGN_OR_RETURN(auto mapping, MappedFile::open(path));
  QVL_ASSIGN_OR_RETURN(auto header, parse_safetensors_header(mapping->bytes(), path));
  return SafetensorsFile(std::move(mapping), std::move(header));
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const uint8_t* SafetensorsFile::data(const SafetensorsEntry& entry) const {
  return mapping_->data() + header_.data_offset + entry.begin;
}

Tensor SafetensorsFile::view(const SafetensorsEntry& entry) const {
  QVL_CHECK_LE(entry.shape.size(), static_cast<size_t>(kMaxDims)) << entry.name;
  Tensor t;
  t.data = const_cast<uint8_t*>(data(entry));  // read-only map; Tensor has no const flavour
  t.dtype = entry.dtype;
  t.ndim = static_cast<int>(entry.shape.size());
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = entry.shape[i];
  return t;
}

std::string build_safetensors_header(const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata) {
  std::string j = "{";
  bool first = true;
  if (!metadata.empty()) {
    j += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (it != metadata.begin()) j += ",";
      j += json(it->first).dump() + ":" + json(it->second).dump();
    }
    j += "}";
    first = false;
  }
  for (const auto& e : entries) {
    if (!first) j += ",";
    first = false;
    j += json(e.name).dump() + ":{\"dtype\":\"" + std::string(dtype_name(e.dtype)) + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) j += ',';
      j += std::to_string(e.shape[i]);
    }
    j += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  j += "}";
  // Pad so the data region (8 + N) starts 8-byte aligned, as the reference writer does.
  while ((8 + j.size()) % 8 != 0) j += ' ';
  std::string out(8, '\0');
  uint64_t n = j.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + j;
}

}  // namespace qvl
