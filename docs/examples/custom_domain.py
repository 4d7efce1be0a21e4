"""An example custom domain: reverse a word.

Copy this file to `<workspace>/domains/reverse.py` and select it in `workspace.toml`:

    [domain]
    name = "custom"
    module = "reverse"
    seed = 7
    options = { train_size = 2000, val_size = 200, max_length = 6 }

A task's prompt is ``rev:cabbage\\n``-style text; the policy answers with the reversed word
(``egabbac``). The interface is documented in docs/custom_domains.md; every piece below is one
part of it. This file runs inside the evotui process (it is your code, not the policy's), so
it may import anything installed in the evotui environment.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Tasks must be `engine.domains.base.Task`: (task_id, prompt, answer, subset).
from engine.domains.base import Task

LETTERS = "abcdefghij"


@dataclass
class ReverseDomain:
    seed: int = 0
    train_size: int = 2000
    val_size: int = 200
    min_length: int = 3
    max_length: int = 6
    #: Share of warm-up demonstrations with two letters swapped, so the first version is only
    #: partly competent and RL has something to improve.
    demo_flaw_rate: float = 0.3

    # `name` labels the domain in the workbench; `alphabet` lists every character of prompts and
    # completions: the embedded character-level policy gets one token per character. The loader
    # checks that prompts and demonstrations use no other character.
    name: str = "reverse"
    alphabet: str = LETTERS + "rev:\n"

    def __post_init__(self) -> None:
        # Draw val first from its own random stream, then train without val's prompts: the
        # held-out split is really held out, and both depend on the seed alone.
        val = self._draw("val", self.val_size, exclude=set())
        train = self._draw("train", self.train_size, exclude={t.prompt for t in val})
        self._splits = {"train": train, "val": val}

    def _draw(self, split: str, count: int, exclude: set[str]) -> list[Task]:
        rng = random.Random(f"reverse:{self.seed}:{split}")
        tasks: list[Task] = []
        seen = set(exclude)
        while len(tasks) < count:
            length = rng.randint(self.min_length, self.max_length)
            word = "".join(rng.choice(LETTERS) for _ in range(length))
            prompt = f"rev:{word}\n"
            if prompt in seen:
                continue
            seen.add(prompt)
            # task ids must be unique across both splits; `subset` groups per-subset scores.
            tasks.append(Task(f"{split}-{len(tasks):05d}", prompt, word[::-1], f"len{length}"))
        return tasks

    # -- the Domain protocol ------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Task]:
        """The fixed tasks of a split: 'train' (trained on) or 'val' (held out, evaluated)."""
        return self._splits[split]

    def demonstration(self, task: Task, rng: random.Random | None = None) -> str:
        """A completion for the supervised warm-up of the embedded policy. Without `rng` it is
        correct; with `rng`, some are flawed on purpose (mixed quality, as real SFT data)."""
        answer = task.answer
        if rng is not None and len(answer) > 1 and rng.random() < self.demo_flaw_rate:
            i = rng.randrange(len(answer) - 1)
            answer = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]
        return answer

    def is_correct(self, task: Task, completion: str) -> bool:
        """The verifier: what the held-out score counts."""
        return completion.strip() == task.answer

    @property
    def reward_components(self) -> dict[str, Callable[[Task, str], float]]:
        """Named reward components; `[recipe.rewards]` in workspace.toml weighs them. Calling the
        binary one "correctness" lets the harness's score layer use it as the primary metric."""
        return {"correctness": correctness, "format": format_reward, "similarity": similarity}


# Reward components take (task, completion) and return a float; 0.0 is the floor, 1.0 a full
# score. They must never raise, also not on an empty or malformed completion.
def correctness(task: Task, completion: str) -> float:
    return 1.0 if completion.strip() == task.answer else 0.0


def format_reward(task: Task, completion: str) -> float:
    """1.0 when the completion is one word of the task's letters and nothing else."""
    word = completion.strip()
    return 1.0 if word and set(word) <= set(LETTERS) else 0.0


def similarity(task: Task, completion: str) -> float:
    """Continuous: the share of positions right (a denser signal than correctness)."""
    word = completion.strip()
    if not word:
        return 0.0
    right = sum(a == b for a, b in zip(word, task.answer, strict=False))
    return right / max(len(word), len(task.answer))


def make_domain(seed: int, options: dict[str, Any]) -> ReverseDomain:
    """Called with `[domain] seed` and `[domain] options` from workspace.toml. (A module can
    instead define a fixed `DOMAIN = ReverseDomain()`, which takes neither.)"""
    return ReverseDomain(seed=seed, **options)
