#!/usr/bin/env bash
# qvl inspect-image through the binary on assets/example.jpg (640x480, both sides multiples
# of 32 and 307200 >= 65536 pixels, so smart_resize keeps it: grid [1, 30, 40], 1200 patches,
# 300 tokens), its --dump size (1200 x 1536 float32), a --max-image-tokens cap (64 tokens =
# 65536 pixels: beta = sqrt(307200/65536), floor(480/beta/32) = 6, floor(640/beta/32) = 9 ->
# grid [1, 12, 18], 54 tokens) and clear errors for a missing and a non-image file.
set -euo pipefail
qvl="$1"
tmp="$2/inspect_image"
rm -rf "$tmp" && mkdir -p "$tmp"
root="$(cd "$(dirname "$0")/../.." && pwd)"
img="$root/assets/example.jpg"
fail() { echo "inspect_image: FAIL: $*" >&2; exit 1; }

out=$("$qvl" inspect-image --json --dump "$tmp/pv.f32" "$img")
echo "$out" | grep -q '"mode": "RGB"' || fail "mode: $out"
echo "$out" | tr -d ' \n' | grep -q '"image_grid_thw":\[1,30,40\]' || fail "grid: $out"
echo "$out" | grep -q '"tokens": 300' || fail "tokens: $out"
size=$(stat -c %s "$tmp/pv.f32")
[ "$size" -eq $((1200 * 1536 * 4)) ] || fail "dump is $size bytes, expected $((1200 * 1536 * 4))"

capped=$("$qvl" inspect-image --json --max-image-tokens 64 "$img")
echo "$capped" | tr -d ' \n' | grep -q '"image_grid_thw":\[1,12,18\]' || fail "capped grid: $capped"
echo "$capped" | grep -q '"tokens": 54' || fail "capped tokens: $capped"

if "$qvl" inspect-image "$tmp/missing.jpg" 2>"$tmp/err1"; then fail "missing file accepted"; fi
grep -q "missing.jpg" "$tmp/err1" || fail "missing-file error does not name the file: $(cat "$tmp/err1")"
echo "not an image" >"$tmp/text.jpg"
if "$qvl" inspect-image "$tmp/text.jpg" 2>"$tmp/err2"; then fail "text file accepted"; fi
grep -q "unrecognised image data" "$tmp/err2" || fail "text-file error: $(cat "$tmp/err2")"
echo "inspect_image: ok"
