"""Run workers that fail: the run is marked failed with its error, and the engine carries on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core import Engine, RunFailed
from engine.policy.pretrained import POINTER_FILE, load_policy
from engine.runs.artifacts import EVENTS_FILE
from engine.runs.runner import LocalRunner
from engine.runs.spec import RunSpec
from engine.runs.worker import last_checkpoint
from engine.workspace import Workspace
from tests.conftest import commit_workspace_toml


class KillingRunner(LocalRunner):
    """Starts the worker and kills it at once, as the OOM killer would."""

    def start(self, run_dir: Path) -> subprocess.Popen[bytes]:
        proc = super().start(run_dir)
        os.killpg(proc.pid, signal.SIGKILL)
        return proc


def test_a_killed_worker_marks_the_run_failed(tiny_workspace: Workspace) -> None:
    with Engine(tiny_workspace, runner=KillingRunner(), poll_seconds=0.05) as engine:
        with pytest.raises(RunFailed) as info:
            engine.ensure_base()
        run = info.value.run
        assert run.state == "failed" and "worker exited with code -9" in (run.error_tail or "")
        assert engine.store.get_run(run.id).state == "failed"  # type: ignore[union-attr]
        v0 = engine.store.get_version("v0")
        assert v0 is not None and v0.state != "promoted" and v0.checkpoint is None


@pytest.mark.slow
def test_a_crashing_worker_stores_its_error_and_the_engine_carries_on(tiny_workspace_v0: Workspace) -> None:
    with Engine(tiny_workspace_v0, poll_seconds=0.1) as engine:
        engine.ensure_base()
        config = engine.version_config("v0")
        missing = tiny_workspace_v0.root / "no-such-model"
        with pytest.raises(RunFailed) as info:
            engine.training.execute("v0", "eval", config, model_in=missing, model_out=None)
        tail = info.value.run.error_tail or ""
        assert "no-such-model" in tail and "Traceback" in tail
        # Same engine, next run: works.
        ok = engine.training.execute(
            "v0", "eval", config, model_in=tiny_workspace_v0.root / ".evotrainer/models/v0", model_out=None
        )
        assert ok.state == "succeeded"
        states = [(r.kind, r.state) for r in engine.store.list_runs("v0")]
        assert states == [("warmup", "succeeded"), ("eval", "failed"), ("eval", "succeeded")]


def test_runs_left_running_by_a_dead_engine_are_interrupted_on_open(tiny_workspace: Workspace) -> None:
    run_dir = tiny_workspace.runs_dir / "v0-warmup-1"
    run_dir.mkdir(parents=True)
    (run_dir / EVENTS_FILE).write_text(
        json.dumps({"type": "metrics", "step": 5, "values": {"warmup/loss": 1.5}}) + "\n"
    )
    with Engine(tiny_workspace) as engine:
        engine.store.add_version("v0", None, "versions/v0", "x", state="created")
        engine.store.add_run("v0-warmup-1", "v0", "warmup", str(run_dir), {}, 20)
        engine.store.update_run("v0-warmup-1", state="running", pid=_dead_pid())
    with Engine(tiny_workspace) as engine:  # a new engine finds the orphan: dead before its end
        run = engine.store.get_run("v0-warmup-1")
        assert run is not None and run.state == "interrupted"  # to be resumed, not failed
        assert engine.store.metric_series("v0-warmup-1", "warmup/loss") == [(5, 1.5)]


def test_a_train_run_that_finished_while_no_engine_watched_completes_its_version(
    tiny_workspace: Workspace,
) -> None:
    run_dir = tiny_workspace.runs_dir / "v1-train-1"
    config = tiny_workspace.load_config()
    spec = RunSpec(
        run_id="v1-train-1",
        version="v1",
        kind="train",
        config=config,
        model_in=tiny_workspace.model_dir("v0"),
        model_out=tiny_workspace.model_dir("v1"),
    )
    spec.save(run_dir)
    events = [
        {"type": "metrics", "step": 1, "values": {"reward": 0.25}},
        {"type": "end", "status": "succeeded"},
    ]
    (run_dir / EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    with Engine(tiny_workspace) as engine:
        engine.store.add_version("v1", "v0", "versions/v1", "x", state="training")
        engine.store.add_run("v1-train-1", "v1", "train", str(run_dir), {}, 1)
        engine.store.update_run("v1-train-1", state="running", pid=_dead_pid())
    with Engine(tiny_workspace) as engine:
        assert engine.store.get_run("v1-train-1").state == "succeeded"  # type: ignore[union-attr]
        v1 = engine.store.get_version("v1")
        assert v1 is not None and (v1.state, v1.checkpoint) == ("trained", ".evotrainer/models/v1")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_local_model_directory_becomes_v0_as_it_is(tiny_workspace: Workspace) -> None:
    from engine.domains import make_domain
    from engine.policy.pretrained import save_policy
    from engine.policy.tiny import build_tiny_policy

    config = tiny_workspace.load_config()
    model, tokenizer = build_tiny_policy(config.policy.embedded, make_domain(config.domain), seed=5)
    save_policy(model, tokenizer, tiny_workspace.root / "my-model")
    text = tiny_workspace.config_path.read_text().replace('kind = "embedded"', 'kind = "local"\npath = "my-model"')
    tiny_workspace.config_path.write_text(text)
    commit_workspace_toml(tiny_workspace, "use a local model")
    with Engine(tiny_workspace, poll_seconds=0.1) as engine:
        v0 = engine.ensure_base()
        (run,) = engine.store.list_runs("v0")
        # No warm-up ran: the only metrics are the evaluation's, at step 0.
        assert engine.store.query("SELECT DISTINCT step FROM metrics WHERE run_id = ?", [run.id]) == [(0,)]
    assert v0.val_n == config.domain.val_size
    # v0 points at the model; the weights are not copied into the workspace.
    assert json.loads((tiny_workspace.root / (v0.checkpoint or "") / POINTER_FILE).read_text())["name_or_path"] == str(
        tiny_workspace.root / "my-model"
    )
    assert not list((tiny_workspace.root / (v0.checkpoint or "")).glob("*.safetensors"))
    reloaded, _ = load_policy(tiny_workspace.root / (v0.checkpoint or ""))
    assert reloaded.num_parameters() == model.num_parameters()


def test_the_group_filter_drops_dead_groups_from_training_and_logs_its_keep_ratio(tiny_workspace_v0: Workspace) -> None:
    from engine.coach.interventions import Intervention, apply
    from engine.config import CONFIG_FILE
    from engine.core import VersionPlan
    from engine.harness.analyzers.signal import DEAD_STD

    with Engine(tiny_workspace_v0) as engine:
        engine.ensure_base()
        iv = Intervention(
            kind="filter", changes={"recipe.group_filter": {"enabled": True, "std_threshold": 1e-3}}, hypothesis="h"
        )
        text, _ = apply(iv, engine.config_text("v0"), Path(CONFIG_FILE))
        engine.create_version(VersionPlan("v0", "v1", {CONFIG_FILE: text}, "filter", iv.factor, {}, "h", "c", "r"))
        run = engine.train("v1")
        # The logged keep ratio of every step is the share of that step's groups with reward spread.
        rows = engine.store.query(
            """
            WITH spread AS (
                SELECT step, avg((stddev_pop(reward) > 1e-3)::INT) OVER (PARTITION BY step) AS live
                FROM rollouts WHERE run_id = $run AND split = 'train' GROUP BY step, group_id
            )
            SELECT DISTINCT s.step, s.live, m.value FROM spread s
            JOIN metrics m ON m.run_id = $run AND m.key = 'filter/keep_ratio' AND m.step = s.step
            ORDER BY s.step
            """,
            {"run": run.id},
        )
        assert len(rows) == run.total_steps and DEAD_STD == 1e-3
        for _, live, keep in rows:
            assert keep == pytest.approx(live)


def test_a_relaunched_worker_resumes_from_the_latest_whole_checkpoint(tmp_path: Path) -> None:
    for step, whole in ((2, True), (10, True), (12, False)):  # checkpoint-12 was cut off mid-save
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"")
        if whole:
            (ckpt / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-x").mkdir()
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-10"  # 10 > 2: by step, not by name
    assert last_checkpoint(tmp_path / "none-yet") is None
