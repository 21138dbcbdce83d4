#!/usr/bin/env python3
"""Writes the image pipeline's test images (deterministic, seed 1234) and assets/example.jpg.

Run on the GPU machine (PIL 12.3, numpy 2.5):
    python3 tools/reference/make_test_images.py --out OUT
writes OUT/images/<name>.{jpg,png,webp} (committed as tests/fixtures/images/) and
OUT/example.jpg. Every format and PIL mode the decoders handle is covered, plus odd sizes
(1x1, 3x5, 31x33, 40x6000, 6000x40, exact multiples of 32 that skip the resize, 12 MP).
Encodings PIL cannot write (16-bit RGB/RGBA/LA PNG, 2/4-bit gray and palette PNG, interlaced
PNG, PNG with tRNS on RGB, YCCK JPEG) come from the small writers below (zlib + struct).
"""
import argparse
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageDraw

SEED = 1234


# ---------------------------------------------------------------- content

def scene(w, h, seed, noise=6.0):
    """Natural-ish float RGB content in [0, 255]: gradients, soft blobs, hard edges, strokes,
    light noise. Deterministic in (w, h, seed)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    u = x / max(w - 1, 1)
    v = y / max(h - 1, 1)
    img = np.empty((h, w, 3))
    img[..., 0] = 40 + 160 * u + 30 * np.sin(6.0 * v + seed)
    img[..., 1] = 60 + 120 * v + 25 * np.cos(5.0 * u * (1 + seed % 3))
    img[..., 2] = 200 - 150 * u * v
    for _ in range(4):  # soft blobs
        cx, cy = rng.random() * w, rng.random() * h
        r = (0.1 + 0.3 * rng.random()) * max(w, h)
        d = ((x - cx) ** 2 + (y - cy) ** 2) / (r * r)
        img += np.exp(-d)[..., None] * (rng.random(3) * 120 - 60)
    # hard-edged rectangle and a checker patch
    x0, y0 = int(w * 0.55), int(h * 0.15)
    img[y0:y0 + max(1, h // 5), x0:x0 + max(1, w // 4)] = rng.random(3) * 255
    cell = max(1, min(w, h) // 16)
    checker = ((x // cell + y // cell) % 2 == 0) & (u < 0.3) & (v > 0.6)
    img[checker] = 235
    img += rng.normal(0, noise, img.shape)
    img = np.clip(img, 0, 255)
    out = Image.fromarray(np.round(img).astype(np.uint8))
    draw = ImageDraw.Draw(out)
    for i in range(6):  # text-like strokes
        px = int(w * (0.1 + 0.12 * i))
        py = int(h * 0.75)
        s = max(2, min(w, h) // 20)
        draw.line([(px, py), (px + s, py - 2 * s), (px + 2 * s, py)], fill=(20, 20, 20), width=max(1, s // 4))
        draw.line([(px + s // 2, py - s), (px + 3 * s // 2, py - s)], fill=(20, 20, 20), width=max(1, s // 5))
    return np.asarray(out)


def gray_of(rgb):
    return np.round(rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)


# ---------------------------------------------------------------- PNG writer

def _chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def _pack_rows(samples, bit_depth):
    """samples: (h, n) integer array of one row's samples -> list of bytes rows."""
    rows = []
    for row in samples:
        if bit_depth == 16:
            rows.append(row.astype(">u2").tobytes())
        elif bit_depth == 8:
            rows.append(row.astype(np.uint8).tobytes())
        else:
            per = 8 // bit_depth
            padded = np.zeros(((len(row) + per - 1) // per) * per, dtype=np.int64)
            padded[:len(row)] = row
            padded = padded.reshape(-1, per)
            shifts = np.array([8 - bit_depth * (k + 1) for k in range(per)])
            rows.append((padded << shifts).sum(axis=1).astype(np.uint8).tobytes())
    return rows


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def write_png(path, pixels, bit_depth, color_type, palette=None, trns=None, interlace=False):
    """pixels: (h, w) or (h, w, channels) integer array of samples (indices for palette)."""
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    h, w, ch = pixels.shape
    raw = b""
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for (x0, y0, dx, dy) in passes:
        sub = pixels[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for r in _pack_rows(sub.reshape(sub.shape[0], -1), bit_depth):
            raw += b"\x00" + r  # filter type 0
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
    if palette is not None:
        data += _chunk(b"PLTE", bytes(np.asarray(palette, dtype=np.uint8).reshape(-1)))
    if trns is not None:
        data += _chunk(b"tRNS", trns)
    data += _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- YCCK JPEG writer

def write_ycck_jpeg(path, planes, q=3):
    """Baseline JPEG with four 1x1-sampled components and an Adobe APP14 marker with
    transform 2 (YCCK), so libjpeg converts YCCK -> CMYK on decode. `planes` (h, w, 4) uint8
    are stored as the Y, Cb, Cr, K samples. One flat quantisation table; Huffman tables
    whose codes are fixed-length (DC: 12 symbols x 4 bits, AC: 162 symbols x 8 bits), valid
    canonical codes that need no frequency tables."""
    h, w, _ = planes.shape
    n = 8
    k = np.arange(n)
    c = np.sqrt(2.0 / n) * np.cos((2 * k[None, :] + 1) * k[:, None] * np.pi / (2 * n))
    c[0, :] = np.sqrt(1.0 / n)
    zz = sorted(((i, j) for i in range(8) for j in range(8)),
                key=lambda p: (p[0] + p[1], p[1] if (p[0] + p[1]) % 2 == 0 else p[0]))
    ac_symbols = [0x00, 0xF0] + [(r << 4) | s for r in range(16) for s in range(1, 11)]
    ac_code = {sym: i for i, sym in enumerate(ac_symbols)}

    bits = []

    def put(value, length):
        for b in range(length - 1, -1, -1):
            bits.append((value >> b) & 1)

    def magnitude(v):
        s = int(abs(v)).bit_length()
        return s, (v if v >= 0 else v + (1 << s) - 1)

    ph = (h + 7) // 8 * 8
    pw = (w + 7) // 8 * 8
    padded = np.pad(planes.astype(np.float64), ((0, ph - h), (0, pw - w), (0, 0)), mode="edge")
    pred = [0, 0, 0, 0]
    for by in range(0, ph, 8):
        for bx in range(0, pw, 8):
            for comp in range(4):
                block = padded[by:by + 8, bx:bx + 8, comp] - 128.0
                coef = np.round(c @ block @ c.T / q).astype(int)
                seq = [coef[i, j] for (i, j) in zz]
                s, m = magnitude(seq[0] - pred[comp])
                pred[comp] = seq[0]
                put(s, 4)
                if s:
                    put(m, s)
                run = 0
                last = max([i for i in range(1, 64) if seq[i] != 0], default=0)
                for i in range(1, last + 1):
                    if seq[i] == 0:
                        run += 1
                        continue
                    while run > 15:
                        put(ac_code[0xF0], 8)
                        run -= 16
                    s, m = magnitude(seq[i])
                    if s > 10:
                        raise ValueError("coefficient out of baseline range")
                    put(ac_code[(run << 4) | s], 8)
                    put(m, s)
                    run = 0
                if last < 63:
                    put(ac_code[0x00], 8)
    while len(bits) % 8:
        bits.append(1)
    entropy = bytearray()
    for i in range(0, len(bits), 8):
        byte = int("".join(map(str, bits[i:i + 8])), 2)
        entropy.append(byte)
        if byte == 0xFF:
            entropy.append(0x00)

    def seg(marker, payload):
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    out = b"\xff\xd8"
    out += seg(0xEE, b"Adobe" + struct.pack(">HHHB", 100, 0, 0, 2))
    out += seg(0xDB, bytes([0]) + bytes([q] * 64))
    out += seg(0xC0, struct.pack(">BHHB", 8, h, w, 4) + b"".join(bytes([i + 1, 0x11, 0]) for i in range(4)))
    dc_bits = [0] * 16
    dc_bits[3] = 12
    ac_bits = [0] * 16
    ac_bits[7] = len(ac_symbols)
    out += seg(0xC4, bytes([0x00]) + bytes(dc_bits) + bytes(range(12)) +
               bytes([0x10]) + bytes(ac_bits) + bytes(ac_symbols))
    out += seg(0xDA, bytes([4]) + b"".join(bytes([i + 1, 0x00]) for i in range(4)) + bytes([0, 63, 0]))
    out += bytes(entropy) + b"\xff\xd9"
    with open(path, "wb") as f:
        f.write(out)


# ---------------------------------------------------------------- example scene

def example_scene():
    """A pleasant 640x480 landscape: sky gradient, sun, mountains, lake, trees, a house."""
    w, h = 640, 480
    y = np.linspace(0, 1, h)[:, None]
    sky = np.stack([110 + 100 * y, 160 + 70 * y, 235 - 20 * y], axis=-1) * np.ones((1, w, 1))
    im = Image.fromarray(np.clip(sky, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    d.ellipse([470, 50, 550, 130], fill=(255, 225, 120))
    d.polygon([(0, 300), (120, 170), (230, 280), (340, 150), (470, 290), (560, 200), (640, 260), (640, 330), (0, 330)],
              fill=(90, 105, 130))
    d.polygon([(300, 185), (340, 150), (378, 190), (360, 185), (340, 170)], fill=(240, 245, 250))
    d.rectangle([0, 320, 640, 480], fill=(80, 150, 70))
    d.ellipse([60, 360, 330, 450], fill=(70, 130, 190))
    for tx in (380, 420, 600):
        d.rectangle([tx - 5, 330, tx + 5, 370], fill=(100, 70, 40))
        d.polygon([(tx - 28, 340), (tx, 265), (tx + 28, 340)], fill=(30, 100, 45))
    d.rectangle([460, 330, 560, 400], fill=(200, 170, 130))
    d.polygon([(450, 332), (510, 285), (570, 332)], fill=(160, 60, 50))
    d.rectangle([500, 360, 522, 400], fill=(90, 60, 40))
    d.rectangle([470, 345, 490, 362], fill=(170, 210, 240))
    rng = np.random.default_rng(SEED)
    arr = np.asarray(im).astype(np.float64) + rng.normal(0, 2.0, (h, w, 3))
    return Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8))


# ---------------------------------------------------------------- the list

def build(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    made = []

    def path(name):
        made.append(name)
        return os.path.join(out_dir, name)

    def rgb(w, h, s, noise=6.0):
        return scene(w, h, s, noise)

    # JPEG (PIL's encoder)
    Image.fromarray(rgb(640, 480, 1)).save(path("j01_rgb_420_q85.jpg"), quality=85)
    Image.fromarray(rgb(317, 203, 2)).save(path("j02_rgb_444_q95.jpg"), quality=95, subsampling=0)
    Image.fromarray(rgb(333, 251, 3)).save(path("j03_rgb_422_q80.jpg"), quality=80, subsampling=1)
    Image.fromarray(rgb(500, 375, 4)).save(path("j04_progressive.jpg"), quality=85, progressive=True)
    Image.fromarray(gray_of(rgb(300, 200, 5))).save(path("j05_gray.jpg"), quality=90)
    Image.fromarray(gray_of(rgb(129, 97, 6))).save(path("j06_gray_progressive.jpg"), quality=75, progressive=True)
    cmyk = np.concatenate([255 - rgb(257, 193, 7), gray_of(rgb(257, 193, 8))[..., None] // 3], axis=-1)
    Image.frombytes("CMYK", (257, 193), np.ascontiguousarray(cmyk).tobytes()).save(path("j07_cmyk_adobe.jpg"),
                                                                                quality=90)
    ycck = np.concatenate([rgb(72, 56, 9), gray_of(rgb(72, 56, 10))[..., None] // 2], axis=-1)
    write_ycck_jpeg(path("j08_ycck_adobe.jpg"), ycck)
    # 12 MP, the benchmark input of tools/bench/image_preprocess.py (as committed: keep).
    Image.fromarray(rgb(4000, 3000, 11, noise=2.0)).save(path("j09_12mp.jpg"), quality=70)
    Image.fromarray(np.full((1, 1, 3), (200, 30, 90), np.uint8)).save(path("j10_1x1.jpg"), quality=90)
    Image.fromarray(rgb(3, 5, 12)).save(path("j11_3x5.jpg"), quality=90)
    Image.fromarray(rgb(40, 6000, 13)).save(path("j12_tall_40x6000.jpg"), quality=85)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation "rotate 90 CW": the reference does not apply it
    Image.fromarray(rgb(320, 240, 14)).save(path("j13_exif_orientation6.jpg"), quality=85, exif=exif.tobytes())
    Image.fromarray(rgb(31, 33, 15)).save(path("j14_31x33.jpg"), quality=90)
    Image.fromarray(rgb(512, 384, 16)).save(path("j15_exact_512x384.jpg"), quality=90)

    # PNG through PIL
    Image.fromarray(rgb(203, 317, 20)).save(path("p01_rgb8.png"))
    rgba = np.concatenate([rgb(256, 256, 21), np.tile(np.arange(256, dtype=np.uint8), (256, 1))[..., None]], axis=-1)
    Image.fromarray(rgba).save(path("p02_rgba8_256x256.png"))
    Image.fromarray(gray_of(rgb(100, 100, 22))).save(path("p03_gray8.png"))
    g16 = (gray_of(rgb(120, 80, 23)).astype(np.uint16) * 257)
    g16[:40, :60] //= 300  # a region below 256 so the clip to 255 is not everything
    Image.fromarray(g16).save(path("p04_gray16.png"))
    Image.fromarray(gray_of(rgb(200, 150, 24))).convert("1", dither=Image.Dither.NONE).save(path("p05_gray1.png"))
    Image.fromarray(rgb(180, 120, 25)).quantize(colors=200).save(path("p06_palette8.png"))
    la = np.stack([gray_of(rgb(77, 55, 26)), (np.arange(77 * 55) % 256).reshape(55, 77).astype(np.uint8)], axis=-1)
    Image.frombytes("LA", (77, 55), np.ascontiguousarray(la).tobytes()).save(path("p07_la8.png"))
    p = Image.fromarray(rgb(100, 75, 27)).quantize(colors=64)
    p.save(path("p08_palette_trns.png"), transparency=bytes((i * 4) % 256 for i in range(64)))
    Image.fromarray(np.full((1, 1, 3), (12, 200, 99), np.uint8)).save(path("p09_1x1.png"))
    Image.fromarray(rgb(6000, 40, 28, noise=3.0)).save(path("p10_wide_6000x40.png"))
    Image.fromarray(rgb(512, 384, 29)).save(path("p11_exact_512x384.png"))

    # PNG through the writer above (encodings PIL cannot produce)
    def to16(a, s):
        return a.astype(np.uint16) * 257 + (np.random.default_rng(s).integers(0, 257, a.shape)).astype(np.uint16)

    write_png(path("p12_rgb16.png"), to16(rgb(150, 100, 30), 30), 16, 2)
    a16 = np.concatenate([to16(rgb(97, 61, 31), 31), to16(gray_of(rgb(97, 61, 32))[..., None], 32)], axis=-1)
    write_png(path("p13_rgba16.png"), a16, 16, 6)
    la16 = np.stack([to16(gray_of(rgb(40, 30, 33)), 33), to16(gray_of(rgb(40, 30, 34)), 34)], axis=-1)
    write_png(path("p14_la16.png"), la16, 16, 4)
    write_png(path("p15_gray2.png"), gray_of(rgb(45, 30, 35)) >> 6, 2, 0)
    write_png(path("p16_gray4.png"), gray_of(rgb(50, 33, 36)) >> 4, 4, 0)
    pal = np.random.default_rng(37).integers(0, 256, (10, 3))
    idx = (gray_of(rgb(33, 31, 37)).astype(np.int64) * 16) // 256  # 0..15: 10..15 lie past the palette
    write_png(path("p17_palette4_short.png"), idx, 4, 3, palette=pal)
    write_png(path("p18_interlaced_rgb.png"), rgb(123, 77, 38), 8, 2, interlace=True)
    pal2 = np.array([[10, 20, 30], [200, 100, 50], [90, 250, 120], [255, 255, 255]])
    write_png(path("p19_interlaced_palette2.png"), gray_of(rgb(37, 29, 39)) >> 6, 2, 3, palette=pal2,
              trns=bytes([0, 255]), interlace=True)
    write_png(path("p20_rgb_trns.png"), rgb(64, 64, 40), 8, 2, trns=struct.pack(">HHH", 10, 20, 30))
    write_png(path("p21_interlaced_gray16.png"), to16(gray_of(rgb(61, 45, 41)) // 200, 41), 16, 0, interlace=True)

    # WebP (PIL's encoder)
    Image.fromarray(rgb(400, 300, 50)).save(path("w01_lossy.webp"), quality=80)
    wa = np.concatenate([rgb(301, 199, 51), gray_of(rgb(301, 199, 52))[..., None]], axis=-1)
    Image.fromarray(wa).save(path("w02_lossy_alpha.webp"), quality=80)
    Image.fromarray(rgb(256, 192, 53)).save(path("w03_lossless.webp"), lossless=True)
    wl = np.concatenate([rgb(150, 100, 54), gray_of(rgb(150, 100, 55))[..., None]], axis=-1)
    Image.fromarray(wl).save(path("w04_lossless_alpha.webp"), lossless=True)
    Image.fromarray(rgb(33, 31, 56)).save(path("w05_lossy_33x31.webp"), quality=90)
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import PIL
    print(f"make_test_images: python {sys.version.split()[0]} PIL {PIL.__version__} numpy {np.__version__}")
    names = build(os.path.join(args.out, "images"))
    total = 0
    for name in names:
        p = os.path.join(args.out, "images", name)
        size = os.path.getsize(p)
        total += size
        with Image.open(p) as im:
            im.load()  # every image must open and decode in PIL
            print(f"  {name:32s} {im.format:5s} {im.mode:5s} {im.size[0]}x{im.size[1]} {size} bytes")
    print(f"make_test_images: {len(names)} images, {total / 1e6:.2f} MB")
    if len(names) < 30:
        sys.exit("make_test_images: fewer than 30 images")
    ex = os.path.join(args.out, "example.jpg")
    example_scene().save(ex, quality=90)
    print(f"make_test_images: wrote {ex} ({os.path.getsize(ex)} bytes)")


if __name__ == "__main__":
    main()
