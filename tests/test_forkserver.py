"""Workers forked warm by the fork server are the processes a plain subprocess would be: their own
session, the runner's environment, the run's log, exit codes as a subprocess's; the server ends
with its engine process and its workers do not; without a server, runs start cold.

Most tests share this process's server (one environment: the runners' extra_env is the same
everywhere here); a few kill it, or run an engine process of their own, and pay its imports.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.config import parse_config
from engine.runs import forkserver, lock
from engine.runs.artifacts import EVENTS_FILE, LOG_FILE, read_events, run_outcome
from engine.runs.runner import ForkedWorker, LocalRunner, LocalWorker
from engine.runs.spec import RunSpec
from engine.workspace import template_dir
from tests.conftest import tiny_toml, until

pytestmark = pytest.mark.slow

#: Threads of every worker: another test suite may share the machine's two cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PROBE = "tests.forked_probe"


def make_run(root: Path, name: str, warmup_steps: int = 20) -> Path:
    """A run directory with a tiny warm-up's spec (seconds of work once torch is imported)."""
    text = tiny_toml((template_dir("sample") / "workspace.toml").read_text(), warmup_steps=warmup_steps)
    config = parse_config(text, root / "workspace.toml")
    run_dir = root / name
    RunSpec(run_id=name, version=name, kind="warmup", config=config, model_out=root / f"{name}-model", threads=1).save(
        run_dir
    )
    return run_dir


def stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (state, ppid, pgrp, session, ...), None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def gone(pid: int) -> bool:
    fields = stat(pid)
    return fields is None or fields[0] == "Z"


def parent(pid: int) -> int:
    fields = stat(pid)
    assert fields is not None, f"no process {pid}"
    return int(fields[1])


def server_pid() -> int:
    server = forkserver.current_server()
    assert server is not None and server.alive and server.pid is not None
    return server.pid


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """LocalRunner's warm workers run tests/forked_probe.py in place of the worker module."""
    monkeypatch.setattr(forkserver, "fork_worker", functools.partial(forkserver.fork_worker, module=PROBE))


@pytest.fixture
def own_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of servers for this test alone (it kills them): the others' server is left alone."""
    monkeypatch.setattr(forkserver, "_pool", forkserver._Pool())


def report(run_dir: Path) -> dict[str, Any]:
    path = until(lambda: (run_dir / "report.json").exists() and run_dir / "report.json")
    return json.loads(path.read_text())


def test_a_run_is_forked_by_the_warm_server_and_ends_as_it_would(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "warm")
    handle = LocalRunner(extra_env=ONE_THREAD).start(run_dir)
    assert isinstance(handle, ForkedWorker) and handle.pid is not None
    server = server_pid()
    assert parent(handle.pid) == server  # forked by the server, not started by exec from here
    assert Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"engine.runs.forkserver"]
    fields = stat(handle.pid)
    assert fields is not None and int(fields[2]) == int(fields[3]) == handle.pid  # its own session and group
    until(lambda: lock.holder(run_dir))
    assert lock.holder(run_dir) == lock.Holder(handle.pid, lock.start_time(handle.pid))
    assert handle.wait(timeout=300) == 0
    assert handle.poll() == 0 and run_outcome(run_dir) == "end"
    assert [e["type"] for e in read_events(run_dir / EVENTS_FILE, 0)[0]][0] == "start"
    assert list((tmp_path / "warm-model").iterdir())  # the warm-up saved v0
    # The next run is forked by the same server.
    again = LocalRunner(extra_env=ONE_THREAD).start(make_run(tmp_path, "again", warmup_steps=1))
    assert isinstance(again, ForkedWorker) and again.pid is not None and parent(again.pid) == server
    assert again.wait(timeout=300) == 0


def test_exit_codes_reach_the_engine_as_a_subprocesss_would(tmp_path: Path) -> None:
    runner = LocalRunner(extra_env=ONE_THREAD)
    # Another worker holds the run: the worker's lock.EXIT_LOCKED.
    locked = make_run(tmp_path, "locked")
    held = lock.acquire(locked)
    try:
        handle = runner.start(locked)
        assert isinstance(handle, ForkedWorker) and handle.wait(timeout=120) == lock.EXIT_LOCKED
    finally:
        held.close()
    # A run that fails (an evaluation of a model that is not there): 1, with its error event.
    broken = tmp_path / "broken"
    config = RunSpec.load(locked).config
    RunSpec(run_id="broken", version="v", kind="eval", config=config, model_in=tmp_path / "no-such-model").save(broken)
    handle = runner.start(broken)
    assert isinstance(handle, ForkedWorker) and handle.wait(timeout=120) == 1
    assert run_outcome(broken) == "error" and "no-such-model" in (broken / LOG_FILE).read_text()
    # Killed by SIGKILL at a kill point (EVOTUI_KILL_AT from extra_env): -9.
    killed = make_run(tmp_path, "killed")
    handle = LocalRunner(extra_env={**ONE_THREAD, "EVOTUI_KILL_AT": "warmup-step:3"}).start(killed)
    assert isinstance(handle, ForkedWorker) and handle.wait(timeout=120) == -signal.SIGKILL
    steps = [e["step"] for e in read_events(killed / EVENTS_FILE, 0)[0] if e["type"] == "metrics"]
    assert run_outcome(killed) is None and steps and max(steps) <= 3


