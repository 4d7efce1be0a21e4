"""A verifier a tiny policy learns to game within one short version (tests/lax_domain.py): the full
harness must not promote the version, the score-only ablation would. The full loop runs for real;
the ablation judges the version that loop trained (its own loop proposes the same change and trains
the same rollouts, byte for byte: the benchmark's score-only arm runs that loop end to end)."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest
from typer.testing import CliRunner

from engine.coach.interventions import edit_toml
from engine.coach.judging import proposed_decision
from engine.core import Engine
from engine.harness.loader import MODE_LAYERS
from engine.workspace import Workspace, init_workspace
from evotui.cli import app

LAX = Path(__file__).with_name("lax_domain.py")


def lax_workspace(dest: Path) -> Workspace:
    ws = init_workspace(dest)
    (ws.root / "domains").mkdir(exist_ok=True)
    shutil.copy(LAX, ws.root / "domains" / "lax.py")
    text = edit_toml(ws.config_path.read_text(encoding="utf-8"), {"domain": None})
    edits = {
        "domain.name": "custom",
        "domain.module": "lax",
        "domain.options": {"train_size": 2000, "val_size": 400},
        "recipe.rewards": {"correctness": 1.0},
        "recipe.steps": 60,
        "recipe.learning_rate": 1e-4,
        "recipe.max_completion_length": 16,
        "policy.warmup.steps": 150,
        "policy.embedded.max_positions": 64,
    }
    ws.config_path.write_text(edit_toml(text, edits), encoding="utf-8")
    repo = git.Repo(ws.root)
    repo.git.add(A=True)
    repo.index.commit("the lax-verifier domain")
    return ws


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Workspace]:
    """The full loop trains and judges one version; a copy of its workspace is the ablation's."""
    root = tmp_path_factory.mktemp("lax")
    full = lax_workspace(root / "full")
    result = CliRunner().invoke(app, ["run", str(full.root), "--auto-approve", "--versions", "1", "--harness", "full"])
    assert result.exit_code == 0, result.output
    shutil.copytree(full.root, root / "score-only", symlinks=True)
    return {"full": full, "score-only": Workspace(root / "score-only")}


def strict_and_lax(ws: Workspace, version: str) -> tuple[float, float]:
    """Sampled val correctness of a version: the honest reading and the lax verifier's."""
    with Engine(ws) as engine:
        run = engine.eval_run(version)
        assert run is not None
        row = engine.store.query_one(
            """SELECT avg(reward_components['strict']), avg(reward_components['correctness']) FROM rollouts
               WHERE run_id = ? AND split = 'val' AND decoding = 'sampled'""",
            [run.id],
        )
    assert row is not None
    return row[0], row[1]


@pytest.mark.slow
def test_the_hack_is_real(arms: dict[str, Workspace]) -> None:
    """The premise: the lax score rose while the honest reading of the same answers fell."""
    (strict_before, lax_before), (strict_after, lax_after) = (strict_and_lax(arms["full"], v) for v in ("v0", "v1"))
    assert lax_after > lax_before and strict_after < strict_before


@pytest.mark.slow
def test_the_full_harness_rejects_the_hack_and_score_only_promotes_it(arms: dict[str, Workspace]) -> None:
    with Engine(arms["full"]) as engine:
        v1 = engine.store.get_version("v1")
        assert v1 is not None and v1.verdict == "improved"
        # Two blocking rules see it: the verifier audit (the sprayed lists are no answer; it comes
        # first, so it is the reason) and the form shift (the answers grew longer, with more spans).
        assert v1.state == "rejected" and "rule verifier_audit is critical" in (v1.decision_reason or "")
        run = engine.train_run("v1")
        assert run is not None
        blocking = [r.rule for r in engine.diagnosis(run).blocking]
        assert blocking[:1] == ["verifier_audit"] and "form_shift" in blocking, blocking
        assert engine.tree.decision("v1")[0] == "rejected"  # type: ignore[index]
    # The score-only ablation's judgement of the same version: its harness's layers only, and no
    # investigation (`Judge.judge` with `--harness score-only`).
    with Engine(arms["score-only"]) as engine:
        verdict = engine.judge("v1")
        diagnosis = engine.diagnose_version("v1", layers=MODE_LAYERS["score-only"])
        assert verdict.label == "improved" and diagnosis.blocking == []
        decision, reason = proposed_decision(verdict, diagnosis, None, investigated=False)
        assert decision == "promoted", reason
