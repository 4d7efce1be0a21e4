"""The engine daemon: one per workspace, ``python -m engine.daemon WS`` (or ``evotui engine WS``).

It takes the workspace's lock (``.evotrainer/engine.lock``, an `flock` the kernel releases when
the process dies, so a killed engine leaves no stale lock), removes a stale socket, opens the
store (only the engine opens it), and serves ``.evotrainer/engine.sock`` until SIGTERM or SIGINT.
Clients start it detached with `spawn` when none runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from engine.api.server import EngineServer
from engine.api.service import Service
from engine.core import Engine
from engine.workspace import Workspace

LOCK_FILE = "engine.lock"
SOCKET_FILE = "engine.sock"
LOG_FILE = "engine.log"


class EngineRunningError(RuntimeError):
    """Another engine holds this workspace."""


def socket_path(root: Path) -> Path:
    return Workspace.open(root).state_dir / SOCKET_FILE


class WorkspaceLock:
    """The one-engine-per-workspace lock. Holding it means owning the store and the socket."""

    def __init__(self, root: Path):
        self.path = Workspace.open(root).state_dir / LOCK_FILE
        self.file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held for the engine's lifetime
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "?"
            f.close()
            raise EngineRunningError(f"an engine (pid {pid}) already serves this workspace") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self.file = f

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None

    def held_by_other(self) -> bool:
        """True if a live engine holds the lock (probing takes and drops it at once)."""
        if not self.path.exists():
            return False
        with open(self.path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
        return False


async def serve(root: Path, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    """Run the engine for `root` until `stop` is set (or SIGTERM/SIGINT in the main thread)."""
    lock = WorkspaceLock(root)
    lock.acquire()
    path = socket_path(root)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # stale: we hold the lock, so no engine is behind it
    engine = Engine.open(root)
    stop = stop or asyncio.Event()
    server: EngineServer | None = None
    service: Service | None = None
    try:

        def publish(event: str, data: dict[str, object]) -> None:
            if server is not None:
                server.publish(event, data)

        service = Service(engine, publish)
        server = EngineServer(service, path)
        await server.start()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        if service is not None:
            service.job.stop()
            # A run in progress is interrupted the way Ctrl-C interrupts `evotui run`: the worker
            # is stopped and the run left "interrupted", to be resumed from its last checkpoint.
            engine.stop_requested.set()
            if service.job.thread is not None:
                service.job.thread.join(timeout=30)
        if server is not None:
            await server.close()
        if service is not None:
            service.close()
        engine.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        lock.release()


def spawn(root: Path, timeout: float = 30.0) -> int:
    """Start an engine for `root` in the background (its own session, output to engine.log) and
    wait until its socket answers; returns its pid. An engine already running is left alone."""
    ws = Workspace.open(root)
    path = ws.state_dir / SOCKET_FILE
    if WorkspaceLock(root).held_by_other() and path.exists():
        return -1
    ws.state_dir.mkdir(parents=True, exist_ok=True)
    with open(ws.state_dir / LOG_FILE, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.daemon", str(ws.root)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    from engine.api.client import EngineClient, EngineUnavailable

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (ws.state_dir / LOG_FILE).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the engine exited with code {proc.returncode}:\n{tail}")
        try:
            with EngineClient(path, timeout=2.0) as client:
                client.call("hello")
            return proc.pid
        except EngineUnavailable:
            time.sleep(0.1)
    raise RuntimeError(f"the engine did not answer on {path} within {timeout:.0f} s (see {ws.state_dir / LOG_FILE})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m engine.daemon WORKSPACE", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(Path(argv[0])))
    except EngineRunningError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
