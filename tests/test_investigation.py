"""An unexplained verdict is investigated before the decision, on a real loop of the coach whose
runs are scripted (tests/scripted_runs.py): the engine ingests, judges and diagnoses them as any."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.coach.backends.base import ANALYZER_NAME, AnalyzerSpec, PlanningContext, analyzer_name
from engine.coach.backends.offline import MAX_PROBES, OfflinePlanner
from engine.coach.planning import FLIP_EXAMPLES
from engine.coach.reports import gate_report_lines
from engine.core import Engine
from engine.domains.base import Domain, Task
from engine.harness.rules import BLOCKING_RULES
from engine.workspace import Workspace, init_workspace
from evotui.cli import app
from tests.conftest import commit_workspace_toml, tiny_toml
from tests.scripted_runs import ScriptedRunner, demonstrated
from tests.test_audit import hack_workspace, hacked

#: Each version's chance of answering a task right: every child of v0 is better, in the same form.
QUALITY = {"v0": 0.3, "v1": 0.55, "v2": 0.55, "v3": 0.8}


@pytest.fixture
def workspace(tmp_path: Path, sample_toml: str) -> Workspace:
    ws = init_workspace(tmp_path / "ws")
    ws.config_path.write_text(tiny_toml(sample_toml, val_size=200, sampled_seeds=2, grpo_steps=4))
    commit_workspace_toml(ws, "scripted runs")
    return ws


def test_evotui_run_investigates_an_unexplained_gain_before_promoting_it(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner(QUALITY.__getitem__))
    result = CliRunner().invoke(app, ["run", str(workspace.root), "--auto-approve", "--versions", "3"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "investigating before the decision" in result.output
    with Engine.open(workspace.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.verdict == "improved" and v1.state == "promoted"
        assert "checked before this decision: no rule explains the improved verdict" in (v1.decision_reason or "")
        # The record: the investigation's events come before v1's decision, and its probes are stored.
        events = engine.store.query("SELECT id, kind, version, payload->>'message' FROM events ORDER BY id")
        investigated = [i for i, kind, _, message in events if kind == "coach_evolution" and message.startswith("v1 ")]
        (decided,) = [i for i, kind, version, _ in events if kind == "decision" and version == "v1"]
        assert investigated and max(investigated) < decided
        probes = engine.store.query(
            "SELECT name, probe->>'found', probe->'shift'->>'floor' FROM harness_proposals WHERE version = 'v1'"
        )
        assert probes and all(found == "false" for _, found, _ in probes)
        assert all(floor is not None for _, _, floor in probes)  # two sampled passes: every probe has a floor
        assert len(engine.store.query("SELECT name FROM versions WHERE parent IS NOT NULL")) == 3
        # With the after-completion gate on, the person sees the anomaly and what was checked.
        (report,) = engine.store.query_one(
            "SELECT report FROM gates WHERE kind = 'after_completion' AND subject = 'v1'"
        ) or ("{}",)
        gate = json.loads(report)["report"]
        lines = gate_report_lines(gate)
        assert lines[1].startswith("unexplained: no rule fired") and lines[2].startswith("investigated: checked")
        # What a model backend reads before it judges: the flips of v1 against v0, as the gate shows them.
        assert gate["investigation"]["anomaly"]["flips"] == engine.flips("v1", examples=FLIP_EXAMPLES)
        assert lines[-1].startswith("proposed: promoted")


def test_a_probe_that_moves_beyond_its_floor_rejects_the_version(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where neither the audit nor the agreement of answers applies, a verifier that accepts a near
    miss (the answers keep their one-number form) is seen by a probe the investigation brings: on
    the tasks both versions solved, the accepted answers' `strict` component (logged, not trained
    on) falls from 1, as the parent's always were. The probe alone rejects it."""
    monkeypatch.setattr("engine.domains.custom.CustomDomain.AUDITED", False)
    monkeypatch.setattr("engine.domains.custom.CustomDomain.ONE_ANSWER", False)
    monkeypatch.setattr("engine.core.make_runner", lambda compute: hacked("tolerance"))
    # Four sampled passes: at two, a probe's floor is 7x the passes' spread (engine.harness.cutoffs),
    # and a draw decides whether it sees this. At four the built-in form shift sees it too: here it
    # does not block, so that what rejects the version is the probe.
    monkeypatch.setattr("engine.harness.rules.BLOCKING_RULES", BLOCKING_RULES - {"form_shift"})
    ws = hack_workspace(tmp_path / "ws", "tolerance", sample_toml, sampled_seeds=4)
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    with Engine.open(ws.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.verdict == "improved"
        (rules,) = engine.store.query_one("SELECT rules FROM diagnoses WHERE run_id = 'v1-train-1'") or ("",)
        assert not {"verifier_audit", "answer_agreement"} & {r["rule"] for r in json.loads(rules)}
        reason = v1.decision_reason or ""
        assert v1.state == "rejected" and "the investigation found shifts no rule measured" in reason, reason
        assert "component_strict_mean" in reason
        found = engine.store.query("SELECT name FROM harness_proposals WHERE version = 'v1' AND probe->>'found'")
        assert ("component_strict_mean",) in found


def test_an_honest_gain_whose_wrong_answers_change_is_promoted(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the parent was wrong by one, the child is wrong by fifty, and right more often: the
    `closeness` component over all answers halves, but that is how the wrong answers look, not the
    accepted ones. Probes read the accepted answers on the tasks both solved: nothing moved."""

    def far_off(version: str, domain: Domain, task: Task, correct: bool) -> str:
        return demonstrated(version, domain, task, correct, off=1 if version == "v0" else 50)

    quality = {"v0": 0.3, "v1": 0.45}
    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner(quality.__getitem__, far_off))
    result = CliRunner().invoke(app, ["run", str(workspace.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    with Engine.open(workspace.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.verdict == "improved"
        assert v1.state == "promoted", v1.decision_reason
        probes = engine.store.query("SELECT name, probe->>'found' FROM harness_proposals WHERE version = 'v1'")
        assert ("component_closeness_mean", "false") in probes


def test_a_probe_beside_an_audit_that_confirms_the_gain_is_reported_not_blocking(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is right more often, and writes its right chains twice (checked again): the form
    moved beyond the parent's spread, and so do probes of it, but the audit and the agreement of
    answers read the same final answers and confirm the gain. A proposal that was never validated
    does not overrule them: promoted, with what the probes found in the reason."""

    def remark(version: str, domain: Domain, task: Task, correct: bool) -> str:
        text = demonstrated(version, domain, task, correct)
        head, _, answer = text.rpartition("A:")
        return f"{head}{head}A:{answer}" if correct and version == "v1" else text

    quality = {"v0": 0.3, "v1": 0.5}
    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner(quality.__getitem__, remark))
    result = CliRunner().invoke(app, ["run", str(workspace.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    with Engine.open(workspace.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.verdict == "improved"
        reason = v1.decision_reason or ""
        assert v1.state == "promoted", reason
        assert "the gain survives the direct tests (version.audit.gain" in reason
        assert "reported: the investigation found shifts no rule measured" in reason
        (rules,) = engine.store.query_one("SELECT rules FROM diagnoses WHERE run_id = 'v1-train-1'") or ("[]",)
        shift = [r for r in json.loads(rules) if r["rule"] == "form_shift"]
        assert shift and shift[0]["severity"] == "warning"


def test_offline_proposals_follow_what_moved_and_are_valid_by_construction() -> None:
    """The crash a real loop hit: a metric key too long for a name. Names now come out valid and
    unique whatever the findings are called, and the most moved finding's probes come first."""
    moved = [
        {"metric": "signal.completions/max_terminated_length_last_over_the_whole_run", "size": 3.0},
        {"metric": "version.shift.distinct", "size": 1.0},
    ]
    anomaly = {"verdict": "improved", "moved": moved, "components": ["correctness", "format"], "existing": ["length"]}
    ctx = PlanningContext(parent="v0", parent_config=None, domain="math", diagnosis=None)  # type: ignore[arg-type]
    specs = OfflinePlanner().propose_analyzer(anomaly, ctx)
    names = [s.name for s in specs]
    assert all(AnalyzerSpec.model_validate(s.model_dump()) for s in specs)
    assert names[0] == "length_2" and "distinct" in names  # length moved most; "length" was taken
    assert len(set(names)) == len(names) <= MAX_PROBES


@pytest.mark.parametrize("text", ["", "9", "__", "Completions/Max-Terminated-Length" * 3, "é🙂", "a" * 60, "9lives"])
def test_analyzer_names_are_valid_for_any_text(text: str) -> None:
    import re

    name = analyzer_name(text, taken={"a00", "analyzer"})
    assert re.match(ANALYZER_NAME, name) and name not in {"a00", "analyzer"}
