"""What every part of the coach works with (`CoachContext`): the engine it drives, the workspace
config, the harness layers its diagnoses use, where its reasoning goes, the rounds and the memory;
and the lookups several parts make (the diagnoses a round reasons from, the parent's control).
`CoachEvent` and `LoopResult` are what the parts report into.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.coach.gates import Gate
from engine.coach.memory import Memory
from engine.coach.rounds import Rounds
from engine.config import WorkspaceConfig
from engine.core import Engine
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import Layers
from engine.store import Store


@dataclass
class CoachEvent:
    """What a display shows: one line of the coach's reasoning or a decision."""

    kind: str  # round, diagnosis, proposal, refused, fallback, backtest, verdict, decision, escalation, evolution
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopResult:
    trained: list[str] = field(default_factory=list)
    decisions: list[tuple[str, str, str]] = field(default_factory=list)
    waiting: Gate | None = None
    aborted: bool = False
    stopped: str | None = None  # why the loop ended early, in words


#: Says one line of the coach's reasoning: a `CoachEvent`, or (kind, message, **data).
Emit = Callable[..., None]


@dataclass(frozen=True)
class CoachContext:
    engine: Engine
    #: The workspace config the coach follows (its `[coach]`, `[gates]` and `[budget]` tables).
    config: WorkspaceConfig
    #: The harness layers every diagnosis of this coach uses (passed to the engine per call).
    layers: Layers
    emit: Emit
    rounds: Rounds
    memory: Memory

    @property
    def store(self) -> Store:
        return self.engine.store

    def parent_diagnosis(self, parent: str) -> Diagnosis | None:
        """What a round reasons from: the latest GRPO run that started from `parent` or trained it
        (what training does to this policy: after failed branches, the last child's run), else
        the parent's own latest run (v0's warm-up); diagnosed with this coach's layers."""
        run = self.engine.latest_train_run_from(parent)
        if run is None:
            try:
                run = self.engine.latest_run(parent)
            except ValueError:
                return None
        return self.engine.diagnosis(run, self.layers)

    def child_diagnosis(self, version: str) -> Diagnosis | None:
        run = self.engine.train_run(version)
        return self.engine.diagnosis(run, self.layers) if run else None

    def control(self, parent: str) -> str | None:
        """The parent's evaluated control (one a round aborted before it trained does not count)."""
        return next((c for c in self.memory.controls(parent) if self.engine.eval_run(c) is not None), None)
