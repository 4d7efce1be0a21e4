"""Judging a version against its parent on the held-out split, with a noise floor.

Per-task correctness of both versions on the same val tasks is compared with a paired
bootstrap (seeded); a difference counts only when its 95% interval excludes zero. One comparison
is pre-declared as primary (`[eval] primary`: the sampled passes' per-task mean by default) and
decides; the other is reported and can only block (a significant move the other way makes the
verdict mixed), so a promotion rests on one test at 95%, not on whichever of two came out. A task is the
same task only when its id and its prompt are: versions whose data or environment differ are
compared on what they share, never on tasks that merely carry the same id.
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
    #: The split compared: "val", or "clean" when the two versions' environments differ and only
    #: the clean one is common ground.
    split: str = "val"
    #: The pre-declared decoding that decides.
    primary: str = "sampled"

    @property
    def primary_delta(self) -> Delta | None:
        return next((d for d in self.deltas if d.decoding == self.primary), None)

    @property
    def label(self) -> str:
        main = self.primary_delta
        if main is None or main.sign == 0:
            return "insufficient evidence"
        if any(d.sign == -main.sign for d in self.deltas):
            return "mixed"
        return "improved" if main.sign > 0 else "regressed"

    def summary(self) -> str:
        ordered = sorted(self.deltas, key=lambda d: d.decoding != self.primary)
        parts = [
            f"{d.decoding}{' (primary)' if d.decoding == self.primary else ''} {d.parent:.3f}->{d.child:.3f} "
            f"({d.diff:+.3f} ±{d.noise_floor:.3f})"
            for d in ordered
        ]
        where = "val tasks" if self.split == "val" else f"val tasks, {self.split} environment"
        if not self.deltas:
            return f"{self.label}: no {where} in common"
        return f"{self.label}: " + "; ".join(parts) + f" on {self.n_tasks} {where}"


def per_task_correctness(store: Store, run_id: str, decoding: str, split: str = "val") -> dict[tuple[str, str], float]:
    """Mean correctness per (task id, prompt) in the run's last evaluation of `split`."""
    rows = store.query(
        """
        SELECT task_id, prompt, avg(reward_components['correctness'])
        FROM rollouts
        WHERE run_id = $run AND split = $split AND decoding = $decoding
          AND step = (SELECT max(step) FROM rollouts WHERE run_id = $run AND split = $split)
        GROUP BY task_id, prompt
        """,
        {"run": run_id, "decoding": decoding, "split": split},
    )
    return {(task, prompt): float(value) for task, prompt, value in rows}


@dataclass(frozen=True)
class Scores:
    """A run's last evaluation of one split: greedy and sampled correctness, the sampled score's
    95% half-width over tasks (each task's mean over the sampled passes), and the task count."""

    split: str
    greedy: float | None
    sampled: float | None
    halfwidth: float | None
    n_tasks: int

    def summary(self) -> str:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"

        floor = "" if self.halfwidth is None else f" ±{self.halfwidth:.3f}"
        return f"{self.split}: greedy {pct(self.greedy)}, sampled {pct(self.sampled)}{floor} on {self.n_tasks} tasks"


def clean_split(store: Store, run_id: str) -> str:
    """The split of a run's clean val replay: 'clean' when it has one (a leaky environment),
    else 'val' (which is then clean)."""
    row = store.query_one("SELECT count(*) FROM rollouts WHERE run_id = ? AND split = 'clean'", [run_id])
    return "clean" if row and row[0] else "val"


def split_scores(store: Store, run_id: str, split: str) -> Scores:
    """The scores of a run's last evaluation of `split` (val, clean or test)."""
    row = store.query_one(
        """
        WITH ev AS (SELECT * FROM rollouts WHERE run_id = $run AND split = $split),
        last AS (SELECT * FROM ev WHERE step = (SELECT max(step) FROM ev)),
        per_task AS (
            SELECT task_id, avg(coalesce(reward_components['correctness'], reward)) AS solved
            FROM last WHERE decoding = 'sampled' GROUP BY task_id
        )
        SELECT (SELECT avg(coalesce(reward_components['correctness'], reward)) FROM last WHERE decoding = 'greedy'),
               avg(solved), 1.96 * stddev_samp(solved) / sqrt(count(*)),
               greatest(count(*), (SELECT count(DISTINCT task_id) FROM last))
        FROM per_task
        """,
        {"run": run_id, "split": split},
    )
    greedy, sampled, halfwidth, n = row if row else (None, None, None, 0)
    return Scores(split, greedy, sampled, halfwidth, int(n or 0))


def paired_bootstrap(parent: np.ndarray, child: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of mean(child - parent) over tasks resampled with replacement."""
    diff = child - parent
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(BOOTSTRAP_SAMPLES, len(diff)))
    means = diff[idx].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def compare_runs(
    store: Store,
    parent: str,
    parent_run: str,
    child: str,
    child_run: str,
    splits: tuple[str, str] = ("val", "val"),
    primary: str = "sampled",
) -> Verdict:
    """The child's run against the parent's on the tasks both evaluated (`splits`: which split of
    each run, e.g. the parent's clean replay against a child whose val is clean)."""
    deltas = []
    n_tasks = 0
    for decoding in ("greedy", "sampled"):
        a = per_task_correctness(store, parent_run, decoding, splits[0])
        b = per_task_correctness(store, child_run, decoding, splits[1])
        tasks = sorted(a.keys() & b.keys())
        if not tasks:
            continue
        n_tasks = len(tasks)
        pa = np.array([a[t] for t in tasks])
        pb = np.array([b[t] for t in tasks])
        low, high = paired_bootstrap(pa, pb)
        deltas.append(Delta(decoding, float(pa.mean()), float(pb.mean()), low, high))
    split = splits[1] if splits[0] == splits[1] else "clean"
    return Verdict(parent, child, n_tasks, tuple(deltas), split, primary)
