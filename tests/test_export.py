"""`evotui export` and engine/export.py on a store built by hand (no training): what the Parquet
files hold, read back with DuckDB and pandas, against counts on the store itself."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from engine.export import ExportError, export_metrics, export_rollouts
from engine.store import Store
from engine.workspace import Workspace, init_workspace
from evotui.cli import app
from tests.engine_support import Served
from tests.harness_data import Rollout, RunBuilder

runner = CliRunner()


def flat(output: str) -> str:
    """Console output with rich's line wrapping undone."""
    return " ".join(output.split())


def says(output: str, text: str) -> bool:
    """`text` is in `output`, whitespace aside (rich wraps a long path anywhere)."""
    return "".join(text.split()) in "".join(output.split())


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """v0: a train run (6 train, 3 val greedy rollouts; 4 metric rows). v1: a train run (4 train,
    2 val; 1 metric row) and an eval run (3 test rollouts)."""
    workspace = init_workspace(tmp_path / "ws")
    with Store(workspace.db_path) as store:
        store.add_version("v0", None, "versions/v0", "a", state="promoted")
        store.add_version("v1", "v0", "versions/v1", "b", state="trained")
        v0 = RunBuilder(store, run_id="v0-train-1", version="v0")
        v0.step(1, [[Rollout(0.0), Rollout(1.0)], [Rollout(1.0, completion="it's 4"), Rollout(1.0)]])
        v0.step(2, [[Rollout(0.0, truncated=True), Rollout(0.0)]])
        v0.step(2, [[Rollout(1.0)], [Rollout(0.0)], [Rollout(1.0)]], split="val", decoding="greedy")
        v0.metric("reward", [0.5, 0.25]).metric("loss", [0.1, 0.2]).save(2)
        v1 = RunBuilder(store, run_id="v1-train-1", version="v1")
        v1.step(1, [[Rollout(1.0), Rollout(1.0), Rollout(0.0), Rollout(1.0)]])
        v1.step(1, [[Rollout(1.0)], [Rollout(1.0)]], split="val", decoding="greedy")
        v1.metric("reward", [0.75]).save(1)
        evaluation = RunBuilder(store, run_id="v1-eval-1", version="v1")
        evaluation.step(0, [[Rollout(1.0)], [Rollout(0.0)], [Rollout(1.0)]], split="test", decoding="greedy").save(0)
        store.update_run("v1-eval-1", kind="eval")
    return workspace


def store_count(ws: Workspace, table: str, version: str | None = None, split: str | None = None) -> int:
    """COUNT(*) on the store with the export's filter, written independently of engine/export.py."""
    conds, params = [], []
    if version is not None:
        conds.append("runs.version = ?")
        params.append(version)
    if split is not None:
        conds.append("t.split = ?")
        params.append(split)
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    with Store(ws.db_path) as store:
        row = store.query_one(f"SELECT count(*) FROM {table} t JOIN runs ON runs.id = t.run_id {where}", params)
    assert row is not None
    return int(row[0])


def read_back(path: Path) -> pd.DataFrame:
    """The file through pandas, after checking that DuckDB counts the same rows in it."""
    frame = pd.read_parquet(path)
    (count,) = duckdb.connect().execute("SELECT count(*) FROM read_parquet(?)", [str(path)]).fetchone() or (None,)
    assert count == len(frame)
    return frame


def test_the_cli_writes_every_rollout_and_metric_row_with_its_run(ws: Workspace, tmp_path: Path) -> None:
    out = tmp_path / "it's here"  # a quote in the target: COPY's path is a SQL literal
    out.mkdir()
    rollouts, metrics = out / "rollouts.parquet", out / "metrics.parquet"
    result = runner.invoke(app, ["export", str(ws.root), "--rollouts", str(rollouts), "--metrics", str(metrics)])
    assert result.exit_code == 0, result.output
    total = store_count(ws, "rollouts")
    assert total == 18
    assert says(result.output, f"Wrote 18 rollouts to {rollouts}")
    assert says(result.output, f"Wrote 5 metric rows to {metrics}")

    frame = read_back(rollouts)
    assert len(frame) == total
    assert {"version", "run_kind", "run_id", "split", "decoding", "step", "reward", "completion"} <= set(frame.columns)
    assert sorted(set(zip(frame.run_id, frame.version, frame.run_kind, strict=True))) == [
        ("v0-train-1", "v0", "train"),
        ("v1-eval-1", "v1", "eval"),
        ("v1-train-1", "v1", "train"),
    ]
    assert "it's 4" in set(frame.completion)

    frame = read_back(metrics)
    assert len(frame) == store_count(ws, "metrics") == 5
    assert list(frame.columns) == ["version", "run_kind", "run_id", "step", "key", "value"]
    assert sorted(out.iterdir()) == [metrics, rollouts]  # no temporary file left behind


