#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors fuzz target (tests/fuzz/corpus/safetensors/):
small valid files in the layout gen-model and the reference writer produce, plus a few
near-misses (overlap, misalignment, bad dtype, truncated data). No dependencies."""
import json
import os
import struct
import sys

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")
os.makedirs(out, exist_ok=True)


def write(name, header, data=b"", pad=True):
    text = header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))
    if pad:
        while (8 + len(text)) % 8:
            text += " "
    blob = struct.pack("<Q", len(text)) + text.encode() + data
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)


meta = {"format": "pt"}
write("valid_two.st", {"__metadata__": meta,
                       "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                       "a.scale": {"dtype": "F32", "shape": [1, 1], "data_offsets": [12, 16]}}, bytes(range(16)))
write("valid_fp8.st", {"w": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [8, 24]},
                       "s": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(24))
write("valid_all_dtypes.st", {
    "f32": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    "f16": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]},
    "i64": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]},
    "i32": {"dtype": "I32", "shape": [1], "data_offsets": [16, 20]},
    "u8": {"dtype": "U8", "shape": [2], "data_offsets": [20, 22]},
    "b": {"dtype": "BOOL", "shape": [2], "data_offsets": [22, 24]},
    "e": {"dtype": "BF16", "shape": [0, 7], "data_offsets": [24, 24]}}, bytes(24))
write("valid_5d.st", {"conv": {"dtype": "BF16", "shape": [1, 3, 2, 2, 2], "data_offsets": [0, 48]}}, bytes(48))
write("empty.st", {})
write("overlap.st", {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                     "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, bytes(8))
write("misaligned.st", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, bytes(8))
write("bad_dtype.st", {"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8))
write("truncated.st", {"a": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}}, bytes(10))
write("not_json.st", '{"a": {"dtype"', pad=False)
print("wrote", len(os.listdir(out)), "seeds to", out, file=sys.stderr)
