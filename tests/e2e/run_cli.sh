#!/usr/bin/env bash
# qvl run through the binary on the built-in `tiny` model (random weights: the text is
# meaningless, so the checks are on structure, ids and determinism, never on words):
#   - --json has prompt_token_ids, token_ids, text, finish_reason, usage and timings, and the
#     streamed text equals the JSON text for the same greedy request;
#   - image placement: example.jpg (640x480 -> grid 1x30x40 -> 300 pads) and a 96x64 PNG made
#     here (smart_resize scales it up to min_pixels 65536: 320x224 -> grid 1x14x20 -> 70 pads);
#     an unmarked image comes first, a marked one where its <image> is;
#   - --max-tokens with --ignore-eos gives exactly that many tokens, finish_reason "length";
#   - the same --seed gives the same tokens, another seed other tokens;
#   - a --stop string cut from a greedy answer ends the same run right before it (finish_reason
#     "stop", the text up to the string, the tokens a prefix of the free run's);
#   - --each: one request per image with the model loaded once, answers in the images' order (an
#     example.jpg answer in a batch of two is the answer it gets alone), a missing image answered
#     by its error in its place while the others are answered, exit status 1;
#   - clear errors and a non-zero exit for a missing model, an unreadable / non-image / truncated
#     image, more <image> markers than images, a prompt longer than the context, vqa without a
#     question, --each without images, --parallel without --each, and `qvl bench --kv-dtype fp8`
#     on the CPU backend (its cache is fp32).
set -euo pipefail
qvl="$1"
tmp="$2/run_cli"
rm -rf "$tmp" && mkdir -p "$tmp"
root="$(cd "$(dirname "$0")/../.." && pwd)"
img="$root/assets/example.jpg"
export XDG_CACHE_HOME="$tmp/cache"  # the built-in tiny model is generated here on first use
fail() { echo "run_cli: FAIL: $*" >&2; exit 1; }
# json FILE EXPR: evaluates a JavaScript expression over the parsed JSON `j`.
json() { node -e "const j = JSON.parse(require('fs').readFileSync('$1', 'utf8')); console.log($2)"; }

# A 96x64 RGB PNG (a gradient), written with node's zlib.
node -e "
const zlib = require('zlib'), fs = require('fs');
const w = 96, h = 64, raw = Buffer.alloc((w * 3 + 1) * h);
for (let y = 0; y < h; y++) { raw[y * (w * 3 + 1)] = 0;
  for (let x = 0; x < w; x++) { const o = y * (w * 3 + 1) + 1 + x * 3; raw[o] = x * 2; raw[o + 1] = y * 3; raw[o + 2] = 128; } }
const crc = (buf) => { let c, t = []; for (let n = 0; n < 256; n++) { c = n; for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1; t[n] = c >>> 0; }
  let r = 0xffffffff; for (const b of buf) r = t[(r ^ b) & 0xff] ^ (r >>> 8); return (r ^ 0xffffffff) >>> 0; };
const chunk = (type, data) => { const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type), data]); const c = Buffer.alloc(4); c.writeUInt32BE(crc(td)); return Buffer.concat([len, td, c]); };
const ihdr = Buffer.alloc(13); ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4); ihdr[8] = 8; ihdr[9] = 2;
fs.writeFileSync('$tmp/small.png', Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk('IHDR', ihdr),
  chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]));
"

# ---- a greedy caption: --json structure, and the streamed text is the JSON text ----
"$qvl" run --model tiny --image "$img" --task caption --max-tokens 12 --ignore-eos --temperature 0 --json \
  >"$tmp/caption.json" || fail "caption --json exited non-zero"
[ "$(json "$tmp/caption.json" 'j.token_ids.length')" = 12 ] || fail "token_ids: $(cat "$tmp/caption.json")"
[ "$(json "$tmp/caption.json" 'j.finish_reason')" = length ] || fail "finish_reason: $(cat "$tmp/caption.json")"
[ "$(json "$tmp/caption.json" 'j.usage.completion_tokens')" = 12 ] || fail "usage: $(cat "$tmp/caption.json")"
[ "$(json "$tmp/caption.json" 'j.usage.prompt_tokens === j.prompt_token_ids.length')" = true ] || fail "prompt usage"
[ "$(json "$tmp/caption.json" 'typeof j.timings.ttft_ms')" = number ] || fail "timings: $(cat "$tmp/caption.json")"
# <|im_start|>user\n<|vision_start|> then 300 image pads, then <|vision_end|>
[ "$(json "$tmp/caption.json" 'j.prompt_token_ids.slice(0, 4).join(",")')" = "151644,872,198,151652" ] ||
  fail "prompt head: $(json "$tmp/caption.json" 'j.prompt_token_ids.slice(0, 8).join(",")')"
