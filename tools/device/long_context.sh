#!/usr/bin/env bash
# GPU machine: decode at long contexts (bench/RESULTS.md run 44, item 1; the FP8 KV cache: run
# 45). For each preset and KV cache dtype, one `qvl bench` run per prompt length (one 1024x768
# image, then N text tokens; 64 timed steps at batch 1 and 8), its JSON in DIR and one line per
# run: TTFT, prefill rate, and each batch's step, tokens/s and fraction of the floor (which counts
# the KV cache read per token).
#   bash tools/device/long_context.sh DIR [PRESETS (2b,4b-fp8)] [PROMPT TOKENS (4000,16000)]
#     [KV DTYPES (bf16; bf16,fp8 for both)]
# (a relative DIR is taken from the repository root).
set -u
cd "$(dirname "$0")/../.." || exit 1
source build-dev/env.sh
dir=${1:?usage: long_context.sh DIR [PRESETS] [PROMPT TOKENS] [KV DTYPES]}
presets=${2:-2b,4b-fp8}
lengths=${3:-4000,16000}
kvs=${4:-bf16}
source tools/device/common.sh
mkdir -p "$dir"
for m in ${presets//,/ }; do
  qvl_model "$m"
  for kv in ${kvs//,/ }; do
    for p in ${lengths//,/ }; do
      run="$dir/$m.$p.kv-$kv"
      timeout 180 build-dev/qvl bench --model "/tmp/qvl_models/$m" --backend cuda --image-size 1024x768 \
        --prompt-tokens "$p" --gen-tokens 64 --batch 1,8 --repeat 1 --kv-dtype "$kv" --out "$run.json" >/dev/null \
        2>"$run.err" || { echo "$m $p $kv failed:"; tail -3 "$run.err"; continue; }
      python3 - "$run.json" "$m" "$p" "$kv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
runs = ' | '.join('b%d %.4f ms %.0f tok/s %.1f%% of floor (context %.0f)' % (
    x['batch'], x['step_ms'], x['tokens_per_s'], 100 * x['fraction_of_floor'], x['avg_context']) for x in d['decode'])
print('%s, %s prompt tokens, %s KV cache: TTFT %.2f ms, prefill %.0f tok/s | %s' % (
    sys.argv[2], sys.argv[3], sys.argv[4], d['ttft_ms'], d['prefill_tokens_per_s'], runs))
PY
    done
  done
done
