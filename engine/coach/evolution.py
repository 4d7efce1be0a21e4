"""Harness evolution: when no rule explains what happened to a version, propose new analyzers,
probe the version with them, validate them on past versions, and adopt into ``<ws>/harness/``
only those that separate the versions judged improved from those judged regressed.

A proposed analyzer is data (`AnalyzerSpec`: one read-only SQL query over `completions` giving
one number). The engine decides which rollouts `completions` holds: a run's train rollouts (the
analyzer in a diagnosis, and the retrospective validation over past versions), or one sampled
val pass (the probe of a version against its parent, before its decision). An adopted spec is
rendered into a small workspace analyzer file from a fixed template, so nothing a model writes is
executed as Python. Every proposal is recorded, with its probe, adopted or refused; nothing a
proposal does can stop the loop.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import git

from engine.coach.backends.base import AnalyzerSpec
from engine.harness.analyzers.shift import (
    CORRECT,
    POLICY_TEXT,
    RATIO_FEATURES,
    Shift,
    ratio_shift,
    share_shift,
)
from engine.harness.backtest import (
    SEPARATION_ALPHA,
    AnalyzerValidation,
    revalidate_findings,
    store_backtest,
    validate_analyzer,
)
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import HARNESS_DIR
from engine.store import Store
from engine.store.schema import MIGRATIONS

_FORBIDDEN = re.compile(
    r"\b(copy|attach|detach|install|load|pragma|create|insert|update|delete|drop|alter|export|import|set|call|"
    r"checkpoint|vacuum|read_\w+|glob|getenv)\b|;",
    re.IGNORECASE,
)


class UnsafeSQLError(ValueError):
    pass


#: The store's tables: an analyzer reads `completions` (a view of one run's rollouts), none of these.
#: The rows an investigation's probes read (`probe_all`), held for the probes' queries only.
PROBE_ROWS = "probe_rows"
_TABLES = re.compile(
    r"\b(" + "|".join([*re.findall(r"CREATE TABLE (\w+)", "".join(MIGRATIONS)), PROBE_ROWS]) + r")\b", re.IGNORECASE
)


def check_sql(sql: str) -> None:
    """Analyzer SQL is one read-only query over `completions` and nothing else."""
    stripped = sql.strip()
    if not re.match(r"(?is)^(select|with)\b", stripped):
        raise UnsafeSQLError("analyzer SQL must be one SELECT (or WITH ... SELECT) query")
    match = _FORBIDDEN.search(stripped) or _TABLES.search(stripped)
    if match:
        raise UnsafeSQLError(f"analyzer SQL may only read `completions`; it uses {match.group(0)!r}")
    if not re.search(r"(?i)\bcompletions\b", stripped):
        raise UnsafeSQLError("analyzer SQL must read `completions` (one run's rollouts)")


def over_completions(sql: str, where: str, source: str = "rollouts") -> str:
    """`sql` with `completions` bound to the rollouts `where` selects (an SQL condition on the
    `rollouts` columns of `source`), plus the policy's `text` and `correct`."""
    check_sql(sql)
    view = f"completions AS (SELECT o.*, {POLICY_TEXT} AS text, {CORRECT} AS correct FROM {source} o WHERE {where})"
    stripped = sql.strip()
    if stripped[:4].lower() == "with":
        return f"WITH {view}, {stripped[4:].lstrip()}"
    return f"WITH {view} {stripped}"


#: What `completions` holds when a spec measures a run: its train rollouts.
TRAIN_ROWS = "o.run_id = $run AND o.split = 'train'"
#: ... and when it probes a run's sampled val passes against another run's (`$other`): the accepted
#: answers of its latest evaluation, on the tasks both runs solved in some pass. Like with like: a
#: version that solves more tasks moves any number read over all its answers (that moves with the
#: score and can neither explain nor convict it); the same tasks, solved by both, answered in a
#: new way, is what a probe is for (answers a buggy verifier accepts, say). Selected for both runs
#: and every pass at once (`probe_all` holds them in `PROBE_ROWS`); a probe reads one run's pass.
VAL_PASS_ROWS = f"""
    SELECT o.* FROM rollouts o
    WHERE o.run_id IN ($run, $other) AND o.split = 'val' AND o.decoding = 'sampled' AND {CORRECT}
      AND o.step = (SELECT max(step) FROM rollouts WHERE run_id = o.run_id AND split = 'val')
      AND [o.task_id, o.prompt] IN (
        SELECT [o.task_id, o.prompt] FROM rollouts o
        WHERE o.run_id IN ($run, $other) AND o.split = 'val' AND o.decoding = 'sampled' AND {CORRECT}
          AND o.step = (SELECT max(step) FROM rollouts WHERE run_id = o.run_id AND split = 'val')
        GROUP BY o.task_id, o.prompt HAVING count(DISTINCT o.run_id) = 2)
"""


