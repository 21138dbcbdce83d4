#!/usr/bin/env python3
"""Decode throughput as a client of `qvl serve` sees it: N concurrent chat completions, each
generating --max-tokens tokens (ignore_eos), with the sampling a chat client leaves at the
server's defaults or sets itself. Unlike `qvl bench` (device-side decode steps, greedy), this
includes the engine's host work per step: sampling, detokenising, the HTTP responses.

Usage: python3 tools/bench/serve_load.py --qvl build-dev/qvl --model CKPT --out FILE.json
         [--label NAME] [--streams 1,32] [--max-tokens 256] [--rounds 3]
         [--sampling qwen|greedy|penalised] [--port 18123] [--serve-arg=--kv-dtype=fp8 ...]
Starts the server (--max-running = the largest stream count), waits for /health, runs each
stream count --rounds times (the first round of each is a warm-up and not counted), stops it.
Prints one line per stream count and writes FILE.json: per stream count the aggregate
completion tokens per second (median over rounds) and the per-stream rate, with the
completions' token ids of the first stream of round 1 (the same seed must give the same ids
from two builds).
Standard library only (urllib, threading): runs wherever the server runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

SAMPLING = {
    # Qwen3-VL's generation_config.json (the server's defaults for such a checkpoint).
    "qwen": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
    "greedy": {"temperature": 0},
    "penalised": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
                  "presence_penalty": 1.5},
}


def log(msg):
    print(f"serve_load: {msg}", flush=True)


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base, proc, seconds=300):
    t0 = time.time()
    while time.time() - t0 < seconds:
        if proc.poll() is not None:
            raise RuntimeError(f"qvl serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise RuntimeError("qvl serve did not become ready")


def one_round(base, model, streams, max_tokens, sampling, seed0):
    results = [None] * streams
    errors = []

    def worker(i):
        body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "seed": seed0 + i,
                "messages": [{"role": "user", "content": f"Describe a busy street scene, version {i}."}]}
        body.update(sampling)
        try:
            results[i] = post(base + "/v1/chat/completions", body)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"stream {i}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    return wall, tokens, results[0]["choices"][0]["message"]["content"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="qvl")
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sampling", default="qwen", choices=sorted(SAMPLING))
    ap.add_argument("--port", type=int, default=18123)
    ap.add_argument("--serve-arg", action="append", default=[])
    args = ap.parse_args()

    streams = [int(s) for s in args.streams.split(",")]
    base = f"http://127.0.0.1:{args.port}"
    cmd = [args.qvl, "serve", "--model", args.model, "--port", str(args.port), "--max-running", str(max(streams)),
           "--concurrency", str(max(streams)), "--context", str(max(512, args.max_tokens + 128))] + args.serve_arg
    log("starting " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = {"label": args.label, "command": " ".join(cmd), "sampling": SAMPLING[args.sampling],
           "max_tokens": args.max_tokens, "rounds": args.rounds, "streams": {}}
    try:
        out["ready_s"] = wait_ready(base, proc)
        with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        for n in streams:
            rates, text = [], None
            for r in range(args.rounds + 1):
                wall, tokens, first = one_round(base, model, n, args.max_tokens, SAMPLING[args.sampling], 1000 * n)
                if r == 0:
                    continue  # warm-up: decode graphs of this batch size are recorded here
                rates.append(tokens / wall)
                text = text or first
            agg = statistics.median(rates)
            out["streams"][str(n)] = {"tokens_per_s": agg, "per_stream_tokens_per_s": agg / n, "runs": rates,
                                      "first_text": text}
            log(f"{args.label} {args.sampling} streams {n}: {agg:.1f} tok/s aggregate, {agg / n:.1f} per stream "
                f"(rounds {' '.join(f'{x:.1f}' for x in rates)})")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        out["serve_stderr_tail"] = err[-2000:]
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
