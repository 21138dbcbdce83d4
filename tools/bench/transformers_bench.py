#!/usr/bin/env python3
"""The `qvl bench` workload through transformers, for side-by-side numbers on one checkpoint.

Same prompt shape as qvl bench (chat template around one synthetic image of --image-size and
--prompt-tokens text tokens), bf16 weights, SDPA attention, CUDA; an FP8 checkpoint is loaded with
FineGrainedFP8Config(dequantize=True) (no DeepGEMM / `kernels` on the GPU machine), i.e. as BF16.
Reports, as JSON: vision encoder ms, TTFT (prefill forward + argmax), decode tok/s at each --batch
size through model.generate (greedy, forced length; batch > 1 uses a text-only prompt of the same
length so that only decode is measured), and peak torch CUDA memory.

Usage: python3 tools/bench/transformers_bench.py --model CKPT --out OUTDIR [--image-size 1024x768]
         [--prompt-tokens 24] [--gen-tokens 64] [--batch 1,32] [--repeat 5]
Writes OUTDIR/transformers_bench.json (and prints it). Runtime: about a minute for a 2B model.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time


def log(msg):
    print(f"transformers_bench: {msg}", flush=True)


def die(msg):
    print(f"transformers_bench: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def load_model(ckpt, dtype):
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
    model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, **kwargs)
    return model.to("cuda").eval(), bool(q)


def prompt_ids(cfg, grid_hw, text_tokens):
    """qvl bench's prompt: <|im_start|>user\\n [<|vision_start|> pads <|vision_end|>] text <|im_end|>\\n..."""
    image_pad = cfg.get("image_token_id", 151655)
    vs, ve = cfg.get("vision_start_token_id", 151652), cfg.get("vision_end_token_id", 151653)
    ids = [151644, 872, 198]
    if grid_hw:
        ids += [vs] + [image_pad] * (grid_hw[0] * grid_hw[1] // 4) + [ve]
    ids += [1000 + (37 * i) % 50000 for i in range(text_tokens)]
    ids += [151645, 198, 151644, 77091, 198]
    return ids


def timed(fn, repeat, sync):
    fn()  # warm-up
    sync()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        runs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--image-size", default="1024x768")
    ap.add_argument("--prompt-tokens", type=int, default=24)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    if not torch.cuda.is_available():
        die("no CUDA device")
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    log("versions " + json.dumps(versions))
    os.makedirs(args.out, exist_ok=True)
    sync = torch.cuda.synchronize
    cfg = json.load(open(os.path.join(args.model, "config.json")))

    grid = None
    if args.image_size not in ("none", "0"):
        w, h = (int(v) for v in args.image_size.split("x"))
        if w % 32 or h % 32:
            die(f"--image-size {args.image_size}: multiples of 32 expected")
        grid = (h // 16, w // 16)
    ids = prompt_ids(cfg, grid, args.prompt_tokens)
    L = len(ids)

    t = time.time()
    model, fp8 = load_model(args.model, torch.bfloat16)
    load_s = time.time() - t
    log(f"loaded {args.model} ({'FP8 dequantized to BF16' if fp8 else 'BF16'}) in {load_s:.1f} s; prompt {L} tokens")
    torch.cuda.reset_peak_memory_stats()

    dev = "cuda"
    input_ids = torch.tensor([ids], device=dev)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    vision_ms = None
    if grid:
        rng = np.random.default_rng(0)
        patches = grid[0] * grid[1]
        pv = torch.tensor(rng.uniform(-1, 1, size=(patches, 1536)).astype(np.float32), device=dev)
        thw = torch.tensor([[1, grid[0], grid[1]]], device=dev)
        inputs.update(pixel_values=pv, image_grid_thw=thw,
                      mm_token_type_ids=(input_ids == cfg.get("image_token_id", 151655)).to(torch.int32))
        with torch.no_grad():
            vision_ms = timed(lambda: model.model.get_image_features(pv, thw), args.repeat, sync)
        log(f"vision {vision_ms:.2f} ms ({patches} patches)")

    def first_token():
        with torch.no_grad():
            out = model(**inputs, use_cache=True)
            return int(torch.argmax(out.logits[0, -1]))

    ttft_ms = timed(first_token, args.repeat, sync)
    log(f"TTFT {ttft_ms:.2f} ms")

    decode = []
    for b in sorted({int(x) for x in args.batch.split(",")}):
        if b == 1:
            gen_inputs = dict(inputs)
        else:  # text-only prompt of the same length: measures decode, not b images
            text_ids = [i for i in ids if i != cfg.get("image_token_id", 151655)]
            text_ids = (text_ids + [1000 + (53 * i) % 40000 for i in range(L)])[:L]
            t_ids = torch.tensor([text_ids] * b, device=dev)
            gen_inputs = {"input_ids": t_ids, "attention_mask": torch.ones_like(t_ids)}

        def gen(n):
            with torch.no_grad():
                return model.generate(**gen_inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)

        try:
            t1 = timed(lambda: gen(1), max(1, args.repeat // 2), sync)
            tn = timed(lambda: gen(args.gen_tokens + 1), max(1, args.repeat // 2), sync)
        except torch.cuda.OutOfMemoryError as e:
            log(f"batch {b}: out of memory ({e}); skipped")
            torch.cuda.empty_cache()
            continue
        step_ms = (tn - t1) / args.gen_tokens
        decode.append({"batch": b, "step_ms": step_ms, "tokens_per_s": b * 1000.0 / step_ms,
                       "generate_1_ms": t1, "generate_n_ms": tn})
        log(f"batch {b}: {b * 1000.0 / step_ms:.1f} tok/s ({step_ms:.2f} ms/step)")

    result = {
        "script": "tools/bench/transformers_bench.py", "command": " ".join(sys.argv), "versions": versions,
        "gpu": torch.cuda.get_device_name(0), "model": args.model, "fp8_dequantized": fp8,
        "attn_implementation": "sdpa", "dtype": "bfloat16", "prompt_tokens": L, "text_tokens": args.prompt_tokens,
        "image_size": args.image_size, "vision_ms": vision_ms, "ttft_ms": ttft_ms, "decode": decode,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(), "load_s": load_s,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    path = os.path.join(args.out, "transformers_bench.json")
    json.dump(result, open(path, "w"), indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
