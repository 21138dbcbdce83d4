# Helpers for e2e scripts that drive a real `qvl serve` (sourced, not run).
#
#   e2e_init QVL SCRATCH_ROOT NAME   scratch dir $SCRATCH (fresh), shared model cache, node checks
#   serve_start LOG ARGS...          starts `qvl serve ARGS... --port 0` in the background, reads
#                                    the bound port from its log, waits for /health 200;
#                                    sets QVL_URL and SERVE_PID
#   serve_stop                       SIGTERM, then requires a clean exit (status 0) within 30 s
#
# The built-in `tiny` model is generated once into $SCRATCH_ROOT/cache (XDG_CACHE_HOME) and shared
# by every e2e script; concurrent first uses are safe (io/hub.h generates into a temporary
# directory and renames it into place).

E2E_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

e2e_init() {
  QVL=$(realpath "$1")
  local root=$2 name=$3
  mkdir -p "$root"
  root=$(realpath "$root")
  SCRATCH="$root/$name"
  rm -rf "$SCRATCH"
  mkdir -p "$SCRATCH" "$root/cache"
  export XDG_CACHE_HOME="$root/cache"
  export QVL_NODE_MODULES="$E2E_REPO/npm/node_modules"
  command -v node >/dev/null || { echo "e2e: node is required (scripts/deps.sh installs it)" >&2; exit 1; }
  [ -f "$QVL_NODE_MODULES/openai/package.json" ] ||
    { echo "e2e: the openai npm client is missing; run scripts/fetch_npm.sh" >&2; exit 1; }
  SERVE_PID=""
  trap serve_kill EXIT
}

serve_kill() {
  if [ -n "${SERVE_PID:-}" ] && kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -KILL "$SERVE_PID" 2>/dev/null || true
  fi
}

serve_start() {
  SERVE_LOG=$1
  shift
  : >"$SERVE_LOG"  # exists before the first read below, however late the child starts
  "$QVL" serve "$@" --port 0 2>"$SERVE_LOG" &
  SERVE_PID=$!
  local port="" i
  for i in $(seq 1 600); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$SERVE_LOG" | head -1)
    [ -n "$port" ] && break
    kill -0 "$SERVE_PID" 2>/dev/null || { echo "e2e: qvl serve exited early:" >&2; cat "$SERVE_LOG" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "e2e: qvl serve printed no port in 60 s:" >&2; cat "$SERVE_LOG" >&2; exit 1; }
  QVL_URL="http://127.0.0.1:$port"
  # The model loads in the background (the tiny model is generated on first use).
  for i in $(seq 1 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$QVL_URL/health")" = "200" ] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null || { echo "e2e: qvl serve exited while loading:" >&2; cat "$SERVE_LOG" >&2; exit 1; }
    sleep 0.1
  done
  echo "e2e: /health did not turn 200 in 120 s:" >&2
  cat "$SERVE_LOG" >&2
  exit 1
}

serve_stop() {
  kill -TERM "$SERVE_PID"
  local i status
  for i in $(seq 1 300); do
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    echo "e2e: qvl serve did not exit within 30 s of SIGTERM:" >&2
    tail -20 "$SERVE_LOG" >&2
    exit 1
  fi
  status=0
  wait "$SERVE_PID" || status=$?
  SERVE_PID=""
  if [ "$status" -ne 0 ]; then
    echo "e2e: qvl serve exited with status $status after SIGTERM:" >&2
    tail -20 "$SERVE_LOG" >&2
    exit 1
  fi
}
