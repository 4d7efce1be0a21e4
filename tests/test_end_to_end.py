"""A real version trained through the CLI, the engine, a worker process and TRL's GRPOTrainer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.core import Engine
from engine.domains import make_domain, score
from engine.workspace import Workspace, init_workspace
from evotui.cli import app

pytestmark = pytest.mark.slow


def test_a_version_trains_end_to_end(tiny_workspace_v0: Workspace) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(tiny_workspace_v0.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    assert "Versions: correctness on the held-out split" in result.output and "GRPO runs" in result.output

    with Engine.open(tiny_workspace_v0.root) as engine:
        store = engine.store
        config = engine.version_config("v1")
        recipe = config.recipe
        run = engine.train_run("v1")
        assert run is not None and run.state == "succeeded"

        # Every rollout of every step is stored, in groups of num_generations of one task.
        assert store.count_rollouts(run.id, "train") == recipe.steps * recipe.batch_size
        groups = store.query(
            "SELECT count(*), count(DISTINCT task_id), min(sample_idx), max(sample_idx) FROM rollouts "
            "WHERE run_id = ? AND split = 'train' GROUP BY step, group_id",
            [run.id],
        )
        assert len(groups) == recipe.steps * recipe.prompts_per_step
        assert set(groups) == {(recipe.num_generations, 1, 0, recipe.num_generations - 1)}

        # Every stored reward is the verifier's score of the stored completion.
        domain = make_domain(config.domain)
        tasks = {t.task_id: t for split in ("train", "val") for t in domain.tasks(split)}
        rows = store.query(
            "SELECT task_id, completion, reward, reward_components FROM rollouts WHERE run_id = ?", [run.id]
        )
        assert len(rows) == recipe.steps * recipe.batch_size + config.domain.val_size * (1 + config.eval.sampled_seeds)
        for task_id, completion, reward, components in rows:
            total, expected = score(domain, tasks[task_id], completion, recipe.rewards)
            assert components == expected
            assert math.isclose(reward, total, abs_tol=1e-9)

        # TRL's frac_reward_zero_std equals the share of zero-spread groups in the stored rollouts.
        recomputed = store.query(
            """
            WITH g AS (
                SELECT step, group_id, stddev_pop(reward) AS spread FROM rollouts
                WHERE run_id = ? AND split = 'train' GROUP BY step, group_id
            )
            SELECT step, avg(CASE WHEN spread < 1e-9 THEN 1.0 ELSE 0.0 END) FROM g GROUP BY step ORDER BY step
            """,
            [run.id],
        )
        logged = store.metric_series(run.id, "frac_reward_zero_std")
        assert [s for s, _ in logged] == list(range(1, recipe.steps + 1))
        assert [(s, round(v, 6)) for s, v in recomputed] == [(s, round(v, 6)) for s, v in logged]
        for key in (
            "reward",
            "reward_std",
            "entropy",
            "completions/clipped_ratio",
            "rewards/correctness/mean",
        ):
            assert len(store.metric_series(run.id, key)) == recipe.steps, key

        # Lineage in the store mirrors the git version tree.
        v0, v1 = store.get_version("v0"), store.get_version("v1")
        assert v0 is not None and v1 is not None
        assert (v1.parent, v1.branch, v1.commit_sha) == (
            "v0",
            "versions/v1",
            engine.tree.commit_of("v1").hexsha,
        )
        assert engine.tree.lineage("v1") == ["v0", "v1"]
        assert v0.state == "promoted" and v1.verdict is not None
        assert (tiny_workspace_v0.root / v1.checkpoint / "config.json").is_file()  # type: ignore[operator]
        assert v0.val_n == config.domain.val_size
        assert 0.0 <= v1.val_greedy <= 1.0  # type: ignore[operator]

        # The harness diagnosed every run as it ended, and the CLI printed the headline.
        diagnosed = store.query("SELECT run_id, harness_revision FROM diagnoses ORDER BY run_id")
        assert [r[0] for r in diagnosed] == ["v0-warmup-1", "v1-train-1"]
        layers = store.query(
            "SELECT DISTINCT layer FROM findings WHERE diagnosis_id = ? ORDER BY layer", [f"{run.id}-diagnosis"]
        )
        assert {"score", "signal", "version"} <= {r[0] for r in layers}
        (dead,) = store.query_one(
            "SELECT value FROM findings WHERE diagnosis_id = ? AND metric = 'signal.dead_group_ratio'",
            [f"{run.id}-diagnosis"],
        )
        recomputed_dead = sum(v for _, v in recomputed) / len(recomputed)  # equal groups per step
        assert dead == recomputed_dead or abs(dead - recomputed_dead) < 1e-9
    assert f"diagnosis of {run.id}" in result.output

    listing = runner.invoke(app, ["versions", str(tiny_workspace_v0.root)])
    assert listing.exit_code == 0 and "v0" in listing.output and "v1" in listing.output
    status = runner.invoke(app, ["status", str(tiny_workspace_v0.root)])
    assert status.exit_code == 0 and "v1-train-1" in status.output and "succeeded" in status.output


def test_the_sample_workspace_builds_a_partly_competent_v0(tmp_path: Path) -> None:
    """The shipped sample: v0 must leave RL room (above 0, below 90% on val)."""
    workspace = init_workspace(tmp_path / "sample")
    with Engine(workspace) as engine:
        v0 = engine.ensure_base()
    assert v0.val_greedy is not None and v0.val_n is not None
    p, n = v0.val_greedy, v0.val_n
    half_width = 2 * math.sqrt(max(p * (1 - p), 1e-9) / n)
    assert p - half_width > 0, f"v0 val accuracy {p:.3f} is not measurably above 0"
    assert p < 0.9, f"v0 val accuracy {p:.3f} leaves RL no room"
