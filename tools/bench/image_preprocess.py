#!/usr/bin/env python3
"""Side-by-side timing of image preprocessing on this machine's CPU: the transformers 5.17
Qwen3-VL image processor (PIL decode + torchvision backend, default caps) against
`qvl inspect-image --bench`, on the same file (default: the committed 12 MP JPEG).

    python3 tools/bench/image_preprocess.py [--file tests/fixtures/images/j09_12mp.jpg]
        [--qvl build-dev/qvl] [--runs 7]

Both sides measure decode + preprocess to pixel_values with the file already in memory
(the page cache); transformers reports its best and median run, qvl the median and minimum
of its own runs. Prints one JSON object and a markdown table row for bench/RESULTS.md."""
import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", default="tests/fixtures/images/j09_12mp.jpg")
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    if not os.path.exists(args.file):
        sys.exit(f"image_preprocess: {args.file} not found (unpack the image fixtures first)")

    import torch
    import transformers
    import PIL
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    proc = Qwen2VLImageProcessor(
        do_convert_rgb=True, do_resize=True, resample=3, do_rescale=True, rescale_factor=0.00392156862745098,
        do_normalize=True, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16, temporal_patch_size=2, merge_size=2)
    with open(args.file, "rb") as f:
        data = f.read()

    def once():
        t0 = time.perf_counter()
        im = Image.open(io.BytesIO(data))
        out = proc(images=im, return_tensors="pt")
        t1 = time.perf_counter()
        return (t1 - t0) * 1e3, out

    _, out = once()  # warm-up
    hf = [once()[0] for _ in range(args.runs)]
    grid = out["image_grid_thw"].tolist()[0]

    env = dict(os.environ)
    lib = os.path.join(os.path.dirname(os.path.abspath(args.qvl)), "lib")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    r = subprocess.run([args.qvl, "inspect-image", "--json", "--bench", str(args.runs), args.file],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"image_preprocess: qvl failed ({r.returncode}): {r.stderr.strip()}")
    q = json.loads(r.stdout)
    if q["image_grid_thw"] != grid:
        sys.exit(f"image_preprocess: grids differ: qvl {q['image_grid_thw']} vs transformers {grid}")

    result = {
        "file": args.file, "image": f"{q['width']}x{q['height']}", "resized": f"{q['resized_width']}x{q['resized_height']}",
        "image_grid_thw": grid, "runs": args.runs, "cpu_threads_torch": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
        "PIL": PIL.__version__,
        "transformers_ms": {"best": min(hf), "median": statistics.median(hf)},
        "qvl_ms": {"median": q["bench"]["median_ms"], "min": q["bench"]["min_ms"]},
    }
    result["speedup_median"] = result["transformers_ms"]["median"] / result["qvl_ms"]["median"]
    result["qvl_at_least_as_fast"] = result["qvl_ms"]["median"] <= result["transformers_ms"]["best"]
    print(json.dumps(result, indent=2))
    print(f"| image preprocess {result['image']} -> {result['resized']} | transformers best "
          f"{result['transformers_ms']['best']:.1f} ms / median {result['transformers_ms']['median']:.1f} ms | "
          f"qvl median {result['qvl_ms']['median']:.1f} ms | x{result['speedup_median']:.2f} |")


if __name__ == "__main__":
    main()
