#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace qvl {
namespace {
std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_mutex;
const char* level_tag(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "";
  }
  return "";
}
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

void log_message(LogLevel level, const std::string& message) {
  if (level < g_level.load()) return;
  using namespace std::chrono;
  double t = duration<double>(steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "[qvl %s %.3f] %s\n", level_tag(level), t, message.c_str());
}

}  // namespace qvl
