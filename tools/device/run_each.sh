#!/usr/bin/env bash
# GPU machine: `qvl run --each` against one `qvl run` per image, 8 images (assets/example.jpg and
# JPEG fixtures up to 12 MP), a greedy 64-token caption each, on a random checkpoint:
#   bash tools/device/run_each.sh [PRESET [fp8]]      (PRESET: 2b, 4b, 8b; default 2b)
# Expects in .dev-perf/ (ignored by git): build-new.tar.xz (tools/device/pack.sh's build-dev/)
# and tok/ (tokenizer.json.xz, tokenizer_config.json). Prints the wall time of the 8 single runs
# and of --each at --parallel 1, 4 and 8, the single runs' TTFT and decode rates, and how many
# answers of each batch have the single runs' tokens.
set -u
cd "$(dirname "$0")/../.."
tar xJf .dev-perf/build-new.tar.xz
source build-dev/env.sh
cat build-dev/COMMIT
mkdir -p /tmp/tok && xz -dc .dev-perf/tok/tokenizer.json.xz > /tmp/tok/tokenizer.json && cp .dev-perf/tok/tokenizer_config.json /tmp/tok/
build-dev/qvl gen-model --preset ${1:-2b} $([ "${2:-}" = fp8 ] && echo --fp8) --seed 1 --tokenizer-dir /tmp/tok --out /tmp/m >/dev/null || exit 1
f=tests/fixtures/images
imgs=(assets/example.jpg $f/j01_rgb_420_q85.jpg $f/j02_rgb_444_q95.jpg $f/j03_rgb_422_q80.jpg $f/j04_progressive.jpg $f/j09_12mp.jpg $f/j13_exif_orientation6.jpg $f/j15_exact_512x384.jpg)
args=(--model /tmp/m --task caption --max-tokens 64 --ignore-eos --temperature 0 --context 4096 --json)
t0=$(date +%s%N)
for i in "${imgs[@]}"; do build-dev/qvl run "${args[@]}" --image "$i" > /tmp/one_$(basename $i).json 2>/dev/null; done
t1=$(date +%s%N)
echo "8 x qvl run: $(( (t1 - t0) / 1000000 )) ms"
for p in 1 4 8; do
  t0=$(date +%s%N)
  build-dev/qvl run "${args[@]}" --each --parallel $p $(printf -- '--image %s ' "${imgs[@]}") > /tmp/each_$p.jsonl 2>/tmp/each_$p.err || tail -2 /tmp/each_$p.err
  t1=$(date +%s%N)
  echo "qvl run --each --parallel $p: $(( (t1 - t0) / 1000000 )) ms"
done
python3 - "${imgs[@]}" <<'PY'
import json, sys, os
imgs = sys.argv[1:]
one = [json.load(open('/tmp/one_' + os.path.basename(i) + '.json')) for i in imgs]
print('single runs: ttft ms', [round(o['timings']['ttft_ms'], 1) for o in one], 'decode tok/s', [round(o['timings']['decode_tokens_per_s']) for o in one])
for p in (1, 4, 8):
    lines = [json.loads(l) for l in open(f'/tmp/each_{p}.jsonl')]
    same = sum(l['token_ids'] == o['token_ids'] for l, o in zip(lines, one))
    print(f'--parallel {p}: {len(lines)} answers, images in order: {[l["image"] for l in lines] == imgs}, same tokens as the single runs: {same} of {len(one)}')
PY
