#!/usr/bin/env bash
# GPU machine: the wall time of a one-shot `qvl run` (a greedy 32-token caption of
# assets/example.jpg) for build-old/qvl and build-dev/qvl, alternating, 3 rounds, on random 2B BF16
# and 4B FP8 checkpoints; the new build's load phases (--log-level debug); then every GPU test.
# Expects in .dev-perf/ (ignored by git): build-new.tar.xz (tools/device/pack.sh's build-dev/),
# build-old.tar.xz (an earlier qvl as build-old/) and tok/ (tokenizer.json.xz,
# tokenizer_config.json).
#   bash tools/device/oneshot.sh
set -u
cd "$(dirname "$0")/../.."
tar xJf .dev-perf/build-new.tar.xz && tar xJf .dev-perf/build-old.tar.xz
source build-dev/env.sh
echo "new $(cat build-dev/COMMIT) old $(cat build-old/COMMIT)"
mkdir -p /tmp/tok && xz -dc .dev-perf/tok/tokenizer.json.xz > /tmp/tok/tokenizer.json && cp .dev-perf/tok/tokenizer_config.json /tmp/tok/
for m in 2b 4b-fp8; do
  build-dev/qvl gen-model --preset ${m%-fp8} $([[ $m == *-fp8 ]] && echo --fp8) --seed 1 --tokenizer-dir /tmp/tok --out /tmp/m_$m >/dev/null || exit 1
  for r in 1 2 3; do for b in old dev; do
    t0=$(date +%s%N)
    build-$b/qvl --log-level debug run --model /tmp/m_$m --image assets/example.jpg --task caption --max-tokens 32 --temperature 0 --json > /tmp/o.json 2> /tmp/o_$b.err || tail -3 /tmp/o_$b.err
    t1=$(date +%s%N)
    echo "$m $b round $r: wall $(( (t1 - t0) / 1000000 )) ms, ttft $(python3 -c "import json; print(round(json.load(open('/tmp/o.json'))['timings']['ttft_ms'],1))") ms"
  done; done
  echo "-- $m phases (new, last run):"; grep -E "run:|load:" /tmp/o_dev.err
done
timeout 300 build-dev/qvl_gpu_tests > /tmp/gpu.txt 2>&1; echo "gpu tests rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|checks|StagedWeight" /tmp/gpu.txt | tail -6
