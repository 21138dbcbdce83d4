// The CUDA backend's emulated device profiles (CudaBackendOptions::emulate_*,
// apply_emulated_profile): which profiles a device can run and what the backend then takes the
// device for. The GPU tests run the accepted ones (gpu_model_test.cpp, gpu_linear_test.cpp).
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "cli/emulate_gpu.h"

namespace qvl {
namespace {

// An H200 as cudaGetDeviceProperties describes it (sm_90, 227 KB of opt-in shared memory).
CudaDeviceInfo h200() {
  CudaDeviceInfo d;
  d.name = "NVIDIA H200";
  d.compute_capability = 90;
  d.multiprocessors = 132;
  d.max_smem_per_block = 232448;
  return d;
}

CudaBackendOptions profile(int cc, int smem) {
  CudaBackendOptions o;
  o.emulate_compute_capability = cc;
  o.emulate_smem_per_block = smem;
  return o;
}

TEST(CudaProfile, NoneLeavesTheDeviceAsItIs) {
  CudaDeviceInfo d = h200();
  ASSERT_TRUE(apply_emulated_profile(CudaBackendOptions{}, d).is_ok());
  EXPECT_EQ(d.compute_capability, 90);
  EXPECT_EQ(d.max_smem_per_block, 232448);
  EXPECT_EQ(d.name, "NVIDIA H200");
  EXPECT_FALSE(d.emulated);
}

TEST(CudaProfile, ConsumerGpusOnAnH200) {
  for (const auto& [cc, smem] : {std::pair{120, 101376}, std::pair{89, 101376}, std::pair{86, 101376},
                                 std::pair{80, 166912}, std::pair{100, 232448}}) {
    CudaDeviceInfo d = h200();
    const Status s = apply_emulated_profile(profile(cc, smem), d);
    ASSERT_TRUE(s.is_ok()) << cc << ": " << s.to_string();
    EXPECT_EQ(d.compute_capability, cc);
    EXPECT_EQ(d.max_smem_per_block, smem);
    EXPECT_EQ(d.multiprocessors, 132);
    EXPECT_NE(d.name.find("as sm_" + std::to_string(cc)), std::string::npos) << d.name;
    EXPECT_NE(d.name.find("(emulated)"), std::string::npos) << d.name;
  }
  // A profile over a profile (set_cuda_test_profile's device, then a backend's own): the name
  // says the last one once.
  CudaDeviceInfo twice = h200();
  ASSERT_TRUE(apply_emulated_profile(profile(120, 101376), twice).is_ok());
  ASSERT_TRUE(apply_emulated_profile(profile(120, 65536), twice).is_ok());
  EXPECT_TRUE(twice.emulated);
  EXPECT_EQ(twice.max_smem_per_block, 65536);
  EXPECT_EQ(twice.name, "NVIDIA H200 as sm_120 with 65536 B of shared memory per block (emulated)");
  // Shared memory alone: the device's compute capability stays.
  CudaDeviceInfo d = h200();
  ASSERT_TRUE(apply_emulated_profile(profile(0, 101376), d).is_ok());
  EXPECT_EQ(d.compute_capability, 90);
  EXPECT_EQ(d.max_smem_per_block, 101376);
}

// Each refusal names what the device lacks, and leaves info as it was.
TEST(CudaProfile, RefusesWhatTheDeviceCannotRun) {
  struct Bad {
    CudaDeviceInfo device;
    int cc, smem;
    const char* names;
  };
  CudaDeviceInfo a100 = h200();
  a100.name = "NVIDIA A100";
  a100.compute_capability = 80;
  a100.max_smem_per_block = 166912;
  CudaDeviceInfo b200 = h200();
  b200.compute_capability = 100;
  for (const Bad& b :
       {Bad{h200(), 75, 0, "sm_80 or newer"}, Bad{a100, 120, 0, "need sm_90 or newer"}, Bad{a100, 90, 0, "sm_90 only"},
        Bad{b200, 90, 0, "sm_90 only"}, Bad{h200(), 0, 232449, "which has 232448"},
        Bad{a100, 89, 232448, "which has 166912"}, Bad{h200(), 120, -1, "-1 bytes"}}) {
    CudaDeviceInfo d = b.device;
    const Status s = apply_emulated_profile(profile(b.cc, b.smem), d);
    ASSERT_FALSE(s.is_ok()) << b.cc << " / " << b.smem;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(b.names), std::string::npos) << s.to_string();
    EXPECT_EQ(d.compute_capability, b.device.compute_capability);
    EXPECT_EQ(d.max_smem_per_block, b.device.max_smem_per_block);
    EXPECT_EQ(d.name, b.device.name);
  }
}

// qvl bench / qvl forward --emulate-gpu.
TEST(CudaProfile, EmulateGpuFlag) {
  for (const auto& [spec, cc, smem] :
       {std::tuple{"sm_120", 120, 101376}, std::tuple{"sm_89", 89, 101376}, std::tuple{"sm_86", 86, 101376},
        std::tuple{"sm_80", 80, 166912}, std::tuple{"sm_100", 100, 0}, std::tuple{"sm_120:65536", 120, 65536}}) {
    CudaBackendOptions o;
    ASSERT_TRUE(parse_emulate_gpu(spec, o).is_ok()) << spec;
    EXPECT_EQ(o.emulate_compute_capability, cc) << spec;
    EXPECT_EQ(o.emulate_smem_per_block, smem) << spec;
  }
  for (const char* bad :
       {"", "120", "sm120", "sm_", "sm_1", "sm_1200", "sm_12a", "sm_120:", "sm_120:1k", "sm_120:1234567890"}) {
    CudaBackendOptions o;
    const Status s = parse_emulate_gpu(bad, o);
    EXPECT_FALSE(s.is_ok()) << bad;
    EXPECT_NE(s.message().find("--emulate-gpu"), std::string::npos) << s.to_string();
    EXPECT_EQ(o.emulate_compute_capability, 0) << bad;
  }
}

// emulate_occupancy on an H200 (233,472 B of shared memory per multiprocessor) as an RTX 5060
// (sm_120: 102,400 B, 1,536 threads). Each case's padded block must leave the H200 holding the
// number of blocks the 5060 would, counted here from the two capacities.
TEST(CudaProfile, EmulatedOccupancyPadsToTheEmulatedBlocks) {
  const int h200_sm = 232448 + kReservedSmemPerBlock, rtx = 101376 + kReservedSmemPerBlock;
  EXPECT_EQ(h200_sm, 233472);
  EXPECT_EQ(rtx, 102400);
  EXPECT_EQ(threads_per_sm(120), 1536);
  EXPECT_EQ(threads_per_sm(89), 1536);
  EXPECT_EQ(threads_per_sm(90), 2048);
  EXPECT_EQ(threads_per_sm(80), 2048);
  struct Case {
    size_t smem, static_smem;
    int threads;
    size_t blocks;  // on the 5060: min(102400 / (smem + static + 1024), 1536 / threads)
  };
  // The vision flash block at head dim 64 with Q in its own region (55,296 B) and through the K
  // stages (37,888: the cluster split's partial); a block limited by threads (1024 of them); a
  // small block limited by threads (1536 / 128 = 12 < 102400 / 2048 = 50); static shared memory
  // counted with the dynamic.
  for (const Case& c : {Case{55296, 0, 128, 1}, Case{37888, 0, 128, 2}, Case{0, 0, 1024, 1}, Case{1024, 0, 128, 12},
                        Case{30000, 9500, 256, 2}}) {
    const size_t padded = emulated_occupancy_smem(c.smem, c.static_smem, c.threads, rtx, threads_per_sm(120), h200_sm);
    EXPECT_GE(padded, c.smem);
    EXPECT_EQ(static_cast<size_t>(h200_sm) / (padded + c.static_smem + kReservedSmemPerBlock), c.blocks)
        << c.smem << " B, " << c.threads << " threads";
  }
  // A block the device holds no more of anyway keeps its size; one the emulated device cannot hold: 0.
  EXPECT_EQ(emulated_occupancy_smem(200000, 0, 128, h200_sm, 2048, h200_sm), 200000u);
  EXPECT_EQ(emulated_occupancy_smem(120000, 0, 128, rtx, 1536, h200_sm), 0u);
  // The padding needs a profile to pad to.
  CudaBackendOptions o;
  o.emulate_occupancy = true;
  CudaDeviceInfo d = h200();
  const Status s = apply_emulated_profile(o, d);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("emulate_occupancy"), std::string::npos) << s.to_string();
  o.emulate_compute_capability = 120;
  o.emulate_smem_per_block = 101376;
  EXPECT_TRUE(apply_emulated_profile(o, d).is_ok());
}

}  // namespace
}  // namespace qvl
