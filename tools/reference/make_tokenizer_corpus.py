#!/usr/bin/env python3
"""Writes the tokenizer test corpus: tests/fixtures/tokenizer/corpus.jsonl (one JSON string per
line, ASCII-escaped) and its MANIFEST. Deterministic (fixed seed), standard library only, runnable
anywhere:

    python3 tools/reference/make_tokenizer_corpus.py --out tests/fixtures/tokenizer

The corpus covers what users paste: many scripts, code, emoji (ZWJ sequences, skin tones, flags,
keycaps), combining marks and non-NFC input, whitespace and newline runs, digit runs, capitalised
contractions, special tokens inside text and near-misses of them, long strings, the empty string,
and unusual-but-valid code points. Letters and marks are taken from Unicode <= 12 so that every
regex engine and normaliser involved (Oniguruma, PCRE2, utf8proc, unicode-normalization) classifies
them alike; emoji may be newer (their class, "not a letter or digit", is the same when unassigned).
"""
import argparse
import datetime
import hashlib
import json
import os
import random
import sys

SEED = 20261122

LATIN = [
    "Élise a mangé une crème brûlée à l'hôtel.", "Größenwahn ist übermäßig: Straße, Fußgänger.",
    "Tiếng Việt có dấu: người, được, những, thủ đô Hà Nội.", "Zażółć gęślą jaźń, łódź, źdźbło.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.", "Ångström, fjörd, smørrebrød, Ærø.", "naïve café résumé coöperate",
    "Ça va? Où est la bibliothèque? «Très bien», dit-il.", "İstanbul'da ığdır şişe çiğ köfte.",
    "São Paulo, coração, pão, ação.", "Señor Muñoz comió piñata en España.", "Þórr og Óðinn í Ísafirði.",
]
CYRILLIC = ["Съешь же ещё этих мягких французских булок, да выпей чаю.", "Привет, мир! Как дела?",
            "Ґанок, їжак, єнот — українська абетка.", "Москва — столица России; 2024 год.", "ЁЛКА и ёжик"]
GREEK = ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "Καλημέρα κόσμε! Τι κάνεις;", "ΑΘΗΝΑ, Θεσσαλονίκη, ΐ ΰ"]
ARABIC = ["مرحبا بالعالم! كيف حالك؟", "اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ", "الأرقام ٠١٢٣٤٥٦٧٨٩ والسنة ٢٠٢٤"]
HEBREW = ["שלום עולם! מה שלומך?", "עִבְרִית עם ניקוד: בְּרֵאשִׁית בָּרָא", "ירושלים 2024"]
DEVANAGARI = ["नमस्ते दुनिया! आप कैसे हैं?", "हिन्दी भाषा में संख्याएँ ०१२३४५६७८९", "क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़"]
THAI = ["สวัสดีชาวโลก คุณสบายดีไหม", "ภาษาไทยไม่มีช่องว่างระหว่างคำ", "๑๒๓๔๕ บาท"]
CJK = ["你好，世界！今天天气很好。", "我喜欢学习机器学习和自然语言处理。", "北京、上海、广州、深圳",
       "漢字と繁體中文：臺灣的學生", "「引号」『书名号』——破折号……省略号"]
HANGUL = ["안녕하세요, 세계! 반갑습니다.", "한국어 문장입니다. 서울특별시 2024년", "ㄱㄴㄷㄹ ㅏㅑㅓㅕ"]
JAPANESE = ["こんにちは、世界！お元気ですか。", "カタカナとひらがなと漢字を混ぜた文章です。", "ｶﾞｷﾞｸﾞ半角カナ、ﾊﾟﾋﾟﾌﾟ",
            "東京スカイツリーは634メートルです。", "ゔぁ ゔぃ ヴェ ヷ"]
SCRIPTS = LATIN + CYRILLIC + GREEK + ARABIC + HEBREW + DEVANAGARI + THAI + CJK + HANGUL + JAPANESE

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);\n",
    "fn main() {\n    let s: &str = \"héllo\";\n    println!(\"{}\", s.len());\n}\n",
    "func main() {\n\tfmt.Println(\"Hello, 世界\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<div class=\"main\"><p>Hello &amp; welcome</p><br/></div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "for f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}';\ndone\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\r\n",
    "    \t  indented_with_mixed_tabs = True\n\n\n\tpass\n",
    "if (a != b && c <= d || !e) { x += 1; y -= 2; z *= 3; }",
    "pub struct Foo<'a> { bar: &'a str }  // lifetime 'a",
    "@decorator\nclass A(B, metaclass=Meta):\n    '''docstring'''\n    __slots__ = ('x',)\n",
    "regex = r'(?i:\\d+)\\s*[a-z]+$'",
    "#!/bin/bash\nset -euo pipefail\necho \"${HOME}/.cache\" >> /tmp/log 2>&1\n",
]

