"""The DuckDB store of a workspace. Only the engine process opens the file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.store.connection import Connection


@dataclass(frozen=True)
class VersionRecord:
    name: str
    parent: str | None
    branch: str
    commit_sha: str
    state: str
    intervention_id: str | None
    checkpoint: str | None
    val_greedy: float | None
    val_sampled: float | None
    val_n: int | None
    verdict: str | None
    decision_reason: str | None
    created_at: datetime
    decided_at: datetime | None
    #: The verdict's primary comparison: child - parent, and its 95% half-width (the noise floor).
    verdict_delta: float | None = None
    verdict_floor: float | None = None
    #: Why the version was flagged after its decision (its cards and case are retracted), or None.
    flagged: str | None = None


@dataclass(frozen=True)
class RunRecord:
    id: str
    version: str
    kind: str
    state: str
    run_dir: str
    config: str
    total_steps: int | None
    pid: int | None
    error_tail: str | None
    started_at: datetime | None
    ended_at: datetime | None


_VERSION_COLS = ", ".join(f.name for f in fields(VersionRecord))
_RUN_COLS = ", ".join(f.name for f in fields(RunRecord))


class Store(Connection):
    """The workspace's records: versions, interventions, runs, metrics, rollouts, cases, events."""

    # -- versions -----------------------------------------------------------------------------
    def add_version(self, name: str, parent: str | None, branch: str, commit_sha: str, state: str = "created") -> None:
        self.con.execute(
            "INSERT INTO versions (name, parent, branch, commit_sha, state) VALUES (?, ?, ?, ?, ?)",
            [name, parent, branch, commit_sha, state],
        )

    def _update(self, table: str, record: type, key: str, key_value: str, values: dict[str, Any]) -> None:
        """UPDATE one row; column names are checked against the record type (never user text)."""
        allowed = {f.name for f in fields(record)} - {key, "created_at"}
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"{table} has no column(s) {sorted(unknown)}")
        sets = ", ".join(f"{k} = ?" for k in values)
        self.con.execute(f"UPDATE {table} SET {sets} WHERE {key} = ?", [*values.values(), key_value])

    def update_version(self, name: str, **values: Any) -> None:
        self._update("versions", VersionRecord, "name", name, values)

    def get_version(self, name: str) -> VersionRecord | None:
        row = self.query_one(f"SELECT {_VERSION_COLS} FROM versions WHERE name = ?", [name])
        return VersionRecord(*row) if row else None

    def list_versions(self) -> list[VersionRecord]:
        rows = self.query(f"SELECT {_VERSION_COLS} FROM versions ORDER BY CAST(substr(name, 2) AS INTEGER)")
        return [VersionRecord(*r) for r in rows]

    def add_intervention(
        self,
        id: str,
        version: str,
        kind: str,
        factor: str,
        change: dict[str, Any],
        hypothesis: str,
        success_criterion: str,
        rollback: str,
        *,
        round: int | None = None,
        template: str | None = None,
        source: str | None = None,
        evidence: Sequence[str] = (),
    ) -> None:
        self.con.execute(
            "INSERT INTO interventions (id, version, kind, factor, change, hypothesis, success_criterion, rollback,"
            " round, template, source, evidence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                id,
                version,
                kind,
                factor,
                json.dumps(change),
                hypothesis,
                success_criterion,
                rollback,
                round,
                template,
                source,
                json.dumps(list(evidence)),
            ],
        )

    def get_intervention(self, id: str) -> dict[str, Any] | None:
        cur = self.con.execute("SELECT * FROM interventions WHERE id = ?", [id])
        rows = cur.fetchall()
        if not rows:
            return None
        out = dict(zip([d[0] for d in cur.description], rows[0], strict=True))
        out["change"] = json.loads(out["change"])
        out["evidence"] = json.loads(out["evidence"]) if out.get("evidence") else []
        return out

    # -- runs -----------------------------------------------------------------------------------
    def add_run(self, id: str, version: str, kind: str, run_dir: str, config: dict[str, Any], total_steps: int) -> None:
        self.con.execute(
            "INSERT INTO runs (id, version, kind, state, run_dir, config, total_steps)"
            " VALUES (?, ?, ?, 'queued', ?, ?, ?)",
            [id, version, kind, run_dir, json.dumps(config), total_steps],
        )

    def update_run(self, id: str, **values: Any) -> None:
        self._update("runs", RunRecord, "id", id, values)

    def get_run(self, id: str) -> RunRecord | None:
        row = self.query_one(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", [id])
        return RunRecord(*row) if row else None

    def list_runs(self, version: str | None = None) -> list[RunRecord]:
        """Runs in start order: of `version`, or of every version when it is None (only None: an
        empty name is a version with no runs, not a missing filter)."""
        where, params = ("WHERE version = ?", [version]) if version is not None else ("", [])
        rows = self.query(f"SELECT {_RUN_COLS} FROM runs {where} ORDER BY started_at NULLS LAST, id", params)
        return [RunRecord(*r) for r in rows]

    # -- metrics, rollouts, events ----------------------------------------------------------------
    def upsert_metrics(self, run_id: str, rows: Sequence[tuple[int, str, float | None]]) -> int:
        """Insert (step, key, value) rows for a run in one batch; a repeated key replaces its value."""
        if not rows:
            return 0
        steps, keys, values = zip(*rows, strict=True)
        batch = pa.table(  # noqa: F841 - read by DuckDB below, by name
            {
                "run_id": pa.array([run_id] * len(rows), pa.string()),
                "step": pa.array(steps, pa.int32()),
                "key": pa.array(keys, pa.string()),
                "value": pa.array(values, pa.float64()),
            }
        )
        # DuckDB reads the local Arrow table `batch` by name (a replacement scan): a few ms,
        # where register()/unregister() cost ~20 ms each, on every poll of a running run.
        self.con.execute("INSERT OR REPLACE INTO metrics SELECT run_id, step, key, value FROM batch")
        return len(rows)

    def metric_series(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return self.query("SELECT step, value FROM metrics WHERE run_id = ? AND key = ? ORDER BY step", [run_id, key])

    def insert_rollouts(self, source: str, params: Any = None, batch: pa.Table | None = None) -> tuple[Any, ...] | None:
        """Insert the rows of `source` (a SELECT with the rollout columns; every group whole) with
        each group's reward spread, in key order. `source` may read an Arrow table
        passed as `batch` (by that name)."""
        assert batch is None or "batch" in source
        # Executed here, not through query(): DuckDB finds `batch` among this frame's locals.
        rows = self.con.execute(
            # Plain INSERT: OR IGNORE would scramble the insertion order (DuckDB 2.0), and a file is
            # ingested once anyway (ingested_files, in the same transaction).
            f"""INSERT INTO rollouts BY NAME
                SELECT *, stddev_pop(reward) OVER (PARTITION BY run_id, split, decoding, step, group_id) AS group_std
                FROM ({source})
                -- the window reorders rows; insertion order is the order the rollout browser pages in
                ORDER BY run_id, split, decoding, step, group_id, sample_idx""",
            params,
        ).fetchall()
        return rows[0] if rows else None

    def ingest_rollout_files(self, run_id: str, files: Sequence[tuple[Path, str, int]]) -> int:
        """Append Parquet batches of rollouts (path, name relative to the run dir, rows) in one
        statement; a file ingested before is skipped (idempotent).
        Returns the rows added."""
        if not files:
            return 0
        names = [name for _, name, _ in files]
        done = {
            r[0]
            for r in self.query(
                "SELECT file FROM ingested_files WHERE run_id = ? AND list_contains(?, file)", [run_id, names]
            )
        }
        new = [f for f in files if f[1] not in done]
        if not new:
            return 0
        row = self.insert_rollouts(
            "SELECT * REPLACE (CAST($run AS VARCHAR) AS run_id) FROM read_parquet($files)",
            {"run": run_id, "files": [str(path) for path, _, _ in new]},
        )
        self.con.executemany(
            "INSERT INTO ingested_files VALUES (?, ?, ?)", [[run_id, name, rows] for _, name, rows in new]
        )
        return int(row[0]) if row else 0

    def record_case(self, version: str, case: dict[str, Any], decision: str, outcome: str) -> None:
        """A branch's case for the case memory (`case`: signature, domain, parent, kind, template,
        factor, verdict, and against the parent's control: control, vs_control, vs_control_delta);
        recorded again, it replaces the row."""
        columns = ("signature", "domain", "parent", "kind", "template", "factor", "verdict")
        columns += ("control", "vs_control", "vs_control_delta")
        self.con.execute(
            f"INSERT OR REPLACE INTO cases (id, {', '.join(columns)}, decision, outcome)"
            f" VALUES (?, {', '.join('?' * len(columns))}, ?, ?)",
            [version, *(case.get(c) for c in columns), decision, outcome],
        )

    def forget_after(self, run_id: str, step: int, final: bool = False) -> None:
        """A run resumed from its checkpoint at `step` (-1: from the start) redoes what came
        after: its metrics and rollouts past `step` go, with the record of their files (and with
        `final`, the evaluation at `step` itself, which ran after that checkpoint)."""
        redone = "({at} > $step OR ($final AND {at} = $step AND NOT {train}))"
        # A rollout file is named ``rollouts/SPLIT-...-STEP.parquet`` (`artifacts.write_rollouts`).
        file_step = r"CAST(regexp_extract(file, '(\d+)\.parquet$', 1) AS INTEGER)"
        for sql in (
            "DELETE FROM metrics WHERE run_id = $run AND step > $step",
            "DELETE FROM rollouts WHERE run_id = $run AND " + redone.format(at="step", train="split = 'train'"),
            "DELETE FROM ingested_files WHERE run_id = $run AND "
            + redone.format(at=file_step, train="starts_with(file, 'rollouts/train-')"),
        ):
            params = {"run": run_id, "step": step, "final": final}
            self.con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql})

    def count_rollouts(self, run_id: str | None = None, split: str | None = None) -> int:
        conds, params = [], []
        if run_id is not None:
            conds.append("run_id = ?")
            params.append(run_id)
        if split is not None:
            conds.append("split = ?")
            params.append(split)
        where = f"WHERE {' AND '.join(conds)}" if conds else ""
        row = self.query_one(f"SELECT count(*) FROM rollouts {where}", params)
        return int(row[0]) if row else 0

    def add_event(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        run_id: str | None = None,
        version: str | None = None,
    ) -> None:
        self.con.execute(
            "INSERT INTO events (run_id, version, kind, payload) VALUES (?, ?, ?, ?)",
            [run_id, version, kind, json.dumps(payload) if payload is not None else None],
        )

    def events_offset(self, run_id: str) -> int:
        row = self.query_one("SELECT events_offset FROM ingest_state WHERE run_id = ?", [run_id])
        return int(row[0]) if row else 0

    def set_events_offset(self, run_id: str, offset: int) -> None:
        self.con.execute("INSERT OR REPLACE INTO ingest_state VALUES (?, ?)", [run_id, offset])