@pytest.mark.parametrize(("version", "split"), [("v1", None), (None, "val"), ("v0", "train"), ("v1", "test")])
def test_version_and_split_filter_the_rollouts(ws: Workspace, tmp_path: Path, version: str, split: str) -> None:
    path = tmp_path / "out.parquet"
    with Store(ws.db_path) as store:
        written = export_rollouts(store, path, version=version, split=split)
    expected = store_count(ws, "rollouts", version, split)
    assert 0 < written == expected != store_count(ws, "rollouts")
    frame = read_back(path)
    assert len(frame) == expected
    assert set(frame.version) == ({version} if version else {"v0", "v1"})
    assert set(frame.split) == ({split} if split else {"train", "val", "test"})


def test_version_filters_the_metrics(ws: Workspace, tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    result = runner.invoke(app, ["export", str(ws.root), "--metrics", str(path), "--version", "v0"])
    assert result.exit_code == 0, result.output
    frame = read_back(path)
    assert len(frame) == store_count(ws, "metrics", "v0") == 4 != store_count(ws, "metrics")
    assert set(frame.version) == {"v0"} and set(frame.key) == {"reward", "loss"}


def test_no_matching_rows_is_an_empty_file_not_an_error(ws: Workspace, tmp_path: Path) -> None:
    path = tmp_path / "none.parquet"
    result = runner.invoke(app, ["export", str(ws.root), "--rollouts", str(path), "--version", "v0", "--split", "test"])
    assert result.exit_code == 0, result.output
    assert says(result.output, f"Wrote 0 rows to {path}: no rollouts of v0 on test")
    frame = read_back(path)
    assert len(frame) == 0 and {"version", "split", "reward", "completion"} <= set(frame.columns)


def test_an_unknown_version_or_split_is_named_and_writes_nothing(ws: Workspace, tmp_path: Path) -> None:
    path = tmp_path / "out.parquet"
    result = runner.invoke(app, ["export", str(ws.root), "--rollouts", str(path), "--version", "v9"])
    assert result.exit_code == 1
    assert "error: unknown version 'v9': it has v0, v1" in flat(result.output)
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["export", str(ws.root), "--rollouts", str(path), "--split", "tset"])
    assert result.exit_code == 1
    assert "unknown split 'tset': the splits are train, val, test" in flat(result.output)
    with Store(ws.db_path) as store, pytest.raises(ExportError, match="unknown version 'v9'"):
        export_metrics(store, path, version="v9")
    assert list(tmp_path.glob("*.parquet*")) == [] and list(tmp_path.glob(".*")) == []


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.parquet"
    path.write_text("the previous export")

    def refuse(src: object, dst: object) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr("engine.export.os.replace", refuse)
    with Store(ws.db_path) as store, pytest.raises(ExportError, match="cannot write .*read-only file system"):
        export_rollouts(store, path)
    assert path.read_text() == "the previous export"
    assert sorted(tmp_path.iterdir()) == sorted([path, ws.root])
    with Store(ws.db_path) as store, pytest.raises(ExportError, match="the directory .*nowhere does not exist"):
        export_rollouts(store, tmp_path / "nowhere" / "out.parquet")


def test_usage_errors(ws: Workspace, tmp_path: Path) -> None:
    nothing = runner.invoke(app, ["export", str(ws.root)])
    assert nothing.exit_code == 1 and "nothing to export: give --rollouts FILE, --metrics FILE" in flat(nothing.output)
    split = runner.invoke(app, ["export", str(ws.root), "--metrics", str(tmp_path / "m.parquet"), "--split", "val"])
    assert split.exit_code == 1 and "--split filters rollouts" in flat(split.output)
    same = tmp_path / "x.parquet"
    both = runner.invoke(app, ["export", str(ws.root), "--rollouts", str(same), "--metrics", str(same)])
    assert both.exit_code == 1 and "name the same file" in flat(both.output)


def test_with_an_engine_serving_the_workspace_it_says_to_stop_it(ws: Workspace, tmp_path: Path) -> None:
    served = Served(ws.root).start()
    try:
        result = runner.invoke(app, ["export", str(ws.root), "--rollouts", str(tmp_path / "out.parquet")])
    finally:
        served.stop()
    assert result.exit_code == 1
    assert says(result.output, f"an engine serves {ws.root}; stop it first (`evotui engine {ws.root} --stop`)")