#: The answers a probe's share was read over, per pass (its sampling noise sets the least floor).
_COUNT = AnalyzerSpec(
    name="answers", layer="version", kind="share", sql="SELECT count(*) FROM completions", explanation="answers read"
)


def find_anomaly(
    verdict: str, child: Diagnosis | None, parent: Diagnosis | None, tolerance: float = 0.25
) -> dict[str, Any] | None:
    """The score moved beyond the noise floor (improved or regressed), yet the child's diagnosis
    shows no new rule and no signal or behavior finding that moved by more than `tolerance`
    (relative) from the parent's: nothing in the harness explains the change. The anomaly says
    which findings moved most all the same (what proposals start from)."""
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
    return {"verdict": verdict, "version": child.version, "unexplained": True, "moved": moved(child, parent)}


def moved(child: Diagnosis, parent: Diagnosis | None, limit: int = 8) -> list[dict[str, Any]]:
    """The child's findings that moved most from the parent's, largest first: relative change of
    a finding both have, and for a version-layer shift (already a comparison with the parent) how
    many of its floors it moved (the parent's own spread; a shift without a floor is not sized)."""
    before = {f.metric: f.value for f in (parent.findings if parent else ()) if f.value is not None}
    out = []
    for f in child.findings:
        if f.value is None:
            continue
        if f.metric.startswith("version.shift."):
            if not f.threshold:
                continue
            if f.metric.removeprefix("version.shift.") in RATIO_FEATURES:
                if f.value <= 0 or f.threshold <= 1:
                    continue
                size = abs(math.log(f.value)) / math.log(f.threshold)
            else:
                size = abs(f.value) / f.threshold
            out.append({"metric": f.metric, "child": f.value, "size": size})
        elif (old := before.get(f.metric)) is not None and f.value != old:
            size = abs(f.value - old) / max(abs(old), 1e-9)
            out.append({"metric": f.metric, "parent": old, "child": f.value, "size": size})
    return sorted(out, key=lambda m: -m["size"])[:limit]


@dataclass(frozen=True)
class Investigation:
    """What the harness looked at before deciding on a verdict no rule explained: the anomaly
    (and the findings that moved most), the probes of the proposed analyzers, the one adopted."""

    version: str
    anomaly: dict[str, Any]
    probes: list[Probe]
    adopted: list[str]
    error: str | None = None

    @property
    def found(self) -> list[Probe]:
        return [p for p in self.probes if p.found]

    def summary(self) -> str:
        verdict = self.anomaly["verdict"]
        if self.error:
            return f"the investigation of the {verdict} verdict failed: {self.error}"
        if self.found:
            return "the investigation found shifts no rule measured: " + "; ".join(p.summary() for p in self.found)
        adopted = f"; adopted {', '.join(self.adopted)}" if self.adopted else ""
        if not self.anomaly.get("unexplained", True):
            probes = len(self.probes)
            return f"investigated before this decision: none of {probes} probe(s) moved beyond its floor{adopted}"
        return (
            f"checked before this decision: no rule explains the {verdict} verdict, and none of "
            f"{len(self.probes)} probe(s) moved beyond its floor{adopted}: unexplained"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "anomaly": self.anomaly,
            "probes": [p.to_dict() | {"name": p.spec.name} for p in self.probes],
            "adopted": self.adopted,
            "error": self.error,
            "summary": self.summary(),
        }


@dataclass(frozen=True)
class EvolutionResult:
    spec: AnalyzerSpec
    validation: AnalyzerValidation
    adopted: bool
    reason: str
    file: str | None = None
    commit_sha: str | None = None
    probe: Probe | None = None


def spec_value(store: Store, spec: AnalyzerSpec, run_id: str) -> float | None:
    """The spec's number on a run's train rollouts."""
    row = store.query_one(over_completions(spec.sql, TRAIN_ROWS), {"run": run_id})
    if not row or row[0] is None:
        return None
    return float(row[0])