def test_a_kill_point_from_the_engines_environment_reaches_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kills = tmp_path / "kills"
    kills.mkdir()
    monkeypatch.setenv("EVOTUI_KILL_AT", "warmup-step:2")
    monkeypatch.setenv("EVOTUI_KILL_ONCE", str(kills))
    run_dir = make_run(tmp_path, "killed-once")
    runner = LocalRunner(extra_env=ONE_THREAD)
    first = runner.start(run_dir)
    assert isinstance(first, ForkedWorker) and first.wait(timeout=120) == -signal.SIGKILL
    assert (kills / "warmup-step").exists()
    second = runner.start(run_dir)  # the kill point fired once: this one ends
    assert isinstance(second, ForkedWorker) and second.wait(timeout=300) == 0
    assert [e["type"] for e in read_events(run_dir / EVENTS_FILE, 0)[0]].count("resume") == 1


@pytest.mark.usefixtures("probe")
def test_the_child_is_what_a_subprocess_would_be_and_holds_nothing_of_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVOTUI_PROBE_FROM_ENGINE", "os.environ at start")
    extra = {**ONE_THREAD, "EVOTUI_PROBE_EXTRA": "extra_env"}
    run_dir = make_run(tmp_path, "probe")
    (run_dir / "ask.json").write_text(json.dumps({"threads": 2, "exit": 3}))
    (run_dir / LOG_FILE).write_text("an earlier worker's line\n")
    handle = LocalRunner(extra_env=extra).start(run_dir)
    expected_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **extra}
    assert isinstance(handle, ForkedWorker) and handle.wait(timeout=60) == 3
    seen = report(run_dir)
    assert seen["env"] == expected_env
    assert (seen["pid"], seen["ppid"], seen["pgid"], seen["sid"]) == (handle.pid, server_pid(), handle.pid, handle.pid)
    assert seen["cwd"] == os.getcwd() and seen["path0"] == os.getcwd()
    assert seen["argv"] == [str(Path(__file__).with_name("forked_probe.py")), str(run_dir)]
    assert seen["main"] == PROBE  # run as `python -m` runs it
    # Only stdin (/dev/null) and the log: no socket, pidfd or epoll of the server's.
    log = str(run_dir / LOG_FILE)
    assert seen["fds"] == {"0": "/dev/null", "1": log, "2": log}
    assert (run_dir / LOG_FILE).read_text() == "an earlier worker's line\nprobe stdout\nprobe stderr\n"
    # torch's thread setting holds and its pool works; it starts processes of its own.
    assert seen["torch_threads"] == 2 and seen["product"] == 256.0
    assert seen["echo"] == "from a grandchild\n"


@pytest.mark.usefixtures("probe")
def test_children_do_not_share_the_servers_random_state(tmp_path: Path) -> None:
    runner = LocalRunner(extra_env=ONE_THREAD)
    draws = []
    for name in ("a", "b"):
        run_dir = make_run(tmp_path, name)
        handle = runner.start(run_dir)
        assert isinstance(handle, ForkedWorker) and handle.wait(timeout=60) == 0
        draws.append(report(run_dir)["numpy_draw"])
    assert draws[0] != draws[1]


@pytest.mark.usefixtures("probe")
def test_kill_ends_the_worker_and_what_it_started(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "probe")
    (run_dir / "ask.json").write_text(json.dumps({"grandchild": True, "sleep": 300}))
    handle = LocalRunner(extra_env=ONE_THREAD).start(run_dir)
    assert isinstance(handle, ForkedWorker)
    grandchild = report(run_dir)["grandchild"]
    fields = stat(grandchild)
    assert fields is not None and int(fields[2]) == handle.pid  # in the worker's process group
    handle.kill()
    assert handle.wait(timeout=10) == -signal.SIGKILL
    until(lambda: gone(grandchild), 10)
    handle.kill()  # an ended worker: nothing to kill, no error


