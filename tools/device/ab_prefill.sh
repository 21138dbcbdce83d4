#!/usr/bin/env bash
# GPU machine: A/B of qvl bench settings on the time to first token, the settings run in turn
# ROUNDS times, with the eager profile (--profile) for the attentions' per-layer times:
#   bash tools/device/ab_prefill.sh ROUNDS "LABEL|MODEL|PROMPT TOKENS|BENCH ARGS" ...
# MODEL: 2b, 2b-fp8, 4b, 4b-fp8, 8b, 8b-fp8 (generated once into /tmp/qvl_models). Every run is
# `qvl bench --image-size 1024x768 --prompt-tokens N --gen-tokens 4 --batch 1 --repeat 1 --profile`
# (IMAGE= in the environment replaces 1024x768) plus the args (e.g. --kv-dtype fp8 --emulate-gpu
# sm_120 --emulate-occupancy); the JSON of each run is kept in $OUT/abp/LABEL.ROUND.json. One
# line per setting: medians of TTFT, vision, and the vision and prefill attentions' microseconds
# per layer (from the TTFT profile).
set -u
cd "$(dirname "$0")/../.."
source build-dev/env.sh
source tools/device/common.sh
out=${OUT:-/tmp/qvl_out}/abp
mkdir -p "$out"
run() {  # run SPEC ROUND
  local label m p args
  IFS='|' read -r label m p args <<<"$1"
  # shellcheck disable=SC2086
  timeout 300 build-dev/qvl bench --model "/tmp/qvl_models/$m" --backend cuda --image-size "${IMAGE:-1024x768}" \
    --prompt-tokens "$p" --gen-tokens 4 --batch 1 --repeat 1 --profile $args --out "$out/$label.$2.json" >/dev/null \
    2>"$out/$label.$2.err" || { echo "$label round $2 failed:"; tail -3 "$out/$label.$2.err"; }
}
ab_rounds "$1" run "${@:2}"
python3 - "$out" "${@:2}" <<'PY'
import json, statistics, sys, glob, os
out = sys.argv[1]
def per_layer(d, name):
    for p in d.get('profile', []):
        if p['title'].startswith('TTFT'):
            for o in p['ops']:
                if name in o['kernels']:
                    return o['us'] / o['calls']
    return float('nan')
for spec in sys.argv[2:]:
    label = spec.split('|')[0]
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, label + '.*.json')))]
    if not runs:
        print(f'{label:28s} no runs'); continue
    med = lambda xs: statistics.median(xs)
    print(f'{label:28s} ttft {" ".join("%.2f" % d["ttft_ms"] for d in runs)} median {med([d["ttft_ms"] for d in runs]):.2f} '
          f'| vision {med([d["vision_ms"] for d in runs]):.2f} | us a layer: vision attention '
          f'{med([per_layer(d, "vision_attention") for d in runs]):.1f}, prefill attention '
          f'{med([per_layer(d, "text_prefill_attention") for d in runs]):.1f}')
PY
