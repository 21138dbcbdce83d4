#!/usr/bin/env bash
# GPU machine: candidate sampling (Backend::top_k_rows, Sampler::sample_candidates) checked and
# timed against the build before it, in one call. Expects, carried in .dev-perf/ (ignored by
# git): build-new.tar.xz (tools/device/pack.sh output of this commit, as build-dev/),
# build-old.tar.xz (the earlier build, its qvl only, as build-old/), tok/ (tokenizer.json.xz and
# tokenizer_config.json).
#   bash tools/device/sampled.sh [PRESET [quick]]
# PRESET: 2b (default), 2b-fp8, 4b, 4b-fp8 (qvl gen-model --preset, --fp8); "quick" skips the GPU
# tests (a second model in another call).
# Writes into $OUT: gpu_focus.txt (the top-k, argmax and engine GPU tests), bench_PRESET.json (qvl
# bench, new build: tokens_per_s_sampled beside tokens_per_s_sampled_rows), serve_old.json /
# serve_new.json (tools/bench/serve_load.py, 1 and 32 streams, Qwen's sampling), run_ids.txt
# (qvl run with a seed, sampled and penalised, token ids of both builds), gpu_all.txt (every GPU
# test), log.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/qvl_out}
mkdir -p "$out" /tmp/tok
exec > >(tee -a "$out/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
tar xJf .dev-perf/build-new.tar.xz && tar xJf .dev-perf/build-old.tar.xz || exit 1
xz -dc .dev-perf/tok/tokenizer.json.xz > /tmp/tok/tokenizer.json && cp .dev-perf/tok/tokenizer_config.json /tmp/tok/
source build-dev/env.sh
echo "new $(cat build-dev/COMMIT), old $(cat build-old/COMMIT)"

preset=${1:-2b}
quick=${2:-}
if [ -z "$quick" ]; then
  stamp "GPU tests: top-k, argmax, engine"
  timeout 240 build-dev/qvl_gpu_tests --gtest_filter='GpuTopK*:GpuArgmax*:GpuEngine*' > "$out/gpu_focus.txt" 2>&1
  echo "rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|checks" "$out/gpu_focus.txt" | tail -8
fi

stamp "gen-model $preset"
fp8=$([[ $preset == *-fp8 ]] && echo --fp8)
# shellcheck disable=SC2086
timeout 120 build-dev/qvl gen-model --preset "${preset%-fp8}" $fp8 --seed 1 --tokenizer-dir /tmp/tok --out /tmp/qvl_model \
  > /dev/null || exit 1

stamp "qvl bench $preset (new)"
timeout 200 build-dev/qvl bench --model /tmp/qvl_model --image-size 1024x768 --prompt-tokens 24 --gen-tokens 64 \
  --batch 1,8,32 --repeat 3 --out "$out/bench_$preset.json" > /dev/null 2> /tmp/bench.err || tail -5 /tmp/bench.err
python3 - "$out/bench_$preset.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for x in d["decode"]:
    print(f"b{x['batch']}: graph {x['step_ms']:.3f} ms, host argmax {x['step_ms_host_argmax']:.3f}, "
          f"sampled keys {x['step_ms_sampled']:.3f} ({x['tokens_per_s_sampled']:.0f} tok/s), "
          f"sampled rows {x['step_ms_sampled_rows']:.3f} ({x['tokens_per_s_sampled_rows']:.0f} tok/s), "
          f"whole rows {x['sampled_whole_rows']}")
EOF

prompt="Describe a busy street scene in detail, with the people, the cars and the shops."
: > "$out/run_ids.txt"
for args in "--temperature 0.7 --top-k 20 --top-p 0.8 --seed 5" \
            "--temperature 0.7 --top-k 20 --top-p 0.8 --seed 6 --repetition-penalty 1.3 --presence-penalty 1.5"; do
  for b in build-old build-dev; do
    stamp "qvl run $b $args"
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="$PWD/$b/lib:$LD_LIBRARY_PATH" timeout 120 $b/qvl run --model /tmp/qvl_model --prompt "$prompt" \
      --max-tokens 200 --ignore-eos $args --json > /tmp/run.json 2> /tmp/run.err || tail -3 /tmp/run.err
    python3 -c "import json,sys; d=json.load(open('/tmp/run.json')); print('$b', '$args', 'decode tok/s', round(d['timings']['decode_tokens_per_s'],1), 'ids', ' '.join(map(str, d['token_ids'])))" >> "$out/run_ids.txt"
  done
done
python3 - "$out/run_ids.txt" <<'EOF'
import sys
lines = [l.split(" ids ") for l in open(sys.argv[1]).read().splitlines()]
for i in range(0, len(lines) - 1, 2):
    print(lines[i][0], "|", lines[i + 1][0].split(" decode ")[1], "| same ids:", lines[i][1] == lines[i + 1][1])
EOF

for b in build-old build-dev; do
  stamp "serve_load $b"
  name=$([ "$b" = build-dev ] && echo new || echo old)
  LD_LIBRARY_PATH="$PWD/$b/lib:$LD_LIBRARY_PATH" timeout 150 python3 tools/bench/serve_load.py --qvl "$b/qvl" \
    --model /tmp/qvl_model --label "$name" --out "$out/serve_$name.json" --streams 1,32 --max-tokens 256 --rounds 2
done
python3 - "$out/serve_old.json" "$out/serve_new.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for n in a["streams"]:
    x, y = a["streams"][n], b["streams"][n]
    print(f"streams {n}: old {x['tokens_per_s']:.1f} tok/s, new {y['tokens_per_s']:.1f} ({y['tokens_per_s'] / x['tokens_per_s']:.2f}x)"
          + (f", same text: {x['first_text'] == y['first_text']}" if n == "1" else ""))
EOF

if [ -z "$quick" ]; then
  stamp "GPU tests: all"
  timeout 300 build-dev/qvl_gpu_tests > "$out/gpu_all.txt" 2>&1
  echo "rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|checks" "$out/gpu_all.txt" | tail -8
fi
stamp "done"