@dataclass(frozen=True)
class Probe:
    """A spec measured on a version's sampled val passes against its parent's: the shift, with the
    parent's own pass-to-pass spread as its floor (`engine.harness.analyzers.shift`)."""

    spec: AnalyzerSpec
    shift: Shift | None
    error: str | None = None

    @property
    def found(self) -> bool:
        return self.shift is not None and self.shift.counts

    def summary(self) -> str:
        if self.error:
            return f"{self.spec.name}: not measured ({self.error})"
        if self.shift is None:
            return f"{self.spec.name}: no value on the val passes"
        return f"{self.spec.name}: {self.shift.finding('the parent').explanation}"

    def to_dict(self) -> dict[str, Any]:
        s = self.shift
        shift = None if s is None else {"value": s.value, "floor": s.floor, "parent": s.parent, "child": s.child}
        return {"found": self.found, "summary": self.summary(), "shift": shift, "error": self.error}


def probe_all(store: Store, specs: list[AnalyzerSpec], child_run: str, parent_run: str) -> dict[str, Probe]:
    """Each spec measured on every sampled val pass of the child's and the parent's evaluations (the
    accepted answers on the tasks both solved: `VAL_PASS_ROWS`), by name. Those rows are selected
    once (`PROBE_ROWS`): that selection, not a spec's own query, is most of a probe's cost."""
    passes = {
        run_id: [
            k
            for (k,) in store.query(
                "SELECT DISTINCT sample_idx FROM rollouts WHERE run_id = ? AND split = 'val' AND decoding = 'sampled'"
                " ORDER BY 1",
                [run_id],
            )
        ]
        for run_id in (child_run, parent_run)
    }
    with store.temp_table(PROBE_ROWS, VAL_PASS_ROWS, {"run": child_run, "other": parent_run}):
        counts = {run_id: _pass_values(store, _COUNT, run_id, ks) for run_id, ks in passes.items()}
        rows = {run_id: int(sum(n or 0 for n in counted)) for run_id, counted in counts.items()}
        return {s.name: _probe(store, s, passes, rows, child_run, parent_run) for s in specs}


def _pass_values(store: Store, spec: AnalyzerSpec, run_id: str, passes: list[int]) -> list[float | None]:
    """The spec's number on each of `passes` of the run, read from `PROBE_ROWS`."""
    sql = over_completions(spec.sql, "o.run_id = $run AND o.sample_idx = $pass", PROBE_ROWS)
    values = [store.query_one(sql, {"run": run_id, "pass": k}) for k in passes]
    return [None if not row or row[0] is None else float(row[0]) for row in values]


def _probe(
    store: Store,
    spec: AnalyzerSpec,
    passes: dict[str, list[int]],
    rows: dict[str, int],
    child_run: str,
    parent_run: str,
) -> Probe:
    try:
        values = {
            run_id: [v for v in _pass_values(store, spec, run_id, ks) if v is not None] for run_id, ks in passes.items()
        }
        if spec.kind == "mean":
            return Probe(spec, ratio_shift(spec.name, values[child_run], values[parent_run]))
        shift = share_shift(spec.name, values[child_run], values[parent_run], (rows[child_run], rows[parent_run]))
        return Probe(spec, shift)
    except Exception as exc:  # noqa: BLE001 - a bad proposal is refused, never a crash
        return Probe(spec, None, f"{type(exc).__name__}: {exc}")


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

    over_completions(spec.sql, TRAIN_ROWS)  # refuses unsafe SQL before it runs anywhere
    return validate_analyzer(store, f"{spec.layer}.{spec.name}", value_of)


