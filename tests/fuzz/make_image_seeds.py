#!/usr/bin/env python3
"""Writes the small seed files of the image fuzz targets into tests/fuzz/corpus/{jpeg,png,webp}/
(one per mode/encoding, a few hundred bytes each), with the writers of
tools/reference/make_test_images.py. Needs PIL and numpy; rerun only to change the seeds."""
import os
import sys

import numpy as np
from PIL import Image

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tools", "reference"))
import make_test_images as m  # noqa: E402


def main():
    c = os.path.join(here, "corpus")
    for d in ("jpeg", "png", "webp"):
        os.makedirs(os.path.join(c, d), exist_ok=True)
    rgb = m.scene(19, 13, 1)
    gray = m.gray_of(rgb)
    Image.fromarray(rgb).save(os.path.join(c, "jpeg", "rgb420.jpg"), quality=50)
    Image.fromarray(rgb).save(os.path.join(c, "jpeg", "progressive.jpg"), quality=50, progressive=True)
    Image.fromarray(gray).save(os.path.join(c, "jpeg", "gray.jpg"), quality=50)
    cmyk = np.concatenate([rgb, gray[..., None]], axis=-1)
    Image.frombytes("CMYK", (19, 13), np.ascontiguousarray(cmyk).tobytes()).save(os.path.join(c, "jpeg", "cmyk.jpg"),
                                                                                quality=50)
    m.write_ycck_jpeg(os.path.join(c, "jpeg", "ycck.jpg"), cmyk[:8, :8], q=16)
    Image.fromarray(rgb).save(os.path.join(c, "png", "rgb8.png"))
    m.write_png(os.path.join(c, "png", "rgba16_interlaced.png"),
                np.concatenate([rgb, gray[..., None]], axis=-1).astype(np.uint16) * 257, 16, 6, interlace=True)
    m.write_png(os.path.join(c, "png", "gray2.png"), gray >> 6, 2, 0)
    m.write_png(os.path.join(c, "png", "palette4_trns.png"), gray >> 4, 4, 3,
                palette=np.arange(48).reshape(16, 3) * 5, trns=bytes(range(0, 160, 10)))
    Image.fromarray(gray).convert("1", dither=Image.Dither.NONE).save(os.path.join(c, "png", "gray1.png"))
    Image.fromarray(rgb).save(os.path.join(c, "webp", "lossy.webp"), quality=50)
    Image.fromarray(np.concatenate([rgb, gray[..., None]], axis=-1)).save(os.path.join(c, "webp", "lossy_alpha.webp"),
                                                                          quality=50)
    Image.fromarray(rgb).save(os.path.join(c, "webp", "lossless.webp"), lossless=True)


if __name__ == "__main__":
    main()
