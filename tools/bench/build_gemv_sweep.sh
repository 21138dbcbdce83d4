#!/usr/bin/env bash
# Builds tools/bench/gemv_sweep.cu into build-dev/gemv_sweep against the libraries that
# tools/device/pack.sh left in build-devobj/ (run pack.sh first). sm_90 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
/usr/local/cuda/bin/nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90 -DQVL_HAVE_CUDA=1 -Isrc \
  tools/bench/gemv_sweep.cu build-devobj/libqvl_cuda.a build-devobj/libqvl_lib.a -lcublasLt -Xcompiler -fopenmp \
  -o build-dev/gemv_sweep
strip build-dev/gemv_sweep
ls -la build-dev/gemv_sweep
