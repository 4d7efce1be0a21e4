"""Backtests: price an intervention on saved rollouts before paying for a run.

- reward: re-score a run's rollouts under another reward composition;
- filter: which groups a group filter would keep, and how many dead ones remain;
- analyzer: does a metric separate the versions judged improved from those judged regressed?
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from engine.domains import Domain
from engine.harness.analyzers.signal import DEAD_STD
from engine.runs.group_filter import GroupFilter
from engine.store import Store

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RewardBacktest:
    run_id: str
    weights: dict[str, float]
    groups: int
    dead_before: float  # dead-group ratio under the run's own reward
    dead_after: float  # ... under the candidate reward
    revived: float  # share of the dead groups that regain variance
    rank_corr_with_correctness: float | None  # Spearman, over rollouts
    mean_shift: float  # mean candidate reward - mean run reward
    rescored_components: tuple[str, ...]  # components computed by re-running the verifier


@dataclass(frozen=True)
class FilterBacktest:
    run_id: str
    std_threshold: float
    keep_ratio_cap: float | None
    ema: float | None
    kept: float  # share of groups kept
    dead_after: float  # dead-group ratio among the kept groups
    dead_before: float


def _train(run_id: str) -> str:
    return f"run_id = '{run_id.replace(chr(39), chr(39) * 2)}' AND split = 'train'"


def reward_backtest(
    store: Store, run_id: str, weights: dict[str, float], domain: Domain | None = None
) -> RewardBacktest:
    """Dead groups, revived groups, rank correlation with binary correctness and mean shift of a
    candidate reward `weights` (component -> weight) over the run's saved train rollouts.

    Components the rollouts do not carry are re-scored by the domain's verifier (needs `domain`).
    """
    for name in weights:
        if not _NAME.match(name):
            raise ValueError(f"reward component name {name!r} is not an identifier")
    stored = {
        r[0]
        for r in store.query(
            f"SELECT DISTINCT unnest(map_keys(reward_components)) FROM rollouts WHERE {_train(run_id)}"
        )
    }
    if not stored:
        raise ValueError(f"run {run_id} has no train rollouts")
    missing = sorted(set(weights) - stored)
    extra_join = ""
    if missing:
        if domain is None:
            raise ValueError(f"components {missing} are not stored for {run_id} and no domain was given to re-score")
        unknown = set(missing) - set(domain.reward_components)
        if unknown:
            raise ValueError(
                f"unknown reward component(s) {sorted(unknown)}; the domain has {sorted(domain.reward_components)}"
            )
        rescored = _rescore(store, run_id, domain, missing)  # noqa: F841 - read by DuckDB below, by name
        extra_join = "LEFT JOIN rescored x USING (step, group_id, sample_idx)"
    # Names are checked identifiers above; weights are numbers: the expression is safe to inline.
    columns = {name: f"x.{name}" if name in missing else f"reward_components['{name}']" for name in weights}
    terms = " + ".join(f"coalesce({columns[n]}, 0) * {float(w)!r}" for n, w in weights.items()) or "0"
    # Executed here, not through store.query: DuckDB finds `rescored` among this frame's locals.
    rows = store.con.execute(
        f"""
        WITH r AS (
            SELECT step, group_id, reward AS old, {terms} AS new,
                   reward_components['correctness'] AS correct
            FROM rollouts {extra_join} WHERE {_train(run_id)}
        ), g AS (
            SELECT stddev_pop(old) < {DEAD_STD} AS dead_old, stddev_pop(new) < {DEAD_STD} AS dead_new
            FROM r GROUP BY step, group_id
        ), ranked AS (
            SELECT rank() OVER (ORDER BY new) + (count(*) OVER (PARTITION BY new) - 1) / 2 AS rn,
                   rank() OVER (ORDER BY correct) + (count(*) OVER (PARTITION BY correct) - 1) / 2 AS rc
            FROM r WHERE correct IS NOT NULL
        )
        SELECT (SELECT count(*) FROM g), (SELECT avg(dead_old::INT) FROM g), (SELECT avg(dead_new::INT) FROM g),
               (SELECT avg((NOT dead_new)::INT) FILTER (WHERE dead_old) FROM g),
               (SELECT corr(rn, rc) FROM ranked),
               (SELECT avg(new) - avg(old) FROM r)
        """
    ).fetchall()
    groups, before, after, revived, rho, shift = rows[0]
    return RewardBacktest(run_id, dict(weights), groups, before, after, revived or 0.0, rho, shift, tuple(missing))


def _rescore(store: Store, run_id: str, domain: Domain, components: list[str]) -> pa.Table:
    rows = store.query(f"SELECT step, group_id, sample_idx, task_id, completion FROM rollouts WHERE {_train(run_id)}")
    tasks = {t.task_id: t for split in ("train", "val") for t in domain.tasks(split)}
    cols: dict[str, Any] = {
        "step": [r[0] for r in rows],
        "group_id": [r[1] for r in rows],
        "sample_idx": [r[2] for r in rows],
    }
    for name in components:
        fn = domain.reward_components[name]
        cols[name] = [float(fn(tasks[r[3]], r[4])) for r in rows]
    return pa.table(cols)


def filter_backtest(
    store: Store, run_id: str, std_threshold: float, keep_ratio: float | None = None, ema: float | None = None
) -> FilterBacktest:
    """Groups a dead-group-aware filter would keep: reward std above the threshold, at most the
    `keep_ratio` share of a step's groups (highest spread first), and with `ema` the threshold
    following an exponential moving average of each step's median group spread."""
    stats = store.query(
        f"""
        SELECT step, list(spread ORDER BY spread DESC) FROM (
            SELECT step, stddev_pop(reward) AS spread FROM rollouts WHERE {_train(run_id)} GROUP BY step, group_id
        ) GROUP BY step ORDER BY step
        """
    )
    if not stats:
        raise ValueError(f"run {run_id} has no train rollouts")
    group_filter = GroupFilter(std_threshold, keep_ratio, ema)
    kept = total = dead_kept = dead_total = 0
    for _, spreads in stats:  # one iteration per step; the groups of a step are one array
        s = np.asarray(spreads, dtype=float)
        keep = group_filter.keep(s)
        kept += int(keep.sum())
        total += len(s)
        dead_kept += int((keep & (s < DEAD_STD)).sum())
        dead_total += int((s < DEAD_STD).sum())
    return FilterBacktest(
        run_id, std_threshold, keep_ratio, ema, kept / total, dead_kept / kept if kept else 0.0, dead_total / total
    )