def test_a_run_of_another_interpreter_starts_cold(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    handle = LocalRunner(python=str(python), extra_env=ONE_THREAD).start(make_run(tmp_path, "other"))
    assert isinstance(handle, LocalWorker)
    handle.kill()
    assert handle.wait(timeout=10) == -signal.SIGKILL
    handle = LocalRunner(extra_env=ONE_THREAD, warm=False).start(make_run(tmp_path, "cold"))
    assert isinstance(handle, LocalWorker)
    handle.kill()
    assert handle.wait(timeout=10) == -signal.SIGKILL


@pytest.mark.usefixtures("own_pool")
def test_a_dead_server_loses_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = LocalRunner(extra_env=ONE_THREAD)
    # Killed while its worker runs: the worker goes on to its end, which its events tell.
    run_dir = make_run(tmp_path, "orphaned", warmup_steps=60)
    handle = runner.start(run_dir)
    assert isinstance(handle, ForkedWorker) and handle.pid is not None
    first_server = forkserver.current_server()
    assert first_server is not None
    until(lambda: read_events(run_dir / EVENTS_FILE, 0)[0])
    first_server.kill()
    until(lambda: not first_server.alive, 10)
    assert handle.poll() is None and not gone(handle.pid)
    assert handle.wait(timeout=300) == 0 and run_outcome(run_dir) == "end"
    # The next run gets a new server; a worker that dies while its server is dead: how it ended
    # is in its events (none: killed).
    run_dir = make_run(tmp_path, "orphan-killed", warmup_steps=60)
    handle = runner.start(run_dir)
    assert isinstance(handle, ForkedWorker) and handle.pid is not None
    assert parent(handle.pid) == server_pid() != first_server.pid
    forkserver.current_server().kill()  # type: ignore[union-attr]
    os.killpg(handle.pid, signal.SIGKILL)
    assert handle.wait(timeout=10) == -signal.SIGKILL
    # No server to be had (it died once too often): the run starts as a plain subprocess.
    monkeypatch.setattr(forkserver, "MAX_LOST", 2)
    run_dir = make_run(tmp_path, "cold", warmup_steps=1)
    handle = runner.start(run_dir)
    assert isinstance(handle, LocalWorker)
    assert handle.wait(timeout=300) == 0 and run_outcome(run_dir) == "end"


@pytest.mark.usefixtures("own_pool")
def test_a_run_with_another_import_environment_gets_another_server(tmp_path: Path) -> None:
    handle = LocalRunner(extra_env=ONE_THREAD).start(make_run(tmp_path, "one", warmup_steps=1))
    assert isinstance(handle, ForkedWorker) and handle.pid is not None
    first = server_pid()
    assert parent(handle.pid) == first
    # OMP_NUM_THREADS is read when torch is imported: not the server's.
    handle = LocalRunner(extra_env={"OMP_NUM_THREADS": "2"}).start(make_run(tmp_path, "two", warmup_steps=1))
    assert isinstance(handle, ForkedWorker) and handle.pid is not None
    assert parent(handle.pid) == server_pid() != first
    assert handle.wait(timeout=300) == 0
    until(lambda: gone(first), 300)  # retired: it ended once its worker had


def test_a_thread_makes_forking_unsafe() -> None:
    script = textwrap.dedent("""
        import threading
        from engine.runs.forkserver import fork_hazard
        print(fork_hazard())
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        print(fork_hazard())
        stop.set()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    alone, with_thread = out.stdout.splitlines()
    assert alone == "None" and "threads besides its main one" in with_thread and "unsafe" in with_thread


ENGINE = """
import json, os, signal, sys
from pathlib import Path
from engine.runs import forkserver
from engine.runs.runner import ForkedWorker, LocalRunner
handle = LocalRunner(extra_env={"OMP_NUM_THREADS": "1"}).start(Path(sys.argv[1]))
server = forkserver.current_server()
print(json.dumps({"worker": handle.pid, "server": server.pid, "forked": isinstance(handle, ForkedWorker)}), flush=True)
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("end", ["exits", "killed"])
def test_the_server_ends_with_its_engine_process_and_the_worker_goes_on(tmp_path: Path, end: str) -> None:
    run_dir = make_run(tmp_path, "orphan", warmup_steps=300)
    engine = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ENGINE), str(run_dir), end],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert engine.returncode == (0 if end == "exits" else -signal.SIGKILL), engine.stderr
    started = json.loads(engine.stdout)
    assert started["forked"]
    try:
        until(lambda: gone(started["server"]), 10)
        assert not gone(started["worker"])  # the worker trains on
        until(lambda: lock.holder(run_dir))
        assert lock.holder(run_dir).pid == started["worker"]  # type: ignore[union-attr]
    finally:
        os.killpg(started["worker"], signal.SIGKILL)
    until(lambda: lock.holder(run_dir) is None, 10)
