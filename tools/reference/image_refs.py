#!/usr/bin/env python3
"""Reference outputs of the transformers 5.17 Qwen3-VL image processor for every test image.

Run on the GPU machine (torch 2.11 CPU, torchvision 0.26, transformers 5.17, PIL 12.3):
    python3 tools/reference/make_test_images.py --out OUT
    python3 tools/reference/image_refs.py --images OUT/images --out OUT
It writes OUT/image_refs/ (refs.json, resized/<image>.u8z, MANIFEST) and copies the images to
OUT/images/ with a MANIFEST; both directories go to tests/fixtures/ (giving
tests/fixtures/images/ and tests/fixtures/image_refs/). With --pack it also packs them into
OUT/image_fixtures.tar.gz (tools/device/refs.sh packs OUT itself and does not ask for it).

Per image, refs.json holds:
  * PIL: format, mode, size as opened; crc32/sha256/sum of PIL's convert("RGB") bytes
    (H, W, 3) - the decode/convert reference, separate from the resize;
  * the processor (Qwen2VLImageProcessor, torchvision backend, CPU, the Qwen3-VL
    preprocessor_config of spec §3) called on the PIL image: image_grid_thw, pixel_values
    shape, float64 sum and sum of squares, crc32 of the float32 bytes;
  * the resized uint8 image (before normalisation): its size, crc32/sha256, and the bytes
    themselves (zlib, resized/<image>.u8z, (H, W, 3) row-major) - every row for images up to
    1.2 M resized pixels, every 32nd row (listed in "resized_rows") above that, none when the
    size is unchanged ("resized_is_decoded": the reference returns the decoded image as is).
The script checks that pixel_values == patchify((resized - 127.5) / 127.5) bit for bit, so the
stored uint8 image determines the reference tensor exactly.
Also recorded, for information only: the crc32 of torchvision.io.decode_image(..., RGB) of the
file (the decoder transformers uses when handed a path or URL instead of a PIL image).
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import sys
import tarfile
import zlib

FULL_LIMIT = 1_200_000  # resized pixels up to which every row is stored
ROW_STEP = 32           # above it, every 32nd row

PREPROCESSOR_CONFIG = dict(
    do_convert_rgb=True, do_resize=True, resample=3, do_rescale=True, rescale_factor=0.00392156862745098,
    do_normalize=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16, temporal_patch_size=2, merge_size=2)


def crc(b):
    return zlib.crc32(b) & 0xFFFFFFFF


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", required=True, help="directory written by make_test_images.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pack", action="store_true", help="also write OUT/image_fixtures.tar.gz")
    args = ap.parse_args()

    import numpy as np
    import PIL
    import torch
    import torchvision
    import transformers
    from PIL import Image
    from torchvision.transforms.v2 import functional as tvF
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor, smart_resize

    torch.manual_seed(0)
    capability = torch.backends.cpu.get_cpu_capability()
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "torchvision": torchvision.__version__,
                "transformers": transformers.__version__, "PIL": PIL.__version__, "numpy": np.__version__,
                "cpu_capability": capability, "machine": platform.machine(), "threads": torch.get_num_threads()}
    print("image_refs:", json.dumps(versions))
    if not transformers.__version__.startswith("5.17"):
        print(f"image_refs: WARNING: expected transformers 5.17, got {transformers.__version__}")

    proc = Qwen2VLImageProcessor(**PREPROCESSOR_CONFIG)
    print(f"image_refs: processor {type(proc).__name__} backend={getattr(proc, 'backend', '?')}")

    refs_dir = os.path.join(args.out, "image_refs")
    resized_dir = os.path.join(refs_dir, "resized")
    os.makedirs(resized_dir, exist_ok=True)
    images_out = os.path.join(args.out, "images")
    if os.path.abspath(images_out) != os.path.abspath(args.images):
        shutil.copytree(args.images, images_out, dirs_exist_ok=True)

    names = sorted(n for n in os.listdir(args.images) if n.split(".")[-1] in ("jpg", "png", "webp"))
    if len(names) < 30:
        sys.exit(f"image_refs: only {len(names)} images in {args.images}")
    entries = []
    failures = 0
    for name in names:
        path = os.path.join(args.images, name)
        e = {"name": name}
        with open(path, "rb") as f:
            data = f.read()
        im = Image.open(path)
        e.update(format=im.format, mode=im.mode, width=im.size[0], height=im.size[1])
        # transformers' convert_to_rgb: convert only when the mode is not RGB.
        rgb = im if im.mode == "RGB" else im.convert("RGB")
        rgb_bytes = np.asarray(rgb, dtype=np.uint8).tobytes()
        e.update(rgb_crc32=crc(rgb_bytes), rgb_sha256=hashlib.sha256(rgb_bytes).hexdigest(),
                 rgb_sum=int(np.frombuffer(rgb_bytes, np.uint8).sum(dtype=np.int64)))

        # The processor end to end, on a freshly opened PIL image (as a user would call it).
        out = proc(images=Image.open(path), return_tensors="pt")
        pv = out["pixel_values"]
        grid = out["image_grid_thw"].tolist()[0]
        if pv.dtype != torch.float32:
            sys.exit(f"image_refs: {name}: pixel_values dtype {pv.dtype}")
        pv_np = pv.contiguous().numpy()
        e.update(image_grid_thw=grid, pv_shape=list(pv_np.shape), tokens=int(np.prod(grid)) // 4,
                 pv_sum=float(pv_np.astype(np.float64).sum()), pv_sumsq=float((pv_np.astype(np.float64) ** 2).sum()),
                 pv_crc32=crc(pv_np.tobytes()))

        # The resized uint8 image, through the same calls TorchvisionBackend makes.
        t = tvF.pil_to_tensor(rgb).unsqueeze(0)
        h, w = smart_resize(t.shape[-2], t.shape[-1], factor=32, min_pixels=65536, max_pixels=16777216)
        resized = tvF.resize(t, [h, w], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)
        if resized.dtype != torch.uint8:
            sys.exit(f"image_refs: {name}: resized dtype {resized.dtype}")
        hwc = resized[0].permute(1, 2, 0).contiguous().numpy()
        e.update(resized_height=int(h), resized_width=int(w), resized_crc32=crc(hwc.tobytes()),
                 resized_sha256=hashlib.sha256(hwc.tobytes()).hexdigest(),
                 resized_sum=int(hwc.sum(dtype=np.int64)))
        # pixel_values must be (u8 - 127.5) / 127.5 patchified (spec §3.6) - checked bit for bit.
        x = (resized.to(torch.float32) - 127.5) / 127.5
        gh, gw = h // 16, w // 16
        patches = x.reshape(1, 3, gh // 2, 2, 16, gw // 2, 2, 16).permute(0, 2, 5, 3, 6, 1, 4, 7)
        mine = patches.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, 2, -1, -1).reshape(gh * gw, 3 * 2 * 16 * 16)
        same = bool(torch.equal(mine, pv))
        e["pv_equals_patchified_resized"] = same
        if not same:
            failures += 1
            print(f"image_refs: ERROR {name}: pixel_values differ from patchify((u8 - 127.5) / 127.5): "
                  f"max |d| = {float((mine - pv).abs().max())}")
            # Which arithmetic does the processor use then? (diagnostic for the C++ side)
            u = resized.to(torch.float32)
            for label, cand in (("(u*(1/255)-0.5)/0.5", (u * (1 / 255) - 0.5) / 0.5),
                                ("(u-127.5)*(1/127.5)", (u - 127.5) * (1 / 127.5)),
                                ("u*(1/127.5)-1", u * (1 / 127.5) - 1)):
                c = cand.reshape(1, 3, gh // 2, 2, 16, gw // 2, 2, 16).permute(0, 2, 5, 3, 6, 1, 4, 7)
                c = c.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, 2, -1, -1).reshape(gh * gw, 1536)
                if torch.equal(c, pv):
                    e["pv_formula"] = label
                    print(f"image_refs:   {name}: pixel_values match {label}")
        if (h, w) == (rgb.size[1], rgb.size[0]):
            # torchvision returns the input unchanged: the reference uint8 image is the decoded
            # one (rgb_sha256), nothing more to store.
            e["resized_is_decoded"] = True
        else:
            if h * w <= FULL_LIMIT:
                rows = list(range(h))
            else:
                rows = list(range(0, h, ROW_STEP))
                e["resized_rows"] = rows
            with open(os.path.join(resized_dir, name + ".u8z"), "wb") as f:
                f.write(zlib.compress(np.ascontiguousarray(hwc[rows]).tobytes(), 9))

        try:
            from torchvision.io import ImageReadMode, decode_image
            tv = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
            e["tv_decode_crc32"] = crc(tv.permute(1, 2, 0).contiguous().numpy().tobytes())
        except Exception as ex:  # information only
            e["tv_decode_error"] = str(ex)[:200]
        entries.append(e)
        print(f"  {name:32s} {e['format']:5s} {e['mode']:5s} {e['width']}x{e['height']} -> {w}x{h} "
              f"grid {grid} tokens {e['tokens']} pv_sum {e['pv_sum']:.6f} "
              f"tv_decode_same={e.get('tv_decode_crc32') == e['rgb_crc32']} pv_check={same}")

    refs = {"versions": versions, "preprocessor_config": PREPROCESSOR_CONFIG, "full_limit": FULL_LIMIT,
            "row_step": ROW_STEP, "images": entries}
    with open(os.path.join(refs_dir, "refs.json"), "w") as f:
        json.dump(refs, f, indent=1)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    manifest = (f"script: tools/reference/image_refs.py (after tools/reference/make_test_images.py)\n"
                f"command: python3 tools/reference/make_test_images.py --out OUT && "
                f"python3 tools/reference/image_refs.py --images OUT/images --out OUT\n"
                f"versions: {json.dumps(versions)}\nseed: make_test_images SEED=1234 (content seeds per image)\n"
                f"date: {date}\n")
    with open(os.path.join(refs_dir, "MANIFEST"), "w") as f:
        f.write(manifest + "contents: refs.json (per-image references, see the script's docstring), "
                "resized/<image>.u8z (zlib, uint8 HWC rows)\n")
    with open(os.path.join(images_out, "MANIFEST"), "w") as f:
        f.write(manifest + "contents: the test images written by make_test_images.py (PIL's encoders plus "
                "the script's own PNG and YCCK JPEG writers)\n")
    sizes = {d: sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
             for d in (images_out, refs_dir)}
    print(f"image_refs: {len(entries)} images, {failures} pixel_values check failures; "
          + ", ".join(f"{d} {n / 1e6:.2f} MB" for d, n in sizes.items()))
    if args.pack:
        tar_path = os.path.join(args.out, "image_fixtures.tar.gz")
        with tarfile.open(tar_path, "w:gz") as tar:
            tar.add(images_out, arcname="images")
            tar.add(refs_dir, arcname="image_refs")
        print(f"image_refs: wrote {tar_path} ({os.path.getsize(tar_path) / 1e6:.2f} MB)")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
