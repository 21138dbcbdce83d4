# Sourced by the GPU machine's scripts (tools/device/), from the repository root.
#
# qvl_model NAME: the random checkpoint NAME (2b, 2b-fp8, 4b, 4b-fp8, 8b, 8b-fp8; seed 1),
# generated into /tmp/qvl_models/NAME once with build-dev/qvl.
qvl_model() {
  local name=$1 args="--preset ${1%-fp8}"
  [[ $name == *-fp8 ]] && args+=" --fp8"
  mkdir -p /tmp/qvl_models
  # shellcheck disable=SC2086
  [ -d "/tmp/qvl_models/$name" ] || build-dev/qvl gen-model $args --seed 1 --out "/tmp/qvl_models/$name" >/dev/null 2>&1
}

# ab_rounds ROUNDS RUNNER SPEC...: an A/B in turns. Each SPEC is "LABEL|MODEL|..."; its model is
# generated first, then RUNNER SPEC ROUND runs for every SPEC in turn, ROUNDS times (so drift of
# the machine hits each setting alike).
ab_rounds() {
  local rounds=$1 runner=$2 spec m r
  shift 2
  for spec in "$@"; do
    IFS='|' read -r _ m _ <<<"$spec"
    qvl_model "$m"
  done
  for r in $(seq 1 "$rounds"); do
    for spec in "$@"; do "$runner" "$spec" "$r"; done
  done
}
