"""Backtests: price an intervention on saved rollouts before paying for a run.

- reward: re-score a run's rollouts under another reward composition;
- filter: which groups a group filter would keep, and how many dead ones remain;
- analyzer: does a metric separate the versions judged improved from those judged regressed?

`backtest_intervention` prices a proposed intervention (a reward or filter change) on a run and
says whether the backtest contradicts it; `validate_analyzer` is the one test of separation that
harness evolution, escalation's re-validation and `evotui backtest analyzer` all use.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from engine.config import GroupFilterConfig
from engine.domains import Domain
from engine.grpo import DEAD_STD, MIN_KEEP_RATIO
from engine.runs.group_filter import GroupFilter
from engine.store import Store

#: An analyzer separates past outcomes when |AUC - 0.5| is at least this ...
MIN_SEPARATION = 0.25
#: ... and a permutation test of the AUC (two-sided) gives p at most this: with one improved and
#: one regressed version any differing metric has AUC 0 or 1, which means nothing (p = 1).
SEPARATION_ALPHA = 0.05
#: ... with at least this many past versions on each side: below, a permutation test has too few
#: arrangements to mean anything (four a side: 70, the smallest two-sided p 0.029).
MIN_PER_SIDE = 4
#: Label arrangements enumerated exactly up to this many; beyond, as many seeded random ones.
PERMUTATIONS = 20_000

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
    keep_ratio: float
    ema: float
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


def filter_backtest(store: Store, run_id: str, settings: GroupFilterConfig) -> FilterBacktest:
    """Groups the group filter with `settings` would keep, step by step, through the same
    `GroupFilter` training uses: reward std above the threshold, at most the `keep_ratio` share
    of a step's groups (highest spread first), the threshold following an EMA if `ema` > 0."""
    stats = store.query(
        f"""
        SELECT step, list(spread ORDER BY spread DESC) FROM (
            SELECT step, stddev_pop(reward) AS spread FROM rollouts WHERE {_train(run_id)} GROUP BY step, group_id
        ) GROUP BY step ORDER BY step
        """
    )
    if not stats:
        raise ValueError(f"run {run_id} has no train rollouts")
    group_filter = GroupFilter.from_config(settings.model_copy(update={"enabled": True}))
    assert group_filter is not None
    kept = total = dead_kept = dead_total = 0
    for _, spreads in stats:  # one iteration per step; the groups of a step are one array
        s = np.asarray(spreads, dtype=float)
        keep = group_filter.keep(s)
        kept += int(keep.sum())
        total += len(s)
        dead_kept += int((keep & (s < DEAD_STD)).sum())
        dead_total += int((s < DEAD_STD).sum())
    return FilterBacktest(
        run_id,
        settings.std_threshold,
        settings.keep_ratio,
        settings.ema,
        kept / total,
        dead_kept / kept if kept else 0.0,
        dead_total / total,
    )


@dataclass(frozen=True)
class InterventionBacktest:
    """What a round records of a proposal's backtest: the stored backtest's id, one line, and
    whether the backtest contradicts the proposal (it is then dropped before it runs)."""

    id: str | None
    summary: str
    contradicts: bool = False


def backtest_intervention(
    store: Store, run_id: str, kind: str, changes: Mapping[str, Any], domain: Domain | None = None
) -> InterventionBacktest | None:
    """Price a reward or filter intervention (`changes`: dotted workspace.toml paths) on the saved
    train rollouts of `run_id`; None for kinds no backtest applies to.

    Contradicted: a reward that revives no dead group and leaves at least as many dead, or a
    filter that would keep less than `MIN_KEEP_RATIO` of the groups."""
    if kind == "reward":
        weights = changes.get("recipe.rewards")
        if not isinstance(weights, dict):
            return InterventionBacktest(None, "no reward composition to backtest")
        bt = reward_backtest(store, run_id, weights, domain)
        return InterventionBacktest(
            store_backtest(store, "reward", run_id, {"weights": weights}, bt),
            f"dead groups {bt.dead_before:.2f} -> {bt.dead_after:.2f}, {bt.revived:.0%} revived,"
            f" rank corr with correctness {bt.rank_corr_with_correctness or 0:.2f}",
            bt.dead_before > 0 and bt.dead_after >= bt.dead_before and bt.revived == 0,
        )
    if kind == "filter":
        settings = GroupFilterConfig.model_validate(changes.get("recipe.group_filter", {}))
        if not settings.enabled:
            return InterventionBacktest(None, "filter off: nothing to backtest")
        fb = filter_backtest(store, run_id, settings)
        return InterventionBacktest(
            store_backtest(store, "filter", run_id, settings.model_dump(), fb),
            f"keeps {fb.kept:.0%} of groups; dead among kept {fb.dead_before:.2f} -> {fb.dead_after:.2f}",
            fb.kept < MIN_KEEP_RATIO,
        )
    return None


