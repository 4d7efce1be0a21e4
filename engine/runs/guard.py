"""The collapse guard: stop a multi-turn GRPO run early when it collapses into one-step episodes.

A shaped reward that pays for short episodes (the efficiency reward) can teach a policy to submit
at once, without a fix: the anti-pattern that drove the paper's policy to zero. Its first sign is
in the train rollouts themselves, long before an evaluation: episodes ending after one turn
become common while correctness does not rise. The guard watches each step's episodes and says
why it would stop; the worker then ends training, and the coach rejects the version with the
rest of its steps unspent.

The guard's history and its stop are part of each checkpoint (`state` / `restore`,
`engine.runs.checkpoint_state`): a worker resumed from a checkpoint goes on with the windows it
had at that step, and a run the guard stopped stays stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

from engine.config import CollapseGuardConfig


@dataclass(frozen=True)
class StepStats:
    one_step: float  # share of the step's episodes that ended after one turn
    correct: float  # mean correctness
    distinct: float  # mean share of distinct completions within a group


def step_stats(
    num_turns: Sequence[int | None], correct: Sequence[float], completions: Sequence[str], group: int
) -> StepStats:
    n = len(num_turns)
    groups = [completions[i : i + group] for i in range(0, len(completions), group)]
    return StepStats(
        one_step=sum(1 for t in num_turns if t is not None and t <= 1) / n if n else 0.0,
        correct=sum(correct) / len(correct) if correct else 0.0,
        distinct=sum(len(set(g)) / len(g) for g in groups) / len(groups) if groups else 0.0,
    )


@dataclass
class CollapseGuard:
    config: CollapseGuardConfig
    history: list[StepStats] = field(default_factory=list)
    #: Why the guard stopped the run (None while it has not): a stop is final, also across a resume.
    stopped: str | None = None

    def observe(self, stats: StepStats) -> str | None:
        """Record one step; the reason to stop now (once stopped, always that one), or None."""
        self.history.append(stats)
        if self.stopped is None:
            self.stopped = self._reason()
        return self.stopped

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the guard (JSON): every step's stats so far, and its stop."""
        return {"history": [list(astuple(s)) for s in self.history], "stopped": self.stopped}

    def restore(self, state: dict[str, Any]) -> None:
        """Back to the point `state` was taken at (a resumed run's checkpoint)."""
        self.history = [StepStats(*row) for row in state["history"]]
        self.stopped = state["stopped"]

    def _reason(self) -> str | None:
        w = self.config.window
        if not self.config.enabled or len(self.history) < 2 * w:
            return None
        first, last = self.history[:w], self.history[-w:]

        def mean(window: list[StepStats], key: str) -> float:
            return sum(getattr(s, key) for s in window) / len(window)

        one_before, one_now = mean(first, "one_step"), mean(last, "one_step")
        correct_before, correct_now = mean(first, "correct"), mean(last, "correct")
        if one_now < self.config.one_step_share or one_now < 2 * one_before or correct_now > correct_before:
            return None
        return (
            f"collapse: one-turn episodes {one_before:.0%} -> {one_now:.0%} of the first and last {w} steps, "
            f"correctness {correct_before:.2f} -> {correct_now:.2f}, distinct completions per group "
            f"{mean(first, 'distinct'):.2f} -> {mean(last, 'distinct'):.2f}"
        )
