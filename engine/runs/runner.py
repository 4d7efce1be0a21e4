"""Launching run workers and following them until they end.

A runner starts one worker per run (`engine.runs.worker`) and hands back a handle to follow it:
the local runner starts ``python -m engine.runs.worker RUN_DIR`` as a child process in its own
session (or under ``accelerate launch`` for several GPUs), with output to a file (a pipe could
fill up and stall the worker), forked warm from a server that has its imports made where it can
(`engine.runs.forkserver`, `ForkedWorker`); the Ray runner (`engine.runs.ray_runner`) runs it as a
Ray task on a cluster. A worker of an engine that stopped is followed through its run's lock
(`AttachedWorker`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from engine.config import ComputeConfig
from engine.runs import forkserver, lock
from engine.runs.artifacts import LOG_FILE, run_outcome
from engine.runs.launch import WORKER_MODULE, worker_command
from engine.runs.spec import RunSpec


class RunHandle(Protocol):
    #: The worker's process id when it runs on this machine (None: elsewhere, e.g. on a Ray node).
    pid: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class Runner(Protocol):
    #: Its runs run in parallel (the coach trains a round's branches at once).
    parallel: bool
    #: It starts a worker that died again itself (else the engine does, `[compute] max_retries`).
    retries: bool

    def start(self, run_dir: Path) -> RunHandle: ...


def make_runner(compute: ComputeConfig) -> Runner:
    """The runner `[compute]` asks for."""
    if compute.backend == "ray":
        from engine.runs.ray_runner import RayRunner  # ray is an optional extra

        return RayRunner(
            compute.address,
            compute.cpus,
            compute.gpus,
            compute.max_retries,
            accelerate_config=compute.accelerate_config,
        )
    return LocalRunner(compute=compute)


class LocalWorker(subprocess.Popen[bytes]):
    """A worker process in its own session: killing it kills what it started too."""

    def kill(self) -> None:
        if self.poll() is None:  # a reaped worker's pid may be another process's by now
            kill_group(self.pid)


class ForkedWorker:
    """A worker forked by this engine process's fork server (`engine.runs.forkserver`): the same
    process a `LocalWorker` would be, whose exit code the server reports. Should the server end
    first, the worker's end is told by its pidfd and how it ended by its events."""

    def __init__(self, child: forkserver.ForkedChild, run_dir: Path):
        self.child = child
        self.run_dir = run_dir
        self.pid: int | None = child.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            kill_group(self.child.pid)

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self.returncode = self.child.exit_code(timeout)
            except forkserver.ServerLost:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if self.child.ended(left):
                    self.returncode = outcome_code(self.run_dir)
        return self.returncode


class LocalRunner:
    """One process per run on this machine: forked warm where it can be (``warm``: a one-GPU
    worker of this very interpreter), else a subprocess."""

    parallel = False
    retries = False

    def __init__(
        self,
        python: str = sys.executable,
        extra_env: dict[str, str] | None = None,
        compute: ComputeConfig | None = None,
        warm: bool = True,
    ):
        self.python = python
        self.extra_env = extra_env or {}
        self.compute = compute or ComputeConfig()
        self.warm = warm

    def command(self, run_dir: Path) -> list[str]:
        # Several GPUs train one run; a warm-up or an evaluation runs in one process.
        kind = RunSpec.load(run_dir).kind
        compute = self.compute if kind == "train" else self.compute.model_copy(update={"gpus": 1})
        return worker_command(self.python, run_dir, compute)

    def start(self, run_dir: Path) -> LocalWorker | ForkedWorker:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **self.extra_env}
        command = self.command(run_dir)
        with open(run_dir / LOG_FILE, "ab") as log:
            # Several GPUs (accelerate launch) or another interpreter: what the server has imported
            # is not what the worker would.
            if self.warm and command == [sys.executable, "-m", WORKER_MODULE, str(run_dir)]:
                child = forkserver.fork_worker(run_dir, log.fileno(), env, os.getcwd())
                if child is not None:
                    return ForkedWorker(child, run_dir)
            return LocalWorker(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )


class AttachedWorker:
    """A live worker this engine did not start (its engine stopped or died, or it took the run
    before this engine's worker could): it is followed through the lock it holds on its run, and
    ended with its event log. Its pid is None when not known (the lock file does not say it yet,
    or the holder let go already)."""

    def __init__(self, run_dir: Path, pid: int | None, poll_seconds: float = 0.2):
        self.run_dir = run_dir
        self.pid: int | None = pid
        self.poll_seconds = poll_seconds
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and lock.holder(self.run_dir) is None:
            self.returncode = outcome_code(self.run_dir)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(self.poll_seconds)
        return code

    def kill(self) -> None:
        if self.pid is not None and lock.holder(self.run_dir) is not None:
            try:
                kill_group(os.getpgid(self.pid))
            except ProcessLookupError:
                pass


def outcome_code(run_dir: Path) -> int:
    """The exit code of an ended worker that is not our child: its exit status is not ours to
    read, its events say how it ended."""
    outcome = run_outcome(run_dir)
    return 0 if outcome == "end" else 1 if outcome == "error" else -signal.SIGKILL


def kill_group(pgid: int) -> None:
    """SIGKILL a process group (a worker started in its own session, and what it started)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
