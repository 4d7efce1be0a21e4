"""Run workers that start warm: a fork server that has imported the worker once.

A worker started as ``python -m engine.runs.worker RUN_DIR`` spends about ten seconds importing
torch, transformers, TRL and datasets before its first step. The fork server is a child of the
engine process that has made those imports once, and only those (no torch op has run, no thread
is left, no CUDA driver loaded), and forks one child per run. The child becomes what the plain
subprocess would have been, then runs the worker module as ``python -m`` does (`runpy`, so the
worker's ``__main__`` block and its exit code are the same):

- its own session (``kill_group(pid)`` ends it and what it started), stdin /dev/null, stdout and
  stderr appended to the run's log (the engine opens it and passes the descriptor), the engine's
  working directory and, whole, the environment the engine gives the worker;
- its exit code reaches the engine as a subprocess's returncode would (0, 1, 75, -9 for
  SIGKILL...): the server reaps it and reports it;
- nothing of the server's: it closes the server's socket and descriptors before it runs, and
  leads a session of its own, so it outlives the server and the engine as a plain worker does.

One server per engine process, started by its first run (`fork_worker`) and reused by every
`LocalRunner` in the process, so the imports are paid once per process. Imports read the
environment, so a server serves one environment: only variables read at call time (`CALL_TIME_ENV`)
may differ between its children; a run with another environment replaces the server (the old one
ends once its children have). The server ends when the engine process does (its socket closes,
or the engine's pidfd says so), leaving its children running; an engine that dies leaves its
workers training, and the next one re-attaches through the run lock (`runner.AttachedWorker`).

Whenever the warm path cannot be taken (the server failed to start or died, it has a thread left
after its imports, a fork failed), `fork_worker` returns None and the runner starts a plain
subprocess: a run is never lost to the fork server. A child is started only after the engine has
its pid (the child waits for a "go" on a socket of its own), so a failure before that leaves no
second worker behind.

What differs from a fresh process, knowingly: children share the server's hash seed
(PYTHONHASHSEED) and its import-time warnings are not in the run's log; numpy's global random
state, which a fresh process seeds from the OS, is reseeded in each child.

The server runs as ``python -m engine.runs.forkserver FD ENGINE_PID``. This module imports the
standard library only: the engine imports it and must not load torch.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import runpy
import selectors
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from engine.runs.launch import WORKER_MODULE  # what a server imports before it forks, and its children run

#: Environment variables read only when used, not at import (a server's children may differ in
#: them): the kill points (`engine.faults`) and the sandbox's switch, and pytest's test name.
CALL_TIME_ENV = ("EVOTUI_", "PYTEST_CURRENT_TEST")
#: Threads that a fork leaves safe, though the server runs them: jemalloc's purging thread (pyarrow
#: bundles jemalloc, which starts it at its first allocation) is stopped and its locks taken
#: around a fork by jemalloc's own pthread_atfork handlers, and started again in the child when
#: needed; torch's DataLoader workers fork such processes every day.
FORK_SAFE_THREADS = ("jemalloc_bg_thd",)
#: How long a run waits for a starting server's imports before it starts cold instead.
READY_SECONDS = 120.0
#: How long a fork may take until the child reports its session.
FORK_SECONDS = 30.0
#: Servers that may fail to start or die in one engine process before runs start cold for good.
MAX_LOST = 3
#: The exit code of a child that never got its "go" (the engine gave up on it and started the run
#: otherwise): it ran nothing.
NOT_STARTED = 70
#: The largest message on the control socket (a request carries the whole environment).
MAX_MESSAGE = 1 << 20


class ServerLost(RuntimeError):
    """The server ended before it reported a child's exit (the child may still run)."""


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a worker's environment that its imports may read: what a server must match."""
    return {k: v for k, v in env.items() if not k.startswith(CALL_TIME_ENV)}


# --- the engine's side -------------------------------------------------------------------------


@dataclass
class _Fork:
    """A fork request, until the server reports its child's pid and, later, its exit code."""

    pid: int | None = None
    error: str | None = None
    returncode: int | None = None


