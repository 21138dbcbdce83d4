#!/usr/bin/env bash
# e2e: the OpenAI API of a real `qvl serve` on the built-in tiny model, through the official
# openai npm client (serve_api.mjs); then SIGTERM while a long stream and a long non-streamed
# request are in flight: both must end (the stream with an error event and [DONE], the other
# with a 503) within --shutdown-timeout, and the server must exit 0.
# Usage: bash serve_api.sh QVL_BINARY SCRATCH_ROOT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/serve.sh"
e2e_init "$1" "$2" serve_api

# --threads 1: the tiny model gains nothing from more, and CI's few cores are shared.
serve_start "$SCRATCH/serve.log" tiny --threads 1 --served-model-name tiny-e2e --shutdown-timeout 2
status=0
node "$here/serve_api.mjs" "$QVL_URL" "$QVL" "$SCRATCH" tiny-e2e || status=1

long='{"messages":[{"role":"user","content":"Go on forever."}],"max_tokens":3000,"ignore_eos":true'
curl -sN "$QVL_URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$long,\"stream\":true}" \
  >"$SCRATCH/stream.out" &
stream_pid=$!
curl -s -o "$SCRATCH/plain.out" -w '%{http_code}' "$QVL_URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "$long}" >"$SCRATCH/plain.status" &
plain_pid=$!
for i in $(seq 1 100); do grep -q '"content"' "$SCRATCH/stream.out" 2>/dev/null && break; sleep 0.1; done
sleep 0.2  # let the non-streamed request reach the engine too
start=$(date +%s%N)
serve_stop
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
wait "$stream_pid" "$plain_pid"
fail() { echo "not ok - $1" >&2; exit 1; }
[ "$elapsed_ms" -lt 10000 ] || fail "shutdown took $elapsed_ms ms with --shutdown-timeout 2"
tail -n 4 "$SCRATCH/stream.out" | grep -q '^data: {"error":{.*"message":"the request was cancelled: the server is shutting down"' ||
  fail "the stream did not end with the shutdown error event: $(tail -c 300 "$SCRATCH/stream.out")"
[ "$(tail -n 2 "$SCRATCH/stream.out" | head -1)" = "data: [DONE]" ] || fail "the stream did not end with [DONE]"
[ "$(cat "$SCRATCH/plain.status")" = 503 ] || fail "the non-streamed request got $(cat "$SCRATCH/plain.status"), not 503"
grep -q '"message":"the request was cancelled: the server is shutting down"' "$SCRATCH/plain.out" ||
  fail "non-streamed body: $(cat "$SCRATCH/plain.out")"
grep -q "stopped cleanly" "$SCRATCH/serve.log" || fail "no 'stopped cleanly' in the log"
echo "ok - SIGTERM with 2 requests in flight: both cancelled at the 2 s deadline, exit 0 after $elapsed_ms ms"
exit $status
