"""The coach's rounds in the store (`rounds` table): where each round stands, and its branches.

A round is persisted at every stage, so a loop stopped at a pending gate, or by a dead engine,
resumes where it stopped. This module is the table's only reader and writer. `Round` and `Branch`
are values: a transition (`advance`, `propose`, `update_branch`, `end`) returns a new value that it
has already stored, and leaves the one it was given unchanged, so a change that is not saved cannot
happen. The loop decides which transition comes next.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
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

    model_config = ConfigDict(extra="forbid", frozen=True)

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


@dataclass(frozen=True)
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
    branches: tuple[Branch, ...] = ()


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

    def advance(self, rnd: Round, stage: Stage, **values: Any) -> Round:
        """`rnd` moved to `stage` (with `diagnosis` or `rationale` set), stored."""
        return self._put(replace(rnd, stage=stage, **values))

    def propose(self, rnd: Round, branches: Sequence[Branch], rationale: str | None) -> Round:
        """`rnd` with the branches its design proposes and why, stored."""
        return self._put(replace(rnd, branches=tuple(branches), rationale=rationale))

    def update_branch(self, rnd: Round, index: int, **values: Any) -> Round:
        """`rnd` with its branch `index` changed (its backtest, version, whether it is settled), stored."""
        if unknown := values.keys() - Branch.model_fields.keys():
            raise ValueError(f"a branch has no field {', '.join(sorted(unknown))}")
        branches = list(rnd.branches)
        branches[index] = branches[index].model_copy(update=values)
        return self._put(replace(rnd, branches=tuple(branches)))

    def end(self, rnd: Round, state: State = "done") -> Round:
        """`rnd` closed: done (its stage too) or aborted (at the stage it stopped in), stored."""
        ended = replace(rnd, state=state, stage="done" if state == "done" else rnd.stage)
        return self._put(ended, ended_at=datetime.now())

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

    def _put(self, rnd: Round, **columns: Any) -> Round:
        """Store every field a transition may change; the value returned is the row read back."""
        proposals = json.dumps([b.model_dump(mode="json") for b in rnd.branches])
        values = {"state": rnd.state, "stage": rnd.stage, "diagnosis": rnd.diagnosis, "rationale": rnd.rationale}
        values |= {"proposals": proposals, **columns}
        sets = ", ".join(f"{k} = ?" for k in values)
        self.store.con.execute(f"UPDATE rounds SET {sets} WHERE id = ?", [*values.values(), rnd.id])
        return self.get(rnd.id)


def _round(row: tuple[Any, ...]) -> Round:
    *head, proposals = row
    return Round(*head, branches=tuple(_branches(proposals)))


def _branches(proposals: str | None) -> list[Branch]:
    return [Branch.model_validate(b) for b in json.loads(proposals or "[]")]
