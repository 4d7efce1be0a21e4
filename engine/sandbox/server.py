"""The engine's handle on one running zygote: start it, send it executions, read its answers.

One reader thread owns the zygote's stdout and hands each answer to the thread waiting for it, so
that several threads can run executions at once through one zygote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

from engine.sandbox.tiers import SANDBOX_GID, Plan

ZYGOTE_SOURCE = (Path(__file__).parent / "zygote.py").read_text()
# Starting bubblewrap and a warm interpreter takes ~0.1 s; a loaded CI machine may take far more.
START_TIMEOUT = 60.0


class ZygoteFailed(RuntimeError):
    """The zygote did not start, or died; the message carries its last words."""


class _Waiter:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: dict[str, Any] | None = None


class Zygote:
    def __init__(self, plan: Plan, config: dict[str, Any], log_path: Path, uid: int) -> None:
        self.plan = plan
        self.log_path = log_path
        self.uid = uid
        self._waiters: dict[int, _Waiter] = {}
        # Process group of each execution in flight: where the zygote runs without a PID
        # namespace, killing it leaves these behind (see _kill_strays).
        self._groups: dict[int, int] = {}
        self._lock = threading.Lock()  # the two dicts above and `alive`
        self._write_lock = threading.Lock()  # the zygote's stdin
        self._ready = threading.Event()
        self._hello: dict[str, Any] = {}
        self.alive = True
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                plan.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=plan.env,
                cwd="/",
                user=plan.user,
                group=SANDBOX_GID if plan.user is not None else None,
                extra_groups=[] if plan.user is not None else None,
                start_new_session=True,
            )
        # Signals go through a pidfd: a plain pid could be reused once the process is reaped.
        self._pidfd = os.pidfd_open(self.process.pid)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._reader = threading.Thread(
            target=self._read, args=(self.process.stdout,), name="sandbox-zygote-reader", daemon=True
        )
        self._reader.start()
        try:
            self._send(config)
        except OSError:
            pass  # it died at once: the wait below reports why
        if not self._ready.wait(START_TIMEOUT) or not self._hello.get("ready"):
            reason = self._hello.get("error") or self.last_words()
            self.kill()
            raise ZygoteFailed(f"the sandbox server did not start: {reason}")

    @property
    def running(self) -> bool:
        return self.alive and self.process.poll() is None

    def _send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._write_lock:
            self._stdin.write(data)
            self._stdin.flush()

    def _read(self, stream: IO[bytes]) -> None:
        try:
            for line in stream:
                self._dispatch(json.loads(line))
        except ValueError:
            pass  # garbage on the protocol: treat the zygote as dead
        finally:
            with self._lock:
                self.alive = False
                waiters = list(self._waiters.values())
            self._ready.set()
            for waiter in waiters:
                waiter.done.set()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "ready" in message:
            self._hello = message
            self._ready.set()
            return
        with self._lock:
            waiter = self._waiters.get(message["id"])
            if "pgid" in message:
                self._groups[message["id"]] = message["pgid"]
                return
            self._groups.pop(message["id"], None)
        if waiter is not None:
            waiter.answer = message
            waiter.done.set()

    def execute(self, run_id: int, limits: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """The zygote's answer for one execution, or None if it died (then `alive` is False) or
        did not answer in time; either way the caller kills it."""
        waiter = _Waiter()
        with self._lock:
            if not self.alive:
                return None
            self._waiters[run_id] = waiter
        try:
            self._send({"id": run_id, "limits": limits})
            waiter.done.wait(timeout)
        except OSError:
            pass
        finally:
            with self._lock:
                del self._waiters[run_id]
        return waiter.answer

    def last_words(self) -> str:
        """The end of the zygote's stderr, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            text = ""
        return " | ".join(text.splitlines()[-3:])[-500:] or "it said nothing"

    def kill(self) -> None:
        """End the zygote and everything it started, now."""
        with self._lock:
            self.alive = False
            pidfd, self._pidfd = self._pidfd, -1
        # Killing the process is enough: bubblewrap's PID namespace dies with it, and elsewhere
        # the executions die with their parent (see _kill_strays for what they started).
        if pidfd >= 0:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os.close(pidfd)
        self.process.wait()
        self._reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass  # a broken pipe while flushing what the dead zygote never read
        if not self.plan.contained:
            self._kill_strays()

    def _kill_strays(self) -> None:
        """Kill what executions in flight left behind: their main processes die with the zygote
        (parent-death signal), but what they started does not. Matched by process group and uid,
        so a recycled group id cannot hit anyone else's process."""
        with self._lock:
            groups = set(self._groups.values())
            self._groups.clear()
        if not groups:
            return
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) in groups and entry.stat().st_uid == self.uid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue

    def stop(self) -> None:
        """End the zygote gently: end of its stdin makes it kill its children and exit."""
        try:
            self._stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()
