"""The harness's vocabulary: findings, analyzers, rules, and the context they read.

An analyzer reads the store (SQL) for one run and returns findings; a rule combines findings
into a statement about the bottleneck. Built-in ones live in `engine.harness.analyzers` and
`engine.harness.rules`; a workspace adds its own in ``<ws>/harness/*.py`` with the same
decorators, so the harness is versioned with the workspace and can evolve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.config import WorkspaceConfig
from engine.store import RunRecord, Store, VersionRecord

Layer = Literal["score", "signal", "behavior", "version"]
Severity = Literal["info", "warning", "critical"]
LAYERS: tuple[Layer, ...] = ("score", "signal", "behavior", "version")
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Finding:
    """One analyzer's result for one metric."""

    metric: str  # e.g. "signal.dead_group_ratio"
    value: float | None
    severity: Severity = "info"
    explanation: str = ""
    threshold: float | None = None
    steps: tuple[int, ...] = ()  # evidence: steps
    rollouts: tuple[str, ...] = ()  # evidence: rollout ids "run/split/step/group/sample"
    analyzer: str = ""  # filled in by the harness
    layer: Layer = "signal"
    provenance: str = "built-in"  # built-in, workspace, proposed

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "severity": self.severity,
            "threshold": self.threshold,
            "explanation": self.explanation,
            "evidence": {"steps": list(self.steps), "rollouts": list(self.rollouts)},
            "analyzer": self.analyzer,
            "layer": self.layer,
            "provenance": self.provenance,
        }


