"""Kill -9 at the moments a run can die, and the next open finishes it: exact counts after.

A worker killed mid-GRPO or during its evaluation is started again and resumes from its last
checkpoint (TRL's own); an `evotui run` (and the worker with it, as a reboot would) killed during
the warm-up or mid-GRPO is finished by the next `evotui run`, which re-attaches to a worker that
still runs rather than start a second; an engine killed while it ingests, between a run's end and
its version's update, or between a decision's tag and its store update redoes the rest on open.
After each: metric steps and rollouts are stored once each, git and the `versions` table agree,
and every decided branch has its case.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import git
import pytest

from engine.core import Engine
from engine.runs import lock
from engine.runs.artifacts import EVENTS_FILE, read_events
from engine.workspace import Workspace
from tests.conftest import tiny_toml, workspace_with

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY = 6, 2


def survive_toml(sample_toml: str) -> str:
    """The tiny test settings with a checkpoint every SAVE_EVERY of STEPS GRPO steps."""
    head, sep, tail = tiny_toml(sample_toml, grpo_steps=STEPS).partition("[recipe.rewards]")
    return f"{head}save_every = {SAVE_EVERY}\nkeep_checkpoints = 2\n\n{sep}{tail}"


@pytest.fixture
def workspace(tmp_path: Path, sample_toml: str) -> Workspace:
    return workspace_with(tmp_path / "ws", survive_toml(sample_toml), "tiny settings, checkpoints every 2 steps")


def resumes(run_dir: Path) -> list[int]:
    return [e["step"] for e in read_events(run_dir / EVENTS_FILE, 0)[0] if e["type"] == "resume"]


def assert_exact(engine: Engine, run_id: str, steps: int) -> None:
    """Every GRPO step's metrics and rollouts stored once; one final evaluation on val."""
    store = engine.store
    metric_steps = [s for s, _ in store.metric_series(run_id, "reward")]
    assert metric_steps == list(range(1, steps + 1))
    per_step = store.query(
        """SELECT step, count(*), count(DISTINCT (group_id, sample_idx)) FROM rollouts
           WHERE run_id = ? AND split = 'train' GROUP BY step ORDER BY step""",
        [run_id],
    )
    assert [s for s, _, _ in per_step] == list(range(1, steps + 1))
    assert all(n == distinct == per_step[0][1] for _, n, distinct in per_step)  # no row twice
    config = engine.version_config(store.get_run(run_id).version)  # type: ignore[union-attr]
    val = store.query(
        "SELECT step, decoding, count(*) FROM rollouts WHERE run_id = ? AND split = 'val' GROUP BY ALL ORDER BY ALL",
        [run_id],
    )
    size = config.domain.val_size
    assert val == [(steps, "greedy", size), (steps, "sampled", size * config.eval.sampled_seeds)]
    files = store.query("SELECT count(*), count(DISTINCT file) FROM ingested_files WHERE run_id = ?", [run_id])
    assert files[0][0] == files[0][1] == steps + 2


def assert_consistent(root: Path) -> None:
    """git's decision tags and branches agree with the versions table; decided branches have a case."""
    repo = git.Repo(root)
    tags = {t.name.split("/", 1)[1]: t.name.split("/", 1)[0] for t in repo.tags if "/" in t.name}
    with Engine.open(root) as engine:
        versions = {v.name: v.state for v in engine.store.list_versions()}
        decided = {n: s for n, s in versions.items() if s in ("promoted", "rejected", "pruned")}
        assert tags == decided
        assert {b.name for b in repo.branches if b.name.startswith("versions/")} == {f"versions/{n}" for n in versions}
        cases = {r[0]: r[1] for r in engine.store.query("SELECT id, decision FROM cases")}
        assert cases == {n: s for n, s in decided.items() if n != "v0"}


