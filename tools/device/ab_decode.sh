#!/usr/bin/env bash
# GPU machine: A/B of qvl bench settings on random checkpoints, the settings run in turn ROUNDS
# times (so drift of the machine hits each alike), one line per run and a median per setting.
#   bash tools/device/ab_decode.sh ROUNDS "LABEL|MODEL|BENCH ARGS[|QVL BINARY]" ...
# MODEL: 2b, 2b-fp8, 4b, 4b-fp8, 8b, 8b-fp8 (generated once into /tmp/qvl_models); the binary
# defaults to build-dev/qvl (another one, e.g. an older commit's, compares two builds). Every run is
# `qvl bench --image-size 1024x768 --prompt-tokens 24 --gen-tokens 64 --batch 1,8` (BATCH= in the
# environment replaces 1,8) plus the args;
# the JSON of each run is kept in $OUT/ab/LABEL.ROUND.json. Ablations go in the bench args:
# --skip-kernels text_decode_attention, --decode-attention-exit 6 (timing only: results are wrong);
# with --decode-attention-trace the summary adds the trace's stage medians.
set -u
cd "$(dirname "$0")/../.."
source build-dev/env.sh
source tools/device/common.sh
out=${OUT:-/tmp/qvl_out}/ab
mkdir -p "$out"
run() {  # run SPEC ROUND
  local label m args bin
  IFS='|' read -r label m args bin <<<"$1"
  # shellcheck disable=SC2086
  timeout 180 "${bin:-build-dev/qvl}" bench --model "/tmp/qvl_models/$m" --backend cuda --image-size 1024x768 --prompt-tokens 24 \
    --gen-tokens 64 --batch "${BATCH:-1,8}" $args --out "$out/$label.$2.json" >/dev/null 2>"$out/$label.$2.err" ||
    { echo "$label round $2 failed:"; tail -3 "$out/$label.$2.err"; }
}
ab_rounds "$1" run "${@:2}"
python3 - "$out" "${@:2}" <<'EOF'
import json, statistics, sys, glob, os
out = sys.argv[1]
for spec in sys.argv[2:]:
    label = spec.split('|')[0]
    runs = []
    for f in sorted(glob.glob(os.path.join(out, label + '.*.json'))):
        d = json.load(open(f))
        dec = {x['batch']: x for x in d['decode']}
        b8 = dec[8]['step_ms'] if 8 in dec else float('nan')
        # With --profile: the vision encoder's attention, us per call (eager, one event pair a launch).
        att = [o['us'] / o['calls'] for p in d.get('profile', []) if p['title'].startswith('vision encoder')
               for o in p['ops'] if 'vision_attention' in o['kernels']]
        runs.append((dec[1]['step_ms'], dec[1]['fraction_of_floor'], b8, d['ttft_ms'], d['vision_ms'],
                     att[0] if att else float('nan')))
    if not runs:
        print(f'{label:24s} no runs'); continue
    b1 = [r[0] for r in runs]
    print(f'{label:24s} b1 step ms {" ".join(f"{x:.4f}" for x in b1)} median {statistics.median(b1):.4f} '
          f'floor {statistics.median(r[1] for r in runs):.3f} | b8 {statistics.median(r[2] for r in runs):.4f} '
          f'| ttft {statistics.median(r[3] for r in runs):.2f} | vision {statistics.median(r[4] for r in runs):.2f} '
          f'(attention {statistics.median(r[5] for r in runs):.1f} us a layer)')
    # With --decode-attention-trace: the first run's stage medians (us from the PDL wait), for the
    # median block and for each layer's last block, and the per-cluster merge gaps.
    tr = json.load(open(sorted(glob.glob(os.path.join(out, label + '.*.json')))[0])).get('decode_attention_trace')
    if tr:
        for key in ('stage_us_from_wait_median', 'stage_us_last_block_from_first_wait_median',
                    'cluster_us_median', 'last_cluster_us_median'):
            vals = ' '.join(f'{k} {v:+.2f}' for k, v in tr.get(key, {}).items() if v is not None)
            if vals:
                print(f'  {key}: {vals}')
EOF
