#!/usr/bin/env bash
# Stages a build for tools/device/perf_call.sh: pack.sh + the gemv sweep, build-dev/ packed as
# DEST/build-dev.tar.xz next to a copy of perf_call.sh (DEST: a folder the device tool carries,
# e.g. /work/main/.dev-perf).   usage: tools/device/stage_perf.sh DEST
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=$1
tools/device/pack.sh >/tmp/stage_perf_pack.log 2>&1 || { tail -30 /tmp/stage_perf_pack.log; exit 1; }
tools/bench/build_gemv_sweep.sh >/dev/null
git rev-parse HEAD >build-dev/COMMIT
git diff --quiet HEAD -- src tools || echo "+ uncommitted changes" >>build-dev/COMMIT
mkdir -p "$dest"
tar cf - build-dev | xz -6 -T2 >"$dest/build-dev.tar.xz"
cp tools/device/perf_call.sh "$dest/"
ls -la "$dest"