EMOJI = [
    "😀", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸🇩🇪", "1️⃣#️⃣*️⃣", "❤️", "✌🏿", "🧑🏼‍🚀", "🏴‍☠️",
    "🫠🫶🏻", "👁‍🗨", "🐻‍❄️", "🤷‍♀️", "👩🏾‍❤️‍💋‍👨🏻", "©️®️™️", "🀄🃏", "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
]

COMBINING = [
    "e\u0301", "a\u0300\u0301", "o\u0308\u0304", "A\u030a", "\u212b", "\u2126", "n\u0303", "c\u0327",
    "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af", "q\u0307\u0323", "q\u0323\u0307",
    "a\u0323\u0302", "a\u0302\u0323", "\u0915\u093c", "\u0958", "\u00c5\u0301", "i\u0307\u0301",
    "\u0041\u030a\u0327", "\u1e9b\u0323", "\u304b\u3099", "\u30cf\u309a", "\u0627\u0653", "\u05d1\u05bc",
    "\u0301leading combining", "x\u20dd", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319a\u0324l\u0317g\u031bo",
    "\uf900\uf901", "\u2fa1d", "\u0344", "\u0340\u0341", "\u1f71\u1fbb", "\u03d3\u03d4",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \n \n ",
    "\u00a0", "\u3000", "\u2003", "\u2009", "\u202f", "\u205f", "\u2028", "\u2029", "\u0085", "\u000b", "\u000c",
    "\u180e", "\u200b", "\ufeff", "\u1680", " \t \t", "\t\n\t", "    \n    ", "\u00a0\u00a0 ",
]

DIGITS = [
    "0", "7", "42", "1234567890", "3.14159265358979", "1,000,000", "-273.15", "+1 (555) 010-9999",
    "2024-11-22T03:04:05Z", "0xDEADBEEF", "1e-10", "٣٤٥", "１２３４５", "²³¹", "Ⅻ", "½ ¾ ⅞", "१२३", "১২৩",
    "999999999999999999999", "00000", "v1.2.3-rc.4",
]

CONTRACTIONS = [
    "DON'T", "He'S", "I'M", "WE'LL", "THEY'RE", "YOU'VE", "SHE'D", "it's", "IT'S", "can't", "CAN'T",
    "don’t", "DON’T", "'s", "'S", "'ll", "'LL", "'Ll", "'lL", "'ſ", "'ſt", "o'clock", "rock'n'roll",
    "'tis", "ma'am", "y'all'd've", "x'D", "''s", "'re'", " 's", "I' m",
]

SPECIALS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>", "<|vision_pad|>", "<|object_ref_start|>", "<|box_start|>", "<|quad_end|>",
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "<|fim_prefix|>", "<|file_sep|>",
]
NEAR_MISSES = [
    "<|im_start|", "|im_start|>", "<|im_end|>x", "x<|im_end|>", "< |image_pad|>", "<| image_pad |>", "<|IMAGE_PAD|>",
    "<|im_start|><|im_start|>", "<|im_end|><|im_end|>", "<<|im_start|>>", "<|im_start|im_end|>",
    "<|endoftext|", "<|endoftext||>", "<think >", "< think>", "<think/>", "</think", "<tool_call", "<|vision_start|",
    "<|im_start|>user\nhi<|im_end|>\n", "  <|im_end|>  ", "\n<|im_start|>\n", "<|im_sta<|im_end|>rt|>",
    "<|im_star", "t|>", "<|", "|>", "<||>", "<|im_end|>\u0301", "\u00e9<|im_start|>\u0301",
]

ODD_VALID = [
    "\ufffd", "\ufffd\ufffd", "\u0000", "a\u0000b", "\u0001\u0002\u001f", "\u007f", "\u0080\u0081\u009f",
    "\ud7ff", "\ue000\uf8ff", "\U000f0000", "\U0010ffff", "\ufffe\uffff", "\U0001fffe", "\u00c0\u00af",
    "\u00c3\u00a9", "\u00e2\u0080\u0099", "\u00ef\u00bb\u00bf", "\U0001d400\U0001d7ce", "\U00020000\U0002a6d6",
    "\u2060\u200d\u200c", "\u202e reversed \u202c", "\u0600\u061c\u06dd", "\ufe0f\ufe0e",
    "\U000e0041\U000e007f", "\u00ad soft hyphen", "\u034f", "\U0001f3fb",
]

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had "
         "by word but not what all were we when your can said there use an each which she do how their if will "
         "up other about out many then them these so some her would make like him into time has look two more "
         "write go see number no way could people my than first water been call who oil its now find long down "
         "day did get come made may part").split()


