"""Run workers as Ray tasks: ``[compute] backend = "ray"``.

Each run is one Ray task that asks for the run's CPUs and GPUs; Ray places it on a node and
retries it when its worker dies. The task starts the same worker command as the local runner
(``python -m engine.runs.worker RUN_DIR``, under ``accelerate launch`` for a train run on several
GPUs), on that node, and returns its exit code.

The run directory is the workspace's own: every node must see the workspace's filesystem at the
same path (a shared or network filesystem), and have evotui installed at the same ``python``. A
node that cannot read ``RUN_DIR/spec.json`` fails the run with a message that names the node.
A cluster with token authentication needs ``RAY_AUTH_MODE=token`` (and its token) in the engine's
environment before Ray is imported: Ray never turns it on for an explicit address.

Failures, and what Ray does with them:

- The worker exits with a code (0, or 1 after writing its ``error`` event): the task returns it;
  an application failure is never retried.
- The worker is killed by a signal (the OOM killer, a segfault, a ``kill -9``): the task kills its
  own Ray worker with SIGKILL. Ray counts that as a system failure, which ``max_retries`` covers
  (``retry_exceptions`` covers exceptions raised by the task, and stays off), and relaunches the
  task; the relaunched worker resumes in the same run directory.
- The task's own process dies (force-cancelled, Ray's memory monitor, its node): the worker is
  killed with it, and Ray retries as above unless the task was cancelled.
- `RayHandle.kill`: Ray interrupts the task, which kills the worker's process group. Ray never
  retries a cancelled task.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.config import ComputeConfig
from engine.runs.artifacts import LOG_FILE, SPEC_FILE
from engine.runs.launch import worker_command
from engine.runs.runner import kill_group
from engine.runs.spec import RunSpec

try:
    import ray
    from ray.exceptions import (
        LocalRayletDiedError,
        NodeDiedError,
        OutOfMemoryError,
        RayError,
        RayTaskError,
        TaskCancelledError,
        WorkerCrashedError,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('[compute] backend = "ray" needs Ray: pip install "evotui[ray]"') from exc

#: The exit code of a run whose worker Ray lost for good (cancelled, retries spent, node died), as
#: a SIGKILLed local worker's.
WORKER_LOST = -signal.SIGKILL
#: The exit code of a run whose task raised (its run directory unreadable on the node, say).
TASK_FAILED = 1
#: How long `RayHandle.kill` waits for the interrupted task to end before Ray force-kills it.
CANCEL_GRACE_SECONDS = 5.0
#: How often the task wakes while it waits on the worker: Ray's cancel interrupts the task only
#: when Python code runs, never in a blocking wait.
INTERRUPT_POLL_SECONDS = 0.5
#: Prefix of the lines the task writes into the run's log: one when it launches the worker, one
#: when the worker was killed.
LOG_PREFIX = "[ray]"

#: Ray's failures that the task's `max_retries` covers: the process running it, or its node, died.
_SYSTEM_FAILURES: dict[type[RayError], str] = {
    WorkerCrashedError: "the worker died",
    NodeDiedError: "the node died",
    LocalRayletDiedError: "the node's raylet died",
}


@contextmanager
def local_cluster(num_cpus: int = 2, env: dict[str, str] | None = None) -> Iterator[str]:
    """A Ray head on this machine's loopback address, for tests and benchmarks: yields its address
    and stops it after (`ray stop --force`: every Ray process of this user on this machine). It
    has its own temp dir (short: Ray's socket paths have a limit) and no token authentication,
    which `ray start` turns on when ~/.ray holds a token (a driver reads its auth mode when it
    imports ray, so it could not connect)."""
    ray_bin = str(Path(sys.executable).with_name("ray"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, **(env or {}), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    start = [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={num_cpus}"]
    start += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        raise RuntimeError(f"ray start failed:\n{started.stdout}\n{started.stderr}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        ray.shutdown()
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


class RunDirUnreachable(RuntimeError):
    """A Ray node cannot read the run directory: the cluster does not share the workspace's filesystem."""


class RayRunner:
    """One Ray task per run, on the cluster at `address` (None: a local one that Ray starts)."""

    parallel = True
    #: Ray relaunches a task whose worker died (`max_retries`).
    retries = True

    def __init__(
        self,
        address: str | None = None,
        cpus: int = 1,
        gpus: int = 0,
        max_retries: int = 1,
        python: str = sys.executable,
        extra_env: dict[str, str] | None = None,
        accelerate_config: Path | None = None,
    ):
        self.address = address
        self.accelerate_config = accelerate_config
        self.cpus = cpus
        self.gpus = gpus
        self.max_retries = max_retries
        self.python = python
        self.extra_env = extra_env or {}
        self._task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=max_retries, retry_exceptions=False)(
            _run_worker
        )

    def start(self, run_dir: Path) -> RayHandle:
        self._connect()
        compute = ComputeConfig(gpus=self.gpus, accelerate_config=self.accelerate_config)
        ref = self._task.options(name=f"evotui-run:{run_dir.name}").remote(
            str(run_dir), self.python, compute, self.extra_env
        )
        return RayHandle(ref, [self.python, "-m", "engine.runs.worker", str(run_dir)], self.max_retries)

    def _connect(self) -> None:
        if ray.is_initialized():
            return
        # ray.init replaces the main thread's SIGTERM handler with its own exit; the engine keeps its own.
        in_main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
        ray.init(
            address=self.address,
            ignore_reinit_error=True,
            log_to_driver=False,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        # A task that asks for more than any node has would wait for ever: say so now.
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        for field, wanted, resource in (("cpus", self.cpus, "CPU"), ("gpus", self.gpus, "GPU")):
            most = max((n.get(resource, 0) for n in nodes), default=0)
            if wanted > most:
                raise ValueError(
                    f"compute.{field} = {wanted}: no node of the Ray cluster has {wanted} {resource}(s) (at most"
                    f" {most:g}); lower compute.{field} (gpus = 0 on a cluster without GPUs)"
                )


class RayHandle:
    """A run's Ray task, seen as the local runner's process is (`engine.runs.runner.RunHandle`).

    `reason` is Ray's error in one line once the task failed for good, else None.
    """

    #: The worker is not a child of this process (it may not even run on this machine).
    pid: int | None = None

    def __init__(self, ref: ray.ObjectRef[int], args: list[str], max_retries: int):
        self.ref = ref
        self.args = args
        self.max_retries = max_retries
        self.returncode: int | None = None
        self.reason: str | None = None
        self._cancelled = False

    def poll(self) -> int | None:
        if self.returncode is None and ray.wait([self.ref], timeout=0)[0]:
            self._settle()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not ray.wait([self.ref], timeout=timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._settle()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """Cancel the run: Ray interrupts the task, which kills the worker's process group; a task
        still running after `CANCEL_GRACE_SECONDS` is force-killed (its Ray worker exits, and the
        run's worker dies with it). Blocks until then at most."""
        if self.poll() is not None:
            return
        self._cancelled = True
        ray.cancel(self.ref, force=False)
        if not ray.wait([self.ref], timeout=CANCEL_GRACE_SECONDS)[0]:
            ray.cancel(self.ref, force=True)
            self._kill_orphans()

    def _kill_orphans(self) -> None:
        """A force-cancelled task's worker dies with it (its death signal), but what the worker
        started lives on in its process group. On this machine the group is killed here (a group id
        is not reused while a member lives); on another node, Ray's own clean-up is all there is."""
        launched = re.findall(rf"{re.escape(LOG_PREFIX)} worker pid (\d+) launched on node .*\(([^)]*)\)", self._log())
        if launched and launched[-1][1] == ray.util.get_node_ip_address():
            kill_group(int(launched[-1][0]))

    def _log(self) -> str:
        try:
            return (Path(self.args[-1]) / LOG_FILE).read_text(errors="replace")
        except OSError:
            return ""

    def _settle(self) -> None:
        try:
            self.returncode = ray.get(self.ref)
            return
        except TaskCancelledError:  # also RayTaskError(TaskCancelledError): the interrupted task
            self.reason = "ray: the run was cancelled"
            self.returncode = WORKER_LOST
        except RayTaskError as exc:
            self.reason = f"ray: the task failed: {_one_line(exc.cause)}"
            self.returncode = TASK_FAILED
        except RayError as exc:
            if self._cancelled:  # a force-killed task reads as a crash
                self.reason = "ray: the run was cancelled"
            elif (what := _SYSTEM_FAILURES.get(type(exc))) is not None:
                self.reason = f"ray: {what} (retried {self.max_retries} time(s)): {_one_line(exc)}"
            elif isinstance(exc, OutOfMemoryError):
                self.reason = f"ray: the node ran out of memory: {_one_line(exc)}"
            else:
                self.reason = f"ray: {_one_line(exc)}"
            self.returncode = WORKER_LOST


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _run_worker(run_dir: str, python: str, compute: ComputeConfig, extra_env: dict[str, str]) -> int:
    """The Ray task: one launch of the run's worker on this node; returns its exit code."""
    path = Path(run_dir)
    node = f"{socket.gethostname()} ({ray.util.get_node_ip_address()})"
    try:
        (path / SPEC_FILE).read_bytes()
    except OSError as exc:
        raise RunDirUnreachable(
            f"Ray node {node} cannot read {path / SPEC_FILE} ({exc.strerror}): every node of the cluster"
            " must see the workspace's filesystem at the same path"
        ) from None
    # The local runner's command, built here: this node has the GPUs the task asked for.
    if RunSpec.load(path).kind != "train":
        compute = compute.model_copy(update={"gpus": 1})
    command = worker_command(python, path, compute)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **extra_env}
    with open(path / LOG_FILE, "ab") as log:
        # Its own session: the task can kill the worker with everything it started.
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()),
            env=env,
        )
        try:
            log.write(f"{LOG_PREFIX} worker pid {proc.pid} launched on node {node}\n".encode())
            log.flush()
            code = _wait(proc)
        except BaseException:  # ray.cancel interrupts the task (KeyboardInterrupt)
            kill_group(proc.pid)
            proc.wait()
            raise
        if code < 0:
            kill_group(proc.pid)  # what the worker started
            log.write(f"{LOG_PREFIX} worker killed by {signal.Signals(-code).name}; Ray retries the task\n".encode())
            log.flush()
            # Not an exit code and not an exception: Ray counts a killed worker as a system failure,
            # the one `max_retries` retries (an exit of the Ray worker may read as intended).
            os.kill(os.getpid(), signal.SIGKILL)
    return code


def _wait(proc: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return proc.wait(timeout=INTERRUPT_POLL_SECONDS)
        except subprocess.TimeoutExpired:
            continue


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> Callable[[], None] | None:
    """In the worker, before it starts: SIGKILL when the task's process dies (force-cancelled, or
    killed by Ray's memory monitor), so that no orphan races a retry in the same run directory.
    The worker's own session keeps it out of the process group that Ray cleans up. Linux only."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the task died before the signal was set
            os._exit(1)

    return set_death_signal
