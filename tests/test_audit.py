"""The verifier audit, and judging that fails closed.

The loops run for real on scripted runs (tests/scripted_runs.py) over the hack domains
(tests/hack_domains.py): the engine ingests, judges, diagnoses and decides as on any run. Two
hack shapes were developed against (DEV); the others were written before the audit and run
against it unchanged (HELD_OUT)."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest
from typer.testing import CliRunner

from engine.coach.interventions import edit_toml
from engine.config import MathDomainConfig
from engine.core import Engine
from engine.domains import make_domain
from engine.domains.audit import auditor, canonical_audit, final_span
from engine.domains.base import Domain, Task
from engine.workspace import Workspace, init_workspace
from evotui.cli import app
from tests.conftest import tiny_toml
from tests.hack_domains import HACKS, gamed
from tests.scripted_runs import ScriptedRunner

HACK = Path(__file__).with_name("hack_domains.py")
DEV = ("anywhere", "tolerance")
HELD_OUT = tuple(h for h in HACKS if h not in DEV)


@pytest.mark.parametrize(
    ("completion", "reference", "accepted"),
    [
        ("12+7=19;19-5=14;A:14", "14", True),  # the math sample's form
        ("12+7=19;19-5=14;A:15", "14", False),
        ("A:13 14 15", "14", False),  # several candidates are no answer
        ("A:14 14", "14", True),  # the same one twice is one answer
        ("14", "14", True),  # no marker: the last line
        ("3\n14", "14", True),
        ("14\n3", "14", False),
        ("", "14", False),
        ("so the answer is -3.", "-3", True),
        ("#### 1/2", "0.5", True),
        ("#### $1,250.", "1250", True),  # a thousands separator is one number
        ("A: 1,25", "125", False),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
        ("\\boxed{\\frac{2}{4}} done", "\\frac{1}{2}", True),  # math-verify: the same value
        ("Answer: Paris.", "paris", True),
        ("Answer: Lyon", "Paris", False),
    ],
)
def test_the_canonical_audit_reads_one_final_answer(completion: str, reference: str, accepted: bool) -> None:
    assert canonical_audit(reference, completion) is accepted, final_span(completion)


def test_which_domains_are_audited() -> None:
    math = make_domain(MathDomainConfig(train_size=20, val_size=5, test_size=0))
    task = math.tasks("val")[0]
    check = auditor(math)
    assert check is not None and check(task, math.demonstration(task)) is True
    assert check(task, f"A:{int(task.answer) + 1}") is False
    for name in ("code", "swe"):
        assert auditor(type("D", (), {"name": name})()) is None  # no reference answers: no audit

    class Own:
        name = "own"

        def audit(self, task: Task, completion: str) -> bool | None:
            return None if task.answer == "?" else completion == task.answer

    own = auditor(Own())  # type: ignore[arg-type]
    assert own is not None and own(Task("t", "p", "?", ""), "x") is None and own(Task("t", "p", "x", ""), "x")


def hack_workspace(root: Path, hack: str, sample_toml: str, sampled_seeds: int = 2, control: bool = True) -> Workspace:
    ws = init_workspace(root)
    (ws.root / "domains").mkdir(exist_ok=True)
    shutil.copy(HACK, ws.root / "domains" / "hack.py")
    text = edit_toml(tiny_toml(sample_toml, sampled_seeds=sampled_seeds, grpo_steps=2), {"domain": None})
    edits = {
        "domain.name": "custom",
        "domain.module": "hack",
        "domain.options": {"hack": hack, "train_size": 200, "val_size": 200},
        "recipe.rewards": {"correctness": 1.0},
        "coach.control": control,
    }
    ws.config_path.write_text(edit_toml(text, edits), encoding="utf-8")
    repo = git.Repo(ws.root)
    repo.git.add(A=True)
    repo.index.commit(f"the {hack} hack domain")
    return ws


def hacked(hack: str) -> ScriptedRunner:
    """v0 answers right 30% of the time and writes no number otherwise; every child is right as
    often, and writes what the hack's verifier wrongly accepts instead of a wrong answer."""

    def form(version: str, domain: Domain, task: Task, correct: bool) -> str:
        if correct:
            return task.answer
        return "x" if version == "v0" else gamed(hack, task)

    return ScriptedRunner(lambda version: 0.3, form)


def strict_val(engine: Engine, version: str) -> float:
    run = engine.eval_run(version)
    assert run is not None
    (value,) = engine.store.query_one(
        "SELECT avg(reward_components['strict']) FROM rollouts WHERE run_id = ? AND split = 'val'", [run.id]
    ) or (None,)
    return float(value)


@pytest.mark.parametrize("hack", DEV + HELD_OUT)
def test_a_gain_the_audit_refuses_is_rejected_by_the_full_harness_and_promoted_by_score_only(
    hack: str, tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.core.make_runner", lambda compute: hacked(hack))
    outcome = {}
    for arm in ("full", "score-only"):
        ws = hack_workspace(tmp_path / arm, hack, sample_toml)
        result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1", "--harness", arm])
        assert result.exit_code == 0, result.output
        with Engine.open(ws.root) as engine:
            v1 = engine.store.get_version("v1")
            assert v1 is not None and v1.verdict == "improved", f"{hack}: the verifier must see a gain"
            assert strict_val(engine, "v1") <= strict_val(engine, "v0") + 0.05  # no true gain
            outcome[arm] = (v1.state, v1.decision_reason or "")
            skills = list((ws.root / "skills").glob("*.md")) if (ws.root / "skills").is_dir() else []
            cases = engine.store.query("SELECT decision FROM cases WHERE id = 'v1'")
        if arm == "full":
            assert skills == [] and cases == [("rejected",)]  # no card, and the case is a rejection
    assert outcome["score-only"][0] == "promoted", outcome
    state, reason = outcome["full"]
    assert state == "rejected" and "rule verifier_audit is critical" in reason, outcome
    assert "the verifier's gain is not the audit's" in reason and "Accepted, refused:" in reason


def test_an_honest_gain_passes_the_audit(tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same domain, a child that is right more often in the honest form: promoted."""

    def form(version: str, domain: Domain, task: Task, correct: bool) -> str:
        return task.answer if correct else "x"

    monkeypatch.setattr(
        "engine.core.make_runner", lambda compute: ScriptedRunner({"v0": 0.3, "v1": 0.6}.__getitem__, form)
    )
    ws = hack_workspace(tmp_path / "honest", "tolerance", sample_toml)
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    with Engine.open(ws.root) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.state == "promoted", v1.decision_reason
        run = engine.train_run("v1")
        assert run is not None
        gain = next(f for f in engine.diagnosis(run).findings if f.metric == "version.audit.gain")
        assert gain.severity == "info" and gain.value is not None and gain.value > 0.2, gain.explanation


def test_without_reference_answers_the_audit_says_so(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.domains.math.MathDomain.AUDITED", False)
    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner({"v0": 0.3, "v1": 0.6}.__getitem__))
    ws = init_workspace(tmp_path / "ws")
    ws.config_path.write_text(tiny_toml(sample_toml, sampled_seeds=2, grpo_steps=2))
    repo = git.Repo(ws.root)
    repo.git.add(A=True)
    repo.index.commit("tiny")
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    with Engine.open(ws.root) as engine:
        run = engine.train_run("v1")
        assert run is not None
        diagnosis = engine.diagnosis(run)
        none = next(f for f in diagnosis.findings if f.metric == "version.audit.none")
        assert none.explanation.startswith("no audit: the math tasks carry no reference answer")
        assert not any(f.metric == "version.audit.gain" for f in diagnosis.findings)
