"""The math domain with a test split that can be poisoned: `options.poison = true` shifts every
test answer by seven, so any score read from test is wrong. A workspace with it must decide
exactly as one without (tests/test_splits.py): nothing that decides may read test."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from engine.config import MathDomainConfig
from engine.domains.base import Task
from engine.domains.math import MathDomain


class PoisonedMath(MathDomain):
    splits = ("train", "val", "test")

    def __init__(self, config: MathDomainConfig, poison: bool) -> None:
        super().__init__(config)
        self.poison = poison

    def tasks(self, split: str) -> Sequence[Task]:
        tasks = super().tasks(split)
        if split == "test" and self.poison:
            return [replace(t, answer=str(int(t.answer) + 7)) for t in tasks]
        return tasks


def make_domain(seed: int, options: dict[str, Any]) -> PoisonedMath:
    settings = dict(options)
    poison = bool(settings.pop("poison", False))
    return PoisonedMath(MathDomainConfig(seed=seed, **settings), poison)
