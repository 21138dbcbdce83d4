#!/usr/bin/env bash
# e2e: every script under examples/ runs against a real `qvl serve` on the tiny model and prints
# an answer (random weights: the text itself is meaningless, so only its presence is checked).
# The Python examples run when the `openai` Python package is importable, and are reported as
# skipped otherwise (it is not a Debian package; the node and curl ones always run).
# Usage: bash serve_examples.sh QVL_BINARY SCRATCH_ROOT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/serve.sh"
e2e_init "$1" "$2" serve_examples

# A test picture: the e2e helpers' PNG encoder.
node -e "import('$here/lib/common.mjs').then(m => require('fs').writeFileSync('$SCRATCH/photo.png', m.png(96, 64, 7)))"
# The node examples import 'openai': give their copy the pinned node_modules.
cp -r "$E2E_REPO/examples/node" "$SCRATCH/node"
ln -s "$QVL_NODE_MODULES" "$SCRATCH/node/node_modules"

key="examples-$RANDOM"
serve_start "$SCRATCH/serve.log" tiny --threads 1 --api-key "$key"
export QVL_BASE_URL="$QVL_URL/v1" QVL_API_KEY="$key"

failed=0
run_example() {
  local name=$1
  shift
  local out
  if out=$("$@" 2>"$SCRATCH/example.err") && [ -n "$out" ] && ! grep -q '"error"' <<<"$out"; then
    echo "ok - $name"
  else
    echo "not ok - $name"
    echo "  output: ${out:0:400}"
    sed 's/^/  stderr: /' "$SCRATCH/example.err" | head -20
    failed=1
  fi
}
ex="$E2E_REPO/examples"
for job in caption vqa scene; do
  args=("$SCRATCH/photo.png")
  [ "$job" = vqa ] && args+=("What colour is the \"top\" left corner?")
  run_example "node $job" node "$SCRATCH/node/$job.mjs" "${args[@]}"
  run_example "curl $job" bash "$ex/curl/$job.sh" "${args[@]}"
  if python3 -c "import openai" 2>/dev/null; then
    run_example "python $job" python3 "$ex/python/$job.py" "${args[@]}"
  else
    echo "skip - python $job (the openai Python package is not installed)"
  fi
done
serve_stop
exit $failed
