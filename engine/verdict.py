"""Judging a version against its parent on the held-out split, with a noise floor.

Per-task correctness of both versions on the same val tasks is compared with a paired
bootstrap (seeded); a difference counts only when its 95% interval excludes zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.store import Store

BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class Delta:
    decoding: str
    parent: float
    child: float
    low: float  # 95% interval of child - parent
    high: float

    @property
    def diff(self) -> float:
        return self.child - self.parent

    @property
    def noise_floor(self) -> float:
        return (self.high - self.low) / 2

    @property
    def sign(self) -> int:
        return 1 if self.low > 0 else -1 if self.high < 0 else 0


@dataclass(frozen=True)
class Verdict:
    parent: str
    child: str
    n_tasks: int
    deltas: tuple[Delta, ...]

    @property
    def label(self) -> str:
        signs = {d.sign for d in self.deltas}
        if 1 in signs and -1 in signs:
            return "mixed"
        if 1 in signs:
            return "improved"
        if -1 in signs:
            return "regressed"
        return "insufficient evidence"

    def summary(self) -> str:
        parts = [
            f"{d.decoding} {d.parent:.3f}->{d.child:.3f} ({d.diff:+.3f} ±{d.noise_floor:.3f})" for d in self.deltas
        ]
        return f"{self.label}: " + "; ".join(parts) + f" on {self.n_tasks} val tasks"


def per_task_correctness(store: Store, run_id: str, decoding: str) -> dict[str, float]:
    """Mean correctness per val task in the run's last evaluation."""
    rows = store.query(
        """
        SELECT task_id, avg(reward_components['correctness'])
        FROM rollouts
        WHERE run_id = $run AND split = 'val' AND decoding = $decoding
          AND step = (SELECT max(step) FROM rollouts WHERE run_id = $run AND split = 'val')
        GROUP BY task_id
        """,
        {"run": run_id, "decoding": decoding},
    )
    return {task: float(value) for task, value in rows}


def paired_bootstrap(parent: np.ndarray, child: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of mean(child - parent) over tasks resampled with replacement."""
    diff = child - parent
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(BOOTSTRAP_SAMPLES, len(diff)))
    means = diff[idx].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def compare_runs(store: Store, parent: str, parent_run: str, child: str, child_run: str) -> Verdict:
    deltas = []
    n_tasks = 0
    for decoding in ("greedy", "sampled"):
        a = per_task_correctness(store, parent_run, decoding)
        b = per_task_correctness(store, child_run, decoding)
        tasks = sorted(a.keys() & b.keys())
        if not tasks:
            continue
        n_tasks = len(tasks)
        pa = np.array([a[t] for t in tasks])
        pb = np.array([b[t] for t in tasks])
        low, high = paired_bootstrap(pa, pb)
        deltas.append(Delta(decoding, float(pa.mean()), float(pb.mean()), low, high))
    if not deltas:
        raise ValueError(f"no common val tasks between {parent} ({parent_run}) and {child} ({child_run})")
    return Verdict(parent, child, n_tasks, tuple(deltas))
