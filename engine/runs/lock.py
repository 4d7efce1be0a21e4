"""One worker per run: a live worker holds an exclusive `flock` on ``RUN_DIR/worker.lock``.

The kernel drops an flock when its holder's files close: when it exits, is killed, or turns
zombie. So "the lock is held" is liveness that a dead worker, a zombie or a reused pid cannot
fake, which ``kill(pid, 0)`` is not. The file also says who holds it (pid, and the process's start
time), for re-attaching to it and for stopping it.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOCK_FILE = "worker.lock"
#: The exit code of a worker that found another worker holding its run (it did nothing). The
#: engine re-attaches to the holder (`engine.core.following`); it is no crash of the run.
EXIT_LOCKED = 75


class RunLocked(RuntimeError):
    """Another worker holds this run."""


@dataclass(frozen=True)
class Holder:
    pid: int | None
    #: The holder's start time, in clock ticks since boot (/proc/PID/stat field 22).
    started: int | None = None


def acquire(run_dir: Path) -> IO[str]:
    """Take the run's lock for this process's lifetime (keep the returned file open); raises
    RunLocked if a live worker holds it."""
    f = open(run_dir / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 - held until exit
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _parse(f.read())
        f.close()
        raise RunLocked(f"a worker (pid {holder.pid or '?'}) already runs {run_dir.name}") from None
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "started": start_time(os.getpid())}))
    f.flush()
    return f


def holder(run_dir: Path) -> Holder | None:
    """The live worker holding the run's lock, or None when no process holds it."""
    path = run_dir / LOCK_FILE
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _parse(f.read())
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (None if there is no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after its last ")".
    return int(stat.rpartition(")")[2].split()[19])


def _parse(text: str) -> Holder:
    try:
        data = json.loads(text)
        return Holder(int(data["pid"]), data.get("started"))
    except (ValueError, KeyError, TypeError):
        return Holder(None)  # being written: the holder is live, its pid not known yet
