"""The word problems of the `dataset` template: a generated stand-in for a GSM8K-style file.

Each row has a prompt, a numeric answer and a worked solution (the warm-up's reference
completion), as a user's own data would. `sample_workspace/variants/dataset/word_problems.jsonl`
is `write_jsonl(path, word_problems(SAMPLE_ROWS, SAMPLE_SEED))`; a test holds it to that.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SAMPLE_ROWS = 3000
SAMPLE_SEED = 7

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gita", "Hugo", "Ines", "Jon")
_THINGS = ("apples", "books", "coins", "shells", "stamps", "marbles", "pens", "cards")


def word_problems(count: int, seed: int) -> list[dict[str, str]]:
    """`count` distinct problems: a start, then one or two gains or losses."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(rows) < count:
        name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        total = rng.randint(2, 40)
        sentences = [f"{name} has {total} {thing}."]
        steps = []
        for _ in range(rng.randint(1, 2)):
            amount = rng.randint(1, 20)
            if rng.random() < 0.5 or amount > total:
                sentences.append(f"{name} gets {amount} more.")
                steps.append(f"{total}+{amount}={total + amount}.")
                total += amount
            else:
                sentences.append(f"{name} gives away {amount}.")
                steps.append(f"{total}-{amount}={total - amount}.")
                total -= amount
        prompt = " ".join(sentences) + f" How many {thing} does {name} have now?"
        if prompt in seen:
            continue
        seen.add(prompt)
        solution = " ".join(steps) + f" Answer: {total}"
        rows.append({"id": f"wp-{len(rows):05d}", "prompt": prompt, "answer": str(total), "solution": solution})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
