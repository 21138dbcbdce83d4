#!/usr/bin/env bash
# Analyse a scene and stream the answer (server-sent events), with curl only.
#   bash scene.sh street.jpg
# Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY, QVL_MODEL.
# With jq the text is printed as it arrives; without it, the raw `data: {...}` events are.
set -euo pipefail
base=${QVL_BASE_URL:-http://127.0.0.1:8000/v1}
image=$1
case "${image,,}" in *.png) mime=image/png ;; *.webp) mime=image/webp ;; *) mime=image/jpeg ;; esac
model=${QVL_MODEL:-$(curl -sf "$base/models" -H "Authorization: Bearer ${QVL_API_KEY:-none}" |
  sed -n 's/.*"id":"\([^"]*\)".*/\1/p')}
prompt="Analyse this scene. List: 1) the setting and time of day, 2) the main objects and people with where they are, 3) what is happening, 4) anything unusual or hazardous."

{
  printf '{"model":"%s","max_tokens":512,"stream":true,"messages":[{"role":"user","content":[' "$model"
  printf '{"type":"image_url","image_url":{"url":"data:%s;base64,' "$mime"
  base64 -w0 "$image"
  printf '"}},{"type":"text","text":"%s"}]}]}' "$prompt"
} | curl -sSN "$base/chat/completions" -H "Content-Type: application/json" \
    -H "Authorization: Bearer ${QVL_API_KEY:-none}" --data-binary @- |
  if command -v jq >/dev/null; then
    sed -un 's/^data: //p' | grep --line-buffered -v '^\[DONE\]$' |
      jq --unbuffered -rj '.choices[0].delta.content // .error.message // empty'
    echo
  else
    cat
  fi
