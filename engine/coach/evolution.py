"""Harness evolution: when no rule explains what happened to a version, propose new analyzers,
validate them on past versions, and adopt into ``<ws>/harness/`` only those that separate the
versions judged improved from those judged regressed.

A proposed analyzer is data (`AnalyzerSpec`: one read-only SQL query giving one number per run).
It is rendered into a small workspace analyzer file from a fixed template, so nothing a model
writes is executed as Python. Adopted and refused proposals are both recorded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

from engine.coach.backends.base import AnalyzerSpec
from engine.config import WorkspaceConfig
from engine.harness.backtest import AnalyzerValidation, revalidate_findings, store_backtest, validate_analyzer
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import HARNESS_DIR
from engine.store import RunRecord, Store

_FORBIDDEN = re.compile(
    r"\b(copy|attach|detach|install|load|pragma|create|insert|update|delete|drop|alter|export|import|set|call|"
    r"checkpoint|vacuum|read_\w+|glob|getenv)\b|;",
    re.IGNORECASE,
)


class UnsafeSQLError(ValueError):
    pass


def check_sql(sql: str) -> None:
    """Analyzer SQL reads the store and nothing else."""
    stripped = sql.strip()
    if not re.match(r"(?is)^(select|with)\b", stripped):
        raise UnsafeSQLError("analyzer SQL must be one SELECT (or WITH ... SELECT) query")
    match = _FORBIDDEN.search(stripped)
    if match:
        raise UnsafeSQLError(f"analyzer SQL may only read the store; it uses {match.group(0)!r}")


def find_anomaly(
    verdict: str, child: Diagnosis | None, parent: Diagnosis | None, tolerance: float = 0.25
) -> dict[str, Any] | None:
    """The score moved beyond the noise floor (improved or regressed), yet the child's diagnosis
    shows no new rule and no signal or behavior finding that moved by more than `tolerance`
    (relative) from the parent's: nothing in the harness explains the change."""
    if verdict not in ("improved", "regressed") or child is None:
        return None
    if set(child.rule_names) - set(parent.rule_names if parent else ()):
        return None
    before = {f.metric: f.value for f in (parent.findings if parent else ()) if f.value is not None}
    for f in child.findings:
        old, new = before.get(f.metric), f.value
        if f.layer not in ("signal", "behavior") or old is None or new is None or "trend" in f.metric:
            continue
        if abs(new - old) > tolerance * max(abs(old), 1e-9):
            return None
    return {"verdict": verdict, "version": child.version, "unexplained": True}


def describe_anomaly(store: Store, run: RunRecord | None, config: WorkspaceConfig) -> dict[str, Any]:
    """What proposals for an anomaly may measure: the version's reward components and the metric
    keys its run logged."""
    keys = store.query("SELECT DISTINCT key FROM metrics WHERE run_id = ? ORDER BY key", [run.id]) if run else []
    return {"components": sorted(config.recipe.rewards), "metric_keys": [k for (k,) in keys]}


@dataclass(frozen=True)
class EvolutionResult:
    spec: AnalyzerSpec
    validation: AnalyzerValidation
    adopted: bool
    reason: str
    file: str | None = None
    commit_sha: str | None = None


def spec_value(store: Store, spec: AnalyzerSpec, run_id: str) -> float | None:
    row = store.query_one(spec.sql, {"run": run_id} if "$run" in spec.sql else None)
    if not row or row[0] is None:
        return None
    return float(row[0])


def validate_spec(store: Store, spec: AnalyzerSpec) -> AnalyzerValidation:
    """The spec's number on every judged version's latest train run, and how well it separates."""
    check_sql(spec.sql)

    def value_of(version: str) -> float | None:
        row = store.query_one(
            "SELECT id FROM runs WHERE version = ? AND kind = 'train' AND state = 'succeeded'"
            " ORDER BY ended_at DESC LIMIT 1",
            [version],
        )
        return spec_value(store, spec, row[0]) if row else None

    return validate_analyzer(store, f"{spec.layer}.{spec.name}", value_of)


def render(spec: AnalyzerSpec, validation: AnalyzerValidation, round: int | None) -> str:
    """The workspace analyzer file for an adopted spec."""
    direction = "higher" if (validation.auc or 0.5) >= 0.5 else "lower"
    return f'''"""Adopted by the coach (round {round}, {spec.source}): {spec.explanation}.

Retrospective validation: AUC {validation.auc:.2f} (permutation p {validation.p_value:.3f}) over
{len(validation.improved)} improved and {len(validation.regressed)} regressed versions ({direction} values
went with improved versions).
"""

from engine.harness.base import Context, Finding, analyzer

SQL = {json.dumps(spec.sql.strip())}


@analyzer({spec.name!r}, {spec.layer!r}, {spec.explanation!r})
def {spec.name}(ctx: Context) -> Finding | None:
    row = ctx.q1(SQL)
    if not row or row[0] is None:
        return None
    return Finding({f"{spec.layer}.{spec.name}"!r}, float(row[0]), "info", {spec.explanation!r})
'''


