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
from engine.harness.backtest import AnalyzerValidation, validate_analyzer
from engine.harness.loader import HARNESS_DIR
from engine.store import Store

#: |AUC - 0.5| at least this much, over at least one improved and one regressed version.
MIN_SEPARATION = 0.25

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
    verdict: str, child: dict[str, Any] | None, parent: dict[str, Any] | None, tolerance: float = 0.25
) -> dict[str, Any] | None:
    """The score moved beyond the noise floor (improved or regressed), yet the child's diagnosis
    shows no new rule and no signal or behavior finding that moved by more than `tolerance`
    (relative) from the parent's: nothing in the harness explains the change."""
    if verdict not in ("improved", "regressed") or not child:
        return None
    child_rules = {r["rule"] for r in child.get("rules", [])}
    parent_rules = {r["rule"] for r in (parent or {}).get("rules", [])}
    if child_rules - parent_rules:
        return None
    before = {f["metric"]: f["value"] for f in (parent or {}).get("findings", []) if f.get("value") is not None}
    moved = []
    for f in child.get("findings", []):
        old, new = before.get(f["metric"]), f.get("value")
        if f.get("layer") not in ("signal", "behavior") or old is None or new is None or "trend" in f["metric"]:
            continue
        if abs(new - old) > tolerance * max(abs(old), 1e-9):
            moved.append(f["metric"])
    if moved:
        return None
    return {"verdict": verdict, "version": child.get("version"), "unexplained": True}


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

Retrospective validation: AUC {validation.auc:.2f} over {len(validation.improved)} improved and
{len(validation.regressed)} regressed versions ({direction} values went with improved versions).
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
        if validation.auc is None:
            reason = "cannot validate: needs at least one improved and one regressed past version"
        elif abs(validation.auc - 0.5) < MIN_SEPARATION:
            reason = f"does not separate past outcomes (AUC {validation.auc:.2f})"
        else:
            reason = f"separates past outcomes (AUC {validation.auc:.2f})"
        results.append(EvolutionResult(spec, validation, False, reason))
    separating = [r for r in results if r.reason.startswith("separates")]
    best = max(separating, key=lambda r: abs((r.validation.auc or 0.5) - 0.5), default=None)
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
