#!/usr/bin/env bash
# e2e: the bad-input table (serve_bad_input.mjs) against a real `qvl serve` on the tiny model,
# started with small limits so that every limit can be hit cheaply.
# Usage: bash serve_bad_input.sh QVL_BINARY SCRATCH_ROOT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/serve.sh"
e2e_init "$1" "$2" serve_bad_input

key="e2e-$RANDOM-$RANDOM"
mkdir -p "$SCRATCH/media"
serve_start "$SCRATCH/serve.log" tiny --threads 1 --api-key "$key" --max-images-per-request 2 \
  --max-image-input-pixels 100000 --allowed-media-dir "$SCRATCH/media" --max-body-bytes 1048576 --context 512
node "$here/serve_bad_input.mjs" "$QVL_URL" "$key" "$SCRATCH"
serve_stop
