"""Decisions on versions (promote, reject, prune), recorded as one unit across the version tree
and the store, and redone when an engine died half-way through one."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from engine import faults
from engine.store import Store
from engine.versions import DECISIONS, VersionTree


class Decisions:
    def __init__(self, store: Store, tree: VersionTree):
        self.store = store
        self.tree = tree

    def decide(self, version: str, decision: str, reason: str, case: dict[str, Any] | None = None) -> None:
        """Record a decision as one unit: the version tree's tag, the version's state, the event
        and the branch's `case` for the case memory (see `Store.record_case`). Its intent is
        stored first, so that an engine killed half-way redoes the rest on its next open."""
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
        recorded = self.tree.decision(version)
        if recorded is not None and recorded[0] != decision:
            raise ValueError(f"{version} is already {recorded[0]} in the version tree")
        self.store.add_event("decision_intent", {"decision": decision, "reason": reason, "case": case}, version=version)
        self._apply(version, decision, reason, case)

    def redo(self) -> None:
        """Decisions whose intent was stored but whose version does not hold them yet."""
        rows = self.store.query(
            """WITH latest AS (
                   SELECT version, payload FROM events WHERE kind = 'decision_intent'
                   QUALIFY row_number() OVER (PARTITION BY version ORDER BY id DESC) = 1)
               SELECT l.version, l.payload FROM latest l JOIN versions v ON v.name = l.version
               WHERE v.state <> l.payload->>'decision'"""
        )
        for version, payload in rows:
            intent = json.loads(payload)
            self._apply(version, intent["decision"], intent["reason"], intent.get("case"))

    def _apply(self, version: str, decision: str, reason: str, case: dict[str, Any] | None) -> None:
        if self.tree.decision(version) is None:  # else: tagged by an engine that stopped after it
            self.tree.decide(decision, version, reason)
        faults.point("decision-tag")
        with self.store.transaction():
            self.store.update_version(version, state=decision, decision_reason=reason, decided_at=datetime.now())
            self.store.add_event("decision", {"decision": decision, "reason": reason}, version=version)
            if case is not None:
                self.store.record_case(version, case, decision, reason)
