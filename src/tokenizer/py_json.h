// JSON serialisation byte-identical to Python's `json.dumps(x, ensure_ascii=False)`, which is
// what transformers' chat-template `tojson` filter produces: keys in insertion order, ", " and
// ": " separators, non-ASCII kept raw, only `"`, `\` and control characters escaped, floats
// in Python's repr form (shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf" → Infinity).
// Used for tool definitions and tool-call arguments given as objects.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace qvl {

std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace qvl
