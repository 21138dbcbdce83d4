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

# Startup errors: a clear message and a non-zero exit, never a server that hangs or shares a port.
startup_fails() {  # EXPECTED_MESSAGE ARGS...
  local expected=$1 out
  shift
  if out=$(timeout 60 "$QVL" serve "$@" 2>&1); then
    echo "not ok - qvl serve $* exited 0" >&2
    exit 1
  fi
  grep -qF -- "$expected" <<<"$out" || { echo "not ok - qvl serve $*: no '$expected' in: $out" >&2; exit 1; }
  echo "ok - qvl serve $* fails: $expected"
}
startup_fails "model '$SCRATCH/no-such-model' not found" "$SCRATCH/no-such-model" --port 0
startup_fails "--allowed-media-dir '$SCRATCH/nope' is not a directory" tiny --allowed-media-dir "$SCRATCH/nope"
serve_start "$SCRATCH/serve2.log" tiny --threads 1  # a second server on its port must fail
port=${QVL_URL##*:}
startup_fails "cannot listen on 127.0.0.1:$port (address in use or not available)" tiny --port "$port"
serve_stop