def sentence(rng, n):
    words = [rng.choice(WORDS) for _ in range(n)]
    if words:
        words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", "!", "?", ",", ";", ":", ""])


def fragment(rng):
    kind = rng.randrange(11)
    pools = [SCRIPTS, CODE, EMOJI, COMBINING, WHITESPACE, DIGITS, CONTRACTIONS, SPECIALS, NEAR_MISSES, ODD_VALID]
    if kind == 10:
        return sentence(rng, rng.randint(1, 12))
    return rng.choice(pools[kind])


def build(rng):
    corpus = [""]
    # Every listed item alone, and with context on both sides.
    for pool in [SCRIPTS, CODE, EMOJI, COMBINING, WHITESPACE, DIGITS, CONTRACTIONS, SPECIALS, NEAR_MISSES, ODD_VALID]:
        for item in pool:
            corpus.append(item)
            corpus.append("x " + item + " y")
            corpus.append(item + item)
    # Whitespace against words, digits and punctuation (the `\s+(?!\S)` / `\s*[\r\n]+` rules).
    for ws in WHITESPACE:
        for word in ["word", "42", "!!", "日本", "\u00e9t\u00e9", "<|im_end|>"]:
            corpus.append(word + ws + word)
            corpus.append(ws + word + ws)
            corpus.append(word + ws * 3 + word + ws)
    # Contractions in sentences, in several capitalisations.
    for c in CONTRACTIONS:
        corpus.append("I said " + c + " twice: " + c.upper() + " and " + c.lower() + ".")
    # Runs of digits of every length 1..40 (the pre-tokenizer splits digits one by one).
    for n in range(1, 41):
        corpus.append("".join(str((i * 7 + n) % 10) for i in range(n)))
        corpus.append("abc" + "9" * n + "def")
    # Random mixtures of everything.
    while len(corpus) < 2400:
        parts = [fragment(rng) for _ in range(rng.randint(1, 8))]
        seps = ["", " ", "\n", "  ", "\t", ", "]
        corpus.append("".join(p + rng.choice(seps) for p in parts))
    # Long strings.
    for k in range(12):
        corpus.append(" ".join(sentence(rng, rng.randint(5, 20)) for _ in range(60 + 40 * k)))
    for k in range(8):
        corpus.append("".join(fragment(rng) + rng.choice(["", " ", "\n"]) for _ in range(300 + 100 * k)))
    corpus += ["a" * 3000, "=" * 2000, " " * 4000, "\n" * 1000, "ab" * 1500, "\u00e9" * 1000, "日本語" * 700,
               "👍🏽" * 300, "<|im_end|>" * 200, "e\u0301" * 500,
               "".join(chr(0x41 + (i * 31) % 58) for i in range(4000)),
               "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(6000))]
    return corpus


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (tests/fixtures/tokenizer)")
    args = ap.parse_args()
    rng = random.Random(SEED)
    corpus = build(rng)
    for i, s in enumerate(corpus):
        s.encode("utf-8")  # raises on a lone surrogate: the corpus must be valid UTF-8
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "corpus.jsonl")
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    total = sum(len(s.encode("utf-8")) for s in corpus)
    with open(os.path.join(args.out, "MANIFEST"), "w") as f:
        f.write("corpus.jsonl\n")
        f.write("  script: tools/reference/make_tokenizer_corpus.py\n")
        f.write("  command: python3 " + " ".join(sys.argv) + "\n")
        f.write(f"  python: {sys.version.split()[0]}\n  seed: {SEED}\n")
        f.write(f"  date: {datetime.date.today().isoformat()}\n")
        f.write(f"  strings: {len(corpus)}\n  utf8_bytes: {total}\n  sha256: {digest}\n")
        f.write("ids.jsonl: not yet produced; run tools/reference/tokenize_corpus.py on the GPU machine\n")
    print(f"wrote {path}: {len(corpus)} strings, {total} UTF-8 bytes, sha256 {digest}")


if __name__ == "__main__":
    main()
