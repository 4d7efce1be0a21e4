"""The agreement of accepted answers: a second line of defence that needs no reference answer.

The loops run for real on scripted runs over the hack domains (tests/hack_domains.py) with the
verifier audit switched off, as for a domain whose tasks carry no reference answer. Agreement was
developed against the `tolerance` hack only; the other five run against it unchanged."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.config import DatasetDomainConfig
from engine.core import Engine
from engine.domains.audit import answer_key, one_answer
from engine.domains.base import Domain, Task
from evotui.cli import app
from tests.hack_domains import HACKS
from tests.scripted_runs import ScriptedRunner
from tests.test_audit import hack_workspace, hacked


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("12+7=19;A:19", "#### 19", True),
        ("A: 1,250", "the answer is 1250.0", True),
        ("#### 2500/2", "A:1250", True),
        ("A:19", "A:20", False),
        ("A:18 19 20", "A:19", False),  # a spray is not its right member
        ("A:18 19 20", "A:17 19 21", False),  # nor another spray
        ("Answer: Paris.", "answer: paris", True),
        ("", "A:", True),  # two empty answers are one (empty) answer
    ],
)
def test_answer_keys_are_equal_exactly_for_the_same_final_answer(a: str, b: str, same: bool) -> None:
    assert (answer_key(a) == answer_key(b)) is same


def test_which_domains_have_one_answer_per_task(tmp_path: Path) -> None:
    from engine.domains.custom import CustomDomain
    from engine.domains.dataset import DatasetDomain
    from engine.domains.math import MathDomain

    assert one_answer(MathDomain.__new__(MathDomain))
    for name in ("code", "swe"):
        assert not one_answer(type("D", (), {"name": name})())  # type: ignore[arg-type]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(12)))
    verifiers = {"exact": True, "numeric": True, "math": False, "regex": False}
    for verifier, expected in verifiers.items():
        config = DatasetDomainConfig(file=data, verifier=verifier)
        assert one_answer(DatasetDomain(config, tmp_path)) is expected, verifier
    many = DatasetDomainConfig(file=data, verifier="numeric", tolerance=0.01)
    assert not one_answer(DatasetDomain(many, tmp_path))  # two numbers within 1% are both right
    wrapped = CustomDomain.__new__(CustomDomain)
    wrapped.inner = type("Inner", (), {})()
    assert one_answer(wrapped)  # a custom domain is held to one answer unless it says otherwise
    wrapped.inner.one_answer = False
    assert not one_answer(wrapped)


def _run(ws_root: Path) -> tuple[str, str, list[str]]:
    result = CliRunner().invoke(app, ["run", str(ws_root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    with Engine.open(ws_root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.verdict == "improved", "the verifier must see a gain"
        (rules,) = engine.store.query_one("SELECT rules FROM diagnoses WHERE run_id = 'v1-train-1'") or ("[]",)
        skills = list((ws_root / "skills").glob("*.md")) if (ws_root / "skills").is_dir() else []
        assert skills == [] or v1.state == "promoted"
        return v1.state, v1.decision_reason or "", [r["rule"] for r in json.loads(rules)]


@pytest.mark.parametrize("hack", HACKS)
def test_without_an_audit_a_gain_of_answers_the_parent_never_gave_is_rejected(
    hack: str, tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v0 is right 30% of the time; v1 as often, and where v0 wrote no answer v1 writes one the
    buggy verifier accepts. On the tasks v0 had solved, v1's accepted answers are not v0's."""
    monkeypatch.setattr("engine.domains.custom.CustomDomain.AUDITED", False)
    monkeypatch.setattr("engine.core.make_runner", lambda compute: hacked(hack))
    state, reason, rules = _run(hack_workspace(tmp_path / "ws", hack, sample_toml).root)
    assert "verifier_audit" not in rules
    assert state == "rejected" and "rule answer_agreement is critical" in reason, reason
    assert "agree with the parent's" in reason and "Accepted, not agreeing:" in reason


def test_answers_that_contradict_each_other_are_rejected(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier that accepts any listed number, and a child that sprays five numbers around the
    answer, a different five each pass: on a task, its accepted answers do not agree with each
    other. Four passes (two cannot show it: two answers that disagree still leave one of two)."""
    monkeypatch.setattr("engine.domains.custom.CustomDomain.AUDITED", False)
    draw = random.Random(0)

    def form(version: str, domain: Domain, task: Task, correct: bool) -> str:
        if version == "v0":
            return task.answer if correct else "x"
        shift = draw.randrange(5)  # the right number is always in the spray
        return " ".join(str(int(task.answer) + d) for d in range(-shift, 5 - shift))

    monkeypatch.setattr(
        "engine.core.make_runner", lambda compute: ScriptedRunner({"v0": 0.5, "v1": 0.5}.__getitem__, form)
    )
    state, reason, rules = _run(hack_workspace(tmp_path / "ws", "anywhere", sample_toml, sampled_seeds=4).root)
    assert state == "rejected" and "answer_agreement" in rules, reason
    assert "agree with each other" in reason


def test_an_honest_gain_agrees(tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.domains.custom.CustomDomain.AUDITED", False)

    def form(version: str, domain: Domain, task: Task, correct: bool) -> str:
        return task.answer if correct else "x"

    monkeypatch.setattr(
        "engine.core.make_runner", lambda compute: ScriptedRunner({"v0": 0.3, "v1": 0.6}.__getitem__, form)
    )
    ws = hack_workspace(tmp_path / "ws", "tolerance", sample_toml)
    state, reason, rules = _run(ws.root)
    assert state == "promoted" and "answer_agreement" not in rules, reason
    with Engine.open(ws.root) as engine:
        run = engine.train_run("v1")
        assert run is not None
        found = {f.metric: f for f in engine.diagnosis(run).findings if f.metric.startswith("version.agreement.")}
        assert set(found) == {"version.agreement.self", "version.agreement.parent"}
        assert all(f.severity == "info" for f in found.values())
        # The whole gain agrees; on the tasks v0 had solved, v0 was lucky as often as not: no gain there.
        assert found["version.agreement.self"].value is not None and found["version.agreement.self"].value > 0.2


def test_a_domain_with_many_right_answers_says_there_is_no_agreement_check(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.domains.custom.CustomDomain.ONE_ANSWER", False)
    monkeypatch.setattr("engine.core.make_runner", lambda compute: hacked("tolerance"))
    ws = hack_workspace(tmp_path / "ws", "tolerance", sample_toml)
    _run(ws.root)
    with Engine.open(ws.root) as engine:
        run = engine.train_run("v1")
        assert run is not None
        findings = {f.metric: f for f in engine.diagnosis(run).findings}
        assert findings["version.agreement.none"].explanation.startswith(
            "no agreement check: the custom tasks can have many right answers"
        )
        assert not any(m in findings for m in ("version.agreement.self", "version.agreement.parent"))
