"""The coach's memory in the store: the version ledger, case memory, the retrieval trace and the
record of model calls. (Skill cards live as Markdown in the workspace: `skills.py`.)"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.coach.backends.base import ModelCall
from engine.coach.interventions import CONTROL, Intervention
from engine.coach.skills import SkillLibrary
from engine.harness.diagnose import Diagnosis
from engine.store import Store

#: Version states that end a version's story, and whether they count as a failure of the coach.
FAILED_STATES = ("rejected", "pruned", "failed")


def failure_signature(diagnosis: Diagnosis | None) -> str:
    """What a case is filed under: the rules that fired on the parent, sorted ('none' if none)."""
    rules = sorted(set(diagnosis.rule_names if diagnosis else ()))
    return "+".join(rules) if rules else "none"


@dataclass(frozen=True)
class Lookups:
    """What a round looked up before proposing: the literature query and its hits, the skill
    cards its rules matched, the cases filed under its signature."""

    query: str
    hits: list[dict[str, Any]] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    skills: list[dict[str, Any]] = field(default_factory=list)
    signature: str = "none"
    cases: list[dict[str, Any]] = field(default_factory=list)


class Memory:
    def __init__(self, store: Store):
        self.store = store

    # -- the version ledger -------------------------------------------------------------------
    def ledger(self) -> list[dict[str, Any]]:
        """Every version with its intervention, verdict, decision and reason, oldest first."""
        cur = self.store.con.execute(
            """
            SELECT v.name, v.parent, v.state, v.verdict, v.decision_reason AS reason, v.val_greedy, v.val_sampled,
                   i.kind, i.factor, i.template, i.source, i.round, i.hypothesis
            FROM versions v LEFT JOIN interventions i ON i.id = v.intervention_id
            ORDER BY CAST(substr(v.name, 2) AS INTEGER)
            """
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def controls(self, parent: str) -> list[str]:
        """The control branches of `parent` (the parent trained on unchanged), oldest first, but
        those whose run failed."""
        rows = self.store.query(
            """SELECT v.name FROM versions v JOIN interventions i ON i.id = v.intervention_id
               WHERE v.parent = ? AND i.template = ? AND v.state != 'failed'
               ORDER BY CAST(substr(v.name, 2) AS INTEGER)""",
            [parent, CONTROL],
        )
        return [name for (name,) in rows]

    def consecutive_failures(self) -> int:
        """Child versions that ended without promotion since the last promotion (decision order)."""
        rows = self.store.query(
            """SELECT state FROM versions
               WHERE parent IS NOT NULL AND state IN ('promoted', 'rejected', 'pruned', 'failed')
               ORDER BY coalesce(decided_at, created_at), CAST(substr(name, 2) AS INTEGER)"""
        )
        count = 0
        for (state,) in rows:
            count = 0 if state == "promoted" else count + 1
        return count

    # -- case memory ----------------------------------------------------------------------------
    def record_case(
        self,
        version: str,
        signature: str,
        domain: str,
        parent: str,
        kind: str,
        template: str | None,
        factor: str,
        verdict: str | None,
        decision: str,
        outcome: str,
    ) -> None:
        case = {"signature": signature, "domain": domain, "parent": parent, "kind": kind}
        case |= {"template": template, "factor": factor, "verdict": verdict}
        self.store.record_case(version, case, decision, outcome)

    def cases(self, signature: str, domain: str) -> list[dict[str, Any]]:
        """Cases with this signature first, then those sharing at least one rule; newest first;
        never a retracted one (`flag`)."""
        rules = signature.split("+")
        cur = self.store.con.execute(
            """
            SELECT id AS version, signature, domain, parent, kind, template, factor, verdict, decision, outcome,
                   signature = $sig AS exact
            FROM cases
            WHERE domain = $domain AND retracted IS NULL
              AND (signature = $sig OR len(list_intersect(string_split(signature, '+'), $rules)) > 0)
            ORDER BY exact DESC, created_at DESC
            """,
            {"sig": signature, "domain": domain, "rules": rules},
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def flag(self, version: str, reason: str, skills: SkillLibrary) -> dict[str, Any]:
        """A version found wanting after its decision (a person's flag, or a re-diagnosis in which a
        blocking rule now fires): the version is marked, its case and every skill card entry it
        validated are retracted (kept, marked with `reason`, never retrieved again)."""
        if not reason.strip():
            raise ValueError("a flag needs a reason: say what is wrong with the version")
        record = self.store.get_version(version)
        if record is None:
            raise ValueError(f"no version {version!r} in this workspace")
        with self.store.transaction():
            self.store.update_version(version, flagged=reason)
            cases = self.store.query("UPDATE cases SET retracted = ? WHERE id = ? RETURNING id", [reason, version])
            cards = skills.retract(version, reason)
            self.store.add_event("flag", {"reason": reason, "cards": cards, "case": bool(cases)}, version=version)
        return {"version": version, "reason": reason, "state": record.state, "cards": cards, "case": bool(cases)}

    # -- traces ---------------------------------------------------------------------------------
    def record_retrieval(
        self, round: int | None, source: str, query: str, hits: Sequence[dict[str, Any]], adopted: Iterable[str]
    ) -> None:
        self.store.con.execute(
            "INSERT INTO retrievals (round, source, query, hits, adopted) VALUES (?, ?, ?, ?, ?)",
            [round, source, query, json.dumps(list(hits), default=str), json.dumps(sorted(set(adopted)))],
        )

    def record_lookups(self, round: int | None, lookups: Lookups, proposed: Sequence[Intervention]) -> None:
        """The retrieval trace of one proposal: each source's query and hits, and what was used:
        literature and skills the proposals cite, cases that kept a failed intervention out."""
        cited = {e.split(":", 1)[1] for iv in proposed for e in iv.evidence if ":" in e}
        templates = {iv.template for iv in proposed}
        docs = [h["doc"] for h in lookups.hits]
        self.record_retrieval(round, "literature", lookups.query, lookups.hits, [d for d in docs if d in cited])
        cards = [s["id"] for s in lookups.skills]
        used = [c for c in cards if c in cited]
        self.record_retrieval(round, "skills", " ".join(lookups.rules) or "general", lookups.skills, used)
        avoided = [
            c["version"]
            for c in lookups.cases
            if c.get("template") and c["decision"] != "promoted" and c["template"] not in templates
        ]
        self.record_retrieval(round, "cases", lookups.signature, lookups.cases, avoided)

    def retrievals(self, round: int | None = None) -> list[dict[str, Any]]:
        cur = self.store.con.execute(
            "SELECT round, source, query, hits, adopted FROM retrievals WHERE ? IS NULL OR round = ? ORDER BY id",
            [round, round],
        )
        return [
            {"round": r, "source": s, "query": q, "hits": json.loads(h), "adopted": json.loads(a)}
            for r, s, q, h, a in cur.fetchall()
        ]

    def record_calls(self, round: int | None, calls: Sequence[ModelCall]) -> None:
        for c in calls:
            self.store.con.execute(
                "INSERT INTO model_calls (round, backend, model, purpose, input_tokens, output_tokens, ok, error,"
                " seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [round, c.backend, c.model, c.purpose, c.input_tokens, c.output_tokens, c.ok, c.error, c.seconds],
            )
