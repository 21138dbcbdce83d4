#!/usr/bin/env bash
# Ask a question about an image (visual question answering), with curl only.
#   bash vqa.sh photo.jpg "How many people are in the picture?"
# Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY, QVL_MODEL.
set -euo pipefail
base=${QVL_BASE_URL:-http://127.0.0.1:8000/v1}
image=$1
# JSON string escaping for the question: backslashes, quotes, and control characters as spaces.
question=$(printf '%s' "$2" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr '\n\t\r' '   ')
case "${image,,}" in *.png) mime=image/png ;; *.webp) mime=image/webp ;; *) mime=image/jpeg ;; esac
model=${QVL_MODEL:-$(curl -sf "$base/models" -H "Authorization: Bearer ${QVL_API_KEY:-none}" |
  sed -n 's/.*"id":"\([^"]*\)".*/\1/p')}

{
  printf '{"model":"%s","max_tokens":128,"temperature":0,"messages":[' "$model"
  printf '{"role":"system","content":"Answer questions about the image briefly and precisely."},'
  printf '{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:%s;base64,' "$mime"
  base64 -w0 "$image"
  printf '"}},{"type":"text","text":"%s"}]}]}' "$question"
} | curl -sS "$base/chat/completions" -H "Content-Type: application/json" \
    -H "Authorization: Bearer ${QVL_API_KEY:-none}" --data-binary @- |
  if command -v jq >/dev/null; then jq -r '.choices[0].message.content // .'; else cat; echo; fi
