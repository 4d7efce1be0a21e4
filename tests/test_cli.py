from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.workspace import Workspace
from evotui.cli import app

runner = CliRunner()


def test_init_creates_a_repository_and_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ws" / ".git").is_dir() and (tmp_path / "ws" / "workspace.toml").is_file()
    assert ".evotrainer/" in (tmp_path / "ws" / ".gitignore").read_text()
    again = runner.invoke(app, ["init", str(tmp_path / "ws")])
    assert again.exit_code == 1 and "not empty" in again.output
    unknown = runner.invoke(app, ["init", str(tmp_path / "other"), "--from", "nope"])
    assert unknown.exit_code == 1 and "unknown template 'nope'; available: sample, code, swe" in flat(unknown.output)


def test_each_template_makes_a_workspace_of_its_domain(tmp_path: Path) -> None:
    for template, domain in (("sample", "math"), ("code", "code"), ("swe", "swe")):
        result = runner.invoke(app, ["init", str(tmp_path / template), "--from", template])
        assert result.exit_code == 0, result.output
        ws = Workspace.open(tmp_path / template)
        assert ws.load_config().domain.name == domain
        assert not (ws.root / "variants").exists()  # the other templates stay out of a workspace


def flat(output: str) -> str:
    """Console output with rich's line wrapping undone."""
    return " ".join(output.split())


def test_without_a_terminal_run_stops_at_a_gate_that_the_cli_answers(tiny_workspace_v0: Workspace) -> None:
    ws = str(tiny_workspace_v0.root)
    first = runner.invoke(app, ["run", ws])
    assert first.exit_code == 0, first.output
    assert "gate g1 waits" in flat(first.output) and f"evotui approve|abort {ws} g1" in flat(first.output)
    assert [p.name for p in tiny_workspace_v0.runs_dir.iterdir()] == ["v0-warmup-1"]  # v0 only: no branch ran
    listed = flat(runner.invoke(app, ["gates", ws]).output)
    assert "g1 after_design round1-design0: pending" in listed and "hypothesis: If " in listed
    # v0's baseline completions run into the sample's 28-token budget and miss the format: the
    # branch answers one of those rules, the one the round's draw ranks first, and the gate shows
    # the ranking.
    assert "signals: truncation" in listed and "ranking (won/lost against the control" in listed
    assert "recipe.max_completion_length" in listed or "recipe.rewards" in listed

    assert runner.invoke(app, ["revise", ws, "g1", " "]).exit_code == 1  # revise needs feedback
    revised = runner.invoke(app, ["revise", ws, "g1", "avoid the completion length"])
    assert revised.exit_code == 0 and "revised" in revised.output
    second = runner.invoke(app, ["run", ws])
    assert "gate g2 waits" in flat(second.output)
    proposals = flat(runner.invoke(app, ["gates", ws]).output)
    assert "g2 after_design round1-design1" in proposals and "recipe.max_completion_length" not in proposals

    again = runner.invoke(app, ["approve", ws, "g1"])
    assert again.exit_code == 1 and "already answered" in flat(again.output)
    assert runner.invoke(app, ["abort", ws, "g2"]).exit_code == 0
    third = runner.invoke(app, ["run", ws])  # the abort takes effect: the round is rolled back, the loop stops
    assert "stopped: aborted at gate g2 (after_design)" in flat(third.output)
    fourth = runner.invoke(app, ["run", ws])
    assert "gate g3 waits" in flat(fourth.output)  # a new round after the aborted one
    assert [p.name for p in tiny_workspace_v0.runs_dir.iterdir()] == ["v0-warmup-1"]
    history = flat(runner.invoke(app, ["gates", ws, "--all"]).output)
    assert "g2 after_design round1-design1: aborted" in history and "feedback: avoid the completion length" in history


