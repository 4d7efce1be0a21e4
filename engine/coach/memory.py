"""The coach's memory in the store: the version ledger, case memory, the retrieval trace and the
record of model calls. (Skill cards live as Markdown in the workspace: `skills.py`.)"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from engine.coach.backends.base import ModelCall
from engine.store import Store

#: Version states that end a version's story, and whether they count as a failure of the coach.
FAILED_STATES = ("rejected", "pruned", "failed")


def failure_signature(diagnosis: dict[str, Any] | None) -> str:
    """What a case is filed under: the rules that fired on the parent, sorted ('none' if none)."""
    rules = sorted({r["rule"] for r in (diagnosis or {}).get("rules", [])})
    return "+".join(rules) if rules else "none"


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
        self.store.con.execute(
            "INSERT OR REPLACE INTO cases (id, signature, domain, parent, kind, template, factor, verdict, decision,"
            " outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [version, signature, domain, parent, kind, template, factor, verdict, decision, outcome],
        )

    def cases(self, signature: str, domain: str) -> list[dict[str, Any]]:
        """Cases with this signature first, then those sharing at least one rule; newest first."""
        rules = signature.split("+")
        cur = self.store.con.execute(
            """
            SELECT id AS version, signature, domain, parent, kind, template, factor, verdict, decision, outcome,
                   signature = $sig AS exact
            FROM cases
            WHERE domain = $domain
              AND (signature = $sig OR len(list_intersect(string_split(signature, '+'), $rules)) > 0)
            ORDER BY exact DESC, created_at DESC
            """,
            {"sig": signature, "domain": domain, "rules": rules},
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    # -- traces ---------------------------------------------------------------------------------
    def record_retrieval(
        self, round: int | None, source: str, query: str, hits: Sequence[dict[str, Any]], adopted: Iterable[str]
    ) -> None:
        self.store.con.execute(
            "INSERT INTO retrievals (round, source, query, hits, adopted) VALUES (?, ?, ?, ?, ?)",
            [round, source, query, json.dumps(list(hits), default=str), json.dumps(sorted(set(adopted)))],
        )

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

    def token_totals(self) -> tuple[int, int]:
        row = self.store.query_one(
            "SELECT coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0) FROM model_calls"
        )
        return (int(row[0]), int(row[1])) if row else (0, 0)