class ForkedChild:
    """A worker forked by a server, as the engine follows it."""

    def __init__(self, server: ForkServer, fork: _Fork, pid: int, pidfd: int):
        self.server = server
        self.pid = pid
        self._fork = fork
        # Opened while the child waits for its "go", so it is this child: it tells when the child
        # has ended should the server die first.
        self._pidfd = pidfd

    def exit_code(self, timeout: float | None) -> int | None:
        """The child's exit code as the server reaped it; None while it runs (waiting up to
        `timeout`). Raises ServerLost when the server ended without reporting it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.server.changed:
            while self._fork.returncode is None:
                if not self.server.alive:
                    raise ServerLost(f"the fork server of worker {self.pid} ended")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.server.changed.wait(left)
            self._close()
            return self._fork.returncode

    def ended(self, timeout: float | None) -> bool:
        """Whether the child has ended (waiting up to `timeout`), for after ServerLost: its exit
        code went with the server."""
        with self.server.changed:
            if self._pidfd < 0:
                return True
            pidfd = os.dup(self._pidfd)
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(pidfd, selectors.EVENT_READ)
                return bool(selector.select(timeout))
        finally:
            os.close(pidfd)

    def _close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class ForkServer:
    """The engine's side of one fork server: the process, its socket, a thread reading it."""

    def __init__(self, env: Mapping[str, str], python: str = sys.executable):
        self.key = import_env(env)
        self.changed = threading.Condition()
        self.ready: bool | None = None  # None while it imports
        self.error: str | None = None
        self.alive = True
        self.pid: int | None = None  # the server's, once ready
        self._forks: dict[int, _Fork] = {}
        self._ids = itertools.count(1)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control = ours
        try:
            self.process = subprocess.Popen(
                [python, "-m", __name__, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                env=self.key,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # no terminal's Ctrl-C: it ends with the engine process
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._reader = threading.Thread(target=self._read, name="fork-server-reader", daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float) -> bool:
        with self.changed:
            self.changed.wait_for(lambda: self.ready is not None or not self.alive, timeout)
            return bool(self.ready and self.alive)

    def fork(
        self, run_dir: Path, log_fd: int, env: Mapping[str, str], cwd: str, module: str = WORKER_MODULE
    ) -> ForkedChild | None:
        """A child running `module` (the worker) on `run_dir`, or None when the server could not
        start one (it then runs nothing)."""
        fork_id = next(self._ids)
        fork = _Fork()
        request = {"op": "fork", "id": fork_id, "module": module, "run_dir": str(run_dir), "cwd": cwd, "env": dict(env)}
        ours, theirs = socket.socketpair()
        try:
            with ours:
                try:
                    with self.changed:  # the reader closes the socket under this lock when the server ends
                        if not (self.ready and self.alive):
                            raise OSError("the fork server is not ready")
                        self._forks[fork_id] = fork
                        socket.send_fds(self.control, [json.dumps(request).encode()], [log_fd, theirs.fileno()])
                finally:
                    theirs.close()
                ours.settimeout(FORK_SECONDS)
                if ours.recv(1) != b"r":  # its session is its own: kill_group(pid) works from here on
                    raise OSError("the child ended before it was set up")
                with self.changed:
                    self.changed.wait_for(lambda: fork.pid is not None or fork.error is not None, FORK_SECONDS)
                if fork.pid is None:
                    raise OSError(fork.error or "the server did not report the child's pid")
                pidfd = os.pidfd_open(fork.pid)
                try:
                    ours.sendall(b"g")
                except OSError:
                    os.close(pidfd)
                    raise
            return ForkedChild(self, fork, fork.pid, pidfd)
        except OSError:  # the child, if any, never got its "go": it ran nothing
            with self.changed:
                self._forks.pop(fork_id, None)
            return None

    def retire(self) -> None:
        """Fork no more; end once the children have ended (their exit codes still come)."""
        with self.changed, contextlib.suppress(OSError):
            if self.alive:
                self.control.send(json.dumps({"op": "retire"}).encode())

    def kill(self) -> None:
        """End the server now (its children go on; their exit codes are lost)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def _read(self) -> None:
        try:
            while message := self.control.recv(MAX_MESSAGE):
                data = json.loads(message)
                with self.changed:
                    if "ready" in data:
                        self.ready, self.error, self.pid = data["ready"], data.get("error"), data.get("pid")
                    elif (fork := self._forks.get(data["id"])) is not None:
                        if "returncode" in data:
                            fork.returncode = data["returncode"]
                            del self._forks[data["id"]]
                        else:
                            fork.pid, fork.error = data.get("pid"), data.get("error")
                    self.changed.notify_all()
        except OSError:
            pass
        finally:
            with self.changed:
                self.alive = False
                self.control.close()
                self.changed.notify_all()
            self.process.wait()


class _Pool:
    """This process's server: one at a time, replaced when a run's environment differs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.server: ForkServer | None = None
        self.lost = 0  # servers that failed to start or died

    def server_for(self, env: Mapping[str, str]) -> ForkServer | None:
        with self.lock:
            server = self.server
            if server is not None and server.ready is False:  # its imports failed or left a thread:
                self.lost = MAX_LOST  # another would fail alike
                server = self.server = None
            elif server is not None and not server.alive:  # killed, say
                self.lost += 1
                server = self.server = None
            if server is not None and server.key != import_env(env):
                server.retire()
                server = self.server = None
            if server is None:
                if self.lost >= MAX_LOST:
                    return None
                try:
                    server = self.server = ForkServer(env)
                except OSError:
                    self.lost += 1
                    return None
        return server if server.wait_ready(READY_SECONDS) else None


_pool = _Pool()


def _forget_in_child() -> None:
    # A process forked from the engine's has no reader thread: it starts a server of its own.
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_forget_in_child)


def fork_worker(
    run_dir: Path, log_fd: int, env: Mapping[str, str], cwd: str, module: str = WORKER_MODULE
) -> ForkedChild | None:
    """A warm worker on `run_dir` (its output appended to `log_fd`, with exactly `env`, in `cwd`),
    forked by this process's server; None where the warm path cannot be taken: start it cold.
    `module` is what the child runs as ``python -m MODULE RUN_DIR`` (tests run probes)."""
    server = _pool.server_for(env)
    return server.fork(run_dir, log_fd, env, cwd, module) if server is not None else None


def current_server() -> ForkServer | None:
    """This process's server, if one was started (for tests and benchmarks)."""
    return _pool.server


# --- the server: everything below runs in the server process and its children -----------------


@dataclass
class _Job:
    """What a forked child runs, once it is set up."""

    module: str
    run_dir: str
    cwd: str
    server_cwd: str

    def run(self) -> NoReturn:
        # `python -m` puts the working directory first on the path: the engine's, not the server's.
        if sys.path and sys.path[0] == self.server_cwd:
            sys.path[0] = self.cwd
        if (np := sys.modules.get("numpy")) is not None:
            np.random.seed()  # a fresh process's is seeded from the OS: not one state for all children
        sys.argv = ["-m", self.run_dir]
        runpy.run_module(self.module, run_name="__main__", alter_sys=True)
        sys.exit(0)  # the worker's __main__ block exits itself


@dataclass
class _Server:
    control: socket.socket
    parent: int  # a pidfd on the engine process
    cwd: str  # the server's working directory (first on its sys.path, as `python -m` puts it)
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    children: dict[int, tuple[int, int]] = field(default_factory=dict)  # pidfd -> (fork id, pid)
    retiring: bool = False

    def serve(self) -> _Job | None:
        """Fork children until the engine process ends (None) or, in a child, its job."""
        self.selector.register(self.control, selectors.EVENT_READ, "control")
        self.selector.register(self.parent, selectors.EVENT_READ, "parent")
        while not (self.retiring and not self.children):
            for key, _ in self.selector.select():
                if key.data == "parent":
                    return None
                if key.data == "control":
                    try:
                        message, fds, _, _ = socket.recv_fds(self.control, MAX_MESSAGE, 2)
                    except OSError:
                        return None
                    if not message:
                        return None
                    job = self._handle(json.loads(message), fds)
                    if job is not None:
                        return job
                else:
                    self._reap(key.fd)
        return None

    def _handle(self, request: dict[str, Any], fds: list[int]) -> _Job | None:
        if request["op"] == "retire":
            self.retiring = True
            return None
        log_fd, handshake_fd = fds
        pid = None
        error = fork_hazard()
        if error is None:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                error = f"could not fork: {exc}"
            if pid == 0:
                return self._become_child(request, log_fd, handshake_fd)
        os.close(log_fd)
        os.close(handshake_fd)  # a child that never forked: the engine reads the end of it
        if pid is None:
            self._send({"id": request["id"], "error": error})
            return None
        pidfd = os.pidfd_open(pid)  # not reaped before this: it exists, if as a zombie
        self.children[pidfd] = (request["id"], pid)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        self._send({"id": request["id"], "pid": pid})
        return None

    def _reap(self, pidfd: int) -> None:
        fork_id, pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        self._send({"id": fork_id, "returncode": os.waitstatus_to_exitcode(status)})

    def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the engine is gone: the selector says so next
            self.control.send(json.dumps(message).encode())

    def _become_child(self, request: dict[str, Any], log_fd: int, handshake_fd: int) -> _Job:
        """Turn this forked process into what ``Popen(..., start_new_session=True)`` would have
        started; wait for the engine's "go"."""
        try:
            os.setsid()
            for pidfd in self.children:
                os.close(pidfd)
            self.selector.close()
            self.control.close()
            os.close(self.parent)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(log_fd)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.close(null)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            with socket.socket(fileno=handshake_fd) as handshake:
                handshake.sendall(b"r")
                go = handshake.recv(1)
        except BaseException:  # noqa: BLE001 - the engine starts the run otherwise
            os._exit(NOT_STARTED)
        if go != b"g":
            os._exit(NOT_STARTED)
        return _Job(request["module"], request["run_dir"], request["cwd"], self.cwd)


def other_threads() -> list[str]:
    """The names of this process's threads besides the main one and those that a fork leaves
    safe (`FORK_SAFE_THREADS`)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
            if int(task) != os.getpid() and name not in FORK_SAFE_THREADS:
                names.append(name)
    return names


def cuda_touched() -> bool:
    """Whether the CUDA driver is loaded here: a forked child could not use the GPU."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        return any("libcuda.so" in line for line in maps)


def fork_hazard() -> str | None:
    """Why this process must not fork a worker now, or None."""
    if running := other_threads():
        return f"the fork server runs threads besides its main one ({', '.join(sorted(running))}): forking it is unsafe"
    if cuda_touched():
        return "an import loaded the CUDA driver in the fork server: its children could not use the GPU"
    return None


def _trial_fork() -> None:
    """Fork once and reap: libraries that keep threads (OpenBLAS's pool, started by importing
    numpy) stop them before a fork (pthread_atfork) and restart them only when used again."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _serve(fd: int, engine_pid: int) -> _Job | None:
    control = socket.socket(fileno=fd)
    try:
        parent = os.pidfd_open(engine_pid)
    except ProcessLookupError:
        return None
    if os.getppid() != engine_pid:  # it ended before we could watch it
        return None

    def send(message: dict[str, Any]) -> None:
        control.send(json.dumps(message).encode())

    try:
        __import__(WORKER_MODULE)
        _trial_fork()
        hazard = fork_hazard()
    except BaseException as exc:  # noqa: BLE001 - told to the engine, which starts its runs cold
        hazard = "".join(traceback.format_exception(exc))[-2000:]
    send({"ready": hazard is None, "error": hazard, "pid": os.getpid()})
    if hazard is not None:
        return None
    # Every object so far is shared with the children: keep the collector from copying their
    # pages by scanning them.
    gc.freeze()
    return _Server(control, parent, os.getcwd()).serve()


def main(argv: list[str]) -> None:
    job = _serve(int(argv[0]), int(argv[1]))
    if job is None:
        os._exit(0)  # the children go on: nothing to wait for
    job.run()


if __name__ == "__main__":
    main(sys.argv[1:])
