"""What every domain provides: a seeded task generator, a verifier, a prompt format, rewards."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    answer: str
    subset: str  # for per-subset scores, e.g. the number of operands


# A reward component scores one completion of one task; 0.0 is the floor, 1.0 a full score.
RewardFn = Callable[[Task, str], float]


class Domain(Protocol):
    name: str
    #: Every character the embedded character-level tokenizer must know.
    alphabet: str

    @property
    def reward_components(self) -> dict[str, RewardFn]: ...

    def tasks(self, split: str) -> Sequence[Task]: ...

    def demonstration(self, task: Task, rng: random.Random | None = None) -> str:
        """A completion for the supervised warm-up of the embedded policy; `rng` lets a domain
        mix demonstration styles reproducibly."""
        ...

    def is_correct(self, task: Task, completion: str) -> bool: ...
