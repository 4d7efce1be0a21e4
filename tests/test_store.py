from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from engine.runs.artifacts import EVENTS_FILE, EventLog, RolloutBatch, write_rollouts
from engine.runs.ingest import ingest_run
from engine.store import SCHEMA_VERSION, Store
from engine.store import schema as schema_module


def _batch(run_id: str, step: int, groups: int, size: int) -> RolloutBatch:
    batch = RolloutBatch(run_id=run_id, step=step, split="train", decoding="sampled")
    for i in range(groups * size):
        correct = float((i * 7 + step) % 3 == 0)
        batch.group_id.append(i // size)
        batch.sample_idx.append(i % size)
        batch.task_id.append(f"t{i // size}")
        batch.subset.append("ops3")
        batch.prompt.append(f"Q:{i}+1\n")
        batch.completion.append(f"A:{i + 1}")
        batch.reward_components.append({"correctness": correct, "format": 1.0})
        batch.reward.append(correct + 0.1)
        batch.truncated.append(i % 5 == 0)
        batch.completion_length.append(4 + i % 3)
    return batch


def test_migrates_an_empty_file_and_reopens_without_reapplying(tmp_path: Path) -> None:
    path = tmp_path / "evo.duckdb"
    with Store(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        tables = {r[0] for r in store.query("SELECT table_name FROM information_schema.tables")}
        assert {"versions", "interventions", "runs", "metrics", "rollouts", "events"} <= tables
        store.add_version("v0", None, "versions/v0", "abc")
    with Store(path) as store:
        assert store.query("SELECT count(*) FROM schema_meta") == [(SCHEMA_VERSION,)]
        assert store.get_version("v0") is not None


def test_forward_migration_keeps_existing_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "evo.duckdb"
    with Store(path) as store:
        store.add_version("v0", None, "versions/v0", "abc")
    extra = "ALTER TABLE versions ADD COLUMN note VARCHAR DEFAULT 'migrated'"
    monkeypatch.setattr(schema_module, "MIGRATIONS", [*schema_module.MIGRATIONS, extra])
    monkeypatch.setattr("engine.store.connection.MIGRATIONS", [*schema_module.MIGRATIONS])
    monkeypatch.setattr("engine.store.connection.SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with Store(path) as store:
        assert store.schema_version() == SCHEMA_VERSION + 1
        assert store.query("SELECT name, note FROM versions") == [("v0", "migrated")]


def test_refuses_a_file_from_a_newer_evotui(tmp_path: Path) -> None:
    path = tmp_path / "evo.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_meta VALUES (?)", [SCHEMA_VERSION + 5])
    con.close()
    with pytest.raises(RuntimeError, match="newer than this evotui understands"):
        Store(path)


def test_a_second_writer_gets_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "evo.duckdb"
    # DuckDB's lock is per process; a child process stands in for a second evotui.
    import subprocess
    import sys

    with Store(path):
        code = (
            "from engine.store import Store, StoreLockedError\n"
            f"try:\n    Store({str(path)!r})\nexcept StoreLockedError as e:\n    print('LOCKED', e)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("LOCKED") and "in use by another evotui process" in out


def test_version_run_and_intervention_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "evo.duckdb") as store:
        store.add_version("v0", None, "versions/v0", "a" * 40, state="promoted")
        store.add_version("v1", "v0", "versions/v1", "b" * 40)
        change = {"recipe.learning_rate": {"from": 1e-4, "to": 5e-5}}
        store.add_intervention("v1-delta", "v1", "recipe", "recipe.learning_rate", change, "h", "c", "r")
        store.update_version("v1", intervention_id="v1-delta", val_greedy=0.25, state="trained")
        store.add_run("v1-train-1", "v1", "train", "/runs/x", {"k": 1}, 10)
        store.update_run("v1-train-1", state="failed", error_tail="boom")

        v1 = store.get_version("v1")
        assert v1 is not None and (v1.parent, v1.state, v1.val_greedy) == ("v0", "trained", 0.25)
        assert [v.name for v in store.list_versions()] == ["v0", "v1"]
        assert store.get_intervention("v1-delta")["change"] == change  # type: ignore[index]
        run = store.get_run("v1-train-1")
        assert run is not None and (run.state, run.error_tail, json.loads(run.config)) == (
            "failed",
            "boom",
            {"k": 1},
        )
        with pytest.raises(ValueError, match="no column"):
            store.update_version("v1", colour="red")


def test_metrics_upsert_replaces_instead_of_duplicating(tmp_path: Path) -> None:
    with Store(tmp_path / "evo.duckdb") as store:
        store.upsert_metrics("r", [(1, "reward", 0.5), (2, "reward", 0.7), (1, "kl", None)])
        store.upsert_metrics("r", [(2, "reward", 0.9)])
        assert store.metric_series("r", "reward") == [(1, 0.5), (2, 0.9)]
        assert store.query("SELECT count(*) FROM metrics") == [(3,)]


def test_ingest_is_idempotent_across_restarts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = EventLog(run_dir / EVENTS_FILE)
    for step in (1, 2):
        batch = _batch("r1", step, groups=3, size=4)
        file = write_rollouts(run_dir, f"train-{step:06d}", batch)
        log.write("rollouts", step=step, split="train", file=file, rows=len(batch))
        log.write("metrics", step=step, values={"reward": sum(batch.reward) / len(batch)})
    # A torn last line (a worker killed mid-write) must wait, not break ingestion.
    with open(run_dir / EVENTS_FILE, "a") as fh:
        fh.write('{"type":"metrics","step":3,"val')
    db = tmp_path / "evo.duckdb"
    with Store(db) as store:
        first = ingest_run(store, "r1", run_dir)
        assert (first.rollout_rows, first.metric_rows) == (24, 2)
        assert ingest_run(store, "r1", run_dir).events == []
    with Store(db) as store:  # a restarted engine continues from the stored offset
        assert ingest_run(store, "r1", run_dir).events == []
        store.set_events_offset("r1", 0)  # even replaying everything adds nothing
        again = ingest_run(store, "r1", run_dir)
        assert len(again.events) == 4 and again.rollout_rows == 0
        assert store.count_rollouts("r1") == 24
        assert store.query("SELECT sum(rows) FROM ingested_files WHERE run_id = 'r1'") == [(24,)]
        assert store.query("SELECT count(*) FROM metrics") == [(2,)]
        stored = store.query(
            "SELECT reward_components['correctness'], truncated FROM rollouts "
            "WHERE run_id = 'r1' AND step = 2 ORDER BY group_id, sample_idx"
        )
        expected = _batch("r1", 2, 3, 4)
        assert stored == [
            (c["correctness"], t) for c, t in zip(expected.reward_components, expected.truncated, strict=True)
        ]
