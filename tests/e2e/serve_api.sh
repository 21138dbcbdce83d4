#!/usr/bin/env bash
# e2e: the OpenAI API of a real `qvl serve` on the built-in tiny model, through the official
# openai npm client (serve_api.mjs), then a clean SIGTERM shutdown.
# Usage: bash serve_api.sh QVL_BINARY SCRATCH_ROOT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/serve.sh"
e2e_init "$1" "$2" serve_api

serve_start "$SCRATCH/serve.log" tiny --threads 1 --served-model-name tiny-e2e
node "$here/serve_api.mjs" "$QVL_URL" "$QVL" "$SCRATCH" tiny-e2e
serve_stop
grep -q "shutting down" "$SCRATCH/serve.log" || { echo "e2e: no shutdown line in the log" >&2; exit 1; }
