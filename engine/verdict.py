"""Judging a version against its parent on the held-out split, with a noise floor.

Per-task correctness of both versions on the same val tasks is compared with a paired
bootstrap (seeded); a difference counts only when its 95% interval excludes zero. One comparison
is pre-declared as primary (`[eval] primary`: the sampled passes' per-task mean by default) and
decides, so a promotion rests on one test at 95%, not on whichever of two came out. The other
decoding is reported; it blocks only where the workspace declares it a guardrail with a margin
(`[eval] guardrails = { greedy = 0.05 }`): a primary gain whose guardrail's whole interval lies
below -margin is mixed. A task is the same task only when its id and its prompt are: versions
whose data or environment differ are compared on what they share, never on tasks that merely
carry the same id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    #: Decodings that block a primary gain, each with its margin: `(("greedy", 0.05),)`.
    guardrails: tuple[tuple[str, float], ...] = ()

    @property
    def primary_delta(self) -> Delta | None:
        return next((d for d in self.deltas if d.decoding == self.primary), None)

    @property
    def breached(self) -> list[tuple[Delta, float]]:
        """The guardrails whose whole interval lies below -margin, with their margins."""
        margins = dict(self.guardrails)
        return [
            (d, margins[d.decoding]) for d in self.deltas if d.decoding in margins and d.high < -margins[d.decoding]
        ]

    @property
    def label(self) -> str:
        main = self.primary_delta
        if main is None or main.sign == 0:
            return "insufficient evidence"
        if main.sign > 0 and self.breached:
            return "mixed"
        return "improved" if main.sign > 0 else "regressed"

    def summary(self) -> str:
        ordered = sorted(self.deltas, key=lambda d: d.decoding != self.primary)
        margins = dict(self.guardrails)

        def role(d: Delta) -> str:
            if d.decoding == self.primary:
                return " (primary)"
            return f" (guardrail -{margins[d.decoding]:g})" if d.decoding in margins else ""

        parts = [
            f"{d.decoding}{role(d)} {d.parent:.3f}->{d.child:.3f} ({d.diff:+.3f} ±{d.noise_floor:.3f})" for d in ordered
        ]
        where = "val tasks" if self.split == "val" else f"val tasks, {self.split} environment"
        if not self.deltas:
            return f"{self.label}: no {where} in common"
        breach = "".join(
            f"; {d.decoding} fell below its guardrail (interval [{d.low:+.3f}, {d.high:+.3f}] under -{m:g})"
            for d, m in (self.breached if self.label == "mixed" else [])
        )
        return f"{self.label}: " + "; ".join(parts) + f" on {self.n_tasks} {where}{breach}"


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
    guardrails: dict[str, float] | None = None,
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
    return Verdict(parent, child, n_tasks, tuple(deltas), split, primary, tuple(sorted((guardrails or {}).items())))


def flips(
    store: Store,
    parent_run: str,
    child_run: str,
    decoding: str,
    splits: tuple[str, str] = ("val", "val"),
    examples: int = 5,
) -> dict[str, Any]:
    """The tasks whose outcome flipped between the parent's run and the child's on `decoding`
    (solved: the task's mean correctness over its passes is at least one half), counted each way,
    with up to `examples` of each way: the prompt, both versions' first answers and the reference
    where the domain has one. What a person reads before approving a verdict."""
    rows = store.query(
        """
        WITH sides AS (SELECT * FROM (VALUES ($parent, $parent_split, 'parent'), ($child, $child_split, 'child'))
                       t(run_id, split, side)),
        last AS (
            SELECT s.side, o.task_id, o.prompt, o.sample_idx, o.completion, o.reference,
                   coalesce(o.reward_components['correctness'], o.reward) AS c
            FROM sides s JOIN rollouts o ON o.run_id = s.run_id AND o.split = s.split
            WHERE o.decoding = $decoding
            QUALIFY o.step = max(o.step) OVER (PARTITION BY s.side)
        ),
        per AS (
            SELECT side, task_id, prompt, avg(c) >= 0.5 AS solved, arg_min(completion, sample_idx) AS answer,
                   any_value(reference) AS reference
            FROM last GROUP BY ALL
        ),
        paired AS (
            SELECT p.task_id, p.prompt, p.solved AS before, c.solved AS after, p.answer AS parent_answer,
                   c.answer AS child_answer, coalesce(c.reference, p.reference) AS reference
            FROM per p JOIN per c USING (task_id, prompt) WHERE p.side = 'parent' AND c.side = 'child'
        ),
        flipped AS (
            SELECT *, row_number() OVER (PARTITION BY after ORDER BY task_id) AS k
            FROM paired WHERE before <> after
        )
        SELECT (SELECT count(*) FROM paired), (SELECT count(*) FILTER (WHERE after) FROM flipped),
               (SELECT count(*) FILTER (WHERE NOT after) FROM flipped),
               (SELECT list({'direction': CASE WHEN after THEN 'to_right' ELSE 'to_wrong' END, 'task': task_id,
                             'prompt': prompt, 'parent': parent_answer, 'child': child_answer, 'reference': reference}
                            ORDER BY after DESC, task_id)
                FROM flipped WHERE k <= $examples)
        """,
        {
            "parent": parent_run,
            "child": child_run,
            "parent_split": splits[0],
            "child_split": splits[1],
            "decoding": decoding,
            "examples": examples,
        },
    )
    tasks, to_right, to_wrong, shown = rows[0]
    return {
        "decoding": decoding,
        "tasks": int(tasks),
        "to_right": int(to_right or 0),
        "to_wrong": int(to_wrong or 0),
        "examples": list(shown or []),
    }
