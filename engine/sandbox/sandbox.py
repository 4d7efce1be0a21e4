"""`Sandbox`: runs policy-written Python in the strongest isolation tier this machine offers.

At start-up it probes the tiers strongest first (see `tiers`), starts the zygote in the first that
works and runs a canary in it (a TCP connect and a read of a planted file outside the scratch
directory): a tier whose canary gets through is refused, failing closed. A zygote that dies is
replaced, canary and all, on the next call.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import socket
import stat
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from engine.sandbox.results import Limits, Reason, SandboxResult
from engine.sandbox.seccomp import SeccompUnavailable, build_filter
from engine.sandbox.server import ZYGOTE_SOURCE, Zygote, ZygoteFailed
from engine.sandbox.tiers import (
    ALL_TIERS,
    DEVICES_WRITE,
    STRONG_TIERS,
    TIER_C,
    Interpreter,
    Plan,
    TierUnavailable,
    code_env,
    plan_tier,
    sandbox_ids,
)

logger = logging.getLogger("engine.sandbox")

DEFAULT_LIMITS = Limits()

ALLOW_WEAK_ENV = "EVOTUI_SANDBOX_ALLOW_WEAK"
# How long past its wall-time limit an execution may take to be answered before the zygote is
# presumed stuck and replaced (it kills on time itself; this only guards against its own failure).
ANSWER_GRACE_SECONDS = 10.0
# Exit code of a child whose set-up failed (zygote.SETUP_FAILED).
SETUP_FAILED = 70
WEAK_WARNING = (
    "sandbox tier 'rlimits': policy code runs with NO network or file-system isolation "
    "(only rlimits and a cleared environment); install bubblewrap or use a kernel with Landlock"
)


class SandboxUnavailable(RuntimeError):
    """No strong isolation tier works on this machine and weak isolation was not accepted."""


class Sandbox:
    """Runs Python source in a fresh scratch directory, isolated from the network, the workspace,
    the home directory and the engine's environment, under per-execution limits.

    Thread-safe: concurrent calls run concurrently, up to one per CPU (at least two)."""

    tier: str

    def __init__(
        self,
        limits: Limits = DEFAULT_LIMITS,
        *,
        allow_weak: bool = False,
        tier: str | None = None,
        python: str | None = None,
    ) -> None:
        """`tier` forces one tier (tests, diagnosis); `python` picks the interpreter the code runs
        under (default: the base interpreter of the engine's own Python, stdlib only)."""
        if tier is not None and tier not in ALL_TIERS:
            raise ValueError(f"unknown sandbox tier {tier!r}; known: {', '.join(ALL_TIERS)}")
        self.limits = limits
        self._allow_weak = allow_weak or os.environ.get(ALLOW_WEAK_ENV) == "1"
        self._uid, self._gid = sandbox_ids()
        self._ids = itertools.count(1)
        self._start_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))
        self._zygote: Zygote | None = None
        self._closed = False
        # Under root the sandbox uid must reach this directory: /tmp, whatever TMPDIR says.
        self._dir = Path(tempfile.mkdtemp(prefix="evotui-sandbox-", dir="/tmp" if os.geteuid() == 0 else None))
        try:
            self._prepare_dirs()
            self.interpreter = Interpreter.find(python)
            self._plan, self._seccomp = self._choose(tier)
            self.tier = self._plan.tier
        except BaseException:
            self._remove_dir()
            raise

    # --- start-up ------------------------------------------------------------------------------

    def _prepare_dirs(self) -> None:
        os.chmod(self._dir, 0o711)
        self._scratch = self._dir / "scratch"
        self._scratch.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(self._scratch, self._uid, self._gid)
        # The canary's target: readable by the sandbox uid as far as file modes go, so only the
        # sandbox's own layers can keep the canary from reading it.
        self._secret = self._dir / "canary.txt"
        self._secret.write_text(secrets.token_hex(16))
        os.chmod(self._secret, 0o644)

    def _choose(self, forced: str | None) -> tuple[Plan, bytes]:
        failures: dict[str, str] = {}
        try:
            seccomp = build_filter()
        except SeccompUnavailable as exc:
            seccomp = b""
            failures = {tier: str(exc) for tier in STRONG_TIERS}
        candidates = STRONG_TIERS if forced is None else tuple(t for t in STRONG_TIERS if t == forced)
        for tier in candidates:
            if tier in failures:
                continue
            try:
                plan = plan_tier(tier, self.interpreter, self._scratch, ["-c", ZYGOTE_SOURCE])
                self._zygote = self._start(plan, seccomp)
                return plan, seccomp
            except (TierUnavailable, ZygoteFailed, SandboxUnavailable, OSError) as exc:
                failures[tier] = str(exc)
        if forced in (None, TIER_C) and self._allow_weak:
            plan = plan_tier(TIER_C, self.interpreter, self._scratch, ["-c", ZYGOTE_SOURCE])
            self._zygote = self._start(plan, b"")
            for note in [WEAK_WARNING, *plan.notes]:
                logger.warning(note)
            return plan, b""
        raise SandboxUnavailable(_unavailable_message(failures, forced))

    def _start(self, plan: Plan, seccomp: bytes) -> Zygote:
        config = {
            "scratch": plan.scratch_inside,
            "read_only": plan.read_only,
            "read_write": list(DEVICES_WRITE),
            "env": code_env(self.interpreter),
            "seccomp": seccomp.hex() if plan.seccomp else "",
            "landlock": plan.landlock,
            "userns": plan.userns,
            "report_groups": not plan.contained,
        }
        zygote = Zygote(plan, config, self._dir / "zygote.log", self._uid)
        if plan.tier != TIER_C:
            try:
                self._canary(zygote)
            except BaseException:
                zygote.kill()
                raise
        return zygote

    def _canary(self, zygote: Zygote) -> None:
        """Fail closed unless a TCP connect and a read of the planted file are both blocked."""
        with socket.create_server(("127.0.0.1", 0)) as listener:
            listener.setblocking(False)
            port = listener.getsockname()[1]
            code = (
                "import json, os, socket\n"
                "seen = {}\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
                "    seen['network'] = 'open'\n"
                "except OSError as exc:\n"
                "    seen['network'] = 'blocked'\n"
                "try:\n"
                f"    seen['file'] = 'open: ' + open({str(self._secret)!r}).read()\n"
                "except OSError:\n"
                "    seen['file'] = 'blocked'\n"
                "seen['env'] = sorted(os.environ)\n"
                "print(json.dumps(seen))\n"
            )
            result = self._execute(zygote, code, {}, "", Limits(wall_seconds=10, cpu_seconds=5))
            if result is None:
                raise ZygoteFailed(f"the sandbox server died before the canary ran: {zygote.last_words()}")
            try:
                listener.accept()[0].close()
                connected = True
            except BlockingIOError:
                connected = False
        try:
            seen = json.loads(result.stdout)
        except ValueError:
            raise ZygoteFailed(f"the canary did not run: {result.detail} {result.stderr[-300:]}") from None
        allowed_env = set(code_env(self.interpreter)) | {"HOME", "TMPDIR"}
        leaks = [
            *(["a TCP connect to 127.0.0.1 got through"] if connected or seen["network"] != "blocked" else []),
            *([f"the planted file {self._secret} was read"] if seen["file"] != "blocked" else []),
            *(
                [f"environment variables leaked: {sorted(set(seen['env']) - allowed_env)}"]
                if not set(seen["env"]) <= allowed_env
                else []
            ),
        ]
        if leaks:
            raise SandboxUnavailable(f"tier {zygote.plan.tier} failed its canary: {'; '.join(leaks)}")

    def _zygote_now(self) -> Zygote:
        """The running zygote, started afresh (canary included) if the last one died."""
        with self._start_lock:
            if self._closed:
                raise RuntimeError("this Sandbox is closed")
            if self._zygote is not None and not self._zygote.running:
                self._zygote.kill()
                logger.warning("sandbox server died between executions; restarting it (%s)", self._zygote.last_words())
                self._zygote = None
            if self._zygote is None:
                self._zygote = self._start(self._plan, self._seccomp)
            return self._zygote

    def _discard(self, zygote: Zygote, why: str) -> None:
        with self._start_lock:
            if self._zygote is zygote:
                self._zygote = None
        zygote.kill()
        logger.warning("sandbox server %s; replacing it (%s)", why, zygote.last_words())

    # --- executions ----------------------------------------------------------------------------

    def run_python(
        self,
        code: str,
        files: dict[str, str] | None = None,
        *,
        stdin: str = "",
        limits: Limits | None = None,
    ) -> SandboxResult:
        """Run `code` as `__main__` (stdlib only) in a fresh scratch directory holding `files`, its
        cwd and only writable place, removed afterwards. Whatever the code does (a timeout, a limit
        hit, an attempt to escape), the outcome is a result whose `reason` says so; this raises
        only for the caller's own errors (a file name leaving the scratch directory)."""
        files = dict(files or {})
        for name in files:
            _check_file_name(name)
        limits = limits or self.limits
        if self.tier == TIER_C:
            logger.warning(WEAK_WARNING)
        with self._slots:
            # A zygote that dies under an execution (killed from outside, say) takes the execution
            # with it: a fresh zygote runs it again, so that the restart is invisible to the caller.
            for _ in range(2):
                try:
                    zygote = self._zygote_now()
                except (ZygoteFailed, SandboxUnavailable, TierUnavailable, OSError) as exc:
                    return _error(f"the sandbox could not start: {exc}", self.tier)
                result = self._execute(zygote, code, files, stdin, limits)
                if result is not None:
                    return result
        return _error("the sandbox server died twice during the execution", self.tier)

    def _execute(
        self, zygote: Zygote, code: str, files: dict[str, str], stdin: str, limits: Limits
    ) -> SandboxResult | None:
        """One execution through `zygote`; None if the zygote died under it."""
        run_id = next(self._ids)
        payload = self._scratch / f"{run_id}.json"
        run_dir = self._scratch / str(run_id)
        try:
            try:
                # Exclusive and never through a link: only the engine writes here.
                fd = os.open(payload, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with open(fd, "w", encoding="utf-8") as handle:
                    os.fchmod(fd, 0o644)
                    json.dump({"code": code, "files": files, "stdin": stdin}, handle)
            except OSError as exc:
                return _error(f"could not hand the code to the sandbox: {exc}", zygote.plan.tier)
            patience = limits.wall_seconds + ANSWER_GRACE_SECONDS
            answer = zygote.execute(run_id, limits.as_message(), patience)
            if answer is None:
                died = not zygote.alive
                self._discard(zygote, "died during an execution" if died else "stopped answering")
                if died:
                    return None
                return _error(
                    f"the sandbox server did not answer within {patience:g} s and was replaced", zygote.plan.tier
                )
            if "error" in answer:
                return _error(answer["error"], zygote.plan.tier)
            stdout = _read_output(run_dir / "stdout", limits.output_bytes)
            stderr = _read_output(run_dir / "stderr", limits.output_bytes)
            return _result(answer, stdout, stderr, limits, zygote.plan.tier)
        finally:
            payload.unlink(missing_ok=True)
            _remove_tree(run_dir)

    # --- life cycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the zygote (killing anything still running) and remove the scratch directory."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.stop()
        self._remove_dir()

    def _remove_dir(self) -> None:
        view = self._dir / "python"
        if os.path.ismount(view):
            # The interpreter is bound here in the launcher's private mount namespace only; if it
            # ever showed here, removing the directory would delete the Python installation.
            logger.error("%s is a mount point; leaving %s in place", view, self._dir)
            return
        _remove_tree(self._dir)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _unavailable_message(failures: dict[str, str], forced: str | None) -> str:
    lines = [f"  - {tier}: {why}" for tier, why in failures.items()]
    if forced == TIER_C:
        lines.append(f"  - {TIER_C}: refused without allow_weak=True")
    head = f"Sandbox tier {forced} is not available:" if forced else "No strong sandbox tier works on this machine:"
    return "\n".join(
        [
            head,
            *lines,
            "Fix one of these, or accept weak isolation with Sandbox(allow_weak=True) or the environment "
            f"variable {ALLOW_WEAK_ENV}=1: policy code then runs under rlimits and a cleared environment only, "
            "with network and files open to it, and every execution logs a warning.",
        ]
    )


def _check_file_name(name: str) -> None:
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or name.endswith("/"):
        raise ValueError(f"sandbox file name {name!r} must be a relative path inside the scratch directory")


def _read_output(path: Path, limit: int) -> str:
    """The start of an output file. Where Landlock is missing the code could have swapped the
    file for a link to a host file or a FIFO: never follow a link, never block, plain files only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with open(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        data = handle.read(limit)
        rest = info.st_size - len(data)
    text = data.decode("utf-8", errors="replace")
    return text + f"\n[... {rest} more bytes cut]" if rest > 0 else text


def _remove_tree(path: Path) -> None:
    """Remove what the code left, even directories it made unreadable (a non-root engine shares
    the code's uid, so it may chmod them back)."""

    def fix(function: Any, failed: str, _: Any) -> None:
        os.chmod(os.path.dirname(failed), 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, 0o700)
            shutil.rmtree(failed, ignore_errors=True)
        else:
            os.unlink(failed)

    if os.path.lexists(path):
        try:
            shutil.rmtree(path, onerror=fix)
        except OSError as exc:
            logger.warning("could not remove sandbox directory %s: %s", path, exc)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal, say
        return f"signal {number}"


def _error(detail: str, tier: str) -> SandboxResult:
    return SandboxResult(False, None, "", "", "error", detail, 0.0, tier)


def _result(answer: dict[str, Any], stdout: str, stderr: str, limits: Limits, tier: str) -> SandboxResult:
    flags: list[str] = answer["flags"]
    exit_code: int | None = answer["exit_code"]
    killed_by: int | None = answer["signal"]
    timed_out = bool(answer["timed_out"])
    cpu = float(answer["cpu_seconds"])
    violation = next((flag.split(" ", 1)[1] for flag in flags if flag.startswith("violation ")), None)
    setup = next((flag.split(" ", 1)[1] for flag in flags if flag.startswith("setup ")), None)
    reason: Reason | None = None
    if setup is not None and exit_code == SETUP_FAILED:
        reason, detail = "error", f"the sandbox could not set up the execution: {setup}"
    elif violation is not None:
        reason, detail = "violation", f"sandbox violation: {violation}"
    elif "processes" in flags:
        reason, detail = "processes", f"hit the limit of {limits.processes} processes"
    elif "memory" in flags:
        reason, detail = "memory", f"ran out of memory under the {limits.memory_mb} MB limit"
    elif "file_size" in flags:
        reason, detail = "file_size", f"wrote past the {limits.file_size_mb} MB file-size limit"
    elif killed_by == signal.SIGXCPU or (
        killed_by == signal.SIGKILL and not timed_out and cpu >= math.ceil(limits.cpu_seconds)
    ):
        reason, detail = "cpu", f"killed after {cpu:.1f} s CPU time (limit {limits.cpu_seconds:g} s)"
    elif timed_out:
        reason, detail = "timeout", f"killed after {limits.wall_seconds:g} s wall time"
    elif killed_by is not None:
        reason, detail = "exit", f"killed by {_signal_name(killed_by)}"
    elif exit_code != 0:
        last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
        reason, detail = "exit", f"exit code {exit_code}" + (f": {last[:200]}" if last else "")
    else:
        detail = f"exited 0 in {answer['seconds']:.3f} s"
    if timed_out and reason not in ("timeout", None):
        detail += f"; killed after {limits.wall_seconds:g} s wall time"
    return SandboxResult(reason is None, exit_code, stdout, stderr, reason, detail, float(answer["seconds"]), tier)


_shared: Sandbox | None = None
_shared_lock = threading.Lock()


def get_sandbox() -> Sandbox:
    """The process's shared Sandbox, created on first use with default limits and closed at exit.
    Weak isolation only if EVOTUI_SANDBOX_ALLOW_WEAK=1."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Sandbox()
            atexit.register(_shared.close)
        return _shared
