"""Gates: the points where the trainer stops for a person.

A gate stores a structured report and waits. Answers are *approve*, *revise* (free text that feeds
the next proposal) and *abort* (stop the loop and roll back what the round had not run yet). The
state machine is small and strict: a gate is answered once, from ``pending``.

Whoever drives the coach supplies an `Answerer`: a terminal prompt, ``--auto-approve``, or nobody
(headless without auto-approve). When the answerer has no answer, the gate stays pending, the
loop stops, and ``evotui approve|revise|abort WS GATE_ID`` answers it for the next ``run``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from engine.store import Store

GateKind = Literal["after_diagnosis", "after_design", "after_backtest", "after_completion"]
GATE_KINDS: tuple[str, ...] = GateKind.__args__  # type: ignore[attr-defined]
Verb = Literal["approve", "revise", "abort"]
_STATE_OF = {"approve": "approved", "revise": "revised", "abort": "aborted"}


class GateError(ValueError):
    """A gate that does not exist or cannot take the answer (says which and why)."""


@dataclass(frozen=True)
class Answer:
    verb: Verb
    feedback: str = ""
    by: str = "terminal"

    def __post_init__(self) -> None:
        if self.verb not in _STATE_OF:
            raise GateError(f"answer must be approve, revise or abort, not {self.verb!r}")
        if self.verb == "revise" and not self.feedback.strip():
            raise GateError("revise needs feedback text: what should the next proposal do differently?")


@dataclass(frozen=True)
class Gate:
    id: str
    round: int | None
    kind: str
    subject: str
    question: str
    report: dict[str, Any]
    forced: bool
    state: str
    feedback: str | None
    answered_by: str | None
    created_at: datetime
    answered_at: datetime | None

    @property
    def answer(self) -> Answer | None:
        if self.state == "pending":
            return None
        verb = {v: k for k, v in _STATE_OF.items()}[self.state]
        return Answer(verb, self.feedback or "", self.answered_by or "")  # type: ignore[arg-type]


#: Given a pending gate, an answer now, or None when nobody can answer now.
Answerer = Callable[[Gate], Answer | None]


def auto_approve(gate: Gate) -> Answer | None:
    """`--auto-approve`: yes to every gate, except those consecutive failures switched on."""
    return None if gate.forced else Answer("approve", by="auto")


def nobody(gate: Gate) -> Answer | None:
    return None


_COLS = "id, round, kind, subject, question, report, forced, state, feedback, answered_by, created_at, answered_at"


class Gates:
    def __init__(self, store: Store):
        self.store = store

    def _gate(self, row: tuple[Any, ...]) -> Gate:
        values = list(row)
        values[5] = json.loads(values[5])
        return Gate(*values)

    def get(self, gate_id: str) -> Gate:
        row = self.store.query_one(f"SELECT {_COLS} FROM gates WHERE id = ?", [gate_id])
        if row is None:
            known = [r[0] for r in self.store.query("SELECT id FROM gates WHERE state = 'pending' ORDER BY created_at")]
            hint = f"pending gates: {', '.join(known)}" if known else "no gate is pending"
            raise GateError(f"no gate {gate_id!r} in this workspace ({hint})")
        return self._gate(row)

    def find(self, round: int | None, kind: str, subject: str) -> Gate | None:
        row = self.store.query_one(
            f"SELECT {_COLS} FROM gates WHERE round IS NOT DISTINCT FROM ? AND kind = ? AND subject = ?"
            " ORDER BY created_at DESC LIMIT 1",
            [round, kind, subject],
        )
        return self._gate(row) if row else None

    def pending(self) -> list[Gate]:
        rows = self.store.query(f"SELECT {_COLS} FROM gates WHERE state = 'pending' ORDER BY created_at")
        return [self._gate(r) for r in rows]

    def list(self, round: int | None = None) -> list[Gate]:
        where, params = ("WHERE round = ?", [round]) if round is not None else ("", [])
        rows = self.store.query(f"SELECT {_COLS} FROM gates {where} ORDER BY created_at", params)
        return [self._gate(r) for r in rows]

    def open(
        self, round: int | None, kind: str, subject: str, question: str, report: dict[str, Any], forced: bool
    ) -> Gate:
        if kind not in GATE_KINDS:
            raise GateError(f"unknown gate kind {kind!r}; one of {', '.join(GATE_KINDS)}")
        row = self.store.query_one("SELECT count(*) FROM gates")
        gate_id = f"g{(row[0] if row else 0) + 1}"
        self.store.con.execute(
            "INSERT INTO gates (id, round, kind, subject, question, report, forced, state)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'pending')",
            [gate_id, round, kind, subject, question, json.dumps(report, default=str), forced],
        )
        self.store.add_event("gate_opened", {"gate": gate_id, "kind": kind, "subject": subject, "forced": forced})
        return self.get(gate_id)

    def answer(self, gate_id: str, answer: Answer) -> Gate:
        gate = self.get(gate_id)
        if gate.state != "pending":
            raise GateError(f"gate {gate_id} was already answered: {gate.state}")
        self.store.con.execute(
            "UPDATE gates SET state = ?, feedback = ?, answered_by = ?, answered_at = current_timestamp WHERE id = ?",
            [_STATE_OF[answer.verb], answer.feedback or None, answer.by, gate_id],
        )
        self.store.add_event("gate_answered", {"gate": gate_id, "answer": answer.verb, "by": answer.by})
        return self.get(gate_id)

    def feedback(self, since_round: int | None = None) -> list[str]:
        """Revise texts, oldest first (fed into the next proposals)."""
        rows = self.store.query(
            "SELECT feedback FROM gates WHERE state = 'revised' AND (? IS NULL OR round >= ?) ORDER BY answered_at",
            [since_round, since_round],
        )
        return [r[0] for r in rows if r[0]]
