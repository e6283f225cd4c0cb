"""A few thousand lines of mixed text for tokenizer parity: prose, Python source, numbers,
non-Latin scripts, emoji, odd whitespace. Deterministic (seeded); nothing downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import runtime.models

SCRIPTS = [
    "Москва — столица России, крупнейший по численности населения город страны.",
    "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
    "東京は日本の首都であり、世界最大級の都市圏を形成している。カタカナとひらがな。",
    "서울은 대한민국의 수도이며 최대 도시이다.",
    "القاهرة هي عاصمة جمهورية مصر العربية وأكبر مدنها.",
    "नई दिल्ली भारत की राजधानी है और एक बड़ा महानगर है।",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "ירושלים היא בירת ישראל.",
    "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย",
    "Ça coûte 12,50 € — déjà vu, naïve façade, Straße, smørrebrød, Œuvre.",
]
EMOJI = ["😀", "🚀", "👩‍💻", "🇫🇷", "❤️", "👍🏽", "🧪", "🐍", "✅", "🎉", "🤖", "☕"]


def mixed_lines(count: int = 3000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prose = (Path(runtime.models.__file__).parent / "corpus.txt").read_text().splitlines()
    code = Path(json.__file__).parent.joinpath("decoder.py").read_text().splitlines()
    code += Path(random.__file__).read_text().splitlines()[:1500]
    pools = [
        [line for line in prose if line.strip()],
        [line for line in code if line.strip()],
        SCRIPTS,
    ]
    lines: list[str] = []
    while len(lines) < count:
        kind = rng.randrange(6)
        if kind < 3:
            line = rng.choice(pools[kind])
        elif kind == 3:  # numbers in the forms text uses them
            line = " ".join(
                rng.choice(
                    [
                        str(rng.randrange(10**9)),
                        f"{rng.uniform(-1e4, 1e4):.3f}",
                        f"{rng.randrange(1, 13)}/{rng.randrange(1, 29)}/20{rng.randrange(10, 30)}",
                        f"0x{rng.randrange(1 << 32):08x}",
                        f"{rng.randrange(100)}%",
                        f"{rng.random():.2e}",
                    ]
                )
                for _ in range(rng.randrange(1, 8))
            )
        elif kind == 4:  # emoji mixed into words
            words = rng.choice(pools[0]).split()[:8]
            line = " ".join(w + (rng.choice(EMOJI) if rng.random() < 0.4 else "") for w in words)
        else:  # fragments glued with unusual whitespace
            parts = [rng.choice(rng.choice(pools))[: rng.randrange(1, 40)] for _ in range(3)]
            line = rng.choice(["\t", "  ", "\n", " \n ", "\u00a0", ""]).join(parts)
        lines.append(line)
    return lines