@dataclass
class Context:
    """What an analyzer may read: the store (read through SQL), and the run being diagnosed."""

    store: Store
    run: RunRecord
    version: VersionRecord
    config: WorkspaceConfig
    #: Steps in the first and the last window used for trends.
    window: int = 10
    params: dict[str, Any] = field(default_factory=dict)
    _materialized: list[str] = field(default_factory=list, repr=False)

    @property
    def run_id(self) -> str:
        return self.run.id

    def q(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run SQL with ``$run`` (this run's id), ``$window`` and the diagnosis's shared `self.params`
        bound, plus `params`."""
        values = {"run": self.run.id, "window": self.window, **self.params, **(params or {})}
        used = {k: v for k, v in values.items() if f"${k}" in sql}
        return self.store.query(sql, used)

    def q1(self, sql: str, params: dict[str, Any] | None = None) -> tuple[Any, ...]:
        rows = self.q(sql, params)
        return rows[0] if rows else ()

    def materialize(self, name: str, sql: str, params: dict[str, Any] | None = None) -> str:
        """Compute `sql` once per diagnosis into a temporary table shared by analyzers; returns
        its name. (Parsing a million tool-call traces once, not once per analyzer.)"""
        table = f"harness_{name}"
        if table not in self._materialized:
            values = {"run": self.run.id, "window": self.window, **self.params, **(params or {})}
            used = {k: v for k, v in values.items() if f"${k}" in sql}
            self.store.con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {sql}", used)
            self._materialized.append(table)
        return table

    def close(self) -> None:
        for table in self._materialized:
            self.store.con.execute(f"DROP TABLE IF EXISTS {table}")
        self._materialized.clear()

    def example_rollouts(self, condition: str, limit: int = 5) -> tuple[str, ...]:
        """Ids of the run's latest train rollouts matching an SQL `condition` (evidence to read)."""
        rows = self.q(
            f"""SELECT concat_ws('/', run_id, split, step, group_id, sample_idx) FROM rollouts
                WHERE run_id = $run AND split = 'train' AND ({condition})
                ORDER BY step DESC, group_id, sample_idx LIMIT {int(limit)}"""
        )
        return tuple(r[0] for r in rows)

    def window_means(
        self, source: str, value: str, params: dict[str, Any] | None = None
    ) -> tuple[float | None, float | None, float | None]:
        """Mean of `value` over `source` (a query with a `step` column): overall, over the first
        `window` steps and over the last `window` steps (the trends every layer reports)."""
        row = self.q1(
            f"""
            WITH src AS ({source}),
                 b AS (SELECT min(step) + $window AS first_cut, max(step) - $window AS last_cut FROM src)
            SELECT avg({value}), avg({value}) FILTER (WHERE step < (SELECT first_cut FROM b)),
                   avg({value}) FILTER (WHERE step > (SELECT last_cut FROM b))
            FROM src
            """,
            params,
        )
        return (row[0], row[1], row[2]) if row else (None, None, None)

    def metric_keys(self) -> set[str]:
        return {r[0] for r in self.q("SELECT DISTINCT key FROM metrics WHERE run_id = $run")}

    def has_traces(self) -> bool:
        """Whether the run's train rollouts carry tool-call traces (a warm-up run of a multi-turn
        domain has traced val rollouts only: nothing for the behavior layer to read)."""
        row = self.q1(
            "SELECT count(*) FROM rollouts WHERE run_id = $run AND split = 'train' AND tool_calls IS NOT NULL"
        )
        return bool(row and row[0])


AnalyzerFn = Callable[[Context], Iterable[Finding] | Finding | None]


@dataclass(frozen=True)
class Analyzer:
    name: str
    layer: Layer
    fn: AnalyzerFn
    description: str = ""
    provenance: str = "built-in"
    source: str = ""  # file the analyzer was loaded from (workspace analyzers)

    def run(self, ctx: Context) -> list[Finding]:
        out = self.fn(ctx)
        if out is None:
            return []
        findings = [out] if isinstance(out, Finding) else list(out)
        return [
            Finding(**{**f.__dict__, "analyzer": self.name, "layer": self.layer, "provenance": self.provenance})
            for f in findings
        ]


class Findings:
    """The findings of one diagnosis, looked up by metric."""

    def __init__(self, findings: Sequence[Finding]):
        self.all = list(findings)
        self._by_metric = {f.metric: f for f in findings}

    def get(self, metric: str) -> Finding | None:
        return self._by_metric.get(metric)

    def value(self, metric: str, default: float | None = None) -> float | None:
        f = self._by_metric.get(metric)
        return default if f is None or f.value is None else f.value

    def at_least(self, metric: str, severity: Severity) -> bool:
        f = self._by_metric.get(metric)
        return f is not None and SEVERITY_RANK[f.severity] >= SEVERITY_RANK[severity]


@dataclass(frozen=True)
class RuleResult:
    """A rule that fired: why, on which findings, and what kinds of intervention it suggests."""

    explanation: str
    severity: Severity = "warning"
    metrics: tuple[str, ...] = ()
    candidate_kinds: tuple[str, ...] = ()
    rule: str = ""
    provenance: str = "built-in"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "explanation": self.explanation,
            "metrics": list(self.metrics),
            "candidate_kinds": list(self.candidate_kinds),
            "provenance": self.provenance,
        }


RuleFn = Callable[[Findings, Context], RuleResult | None]


@dataclass(frozen=True)
class Rule:
    name: str
    fn: RuleFn
    #: Lower goes first when several rules fire: the bottleneck is the first critical one.
    priority: int = 50
    candidate_kinds: tuple[str, ...] = ()
    provenance: str = "built-in"
    source: str = ""

    def evaluate(self, findings: Findings, ctx: Context) -> RuleResult | None:
        result = self.fn(findings, ctx)
        if result is None:
            return None
        kinds = result.candidate_kinds or self.candidate_kinds
        return RuleResult(
            result.explanation,
            result.severity,
            result.metrics,
            kinds,
            rule=self.name,
            provenance=self.provenance,
        )


# -- registration ----------------------------------------------------------------------------------
# The decorators add to whichever registry is collecting: the built-in one at import, or the
# loader's while it imports a workspace harness file.
_collecting: list[tuple[list[Analyzer], list[Rule]]] = []
BUILTIN_ANALYZERS: list[Analyzer] = []
BUILTIN_RULES: list[Rule] = []


def _target() -> tuple[list[Analyzer], list[Rule]]:
    return _collecting[-1] if _collecting else (BUILTIN_ANALYZERS, BUILTIN_RULES)


def analyzer(name: str, layer: Layer, description: str = "") -> Callable[[AnalyzerFn], AnalyzerFn]:
    if layer not in LAYERS:
        raise ValueError(f"analyzer {name!r}: layer must be one of {', '.join(LAYERS)}, not {layer!r}")

    def register(fn: AnalyzerFn) -> AnalyzerFn:
        _target()[0].append(Analyzer(name, layer, fn, description or (fn.__doc__ or "").strip()))
        return fn

    return register


def rule(name: str, priority: int = 50, candidate_kinds: Sequence[str] = ()) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        _target()[1].append(Rule(name, fn, priority, tuple(candidate_kinds)))
        return fn

    return register


def severity_above(value: float | None, warning: float, critical: float | None = None) -> Severity:
    if value is None:
        return "info"
    if critical is not None and value > critical:
        return "critical"
    return "warning" if value > warning else "info"


def severity_below(value: float | None, warning: float, critical: float | None = None) -> Severity:
    if value is None:
        return "info"
    if critical is not None and value < critical:
        return "critical"
    return "warning" if value < warning else "info"
