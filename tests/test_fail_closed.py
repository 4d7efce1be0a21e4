"""Judging fails closed: an error in the investigation, a probe or a workspace rule holds the
version at a forced gate (which --auto-approve does not answer) instead of promoting it; the
sandbox's own failure is an error, never a score of 0. The loops run on scripted runs
(tests/scripted_runs.py) of an honest gain, which would be promoted but for the injected error."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.coach.backends.base import AnalyzerSpec
from engine.config import CodeDomainConfig
from engine.core import Engine
from engine.domains import make_domain
from engine.domains.code import SandboxInfrastructureError
from engine.sandbox.results import SandboxResult
from engine.workspace import Workspace, init_workspace
from evotui.cli import app
from tests.conftest import commit_workspace_toml, tiny_toml
from tests.scripted_runs import ScriptedRunner

GAIN = {"v0": 0.3, "v1": 0.6}


@pytest.fixture
def workspace(tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner(lambda v: GAIN.get(v, 0.3)))
    ws = init_workspace(tmp_path / "ws")
    ws.config_path.write_text(tiny_toml(sample_toml, val_size=200, sampled_seeds=2, grpo_steps=2))
    commit_workspace_toml(ws, "scripted runs")
    return ws


def run_once(ws: Workspace) -> str:
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    return result.output


def assert_held(ws: Workspace, output: str, why: str) -> None:
    with Engine.open(ws.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.verdict == "improved" and v1.state == "trained", v1
        gates = engine.store.query(
            "SELECT id, forced, state, question FROM gates WHERE kind = 'after_completion' AND subject = 'v1'"
        )
    assert len(gates) == 1, gates
    gate_id, forced, state, question = gates[0]
    assert forced and state == "pending" and why in question, question
    assert "waits (forced" in output
    # A person approves: the version is pruned, never promoted, and leaves no skill card.
    assert CliRunner().invoke(app, ["approve", str(ws.root), gate_id]).exit_code == 0
    run_once(ws)
    with Engine.open(ws.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.state == "pruned" and "held for a person" in (v1.decision_reason or "")
    assert not (ws.root / "skills").is_dir() or not list((ws.root / "skills").glob("*.md"))


def test_a_failed_investigation_holds_the_gain(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> list[AnalyzerSpec]:
        raise RuntimeError("the planner fell over")

    monkeypatch.setattr("engine.coach.planning.Planner.propose_analyzers", broken)
    assert_held(workspace, run_once(workspace), "the planner fell over")


def test_a_probe_that_errors_holds_the_gain(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = AnalyzerSpec(
        name="bad_cast",
        layer="behavior",
        kind="mean",
        sql="SELECT avg(CAST(text || 'x' AS INTEGER)) FROM completions",
        explanation="a probe whose SQL fails on real rows",
    )
    monkeypatch.setattr("engine.coach.planning.Planner.propose_analyzers", lambda *args: [bad])
    assert_held(workspace, run_once(workspace), "a probe of the investigation failed")


def test_a_workspace_rule_that_raises_holds_the_gain(workspace: Workspace) -> None:
    folder = workspace.root / "harness"
    folder.mkdir()
    (folder / "guard.py").write_text(
        "from engine.harness.base import rule\n\n\n"
        '@rule("my_guard")\n'
        "def my_guard(f, ctx):\n"
        "    raise KeyError('a metric this rule expects')\n"
    )
    commit_workspace_toml(workspace, "a workspace rule")
    assert_held(workspace, run_once(workspace), "the workspace harness is broken")


def test_without_errors_the_same_gain_is_promoted(workspace: Workspace) -> None:
    """The control of the tests above: nothing injected, the gain is investigated and promoted."""
    output = run_once(workspace)
    assert "v1 improved and no rule explains it: investigating before the decision" in output
    with Engine.open(workspace.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.state == "promoted" and "before this decision" in (v1.decision_reason or "")


class FlakySandbox:
    """A sandbox that fails as infrastructure (`reason="error"`) the first `failures` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def run_python(self, script: str, limits: object = None) -> SandboxResult:
        self.calls += 1
        if self.calls <= self.failures:
            return SandboxResult(False, None, "", "", "error", "the isolation tier could not start", 0.0, "test")
        return SandboxResult(True, 0, "", "", None, "", 0.0, "test")


@pytest.mark.parametrize("failures", [1, 2])
def test_a_sandbox_failure_is_retried_once_then_an_error_never_a_zero(
    failures: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = FlakySandbox(failures)
    monkeypatch.setattr("engine.sandbox.get_sandbox", lambda: sandbox)
    domain = make_domain(CodeDomainConfig(train_size=10, val_size=4, test_size=0))
    task = domain.tasks("val")[0]
    completion = domain.demonstration(task)
    if failures == 1:
        verdict = domain.verdict(task, completion)  # type: ignore[attr-defined]
        assert sandbox.calls == 2 and verdict.reason == "no_result"  # judged on the retry
    else:
        with pytest.raises(SandboxInfrastructureError, match="failed twice"):
            domain.verdict(task, completion)  # type: ignore[attr-defined]
        assert sandbox.calls == 2
