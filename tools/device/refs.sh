#!/usr/bin/env bash
# GPU machine: runs every reference script that produces committed fixtures or recorded figures,
# and packs the results into $OUT (at most 8 files come back, 16 MiB each).
#   bash tools/device/refs.sh [step ...]     (default: all steps)
# Needs build-dev/ (tools/device/pack.sh) and the tokenizer files carried along.
set -u
cd "$(dirname "$0")/../.."
source build-dev/env.sh
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/qvl_out}
work=/tmp/qvl_refs
mkdir -p "$out" "$work/logs"
steps=${*:-"tokenizer chat images model load tokbench imgbench"}

step() {  # step NAME command...
  local name=$1; shift
  local t0=$(date +%s)
  "$@" >"$work/logs/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 )) s"
  tail -n 12 "$work/logs/$name.log"
}

has() { [[ " $steps " == *" $1 "* ]]; }

# CPU-only reference work runs in the background while the GPU-side checks run.
if has tokenizer; then step tokenizer python3 tools/reference/tokenize_corpus.py --out "$work/tokenizer" & fi
if has chat; then step chat python3 tools/reference/chat_template_ref.py --out "$work/chat_template" & fi
if has images; then
  ( step make_images python3 tools/reference/make_test_images.py --out "$work/images" &&
    step image_refs python3 tools/reference/image_refs.py --images "$work/images/images" --out "$work/images" ) &
fi
if has model; then step model timeout 300 python3 tools/reference/model_fixtures.py --out "$work/model" --threads 8; fi
if has load; then step load timeout 300 python3 tools/reference/check_load.py --out "$work/load" --generate --scratch /tmp/qvl_ckpt; fi
wait
if has tokbench; then step tokbench python3 tools/bench/tokenizer_throughput.py --out "$work/tokbench"; fi
if has imgbench; then
  f=$(ls "$work"/images/images/*12mp*.jpg 2>/dev/null | head -1)
  step imgbench python3 tools/bench/image_preprocess.py --file "${f:-tests/fixtures/images/j09_12mp.jpg}"
fi
if has cpu2b; then step cpu2b timeout 240 python3 tools/reference/cpu_2b_check.py --out "$work/cpu2b"; fi

if has gputests; then step gputests timeout 180 build-dev/qvl_gpu_tests; fi

# Pack: one archive per area so no file exceeds the 16 MiB cap.
for d in tokenizer chat_template images model load tokbench cpu2b; do
  [ -d "$work/$d" ] && tar czf "$out/$d.tar.gz" -C "$work" "$d"
done
tar czf "$out/logs.tar.gz" -C "$work" logs
ls -la "$out"
