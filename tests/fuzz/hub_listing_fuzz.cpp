// libFuzzer target: what `qvl pull` reads from a remote server and the command line. The input's
// first byte picks the parser: the Hub's file listing, a safetensors index, or a glob pattern
// and a path (split at the first '\n'), with URL quoting of the rest. Checks what the cache
// layout relies on: a listed path or shard cannot leave the snapshot directory ('..', '/', '\'),
// blob names and the commit are lowercase hex, a quoted URL part holds only unreserved bytes
// and '%XX', and a pattern without wildcards matches itself.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/download.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool contained(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.find('\\') != std::string::npos) return false;
  return ("/" + p + "/").find("/../") == std::string::npos && ("/" + p + "/").find("/./") == std::string::npos;
}

bool hex(const std::string& s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return !s.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto listing = qvl::parse_hub_listing(text, "fuzz");
      if (!listing.is_ok()) return 0;
      check(hex(listing->commit));
      for (const auto& f : listing->files) {
        check(contained(f.path));
        check(hex(f.blob_name()));
        check(listing->find(f.path) == &f);
      }
      break;
    }
    case 1: {
      auto shards = qvl::index_shards(text, "fuzz");
      if (!shards.is_ok()) return 0;
      check(!shards->empty());
      for (const auto& s : *shards) check(contained(s));
      break;
    }
    default: {
      const size_t nl = text.find('\n');
      const std::string pattern = text.substr(0, nl), path = nl == std::string::npos ? "" : text.substr(nl + 1);
      (void)qvl::glob_match(pattern, path);
      check(qvl::glob_match("*", path));
      if (pattern.find_first_of("*?[") == std::string::npos) check(qvl::glob_match(pattern, pattern));
      for (bool keep_slash : {false, true}) {
        const std::string q = qvl::url_quote(path, keep_slash);
        for (size_t i = 0; i < q.size(); ++i) {
          const char c = q[i];
          const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                             c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
          if (plain) continue;
          check(c == '%' && i + 2 < q.size() && std::isxdigit(static_cast<unsigned char>(q[i + 1])) &&
                std::isxdigit(static_cast<unsigned char>(q[i + 2])));
          i += 2;
        }
      }
    }
  }
  return 0;
}