def render(spec: AnalyzerSpec, validation: AnalyzerValidation, round: int | None) -> str:
    """The workspace analyzer file for an adopted spec. It can block: a run whose value lies
    beyond every version judged improved when it was adopted, on the regressed versions' side, is
    a critical finding, which the `workspace_critical` rule turns into a block. The cut-off is the
    improved versions' own edge, so none of the versions it was validated on would be blocked."""
    higher_improved = (validation.auc or 0.5) >= 0.5
    improved = sorted(validation.improved.values())
    cut_off = improved[0] if higher_improved else improved[-1]
    direction = "higher" if higher_improved else "lower"
    beyond = "<" if higher_improved else ">"
    side = "below the lowest" if higher_improved else "above the highest"
    return f'''"""Adopted by the coach (round {round}, {spec.source}): {spec.explanation}.

Retrospective validation: AUC {validation.auc:.2f} (permutation p {validation.p_value:.3f}) over
{len(validation.improved)} improved and {len(validation.regressed)} regressed versions ({direction} values
went with improved versions). A run {side} value of those improved versions ({cut_off:.6g}) is
critical: the `workspace_critical` rule blocks it.
"""

from engine.harness.base import Context, Finding, analyzer

SQL = {json.dumps(over_completions(spec.sql, TRAIN_ROWS))}
#: The edge of the values of the versions judged improved when this analyzer was adopted.
CUT_OFF = {cut_off!r}
METRIC = {f"{spec.layer}.{spec.name}"!r}
EXPLANATION = {spec.explanation!r}


@analyzer({spec.name!r}, {spec.layer!r}, {spec.explanation!r})
def {spec.name}(ctx: Context) -> Finding | None:
    row = ctx.q1(SQL)
    if not row or row[0] is None:
        return None
    value = float(row[0])
    if value {beyond} CUT_OFF:
        why = f"{{value:.6g}} is {side} value of the versions judged improved at adoption ({{CUT_OFF:.6g}})"
        return Finding(METRIC, value, "critical", f"{{EXPLANATION}}: {{why}}", threshold=CUT_OFF)
    return Finding(METRIC, value, "info", EXPLANATION, threshold=CUT_OFF)
'''


def evolve(
    store: Store,
    workspace_root: Path,
    specs: list[AnalyzerSpec],
    round: int | None,
    existing: set[str],
    version: str | None = None,
    probes: dict[str, Probe] | None = None,
) -> list[EvolutionResult]:
    """Validate every spec; adopt the best-separating one (at most one per anomaly) with a commit
    in the workspace repository; record all of them (with the `probes` of `version`, if any)."""
    probes = probes or {}
    results: list[EvolutionResult] = []
    alpha = SEPARATION_ALPHA / max(1, len(specs))  # several tried at once: Bonferroni
    for spec in specs:
        empty = AnalyzerValidation(spec.name, {}, {}, None)
        if spec.name in existing:
            results.append(EvolutionResult(spec, empty, False, "name taken", probe=probes.get(spec.name)))
            continue
        try:
            validation = replace(validate_spec(store, spec), alpha=alpha)
        except Exception as exc:  # noqa: BLE001 - a bad proposal is refused, never a crash
            reason = f"invalid: {type(exc).__name__}: {exc}"
            results.append(EvolutionResult(spec, empty, False, reason, probe=probes.get(spec.name)))
            continue
        results.append(EvolutionResult(spec, validation, False, validation.summary(), probe=probes.get(spec.name)))
    separating = [r for r in results if r.validation.separates]
    best = min(
        separating, key=lambda r: (r.validation.p_value or 1.0, -abs((r.validation.auc or 0.5) - 0.5)), default=None
    )
    for i, r in enumerate(results):
        if r is best:
            try:
                results[i] = _adopt(workspace_root, r, round)
            except Exception as exc:  # noqa: BLE001 - e.g. a repository that refuses the commit
                results[i] = replace(r, reason=f"{r.reason}, but adopting it failed: {type(exc).__name__}: {exc}")
        elif r in separating:
            results[i] = replace(r, reason=f"{r.reason}, but another separates better")
    _record(store, results, round, version)
    return results


def _adopt(workspace_root: Path, r: EvolutionResult, round: int | None) -> EvolutionResult:
    path = workspace_root / HARNESS_DIR / f"{r.spec.name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(render(r.spec, r.validation, round), encoding="utf-8")
    relative = str(path.relative_to(workspace_root))
    repo = git.Repo(workspace_root)
    repo.index.add([relative])
    commit = repo.index.commit(f"harness: adopt analyzer {r.spec.name} ({r.reason})")
    return replace(r, adopted=True, file=relative, commit_sha=commit.hexsha)


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


def _record(store: Store, results: list[EvolutionResult], round: int | None, version: str | None) -> None:
    row = store.query_one("SELECT count(*) FROM harness_proposals")
    n = row[0] if row else 0
    for i, r in enumerate(results, start=1):
        store.con.execute(
            "INSERT INTO harness_proposals (id, round, name, layer, spec, source, auc, n_improved, n_regressed,"
            " adopted, reason, file, commit_sha, version, probe) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                version,
                json.dumps(r.probe.to_dict()) if r.probe else None,
            ],
        )
