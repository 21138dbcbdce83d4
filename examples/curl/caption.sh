#!/usr/bin/env bash
# Caption an image with a running `qvl serve`, with curl only.
#   bash caption.sh photo.jpg
# Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY, QVL_MODEL (default:
# the first model of /v1/models). Prints the caption when jq is installed, else the whole JSON
# response.
set -euo pipefail
base=${QVL_BASE_URL:-http://127.0.0.1:8000/v1}
image=$1
case "${image,,}" in *.png) mime=image/png ;; *.webp) mime=image/webp ;; *) mime=image/jpeg ;; esac
model=${QVL_MODEL:-$(curl -sf "$base/models" -H "Authorization: Bearer ${QVL_API_KEY:-none}" |
  sed -n 's/.*"id":"\([^"]*\)".*/\1/p')}

# The body goes through stdin: a base64 image is too long for one command-line argument.
{
  printf '{"model":"%s","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":[' "$model"
  printf '{"type":"image_url","image_url":{"url":"data:%s;base64,' "$mime"
  base64 -w0 "$image"
  printf '"}},{"type":"text","text":"Write a one-sentence caption for this image."}]}]}'
} | curl -sS "$base/chat/completions" -H "Content-Type: application/json" \
    -H "Authorization: Bearer ${QVL_API_KEY:-none}" --data-binary @- |
  if command -v jq >/dev/null; then jq -r '.choices[0].message.content // .'; else cat; echo; fi
