#!/usr/bin/env bash
# GPU machine: the layer-offload and 8 GB acceptance runs of issue 8, each step packed into
# $OUT/<step>.tar.gz as soon as it ends (a later timeout loses nothing).
#   bash tools/device/offload.sh STEP...
# Steps:
#   gputests : qvl_gpu_tests, offload (bit-identical logits with/without, eager and graphs, BF16
#              and FP8; decode step times) plus the model and graph tests it builds on
#   memory   : tools/bench/plan_vs_measured.py, one case per model to confirm the plan's weight
#              allocation model and the measured sm_90 row, 8B BF16 refused on 8 GiB, `qvl serve`
#              4B-FP8 on a simulated 8 GB card (+ transformers in the same condition), 8B BF16 on
#              8 GiB with --auto-fit and 4B BF16 on 6 GiB with offloaded layers (decode tok/s)
#   offload  : only the --offload runs of `memory` (8B BF16 8 GiB --auto-fit, 4B BF16 6 GiB)
#   bench    : qvl bench 4B BF16 with 22 offloaded layers, decode batches 1 and 8 (recorded graphs)
#   grid     : the full 24-case plan-vs-measured grid (2B/4B x BF16/FP8 x 2k/8k x 0.5/1/2 MP)
set -u
cd "$(dirname "$0")/../.."
source build-dev/env.sh
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/qvl_out}
work=/tmp/qvl_offload
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv,noheader
cat build-dev/COMMIT 2>/dev/null

step() {  # step NAME SECONDS command...
  local name=$1 secs=$2; shift 2
  local dir="$work/$name"; mkdir -p "$dir"
  local t0=$(date +%s)
  timeout "$secs" "$@" >"$dir/log.txt" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 )) s"
  grep -vE "Loading weights|it/s\]|^\[qvl (info|debug)" "$dir/log.txt" | tail -n 30
  tar czf "$out/$name.tar.gz" -C "$work" "$name"
}

for s in "$@"; do
  d="$work/$s"
  case "$s" in
    gputests) step gputests 120 build-dev/qvl_gpu_tests --gtest_filter='GpuOffload*:GpuModel*:GpuGraphs*' ;;
    memory) step memory 280 python3 tools/bench/plan_vs_measured.py --out "$d" --presets 2b,4b,4b-fp8 \
              --contexts 2048 --megapixels 1 --refusal --serve-8gb --offload ;;
    offload) step offload 240 python3 tools/bench/plan_vs_measured.py --out "$d" --presets "" --megapixels 1 --offload ;;
    bench) build-dev/qvl gen-model --preset 4b --seed 1 --out "$work/4b-bench" >/dev/null 2>&1
           step bench 120 build-dev/qvl bench "$work/4b-bench" --offload-layers 22 --batch 1,8 --gen-tokens 16 \
             --repeat 2 --out "$d/bench_4b_offload22.json"
           rm -rf "$work/4b-bench" ;;
    grid) step grid 540 python3 tools/bench/plan_vs_measured.py --out "$d" ;;
    *) echo "offload.sh: unknown step $s" ;;
  esac
done
ls -la "$out"
