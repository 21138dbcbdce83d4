#!/usr/bin/env bash
# GPU machine: A/B of time to first token between two builds, alternating, 3 rounds, medians:
#   bash tools/device/ab_ttft.sh MODEL...   (MODEL: 2b, 2b-fp8, 4b, 4b-fp8, 8b, 8b-fp8)
# build-base/qvl is the old binary, build-dev/qvl the new one (tools/device/pack.sh); each run is
# `qvl bench --image-size 1024x768 --prompt-tokens 24 --gen-tokens 16 --batch 1`.
set -u
cd "$(dirname "$0")/../.."
source build-dev/env.sh
out=${OUT:-/tmp/out}
mkdir -p /tmp/m "$out"
for m in "$@"; do
  [ -d /tmp/m/$m ] || build-dev/qvl gen-model --preset ${m%-fp8} $([[ $m == *-fp8 ]] && echo --fp8) --seed 1 --out /tmp/m/$m >/dev/null 2>&1
done
for r in 1 2 3; do
  for m in "$@"; do
    for b in base dev; do
      bin=build-$b/qvl
      timeout 120 $bin bench --model /tmp/m/$m --backend cuda --image-size 1024x768 --prompt-tokens 24 --gen-tokens 16 --batch 1 --out /tmp/ab_$m.$b.$r.json >/dev/null 2>/tmp/ab_$m.$b.$r.err || tail -3 /tmp/ab_$m.$b.$r.err
    done
  done
done
python3 - "$@" <<'PY'
import json, sys, statistics
for m in sys.argv[1:]:
    for b in ('base', 'dev'):
        rs = [json.load(open(f'/tmp/ab_{m}.{b}.{r}.json')) for r in (1, 2, 3)]
        t = [x['ttft_ms'] for x in rs]; p = [x['prefill_ms'] for x in rs]; v = [x['vision_ms'] for x in rs]
        mem = rs[0].get('memory', {})
        print(f"{m:8s} {b:4s} ttft {' '.join(f'{x:.2f}' for x in t)} median {statistics.median(t):.2f} | prefill median {statistics.median(p):.2f} | vision {statistics.median(v):.2f} | peak {mem.get('peak_allocated_bytes')}")
PY