@dataclass(frozen=True)
class AnalyzerValidation:
    metric: str
    improved: dict[str, float]  # version -> metric value
    regressed: dict[str, float]
    auc: float | None  # P(value of an improved version > value of a regressed one)

    @property
    def separates(self) -> bool:
        return self.auc is not None and abs(self.auc - 0.5) >= 0.25


def validate_analyzer(store: Store, metric: str, value_of: Callable[[str], float | None]) -> AnalyzerValidation:
    """Compute `metric` on every judged version (through `value_of(version)`) and measure how well
    it separates the improved versions from the regressed ones (AUC; 0.5 = not at all)."""
    judged = store.query("SELECT name, verdict FROM versions WHERE verdict IN ('improved', 'regressed')")
    improved, regressed = {}, {}
    for name, verdict in judged:
        value = value_of(name)
        if value is not None:
            (improved if verdict == "improved" else regressed)[name] = value
    auc = None
    if improved and regressed:
        a = np.array(list(improved.values()))[:, None]
        b = np.array(list(regressed.values()))[None, :]
        auc = float(((a > b) + 0.5 * (a == b)).mean())
    return AnalyzerValidation(metric, improved, regressed, auc)


def store_backtest(store: Store, kind: str, run_id: str | None, params: dict[str, Any], result: Any) -> str:
    row = store.query_one("SELECT count(*) FROM backtests")
    backtest_id = f"bt-{(row[0] if row else 0) + 1}"
    payload = asdict(result) if hasattr(result, "__dataclass_fields__") else result
    store.con.execute(
        "INSERT INTO backtests (id, kind, run_id, params, result) VALUES (?, ?, ?, ?, ?)",
        [backtest_id, kind, run_id, json.dumps(params), json.dumps(payload, default=str)],
    )
    return backtest_id
