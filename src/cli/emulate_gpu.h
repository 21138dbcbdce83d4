// `--emulate-gpu sm_NN[:BYTES]` (qvl bench, qvl forward: testing only): a consumer GPU's profile
// for CudaBackendOptions::emulate_* (cuda_backend.h).
#pragma once

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/status.h"

namespace qvl {

// `qvl bench` / `qvl forward --emulate-gpu sm_NN[:BYTES]` into o's emulate_* fields. Without
// BYTES, the opt-in shared memory per block of that generation's consumer cards (sm_86 / 89 /
// 120: 99 KB) or of an A100 (sm_80: 163 KB); elsewhere the device's own.
inline Status parse_emulate_gpu(const std::string& spec, CudaBackendOptions& o) {
  const size_t colon = spec.find(':');
  const std::string sm = spec.substr(0, colon);
  if (sm.size() < 5 || sm.size() > 6 || sm.rfind("sm_", 0) != 0 ||
      sm.find_first_not_of("0123456789", 3) != std::string::npos)
    return invalid_argument("--emulate-gpu " + spec + ": expected sm_NN[:BYTES], e.g. sm_120 or sm_89:101376");
  const int cc = std::stoi(sm.substr(3));
  int smem = cc == 80 ? 166912 : cc == 86 || cc == 89 || cc == 120 ? 101376 : 0;
  if (colon != std::string::npos) {
    const std::string b = spec.substr(colon + 1);
    if (b.empty() || b.size() > 9 || b.find_first_not_of("0123456789") != std::string::npos)
      return invalid_argument("--emulate-gpu " + spec + ": BYTES must be a number of bytes");
    smem = std::stoi(b);
  }
  o.emulate_compute_capability = cc;
  o.emulate_smem_per_block = smem;
  return Status::ok();
}

}  // namespace qvl
