#!/usr/bin/env python3
"""Writes the seed corpus of hub_listing_fuzz.cpp into tests/fuzz/corpus/hub_listing/.

The first byte of each seed picks the parser (0 listing, 1 safetensors index, 2 glob + path),
as the target reads it; the rest is what huggingface.co sends (or a user types)."""
import json
import pathlib

out = pathlib.Path(__file__).resolve().parent / "corpus" / "hub_listing"
out.mkdir(parents=True, exist_ok=True)
sha = "0123456789abcdef0123456789abcdef01234567"
lfs = "3f5a2c0e0f8b0a7d8e2b1c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081"
listing = {"id": "org/m", "sha": sha, "siblings": [
    {"rfilename": "config.json", "size": 1234, "blobId": sha},
    {"rfilename": "model-00001-of-00002.safetensors", "size": 99, "blobId": sha,
     "lfs": {"sha256": lfs, "size": 99, "pointerSize": 134}},
    {"rfilename": "sub/dir/x.txt", "size": 0, "blobId": sha}]}
seeds = {
    "listing.bin": b"\x00" + json.dumps(listing).encode(),
    "listing_bad_path.bin": b"\x00" + json.dumps(
        {"sha": sha, "siblings": [{"rfilename": "a/../b", "size": 1, "blobId": sha}]}).encode(),
    "index.bin": b"\x01" + json.dumps({"metadata": {"total_size": 10}, "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}).encode(),
    "glob.bin": b"\x02" + b"model-0000?-of-*.safetensors\nmodel-00001-of-00002.safetensors",
    "glob_class.bin": b"\x02" + b"[!a-c]*.md\ndocs/READ ME.md",
}
for name, data in seeds.items():
    (out / name).write_bytes(data)
    print(f"wrote {out / name} ({len(data)} bytes)")