[ "$(json "$tmp/caption.json" 'j.prompt_token_ids.filter(t => t === 151655).length')" = 300 ] || fail "image pads"
[ "$(json "$tmp/caption.json" 'j.prompt_token_ids[304]')" = 151653 ] || fail "vision_end after 300 pads"
"$qvl" run --model tiny --image "$img" --task caption --max-tokens 12 --ignore-eos --temperature 0 \
  >"$tmp/caption.txt" || fail "caption exited non-zero"
json "$tmp/caption.json" 'j.text' >"$tmp/caption.expected"
cmp -s "$tmp/caption.txt" "$tmp/caption.expected" || fail "streamed text differs from --json text"

# ---- image placement: <image> marks where the next --image goes; unmarked images come first ----
"$qvl" run --model tiny --image "$img" --image "$tmp/small.png" --prompt "Compare <image> with the first." \
  --max-tokens 1 --json >"$tmp/place.json" || fail "placement run exited non-zero"
# pad runs in prompt order: small.png (70, unmarked) first, then example.jpg (300) at the marker
runs=$(json "$tmp/place.json" '(() => { const r = []; let n = 0;
  for (const t of j.prompt_token_ids.concat([0])) { if (t === 151655) n++; else if (n) { r.push(n); n = 0; } } return r.join(","); })()')
[ "$runs" = "70,300" ] || fail "pad runs $runs, expected 70,300"

# ---- seeds ----
sample() { "$qvl" run --model tiny --prompt "Say something." --temperature 1.0 --top-k 0 --top-p 1 --max-tokens 16 \
  --ignore-eos --seed "$1" --json | node -e "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>console.log(JSON.parse(s).token_ids.join(',')))"; }
a=$(sample 7) && b=$(sample 7) && c=$(sample 8) || fail "seeded runs exited non-zero"
[ "$a" = "$b" ] || fail "seed 7 gave $a then $b"
[ "$a" != "$c" ] || fail "seeds 7 and 8 gave the same tokens $a"

# ---- stop strings through the real detokenizer: a piece of a greedy answer stops the same run ----
"$qvl" run --model tiny --prompt "Tell me a story." --temperature 0 --max-tokens 24 --ignore-eos --json \
  >"$tmp/free.json" || fail "free run exited non-zero"
# the first 4-character window without whitespace that first occurs at offset >= 6
stop=$(json "$tmp/free.json" '(() => { for (let i = 6; i + 4 <= j.text.length; i++) { const w = j.text.slice(i, i + 4);
  if (!/\s/.test(w) && j.text.indexOf(w) >= 6) return w; } return ""; })()')
[ -n "$stop" ] || fail "no stop window in $(json "$tmp/free.json" 'JSON.stringify(j.text)')"
"$qvl" run --model tiny --prompt "Tell me a story." --temperature 0 --max-tokens 24 --ignore-eos --stop "$stop" --json \
  >"$tmp/stop.json" || fail "stop run exited non-zero"
[ "$(json "$tmp/stop.json" 'j.finish_reason')" = stop ] || fail "stop: finish_reason $(json "$tmp/stop.json" 'j.finish_reason')"
node -e "
const a = JSON.parse(require('fs').readFileSync('$tmp/free.json', 'utf8')), b = JSON.parse(require('fs').readFileSync('$tmp/stop.json', 'utf8'));
const want = a.text.slice(0, a.text.indexOf(process.argv[1]));
if (b.text !== want) { console.error('stop text', JSON.stringify(b.text), 'expected', JSON.stringify(want)); process.exit(1); }
if (b.token_ids.join() !== a.token_ids.slice(0, b.token_ids.length).join()) { console.error('stop tokens are not a prefix'); process.exit(1); }
" "$stop" || fail "stop string '$stop'"

# ---- --each: every --image its own request, the model loaded once, the answers in order ----
# example.jpg, small.png, a missing file, example.jpg again; two decoding at a time. The missing
# file gets its error in its place (and on stderr), the others their answers, the exit status 1.
if "$qvl" run --model tiny --each --parallel 2 --image "$img" --image "$tmp/small.png" --image "$tmp/nowhere.jpg" \
  --image "$img" --task caption --max-tokens 12 --ignore-eos --temperature 0 --json >"$tmp/each.jsonl" \
  2>"$tmp/each.err"; then fail "--each with a missing image exited 0"; fi
