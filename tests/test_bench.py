"""The autonomy benchmark's machinery on a tiny SWE workspace: the arms share v0, spend the same
budget, are scored on the test split (clean), and the report and the store say what the arms did."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.bench.arms import ARMS, BenchError, BenchSettings, run_bench
from engine.bench.report import findings, main_table, store_results, write_report
from engine.runs.artifacts import worker_cpu_seconds
from engine.store import Store
from engine.workspace import Workspace, init_workspace
from tests.conftest import commit_workspace_toml, tiny_toml

pytestmark = pytest.mark.slow


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bench_arms_share_v0_and_budget_and_report_test_scores(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws", "swe")
    ws.config_path.write_text(tiny_toml(ws.config_path.read_text(), train_size=60, val_size=8, warmup_steps=10))
    commit_workspace_toml(ws, "tiny settings for tests")
    settings = BenchSettings(
        budget_steps=2, version_steps=1, seeds=(3,), val_size=6, test_size=5, leak_rate=0.5, lanes=1
    )
    lines: list[str] = []
    run = run_bench(ws.root, settings, say=lines.append)
    arms = {r.arm: r for r in run.results}
    assert tuple(arms) == ARMS and all(r.seed == 3 for r in run.results)

    # Every arm starts from the same v0 checkpoint, built once for the seed.
    weights = {
        arm: _digest(next((Path(r.workspace) / ".evotrainer" / "models" / "v0").glob("*.safetensors")))
        for arm, r in arms.items()
    }
    assert len(set(weights.values())) == 1
    # The hand recipe is one version of the whole budget; each loop spends at least the budget.
    assert [v.steps for v in arms["hand"].versions if v.parent] == [settings.budget_steps]
    for arm in ("score-only", "full"):
        r = arms[arm]
        assert r.steps >= settings.budget_steps or r.stopped
        versions = [v for v in r.versions if v.parent and v.template != "longer_training"]
        assert versions and all(v.steps == settings.version_steps for v in versions)
    assert arms["base"].steps == 0 and arms["base"].final == "v0"

    # The reported score is the test split's (an eval run of its own per arm), recomputed here;
    # no decision read it: the versions' val scores come from their own runs.
    for r in run.results:
        store = Store(Workspace(Path(r.workspace)).db_path)
        try:
            row = store.query_one(
                "SELECT o.run_id, avg(reward_components['correctness']) FILTER (WHERE decoding = 'greedy'),"
                " count(DISTINCT task_id) FROM rollouts o JOIN runs x ON x.id = o.run_id"
                " WHERE x.version = ? AND x.kind = 'eval' AND o.split = 'test' GROUP BY o.run_id",
                [r.final],
            )
            assert row is not None, f"{r.arm}: {r.final} has no test evaluation"
            assert r.test_greedy == pytest.approx(row[1]) and row[2] == settings.test_size
            assert len(r.test_per_task) == settings.test_size
            # The leak is on (leak_rate 0.5): the final version also plays test leaky, whatever
            # its own config says (a loop's close_leak branch turns it off for itself).
            assert len(r.test_leaky_per_task) == settings.test_size
        finally:
            store.close()

    # CPU is charged with what the run workers spent: they are forked from the engine's fork
    # server, not from the benchmark's process, and report their own as they end.
    with Store(Workspace(Path(arms["hand"].workspace)).db_path) as store:
        (run_dir,) = store.query_one("SELECT run_dir FROM runs WHERE version = 'v1' AND kind = 'train'")  # type: ignore[misc]
    trained = worker_cpu_seconds(Path(run_dir))
    assert trained > 0 and arms["hand"].cpu_seconds >= trained

    path, found, plots = write_report(run, "swe")
    text = path.read_text()
    head = main_table(run.results)[0]
    assert "| " + " | ".join(head) + " |" in text
    for f in findings(run, "swe"):
        assert f"## {f.title}" in text
    assert [f.name for f in found] == [
        "main",
        "reach",
        "rl_pays",
        "hand",
        "leak",
        "efficiency",
        "backtest",
        "transfer",
        "compute",
    ]
    assert all((run.root / f"{arm}.png").stat().st_size > 1000 for arm in ARMS)
    assert set(plots) == set(ARMS) and all("clean" in p for p in plots.values())
    with Store(ws.db_path) as store:
        store_results(store, run, found, text)
        rows = store.query("SELECT arm, steps FROM bench_results WHERE bench_id = ? ORDER BY arm", [run.bench_id])
        assert sorted(rows) == sorted((r.arm, r.steps) for r in run.results)
        assert store.query_one("SELECT count(*) FROM bench_reports")[0] == 1  # type: ignore[index]


def test_bench_refuses_uncommitted_workspace_changes(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws", "swe")
    ws.config_path.write_text(ws.config_path.read_text() + "\n# edited\n")
    with pytest.raises(BenchError, match="uncommitted"):
        run_bench(ws.root, BenchSettings(budget_steps=1, version_steps=1, seeds=(0,)))
