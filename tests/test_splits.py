"""Three splits: train trains, val decides, test is held out from everything that decides."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import git
import pytest

from engine.coach.gates import auto_approve
from engine.coach.interventions import edit_toml
from engine.coach.loop import Coach
from engine.config import CodeDomainConfig, MathDomainConfig, SweDomainConfig
from engine.core import Engine
from engine.domains import make_domain
from engine.workspace import Workspace, init_workspace
from tests.conftest import tiny_toml

POISONED = Path(__file__).with_name("poisoned_domain.py")


@pytest.mark.parametrize(
    "config",
    [
        MathDomainConfig(train_size=500, val_size=100, test_size=100),
        CodeDomainConfig(train_size=300, val_size=100, test_size=100),
        SweDomainConfig(train_size=200, val_size=50, test_size=50),
    ],
    ids=["math", "code", "swe"],
)
def test_the_three_splits_share_no_prompt_and_test_leaves_val_as_it_was(config) -> None:  # type: ignore[no-untyped-def]
    domain = make_domain(config)
    splits = {s: domain.tasks(s) for s in ("train", "val", "test")}
    assert {s: len(t) for s, t in splits.items()} == {
        "train": config.train_size,
        "val": 100 if config.name != "swe" else 50,
        "test": config.test_size,
    }
    prompts = [t.prompt for tasks in splits.values() for t in tasks]
    assert len(set(prompts)) == len(prompts)
    without = make_domain(config.model_copy(update={"test_size": 0}))
    assert [t.prompt for t in without.tasks("val")] == [t.prompt for t in splits["val"]]
    assert without.tasks("test") == []


def poisonable_workspace(dest: Path, sample_toml: str, poison: bool) -> Workspace:
    ws = init_workspace(dest)
    (ws.root / "domains").mkdir(exist_ok=True)
    shutil.copy(POISONED, ws.root / "domains" / "poisoned.py")
    text = edit_toml(tiny_toml(sample_toml, val_size=60, sampled_seeds=2, grpo_steps=4), {"domain": None})
    options = {"train_size": 200, "val_size": 60, "test_size": 60, "poison": poison}
    text = edit_toml(text, {"domain.name": "custom", "domain.module": "poisoned", "domain.options": options})
    ws.config_path.write_text(text, encoding="utf-8")
    repo = git.Repo(ws.root)
    repo.git.add(A=True)
    repo.index.commit("a math domain whose test split may be poisoned")
    return ws


def decisions(ws: Workspace) -> list[tuple[object, ...]]:
    with Engine(ws) as engine:
        rows = engine.store.query(
            """SELECT v.name, v.parent, v.state, v.verdict, v.val_greedy, v.val_sampled, v.decision_reason,
                      i.change FROM versions v LEFT JOIN interventions i ON i.id = v.intervention_id ORDER BY v.name"""
        )
        rounds = engine.store.query("SELECT id, parent, proposals FROM rounds ORDER BY id")
    # A branch's proposal without the child's workspace.toml (which names the poison switch).
    proposals = [
        (i, parent, [{k: v for k, v in b.items() if k != "text"} for b in json.loads(p)]) for i, parent, p in rounds
    ]
    return [*rows, *proposals]


@pytest.mark.slow
def test_a_poisoned_test_split_changes_no_decision(tmp_path: Path, sample_toml: str) -> None:
    """Three workspaces that differ only in their test split make the same decisions with the same
    val scores: one whose test answers are right, one whose answers are shifted by seven, and one
    with no test run at all. The first two even hold test rollouts of v0 (scored against their own
    answers) while their coach decides; the third shows that a test run merely existing decides
    nothing either."""
    outcomes, test_scored = {}, {}
    for name, poison, test_run in (("clean", False, True), ("poisoned", True, True), ("untested", False, False)):
        ws = poisonable_workspace(tmp_path / name, sample_toml, poison)
        with Engine(ws) as engine:
            engine.ensure_base()
            if test_run:
                run, scores = engine.evaluate("v0", "test")
                assert scores.n_tasks == 60
                test_scored[name] = engine.store.query(
                    "SELECT task_id, completion, reward_components['correctness'] FROM rollouts"
                    " WHERE run_id = ? AND split = 'test' ORDER BY task_id, sample_idx",
                    [run.id],
                )
            Coach(engine, answer=auto_approve).run(2)
            tested = engine.store.query("SELECT count(*) FROM rollouts WHERE split = 'test'")[0][0]
            assert (tested > 0) == test_run
        outcomes[name] = decisions(ws)
    # The same v0 wrote the same test completions in both; it solves some against the right
    # answers (else the next line would hold vacuously), and the poison scored them against shifted
    # answers, so no completion is right in both.
    clean, poisoned = test_scored["clean"], test_scored["poisoned"]
    assert [r[:2] for r in poisoned] == [r[:2] for r in clean]
    assert {task for task, _, right in clean if right}, "v0 solves no test task: the poison could not show"
    assert not any(p[2] and c[2] for p, c in zip(poisoned, clean, strict=True))
    assert outcomes["poisoned"] == outcomes["clean"] == outcomes["untested"]
    assert len([r for r in outcomes["clean"] if r[0] in ("v1", "v2")]) == 2


def test_the_benchmark_refuses_a_workspace_without_a_test_split(tmp_path: Path) -> None:
    from engine.bench.arms import BenchError, BenchSettings, run_bench

    ws = init_workspace(tmp_path / "ws", "sample")
    text = edit_toml(ws.config_path.read_text(encoding="utf-8"), {"domain.test_size": 0})
    ws.config_path.write_text(text, encoding="utf-8")
    repo = git.Repo(ws.root)
    repo.git.add(A=True)
    repo.index.commit("no test split")
    with pytest.raises(BenchError, match="test split no arm decides on"):
        run_bench(ws.root, BenchSettings(budget_steps=1, version_steps=1, seeds=(0,)))
    # Refused before anything was cloned.
    assert not (ws.state_dir / "bench").exists()
