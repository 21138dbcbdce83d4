#!/usr/bin/env bash
# e2e: load on loopback (serve_load.mjs): 16 concurrent clients x 200 requests against a real
# `qvl serve` on the tiny model, mixed streaming and not, some disconnecting mid-stream; then a
# clean SIGTERM shutdown. QVL_LOAD_CLIENTS / QVL_LOAD_REQUESTS shrink it for a quick local run.
# Usage: bash serve_load.sh QVL_BINARY SCRATCH_ROOT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/serve.sh"
e2e_init "$1" "$2" serve_load

serve_start "$SCRATCH/serve.log" tiny --threads 1
node "$here/serve_load.mjs" "$QVL_URL" "$SERVE_PID" "${QVL_LOAD_CLIENTS:-16}" "${QVL_LOAD_REQUESTS:-200}"
serve_stop