def test_a_bad_workspace_toml_is_reported_not_raised(tiny_workspace: Workspace) -> None:
    text = tiny_workspace.config_path.read_text().replace('loss_type = "dapo"', 'loss_type = "ppo"')
    tiny_workspace.config_path.write_text(text)
    result = runner.invoke(app, ["status", str(tiny_workspace.root)])
    assert result.exit_code == 1
    unwrapped = "".join(result.output.split())  # rich wraps a long path anywhere
    assert "workspace.toml:" in unwrapped and "recipe.loss_type" in unwrapped
    missing = runner.invoke(app, ["versions", str(tiny_workspace.root / "nowhere")])
    assert missing.exit_code == 1 and "is not a workspace" in missing.output


def test_status_and_versions_of_a_new_workspace(tiny_workspace: Workspace) -> None:
    status = runner.invoke(app, ["status", str(tiny_workspace.root)])
    assert status.exit_code == 0 and "0 version(s)" in status.output
    versions = runner.invoke(app, ["versions", str(tiny_workspace.root)])
    assert versions.exit_code == 0 and "No versions yet" in versions.output


def test_report_and_backtests_on_a_constructed_run(tiny_workspace: Workspace) -> None:
    import json

    from engine.core import Engine
    from tests.harness_data import Rollout, RunBuilder

    with Engine(tiny_workspace) as engine:
        engine.tree.create_base("v0")
        engine.tree.create_child("v0", "v1", {}, "v1")
        store = engine.store
        b = RunBuilder(store)
        b.step(
            1,
            [
                [Rollout(reward=0.0, format=f) for f in (0.0, 1.0, 0.0, 1.0)],
                [Rollout(reward=float(i % 2)) for i in range(4)],
            ],
        )
        b.save(steps=1)
        store.update_run("v1-train-1", state="succeeded")
    report = runner.invoke(app, ["report", str(tiny_workspace.root), "v1", "--json"])
    assert report.exit_code == 0, report.output
    data = json.loads(report.output)
    dead = [f for f in data["diagnosis"]["findings"] if f["metric"] == "signal.dead_group_ratio"]
    assert dead[0]["value"] == 0.5  # one of two groups has no spread
    text = runner.invoke(app, ["report", str(tiny_workspace.root), "v1"])
    assert text.exit_code == 0 and text.output.startswith("# Health report: v1")
    bt = runner.invoke(
        app, ["backtest", "reward", str(tiny_workspace.root), "v1", "--weights", "correctness=1,format=1", "--json"]
    )
    assert bt.exit_code == 0, bt.output
    result = json.loads(bt.output)
    assert (result["dead_before"], result["dead_after"], result["revived"]) == (0.5, 0.0, 1.0)
    bad = runner.invoke(app, ["backtest", "reward", str(tiny_workspace.root), "v1", "--weights", "nope=1"])
    assert bad.exit_code == 1 and "unknown reward component(s) ['nope']" in bad.output
    with Engine(tiny_workspace) as engine:
        assert engine.store.query("SELECT kind FROM backtests") == [("reward",)]


def test_run_following_an_engine_that_dies_says_so_in_one_line(
    tiny_workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import threading

    from engine.api.protocol import Reply, encode
    from engine.daemon import SOCKET_FILE

    path = tiny_workspace.state_dir / SOCKET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    answers = {"hello": {"workspace": str(tiny_workspace.root), "name": "t", "pid": 1}}

    def engine_that_dies() -> None:  # answers hello, subscribe and start, then is gone
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as lines:
            for _ in range(3):
                request = json.loads(lines.readline())
                conn.sendall(encode(Reply(id=request["id"], ok=True, result=answers.get(request["method"]))))

    thread = threading.Thread(target=engine_that_dies, daemon=True)
    thread.start()
    monkeypatch.setattr("evotui.cli.engine_socket", lambda root: path)
    result = CliRunner().invoke(app, ["run", str(tiny_workspace.root), "--auto-approve", "--versions", "1"])
    thread.join(10)
    listener.close()
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "went away (the engine closed the connection)" in result.output
    assert f"evotui run {tiny_workspace.root}" in result.output and "Traceback" not in result.output