grep -qF "nowhere.jpg" "$tmp/each.err" || fail "--each stderr lacks the missing image: $(cat "$tmp/each.err")"
node -e "
const fs = require('fs');
const lines = fs.readFileSync('$tmp/each.jsonl', 'utf8').trim().split('\n').map(JSON.parse);
const one = JSON.parse(fs.readFileSync('$tmp/caption.json', 'utf8'));
const want = ['$img', '$tmp/small.png', '$tmp/nowhere.jpg', '$img'];
const fail = (m) => { console.error(m); process.exit(1); };
if (lines.map(l => l.image).join() !== want.join()) fail('images ' + lines.map(l => l.image).join());
if (!lines[2].error || !lines[2].error.includes('nowhere.jpg') || lines[2].token_ids) fail('error line ' + JSON.stringify(lines[2]));
for (const i of [0, 1, 3]) if (lines[i].token_ids.length !== 12 || lines[i].finish_reason !== 'length') fail('line ' + i);
// the same greedy request alone (the caption above) and in the batch: the same tokens and prompt
if (lines[0].token_ids.join() !== one.token_ids.join() || lines[3].token_ids.join() !== one.token_ids.join())
  fail('example.jpg in the batch: ' + lines[0].token_ids + ' / ' + lines[3].token_ids + ', alone: ' + one.token_ids);
if (lines[0].prompt_token_ids.join() !== one.prompt_token_ids.join()) fail('prompt differs from the single run');
if (lines[1].prompt_token_ids.filter(t => t === 151655).length !== 70) fail('small.png pads');
" || fail "--each --json"
# text: an '== PATH' line before each answer, the answer the --json text
"$qvl" run --model tiny --each --image "$tmp/small.png" --image "$img" --task caption --max-tokens 12 --ignore-eos \
  --temperature 0 >"$tmp/each.txt" || fail "--each text exited non-zero"
[ "$(grep -c '^== ' "$tmp/each.txt")" = 2 ] || fail "--each text headers: $(cat "$tmp/each.txt")"
[ "$(sed -n 1p "$tmp/each.txt")" = "== $tmp/small.png" ] || fail "--each text order: $(head -1 "$tmp/each.txt")"
{ echo "== $img"; cat "$tmp/caption.expected"; } >"$tmp/each_tail.expected"
sed -n '/^== .*example.jpg$/,$p' "$tmp/each.txt" | cmp -s - "$tmp/each_tail.expected" || fail "--each text of example.jpg"

# ---- errors: a clear message and a non-zero exit ----
expect_error() {  # name, expected substring, command...
  local name="$1" want="$2"
  shift 2
  if "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"; then fail "$name: exited 0"; fi
  grep -qF -- "$want" "$tmp/$name.err" || fail "$name: stderr lacks '$want': $(cat "$tmp/$name.err")"
}
expect_error missing_model "no-such-model" "$qvl" run --model "$tmp/no-such-model" --prompt hi
expect_error missing_image "nowhere.jpg" "$qvl" run --model tiny --image "$tmp/nowhere.jpg" --prompt hi
echo "not an image" >"$tmp/text.jpg"
expect_error not_image "text.jpg" "$qvl" run --model tiny --image "$tmp/text.jpg" --prompt hi
head -c 2000 "$img" >"$tmp/truncated.jpg"
expect_error truncated_image "truncated.jpg" "$qvl" run --model tiny --image "$tmp/truncated.jpg" --prompt hi
expect_error too_many_markers "2 <image> markers but only 1 --image was given" \
  "$qvl" run --model tiny --image "$img" --prompt "<image> and <image>"
long_prompt=$(for i in $(seq 1 300); do printf 'word%d ' "$i"; done)
expect_error too_long "the context of 256 tokens" "$qvl" run --model tiny --prompt "$long_prompt" --context 256
expect_error vqa_question "--task vqa needs the question in --prompt" "$qvl" run --model tiny --image "$img" --task vqa
expect_error each_no_image "--each answers every --image" "$qvl" run --model tiny --each --prompt hi
expect_error parallel_alone "--parallel applies with --each" "$qvl" run --model tiny --parallel 2 --prompt hi
expect_error bench_kv_fp8_cpu "--kv-dtype fp8: an FP8 KV cache needs the CUDA backend" \
  "$qvl" bench --model tiny --backend cpu --image-size none --kv-dtype fp8
echo "run_cli: ok"
