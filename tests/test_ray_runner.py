"""The Ray runner on a real local Ray cluster: runs in parallel, a killed worker retried, cancel."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.coach.backends.base import Proposals
from engine.coach.gates import auto_approve
from engine.coach.interventions import Intervention
from engine.coach.loop import Coach
from engine.config import parse_config
from engine.core import Engine
from engine.runs.artifacts import EVENTS_FILE, LOG_FILE, ROLLOUT_DIR, read_events
from engine.runs.runner import LocalRunner, make_runner
from engine.runs.spec import RunSpec
from engine.workspace import Workspace, template_dir
from tests.conftest import copy_workspace, tiny_toml, until

ray = pytest.importorskip("ray")

from engine.runs.ray_runner import LOG_PREFIX, RayHandle, RayRunner, local_cluster  # noqa: E402 - needs ray

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))
#: Threads of every process the tests start: another test suite shares the machine's two cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
LAUNCHED = f"{LOG_PREFIX} worker pid"


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    with local_cluster(env=ONE_THREAD) as address:
        yield address


def make_run(root: Path, name: str, warmup_steps: int) -> Path:
    """A run directory with a tiny warm-up's spec (seconds of work once torch is imported)."""
    text = tiny_toml((template_dir("sample") / "workspace.toml").read_text(), warmup_steps=warmup_steps)
    config = parse_config(text, root / "workspace.toml")
    assert config.warmup_steps == warmup_steps
    run_dir = root / name
    RunSpec(run_id=name, version=name, kind="warmup", config=config, model_out=root / f"{name}-model", threads=1).save(
        run_dir
    )
    return run_dir


def runner(address: str, meet: tuple[str, Path] | None = None, **kwargs: Any) -> RayRunner:
    """A Ray runner whose workers run on one thread; with `meet` (a point and a folder), two runs
    wait for each other at that point (`engine.faults`), so that their overlap does not depend on
    how long each took to import torch."""
    rendezvous = {"EVOTUI_MEET": f"{meet[0]}:2:{meet[1]}"} if meet else {}
    return RayRunner(address=address, extra_env={**ONE_THREAD, **rendezvous}, **kwargs)


def worker_pids(run_dir: Path) -> list[int]:
    """Live (not zombie) processes running this run's worker."""
    wanted = ["-m", "engine.runs.worker", str(run_dir)]
    return [pid for pid, argv in _processes() if argv[1:] == wanted]


def _processes() -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        yield int(entry.name), [a.decode(errors="replace") for a in argv]


def events(run_dir: Path) -> list[dict[str, Any]]:
    return read_events(run_dir / EVENTS_FILE, 0)[0]


def launches(run_dir: Path) -> int:
    return (run_dir / LOG_FILE).read_text(errors="replace").count(LAUNCHED)


def finish(handle: RayHandle, seconds: float = 90.0) -> int:
    return handle.wait(timeout=seconds)


def test_two_runs_execute_concurrently(ray_address: str, tmp_path: Path) -> None:
    # Run one at a time, the first would wait out the rendezvous alone and end before the second started.
    ray_runner = runner(ray_address, meet=("warmup-step", tmp_path / "meet"))
    dirs = [make_run(tmp_path, f"r{i}", warmup_steps=20) for i in range(2)]
    handles = [ray_runner.start(d) for d in dirs]
    assert all(h.pid is None and h.poll() is None for h in handles)
    with pytest.raises(subprocess.TimeoutExpired):
        handles[0].wait(timeout=0.01)
    assert [finish(h) for h in handles] == [0, 0]
    assert [h.reason for h in handles] == [None, None]
    spans = []
    for run_dir in dirs:
        log = events(run_dir)
        assert log[0]["type"] == "start" and log[-1] == {**log[-1], "type": "end", "status": "succeeded"}
        assert list((run_dir / ROLLOUT_DIR).glob("val-*.parquet"))
        assert launches(run_dir) == 1
        spans.append((log[0]["ts"], log[-1]["ts"]))
    (start_a, end_a), (start_b, end_b) = spans
    assert start_a < end_b and start_b < end_a, f"the runs did not overlap: {spans}"


def test_a_killed_worker_is_retried_by_ray_and_the_run_succeeds(ray_address: str, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "killed-once", warmup_steps=20)
    handle = runner(ray_address, max_retries=1).start(run_dir)
    until(lambda: events(run_dir))  # the worker is at work
    (pid,) = worker_pids(run_dir)
    os.kill(pid, signal.SIGKILL)
    assert finish(handle) == 0, (run_dir / LOG_FILE).read_text(errors="replace")[-3000:]
    assert handle.reason is None
    assert launches(run_dir) == 2
    assert "worker killed by SIGKILL" in (run_dir / LOG_FILE).read_text()
    assert events(run_dir)[-1]["type"] == "end"
    assert worker_pids(run_dir) == []


def test_without_retries_a_killed_worker_fails_the_run_with_rays_reason(ray_address: str, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "killed", warmup_steps=20)
    handle = runner(ray_address, max_retries=0).start(run_dir)
    (pid,) = until(lambda: worker_pids(run_dir))
    os.kill(pid, signal.SIGKILL)
    assert finish(handle) != 0
    assert handle.reason is not None and "worker died" in handle.reason and "\n" not in handle.reason
    assert launches(run_dir) == 1
    assert not any(e["type"] == "end" for e in events(run_dir))


