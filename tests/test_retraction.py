"""Memory only from versions that earned it: a version flagged after its decision (by a person,
or by a diagnosis with the harness of now) has its skill card entries and its case retracted:
kept, marked, never retrieved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.coach.memory import Memory
from engine.coach.skills import SkillLibrary
from engine.core import Engine
from engine.domains.base import Domain, Task
from engine.store import Store
from evotui.cli import app
from tests.scripted_runs import ScriptedRunner
from tests.test_audit import hack_workspace
from tests.test_memory_library import make_card, validation


def test_a_card_stands_while_one_of_its_versions_does(tmp_path: Path) -> None:
    lib = SkillLibrary(tmp_path)
    lib.write(make_card(validation=[validation("v2", "math"), validation("v5", "math")]))
    rules = ["insufficient_signal"]
    assert lib.retract("v2", "hacked: answers sprayed") == ["insufficient-signal-continuous-correctness"]
    (card,) = lib.load()
    assert [v.get("retracted") for v in card.validation] == ["hacked: answers sprayed", None]
    assert not card.retracted and [c.id for c in lib.match(rules, "math")] == [card.id]
    lib.retract("v5", "lost on test")
    (card,) = lib.load()
    assert card.retracted and lib.match(rules, "math") == []  # kept on disk, never retrieved
    assert "retracted: lost on test" in (tmp_path / "skills" / f"{card.id}.md").read_text(encoding="utf-8")
    assert lib.retract("v9", "no card") == []


def test_a_flagged_versions_case_is_kept_and_not_retrieved(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.duckdb")
    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    store.add_version("v1", "v0", "versions/v1", "b", state="promoted")
    memory = Memory(store)
    memory.record_case("v1", "truncation", "math", "v0", "budget", "longer_budget", "x", "improved", "promoted", "r")
    assert [c["version"] for c in memory.cases("truncation", "math")] == ["v1"]
    with pytest.raises(ValueError, match="needs a reason"):
        memory.flag("v1", " ", SkillLibrary(tmp_path))
    with pytest.raises(ValueError, match="no version 'v7'"):
        memory.flag("v7", "why", SkillLibrary(tmp_path))
    flag = memory.flag("v1", "its gain was a verifier bug", SkillLibrary(tmp_path))
    assert flag["case"] and flag["cards"] == [] and flag["state"] == "promoted"
    assert memory.cases("truncation", "math") == []
    assert store.query("SELECT retracted FROM cases") == [("its gain was a verifier bug",)]
    record = store.get_version("v1")
    assert record is not None and record.flagged == "its gain was a verifier bug"
    assert store.query("SELECT kind, version FROM events WHERE kind = 'flag'") == [("flag", "v1")]


#: A workspace analyzer that finds, after the fact, what the loop's harness did not look for.
LATE_RULE = """
from engine.harness import Finding, analyzer


@analyzer("late_check", "version")
def late_check(ctx):
    if ctx.version.name == "v1":
        return Finding("version.late_check", 1.0, "critical", "a check written after v1 was promoted")
    return None
"""


def test_a_promoted_version_that_a_later_harness_blocks_is_flagged_by_its_diagnosis(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def form(version: str, domain: Domain, task: Task, correct: bool) -> str:
        return task.answer if correct else "x"

    monkeypatch.setattr(
        "engine.core.make_runner", lambda compute: ScriptedRunner({"v0": 0.3, "v1": 0.6}.__getitem__, form)
    )
    ws = hack_workspace(tmp_path / "ws", "tolerance", sample_toml, control=False)  # a card without a control
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    lib = SkillLibrary(ws.root)
    (card,) = lib.load()
    assert [v["version"] for v in card.validation] == ["v1"] and lib.match(card.trigger, "custom") == [card]

    (ws.root / "harness").mkdir(exist_ok=True)
    (ws.root / "harness" / "late.py").write_text(LATE_RULE, encoding="utf-8")
    out = CliRunner().invoke(app, ["diagnose", str(ws.root), "v1", "--json"])
    assert out.exit_code == 0, out.output
    flag = json.loads(out.output)["flagged"]
    assert flag["cards"] == [card.id] and flag["case"]
    assert flag["reason"].startswith("diagnosed again after its promotion: rule workspace_critical is critical")
    (card,) = lib.load()
    assert card.retracted and lib.match(card.trigger, "custom") == []
    with Engine.open(ws.root) as engine:
        assert Memory(engine.store).cases("none", "custom") == []
        record = engine.store.get_version("v1")
        assert record is not None and record.state == "promoted" and record.flagged == flag["reason"]
    # Diagnosed once more, it is already flagged: nothing is retracted twice.
    again = CliRunner().invoke(app, ["diagnose", str(ws.root), "v1", "--json"])
    assert again.exit_code == 0 and "flagged" not in json.loads(again.output)


def test_a_person_flags_a_version_from_the_cli(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner({"v0": 0.3, "v1": 0.6}.__getitem__))
    ws = hack_workspace(tmp_path / "ws", "tolerance", sample_toml)
    assert CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1"]).exit_code == 0
    out = CliRunner().invoke(app, ["flag", str(ws.root), "v1", "--reason", "read its rollouts: numbers off by two"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("v1 (") and "flagged: read its rollouts: numbers off by two" in out.output
    missing = CliRunner().invoke(app, ["flag", str(ws.root), "v9", "--reason", "x"])
    assert missing.exit_code != 0 and "no version 'v9'" in missing.output
