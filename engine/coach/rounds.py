"""The coach's rounds in the store (`rounds` table): where each round stands, and its branches.

A round is persisted at every stage, so a loop stopped at a pending gate, or by a dead engine,
resumes where it stopped. This module is the table's only reader and writer; the loop holds the
state machine that moves a round from stage to stage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from engine.coach.interventions import Intervention
from engine.store import Store

Stage = Literal["diagnosis", "design", "backtest", "run", "done"]
State = Literal["open", "done", "aborted"]


class Branch(BaseModel):
    """One proposed version of a round: its intervention, the child's `workspace.toml`, and what
    became of it (its backtest, the version it was created as, whether it is settled)."""

    model_config = ConfigDict(extra="forbid")

    intervention: Intervention
    #: The child's workspace.toml text.
    text: str
    #: Dotted path -> {"from": parent value, "to": child value}.
    change: dict[str, Any]
    title: str
    backtest: dict[str, Any] | None = None
    #: Why a backtest dropped the branch before it ran.
    dropped: str | None = None
    version: str | None = None
    done: bool = False


@dataclass
class Round:
    id: int
    parent: str
    state: State
    stage: Stage
    backend: str
    harness: str
    escalated: bool
    #: Id of the diagnosis the round reasoned from.
    diagnosis: str | None = None
    rationale: str | None = None
    branches: list[Branch] = field(default_factory=list)


_COLS = "id, parent, state, stage, backend, harness, escalated, diagnosis, rationale, proposals"


class Rounds:
    def __init__(self, store: Store):
        self.store = store

    def current(self) -> Round | None:
        """The open round, if a loop stopped inside one."""
        row = self.store.query_one(f"SELECT {_COLS} FROM rounds WHERE state = 'open' ORDER BY id DESC LIMIT 1")
        return _round(row) if row else None

    def open(self, parent: str, backend: str, harness: str, escalated: bool) -> Round:
        row = self.store.query_one("SELECT coalesce(max(id), 0) + 1 FROM rounds")
        round_id = int(row[0]) if row else 1
        self.store.con.execute(
            "INSERT INTO rounds (id, parent, state, stage, backend, harness, escalated, proposals)"
            " VALUES (?, ?, 'open', 'diagnosis', ?, ?, ?, '[]')",
            [round_id, parent, backend, harness, escalated],
        )
        return self.get(round_id)

    def get(self, round_id: int) -> Round:
        row = self.store.query_one(f"SELECT {_COLS} FROM rounds WHERE id = ?", [round_id])
        if row is None:
            raise ValueError(f"no round {round_id} in this workspace")
        return _round(row)

    def advance(self, rnd: Round, stage: Stage, **values: Any) -> None:
        """Move `rnd` to `stage` (and set `diagnosis` or `rationale`), in the store and in `rnd`."""
        self._set(rnd.id, stage=stage, **values)
        rnd.stage = stage
        for key, value in values.items():
            setattr(rnd, key, value)

    def save_branches(self, rnd: Round) -> None:
        proposals = json.dumps([b.model_dump(mode="json") for b in rnd.branches])
        self._set(rnd.id, proposals=proposals, rationale=rnd.rationale)

    def end(self, rnd: Round, state: State = "done") -> None:
        self._set(rnd.id, state=state, stage="done" if state == "done" else rnd.stage, ended_at=datetime.now())
        rnd.state = state

    def of_version(self, version: str) -> int | None:
        """The round that proposed `version`."""
        row = self.store.query_one(
            "SELECT i.round FROM versions v JOIN interventions i ON i.id = v.intervention_id WHERE v.name = ?",
            [version],
        )
        return row[0] if row else None

    def dropped(self, parent: str) -> list[Branch]:
        """The branches a backtest dropped in earlier rounds from `parent`: what need not be proposed
        again (without this, a loop whose every proposal is dropped would open rounds forever)."""
        rows = self.store.query("SELECT proposals FROM rounds WHERE parent = ? ORDER BY id", [parent])
        return [b for (proposals,) in rows for b in _branches(proposals) if b.dropped]

    def _set(self, round_id: int, **values: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in values)
        self.store.con.execute(f"UPDATE rounds SET {sets} WHERE id = ?", [*values.values(), round_id])


def _round(row: tuple[Any, ...]) -> Round:
    *head, proposals = row
    return Round(*head, branches=_branches(proposals))


def _branches(proposals: str | None) -> list[Branch]:
    return [Branch.model_validate(b) for b in json.loads(proposals or "[]")]