@pytest.mark.parametrize("grace", [None, 0.0], ids=["interrupted", "force-cancelled"])
def test_kill_cancels_the_task_and_stops_the_worker_with_its_children(
    grace: float | None, ray_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled, the task kills the worker's process group; a task that does not answer within the
    grace (on a loaded machine) is force-cancelled, and the group is killed from here."""
    if grace is not None:  # the task never sees the interrupt: only the force-cancel reaches it
        import ray

        cancel = ray.cancel
        monkeypatch.setattr("engine.runs.ray_runner.CANCEL_GRACE_SECONDS", grace)
        monkeypatch.setattr(ray, "cancel", lambda ref, force=False, **kw: cancel(ref, force=True) if force else None)
    run_dir = make_run(tmp_path, "cancelled", warmup_steps=20)
    # The "python" starts a child of its own first: the worker's process group must go as a whole.
    python = tmp_path / "python-with-child"
    python.write_text(f'#!/bin/sh\nsleep 317 &\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    handle = runner(ray_address, python=str(python), max_retries=1).start(run_dir)
    until(lambda: worker_pids(run_dir))
    handle.kill()
    assert finish(handle, seconds=10) != 0
    assert handle.reason is not None and "cancelled" in handle.reason
    # SIGKILL is sent; a process holding torch takes a moment to tear down under load (CI saw one
    # still exiting at the first look), so the group must be gone within seconds, not at once.
    until(lambda: not worker_pids(run_dir), seconds=10)
    until(lambda: not [argv for _, argv in _processes() if argv == ["sleep", "317"]], seconds=10)
    assert launches(run_dir) == 1  # never retried


def test_a_node_without_the_run_directory_fails_the_run_naming_node_and_path(ray_address: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()  # no spec.json: what a node without the shared filesystem sees
    handle = runner(ray_address).start(run_dir)
    assert finish(handle, seconds=30) != 0
    assert handle.reason is not None and str(run_dir / "spec.json") in handle.reason
    assert "Ray node" in handle.reason and "\n" not in handle.reason


def test_a_rounds_two_branches_train_at_once_on_ray_and_are_judged_as_a_local_round_judges_them(
    ray_address: str, tmp_path: Path, built_tiny_v0: Workspace
) -> None:
    text = built_tiny_v0.config_path.read_text()
    local = copy_workspace(built_tiny_v0, tmp_path / "local")
    with Engine(local, runner=LocalRunner(extra_env=ONE_THREAD), poll_seconds=0.1) as engine:
        # A round of two branches at its run stage: the learning rate, the GRPO temperature (no
        # backtest drops either).
        coach = Coach(engine, answer=auto_approve)
        rnd = coach.rounds.open("v0", "offline", "full", False)
        changes = [{"recipe.learning_rate": 4e-5}, {"recipe.temperature": 1.2}]
        proposals = Proposals([Intervention(kind="optimizer", changes=c, hypothesis="h") for c in changes], "", "test")
        rnd = coach.rounds.propose(rnd, coach.planner.branches(rnd, proposals), None)
        assert len(rnd.branches) == 2
        coach.rounds.advance(rnd, "run")
    # The same workspace, v0 and round and all, whose engine runs on the cluster (its workers:
    # one thread each, as here).
    on_ray = tmp_path / "ray"
    shutil.copytree(local.root, on_ray)
    compute = f'\n[compute]\nbackend = "ray"\naddress = "{ray_address}"\ngpus = 0\n'
    (on_ray / "workspace.toml").write_text(text + compute)

    outcomes = {}
    assert isinstance(make_runner(parse_config(text + compute, on_ray / "workspace.toml").compute), RayRunner)
    # The Ray runner that config makes, with a rendezvous after each branch's first GRPO step: run
    # one after the other, the first would wait it out alone and end before the second started.
    on_cluster = runner(ray_address, meet=("grpo-step", tmp_path / "meet"))
    for root, runner_ in ((local.root, LocalRunner(extra_env=ONE_THREAD)), (on_ray, on_cluster)):
        with Engine.open(root, runner=runner_, poll_seconds=0.1) as engine:
            assert engine.runner.parallel == (runner_ is on_cluster)
            result = Coach(engine, answer=auto_approve).run(2)
            assert result.trained == ["v1", "v2"]
            children = [v for v in engine.store.list_versions() if v.parent is not None]
            outcomes[root] = {v.name: (v.verdict, v.state, v.val_greedy, v.val_sampled) for v in children}
            runs = [r for r in engine.store.list_runs() if r.kind == "train"]
            assert [r.state for r in runs] == ["succeeded", "succeeded"]
            assert all(engine.store.count_rollouts(r.id, "val") for r in runs)  # both ingested
            spans = [(events(Path(r.run_dir))[0]["ts"], events(Path(r.run_dir))[-1]["ts"]) for r in runs]
    assert outcomes[on_ray] == outcomes[local.root]
    (a_start, a_end), (b_start, b_end) = spans  # the Ray round's two runs
    assert a_start < b_end and b_start < a_end, f"the branches did not run at the same time: {spans}"
