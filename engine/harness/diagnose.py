"""Diagnosing a run: every analyzer, then every rule, into one stored diagnosis."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import WorkspaceConfig
from engine.harness.base import SEVERITY_RANK, Context, Finding, Findings, RuleResult
from engine.harness.loader import Harness, broken, load_harness
from engine.harness.rules import is_blocking
from engine.store import RunRecord, Store, VersionRecord


@dataclass
class Diagnosis:
    id: str
    version: str
    run_id: str
    harness_revision: str
    findings: list[Finding]
    fired: list[RuleResult] = field(default_factory=list)

    @property
    def bottleneck(self) -> RuleResult | None:
        return self.fired[0] if self.fired else None

    @property
    def rule_names(self) -> list[str]:
        """The rules that fired, bottleneck first."""
        return [r.rule for r in self.fired]

    @property
    def critical(self) -> list[RuleResult]:
        return [r for r in self.fired if r.severity == "critical"]

    @property
    def blocking(self) -> list[RuleResult]:
        """The rules that stand against a promotion (`engine.harness.rules.BLOCKING_RULES`)."""
        return [r for r in self.fired if is_blocking(r.rule, r.severity)]

    def fired_rule(self, name: str) -> RuleResult | None:
        return next((r for r in self.fired if r.rule == name), None)

    @property
    def candidate_kinds(self) -> list[str]:
        seen: dict[str, None] = {}
        for result in self.fired:
            seen.update(dict.fromkeys(result.candidate_kinds))
        return list(seen)

    def headline(self, limit: int = 5) -> list[str]:
        return headline(self.to_dict(), limit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "run_id": self.run_id,
            "harness_revision": self.harness_revision,
            "bottleneck": self.bottleneck.rule if self.bottleneck else None,
            "rules": [r.to_dict() for r in self.fired],
            "candidate_kinds": self.candidate_kinds,
            "findings": [f.to_dict() for f in self.findings],
        }


def headline(d: dict[str, Any], limit: int = 5) -> list[str]:
    """The lines a person reads first (of a diagnosis as `to_dict` gives it, here or from the
    engine's socket): the bottleneck, the other rules, the worst findings."""
    rules = d.get("rules", [])
    lines = [f"bottleneck: {r['rule']} ({r['severity']}): {r['explanation']}" for r in rules[:1]]
    lines += [f"rule {r['rule']} ({r['severity']}): {r['explanation']}" for r in rules[1:]]
    worst = sorted(
        (f for f in d.get("findings", []) if f["severity"] != "info"), key=lambda f: -SEVERITY_RANK[f["severity"]]
    )
    lines += [f"{f['severity']}: {f['metric']}: {f['explanation']}" for f in worst]
    return (lines or ["no rule fired and no finding above info"])[:limit]


def diagnose(
    store: Store,
    run: RunRecord,
    version: VersionRecord,
    config: WorkspaceConfig,
    workspace_root: Path | None = None,
    harness: Harness | None = None,
    window: int | None = None,
) -> Diagnosis:
    harness = harness or load_harness(workspace_root)
    steps = run.total_steps or 0
    ctx = Context(store, run, version, config, window=window or max(1, min(10, steps // 5)))
    findings = list(harness.problems)
    try:
        for a in harness.analyzers:
            try:
                findings += a.run(ctx)
            except Exception as exc:  # noqa: BLE001 - one broken analyzer never sinks the diagnosis
                if a.provenance == "built-in":
                    raise
                findings.append(broken("analyzer", a.name, Path(a.source), exc))
        view = Findings(findings)
        fired = []
        for r in sorted(harness.rules, key=lambda r: r.priority):
            try:
                result = r.evaluate(view, ctx)
            except Exception as exc:  # noqa: BLE001
                if r.provenance == "built-in":
                    raise
                findings.append(broken("rule", r.name, Path(r.source), exc))
                continue
            if result is not None:
                fired.append(result)
    finally:
        ctx.close()
    # The bottleneck is the most severe rule that fired, ties broken by priority.
    fired.sort(key=lambda r: -SEVERITY_RANK[r.severity])
    return Diagnosis(f"{run.id}-diagnosis", version.name, run.id, harness.revision, findings, fired)


def load_diagnosis(store: Store, run_id: str) -> Diagnosis | None:
    """The stored diagnosis of a run, typed as `diagnose` made it (None if it has none)."""
    head = store.query_one(
        "SELECT id, version, harness_revision, rules FROM diagnoses WHERE run_id = ? ORDER BY created_at DESC LIMIT 1",
        [run_id],
    )
    if head is None:
        return None
    diagnosis_id, version, revision, rules = head
    rows = store.query(
        """SELECT metric, value, severity, explanation, threshold, evidence, analyzer, layer, provenance
           FROM findings WHERE diagnosis_id = ? ORDER BY idx""",
        [diagnosis_id],
    )
    findings = []
    for metric, value, severity, explanation, threshold, evidence, analyzer, layer, provenance in rows:
        ev = json.loads(evidence)
        findings.append(
            Finding(
                metric,
                value,
                severity,
                explanation,
                threshold,
                tuple(ev.get("steps", ())),
                tuple(ev.get("rollouts", ())),
                analyzer,
                layer,
                provenance,
            )
        )
    fired = [
        RuleResult(
            r["explanation"],
            r["severity"],
            tuple(r["metrics"]),
            tuple(r["candidate_kinds"]),
            rule=r["rule"],
            provenance=r.get("provenance", "built-in"),
        )
        for r in json.loads(rules)
    ]
    return Diagnosis(diagnosis_id, version, run_id, revision, findings, fired)


def store_diagnosis(store: Store, diagnosis: Diagnosis) -> None:
    """Replace any earlier diagnosis of the same run (re-diagnosing with an evolved harness)."""
    with store.transaction():
        store.con.execute("DELETE FROM findings WHERE diagnosis_id = ?", [diagnosis.id])
        store.con.execute("DELETE FROM diagnoses WHERE id = ?", [diagnosis.id])
        store.con.execute(
            "INSERT INTO diagnoses (id, version, run_id, harness_revision, bottleneck, rules, candidate_kinds)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                diagnosis.id,
                diagnosis.version,
                diagnosis.run_id,
                diagnosis.harness_revision,
                diagnosis.bottleneck.rule if diagnosis.bottleneck else None,
                json.dumps([r.to_dict() for r in diagnosis.fired]),
                json.dumps(diagnosis.candidate_kinds),
            ],
        )
        if diagnosis.findings:
            store.con.executemany(
                "INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    [
                        diagnosis.id,
                        i,
                        f.analyzer,
                        f.provenance,
                        f.layer,
                        f.metric,
                        f.value,
                        f.threshold,
                        f.severity,
                        f.explanation,
                        json.dumps({"steps": list(f.steps), "rollouts": list(f.rollouts)}),
                    ]
                    for i, f in enumerate(diagnosis.findings)
                ],
            )