@dataclass(frozen=True)
class AnalyzerValidation:
    metric: str
    improved: dict[str, float]  # version -> metric value
    regressed: dict[str, float]
    auc: float | None  # P(value of an improved version > value of a regressed one)
    #: Two-sided permutation p-value of the AUC: how often shuffled verdicts separate as well.
    p_value: float | None = None

    #: The level its p-value is held to: SEPARATION_ALPHA, divided by the number of specs tried
    #: together when harness evolution validates several for one anomaly (Bonferroni).
    alpha: float = SEPARATION_ALPHA

    @property
    def separates(self) -> bool:
        return (
            self.auc is not None
            and self.p_value is not None
            and min(len(self.improved), len(self.regressed)) >= MIN_PER_SIDE
            and abs(self.auc - 0.5) >= MIN_SEPARATION
            and self.p_value <= self.alpha
        )

    def summary(self) -> str:
        if self.auc is None:
            return "cannot validate: needs at least one improved and one regressed past version"
        n = f"{len(self.improved)} improved vs {len(self.regressed)} regressed versions"
        verb = "separates" if self.separates else "does not separate"
        few = f"; needs {MIN_PER_SIDE} a side" if min(len(self.improved), len(self.regressed)) < MIN_PER_SIDE else ""
        level = f" at p <= {self.alpha:.4f}" if self.alpha != SEPARATION_ALPHA else ""
        return f"{verb} past outcomes{level} (AUC {self.auc:.2f}, permutation p {self.p_value:.3f}, {n}{few})"


def separation(improved: np.ndarray, regressed: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """(AUC, two-sided permutation p-value) of values of improved vs regressed versions.

    AUC = P(improved value > regressed value), ties half. The p-value is the share of ways of
    labelling the pooled values (as many "improved" as there are) whose AUC is at least as far
    from 0.5: every labelling when there are at most `PERMUTATIONS`, else that many seeded ones."""
    pooled = np.concatenate([improved, regressed]).astype(float)
    k, n = len(improved), len(pooled)
    # AUC from ranks (Mann-Whitney U with midranks for ties): one formula for every labelling.
    order = np.argsort(pooled, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1)
    for value in np.unique(pooled):  # midranks for ties
        tied = pooled == value
        ranks[tied] = ranks[tied].mean()
    scale = k * (n - k)

    def auc_of(rank_sums: np.ndarray) -> np.ndarray:
        return (rank_sums - k * (k + 1) / 2) / scale

    observed = float(auc_of(np.array([ranks[:k].sum()]))[0])
    if math.comb(n, k) <= PERMUTATIONS:
        labellings = np.array(list(itertools.combinations(range(n), k)))
    else:
        rng = np.random.default_rng(seed)
        labellings = np.argsort(rng.random((PERMUTATIONS, n)), axis=1)[:, :k]
    aucs = auc_of(ranks[labellings].sum(axis=1))
    p_value = float(np.mean(np.abs(aucs - 0.5) >= abs(observed - 0.5) - 1e-12))
    return observed, p_value


def validate_analyzer(store: Store, metric: str, value_of: Callable[[str], float | None]) -> AnalyzerValidation:
    """Compute `metric` on every judged version (through `value_of(version)`) and measure how well
    it separates the improved versions from the regressed ones (`separation`)."""
    judged = store.query("SELECT name, verdict FROM versions WHERE verdict IN ('improved', 'regressed')")
    values = {name: (verdict, value_of(name)) for name, verdict in judged}
    return validation_of(metric, {n: (verdict, v) for n, (verdict, v) in values.items() if v is not None})


def validation_of(metric: str, values: Mapping[str, tuple[str, float]]) -> AnalyzerValidation:
    """The separation of `values` (version -> (verdict, value)) between improved and regressed."""
    improved = {n: v for n, (verdict, v) in values.items() if verdict == "improved"}
    regressed = {n: v for n, (verdict, v) in values.items() if verdict == "regressed"}
    if not improved or not regressed:
        return AnalyzerValidation(metric, improved, regressed, None)
    auc, p = separation(np.array(list(improved.values())), np.array(list(regressed.values())))
    return AnalyzerValidation(metric, improved, regressed, auc, p)


def revalidate_findings(store: Store) -> list[AnalyzerValidation]:
    """Every finding's metric, as the latest diagnosis of each judged version recorded it, tested
    for separation of improved from regressed versions (escalation's re-validation of the
    harness), most separating first."""
    rows = store.query(
        """
        WITH latest AS (
            SELECT d.id, d.version, v.verdict FROM diagnoses d JOIN versions v ON v.name = d.version
            WHERE v.verdict IN ('improved', 'regressed')
            QUALIFY row_number() OVER (PARTITION BY d.version ORDER BY d.created_at DESC) = 1
        )
        SELECT f.metric, l.version, l.verdict, f.value FROM findings f JOIN latest l ON l.id = f.diagnosis_id
        WHERE f.value IS NOT NULL AND isfinite(f.value)
        ORDER BY f.metric, l.version
        """
    )
    by_metric: dict[str, dict[str, tuple[str, float]]] = {}
    for metric, version, verdict, value in rows:
        by_metric.setdefault(metric, {})[version] = (verdict, value)
    out = [validation_of(metric, values) for metric, values in by_metric.items()]
    return sorted(out, key=lambda v: (v.p_value if v.p_value is not None else 2.0, v.metric))


def store_backtest(store: Store, kind: str, run_id: str | None, params: dict[str, Any], result: Any) -> str:
    row = store.query_one("SELECT count(*) FROM backtests")
    backtest_id = f"bt-{(row[0] if row else 0) + 1}"
    payload = asdict(result) if hasattr(result, "__dataclass_fields__") else result
    store.con.execute(
        "INSERT INTO backtests (id, kind, run_id, params, result) VALUES (?, ?, ?, ?, ?)",
        [backtest_id, kind, run_id, json.dumps(params), json.dumps(payload, default=str)],
    )
    return backtest_id
