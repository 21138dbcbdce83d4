#!/usr/bin/env bash
# One GPU-machine call for the CUDA performance work: unpacks a build (a tar.xz of build-dev/
# made by tools/device/stage_perf.sh), then runs the steps named on the command line, each
# logging to $OUT/<step>.log (at most 8 files come back):
#   sweep     build-dev/gemv_sweep: decode-Linear kernel configurations and bandwidth ceilings
#   prof-2b   qvl bench --profile on a random 2B BF16 checkpoint, batch 1,8,32
#   prof-fp8  the same on 2B FP8 and 4B FP8
#   gputests  build-dev/qvl_gpu_tests
#   usage: bash perf_call.sh DIR_WITH_TARBALL STEP...
set -u
stage=$1
shift
out=${OUT:-/tmp/qvl_out}
mkdir -p "$out" /tmp/qvl_models
cd "$(dirname "$0")/.."  # the repository root ($stage is carried inside it)
rm -rf build-dev
tar xJf "$stage/build-dev.tar.xz" 2>/dev/null ||
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(filter="fully_trusted")' "$stage/build-dev.tar.xz" ||
  { echo "perf_call: cannot unpack"; exit 1; }
source build-dev/env.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
echo "build: $(cat build-dev/COMMIT)"

model() {  # model NAME ARGS...: a random checkpoint in /tmp/qvl_models/NAME
  local name=$1
  shift
  [ -d "/tmp/qvl_models/$name" ] || build-dev/qvl gen-model "$@" --seed 1 --out "/tmp/qvl_models/$name" >/dev/null
}
bench() {  # bench LOG NAME ARGS...
  local log=$1 name=$2
  shift 2
  echo "--- bench $name $*" >>"$log"
  timeout 120 build-dev/qvl bench --model "/tmp/qvl_models/$name" --backend cuda --image-size 1024x768 \
    --prompt-tokens 24 --gen-tokens 64 "$@" >>"$log" 2>&1
  echo "rc=$?" >>"$log"
}

for s in "$@"; do
  t0=$(date +%s)
  log="$out/$s.log"
  case "$s" in
    sweep) timeout 240 build-dev/gemv_sweep >"$log" 2>&1 ;;
    prof-2b)
      model 2b --preset 2b
      bench "$log" 2b --batch 1,8,32 --profile
      ;;
    prof-fp8)
      model 2b-fp8 --preset 2b --fp8
      model 4b-fp8 --preset 4b --fp8
      bench "$log" 2b-fp8 --batch 1,8,32 --profile
      bench "$log" 4b-fp8 --batch 1,8,32 --profile
      ;;
    gputests) timeout 300 build-dev/qvl_gpu_tests >"$log" 2>&1 ;;
    *) echo "perf_call: unknown step $s" ;;
  esac
  echo "=== $s: rc=$? in $(($(date +%s) - t0)) s"
done
# Summaries last (the reply carries the end of the output; the logs come back whole).
for f in "$out"/prof-*.log; do
  [ -f "$f" ] || continue
  echo "##### $f"
  grep -E '^--- bench|^rc=|"(step_ms|fraction_of_floor|vision_ms|ttft_ms|prefill_ms)"|^== profile' "$f" | head -80
done
[ -f "$out/sweep.log" ] && grep -E "ceiling" "$out/sweep.log"
[ -f "$out/gputests.log" ] && grep -E "checks|FAIL" "$out/gputests.log" | tail -15
ls -la "$out"