def evolve(
    store: Store, workspace_root: Path, specs: list[AnalyzerSpec], round: int | None, existing: set[str]
) -> list[EvolutionResult]:
    """Validate every spec; adopt the best-separating one (at most one per anomaly) with a commit
    in the workspace repository; record all of them."""
    results: list[EvolutionResult] = []
    for spec in specs:
        if spec.name in existing:
            results.append(EvolutionResult(spec, AnalyzerValidation(spec.name, {}, {}, None), False, "name taken"))
            continue
        try:
            validation = validate_spec(store, spec)
        except Exception as exc:  # noqa: BLE001 - a bad proposal is refused, never a crash
            empty = AnalyzerValidation(spec.name, {}, {}, None)
            results.append(EvolutionResult(spec, empty, False, f"invalid: {type(exc).__name__}: {exc}"))
            continue
        results.append(EvolutionResult(spec, validation, False, validation.summary()))
    separating = [r for r in results if r.validation.separates]
    best = min(
        separating, key=lambda r: (r.validation.p_value or 1.0, -abs((r.validation.auc or 0.5) - 0.5)), default=None
    )
    for i, r in enumerate(results):
        if r is best:
            results[i] = _adopt(workspace_root, r, round)
        elif r in separating:
            results[i] = EvolutionResult(r.spec, r.validation, False, f"{r.reason}, but another separates better")
    _record(store, results, round)
    return results


def _adopt(workspace_root: Path, r: EvolutionResult, round: int | None) -> EvolutionResult:
    path = workspace_root / HARNESS_DIR / f"{r.spec.name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(render(r.spec, r.validation, round), encoding="utf-8")
    relative = str(path.relative_to(workspace_root))
    repo = git.Repo(workspace_root)
    repo.index.add([relative])
    commit = repo.index.commit(f"harness: adopt analyzer {r.spec.name} ({r.reason})")
    return EvolutionResult(r.spec, r.validation, True, r.reason, relative, commit.hexsha)


@dataclass(frozen=True)
class Revalidation:
    """Escalation's re-validation of the harness: every metric's separation of past outcomes, and
    the adopted analyzers it retired (workspace file, why)."""

    validations: list[AnalyzerValidation]
    retired: list[tuple[str, str]]

    @property
    def separating(self) -> list[AnalyzerValidation]:
        return [v for v in self.validations if v.separates]


def revalidate(store: Store, workspace_root: Path, round: int | None) -> Revalidation:
    """Test every finding's metric again on the versions judged so far (`revalidate_findings`),
    and each analyzer harness evolution adopted, the way it was adopted (`validate_spec`), now on
    every judged version: one that no longer separates improved from regressed versions is
    retired (its file leaves ``<ws>/harness/`` in a commit that says why), so the escalated round
    reasons with a harness that still predicts outcomes."""
    validations = revalidate_findings(store)
    adopted = store.query(
        "SELECT name, spec, file FROM harness_proposals WHERE adopted AND file IS NOT NULL ORDER BY id"
    )
    retired: list[tuple[str, str]] = []
    repo = git.Repo(workspace_root)
    for name, spec, file in adopted:
        if not (workspace_root / file).exists():  # retired before, or removed by a person
            continue
        v = validate_spec(store, AnalyzerSpec.model_validate_json(spec))
        if v.separates:
            continue
        repo.index.remove([file], working_tree=True)
        repo.index.commit(f"harness: retire analyzer {name} ({v.summary()})")
        retired.append((file, v.summary()))
    store_backtest(
        store,
        "harness_revalidation",
        None,
        {"round": round},
        {
            "metrics": [(v.metric, v.auc, v.p_value) for v in validations],
            "separating": [v.metric for v in validations if v.separates],
            "retired": retired,
        },
    )
    return Revalidation(validations, retired)


def _record(store: Store, results: list[EvolutionResult], round: int | None) -> None:
    row = store.query_one("SELECT count(*) FROM harness_proposals")
    n = row[0] if row else 0
    for i, r in enumerate(results, start=1):
        store.con.execute(
            "INSERT INTO harness_proposals (id, round, name, layer, spec, source, auc, n_improved, n_regressed,"
            " adopted, reason, file, commit_sha) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                f"hp-{n + i}",
                round,
                r.spec.name,
                r.spec.layer,
                r.spec.model_dump_json(),
                r.spec.source,
                r.validation.auc,
                len(r.validation.improved),
                len(r.validation.regressed),
                r.adopted,
                r.reason,
                r.file,
                r.commit_sha,
            ],
        )