class Cli:
    """`evotui` on the workspace as a user starts it, killed at kill points or from outside."""

    def __init__(self, root: Path, kills: Path):
        self.root = root
        self.kills = kills  # where each kill point leaves its mark (it fires once)
        kills.mkdir()

    def start(self, *args: str, kill_at: str | None = None) -> subprocess.Popen[bytes]:
        env = {**os.environ, "EVOTUI_KILL_ONCE": str(self.kills)}
        env.pop("EVOTUI_KILL_AT", None)
        if kill_at:
            env["EVOTUI_KILL_AT"] = kill_at
        evotui = Path(sys.executable).parent / "evotui"
        command = [str(evotui), *(args or ("run", str(self.root), "--auto-approve", "--versions", "1"))]
        return subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def run(self, *args: str, kill_at: str | None = None) -> tuple[int, str]:
        proc = self.start(*args, kill_at=kill_at)
        out, _ = proc.communicate(timeout=600)
        return proc.returncode, out.decode(errors="replace")


def until(condition: Callable[[], bool], seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def trained_past(run_dir: Path, step: int) -> bool:
    events = read_events(run_dir / EVENTS_FILE, 0)[0]
    return any(e["type"] == "metrics" and "reward" in e["values"] and e["step"] >= step for e in events)


def test_kills_of_the_cli_the_engine_and_the_worker_are_each_finished_by_the_next_open(
    workspace: Workspace, tmp_path: Path
) -> None:
    root, runs = workspace.root, workspace.runs_dir
    cli = Cli(root, tmp_path / "kills")
    warmup, train = runs / "v0-warmup-1", runs / "v1-train-1"

    # 1. The engine dies inside an ingest transaction during the warm-up; its worker goes on.
    code, out = cli.run(kill_at="ingest:2")
    assert code == -signal.SIGKILL, out
    assert lock.holder(warmup) is not None  # the orphan, still warming up
    # 2. The next `evotui run` adopts it (no second worker) and goes on; then the CLI and the
    #    worker are killed together mid-GRPO, past the first checkpoint, as a reboot would.
    proc = cli.start()
    until(lambda: trained_past(train, SAVE_EVERY + 1))
    worker = lock.holder(train)
    proc.kill()
    proc.wait()
    assert worker is not None and worker.pid is not None
    os.killpg(worker.pid, signal.SIGKILL)
    until(lambda: lock.holder(train) is None, 10)
    code, out = cli.run("status", str(root))
    assert code == 0 and "v1-train-1 was interrupted" in out and "resumes it" in out, out
    # 3. The next run resumes the run from its checkpoint; its worker is killed during the final
    #    evaluation and started again by the engine (it evaluates again), and the engine dies
    #    between the run's end and its version's update.
    code, out = cli.run(kill_at="eval:1,run-finished")
    assert code == -signal.SIGKILL, out
    # 4. The next one completes v1 on open, judges it, and dies between the tag and the store.
    code, out = cli.run(kill_at="decision-tag")
    assert code == -signal.SIGKILL, out
    # 5. The next open (any command) completes the decision.
    code, out = cli.run("status", str(root))
    assert code == 0, out

    assert [e["type"] for e in read_events(warmup / EVENTS_FILE, 0)[0]].count("start") == 1  # one worker
    first, final = resumes(train)
    assert first in (SAVE_EVERY, 2 * SAVE_EVERY) and final == STEPS
    assert_consistent(root)
    with Engine.open(root) as engine:
        store = engine.store
        loss_steps = [s for s, _ in store.metric_series("v0-warmup-1", "warmup/loss")]
        assert loss_steps == sorted(set(loss_steps)) and loss_steps[-1] == engine.config.warmup_steps
        assert_exact(engine, "v1-train-1", STEPS)
        kinds = [k for (k,) in store.query("SELECT kind FROM events WHERE run_id = 'v0-warmup-1' ORDER BY id")]
        assert kinds.count("run_started") == 1 and kinds.count("run_attached") == 1
        kinds = [k for (k,) in store.query("SELECT kind FROM events WHERE run_id = 'v1-train-1' ORDER BY id")]
        assert kinds.count("run_retried") == 1 and kinds.count("run_interrupted") == 1
        v1 = store.get_version("v1")
        assert v1 is not None and v1.state in ("promoted", "rejected", "pruned") and v1.checkpoint
