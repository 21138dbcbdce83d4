#!/usr/bin/env bash
# One command: installs what is needed, builds qvl, runs every test (unit, golden, e2e, GPU
# tests that skip without a GPU), then builds the libFuzzer targets with clang + ASan/UBSan
# and runs each for a bounded time. Prints ctest's summaries.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/fetch_npm.sh
scripts/build.sh
jobs=$(nproc)
status=0
(cd build && ctest --output-on-failure -j"$jobs") || status=1
cmake -S . -B build-fuzz -G Ninja -DQVL_FUZZ_ONLY=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
cmake --build build-fuzz -j"$jobs"
(cd build-fuzz && ctest --output-on-failure -j"$jobs") || status=1
exit $status
