"""The sandbox's warm server, the "zygote": one long-lived Python process inside the isolation
tier that forks a fresh child for every execution.

A fresh interpreter per execution costs ~20 ms before the first line of policy code runs; a fork
of a warm interpreter that has already imported the common standard-library modules costs well
under that. The engine starts this file once (`python -I -S -c <this source>`) inside bubblewrap
or under the sandbox uid, so it may import the standard library only and must never import
`engine`.

Protocol (JSON lines; the engine writes to our stdin and reads our stdout):
- first line from the engine: the configuration (see `Config`); we answer `{"ready": ...}`;
- then `{"id": N, "limits": {...}}` per execution; the code, files and stdin wait in
  `<scratch>/N.json`, which the child reads and deletes itself, so that this process never holds
  another execution's code or output in memory for a later child to dig out of its heap;
- we answer `{"id": N, "exit_code", "signal", "seconds", "cpu_seconds", "timed_out", "flags"}`
  as soon as the child reports its exit code (or, killed, has died); its stdout and stderr are
  files in `<scratch>/N/`, which the engine reads and removes.

Each child is forked ahead of its execution, while the server is idle (the "spare"), and does
what every execution needs before it is assigned one: lead its own process group (so one
`killpg` ends every process it starts) and, under bubblewrap, enter a user namespace of its own
(so RLIMIT_NPROC counts only its own processes). Once assigned, before any policy code runs, it
writes its files into `<scratch>/N/work`, redirects fds 0-2 to files, restricts itself with
Landlock to that directory, installs the seccomp filter, sets its rlimits and closes every other
fd. End of stdin (the engine went away) kills every child and ends the server.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import json
import math
import os
import resource
import selectors
import signal
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, NoReturn

# Imported once here so that a child starts with them loaded: what a policy's solution usually
# imports (and traceback, for every failure). No more: each fork and each exit costs time in
# proportion to this process's memory, and asyncio or unittest would double it for all.
WARM_MODULES = (
    "array bisect collections copy dataclasses datetime decimal fractions functools heapq itertools "
    "json math operator random re statistics string struct traceback typing"
).split()
AF_UNIX = 1
# For violation messages; importing `socket` for its enum would weigh on every fork.
ADDRESS_FAMILIES = {2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK", 17: "AF_PACKET"}

# Landlock (linux/landlock.h). The syscall numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
# The file-system rights each ABI knows: 13 in ABI 1, then REFER (2), TRUNCATE (3), IOCTL_DEV (5).
FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
FS_RIGHTS_LATEST = (1 << 16) - 1
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
CLONE_NEWUSER = 0x10000000
M_ARENA_MAX = -8
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# The child's exit code when its own set-up failed (EX_SOFTWARE): the engine reports "error".
SETUP_FAILED = 70
# The name the code runs under, as `python main.py` would (no such file is written).
MAIN = "main.py"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or the LSM is off)."""
    return max(
        0,
        int(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)),
    )


@dataclass
class Config:
    """What the engine tells the server on its first line."""

    scratch: str  # where execution directories are made, as this process sees it
    read_only: list[str]  # readable (and executable) paths besides the execution's own directory
    read_write: list[str]  # device files the code may also write (/dev/null)
    env: dict[str, str]  # the whole environment of the code, before HOME and TMPDIR
    seccomp: bytes  # a BPF program, empty for none
    landlock: str  # "required" (refuse to start without it), "optional" (where the kernel has it), "off"
    userns: bool  # give each child its own user namespace so RLIMIT_NPROC counts only its own
    report_groups: bool  # tell the engine each execution's process group as soon as it exists

    @classmethod
    def parse(cls, line: bytes) -> Config:
        raw = json.loads(line)
        raw["seccomp"] = bytes.fromhex(raw["seccomp"])
        return cls(**raw)


@dataclass
class Run:
    """One forked child, as the server tracks it (no code, no output: see the module doc). Until
    it is assigned an execution it is the spare, blocked reading its assignment."""

    pid: int
    pidfd: int
    status_fd: int
    assign_fd: int  # the write end of the child's assignment pipe, -1 once assigned
    run_id: int | None = None
    started: float = 0.0
    deadline: float = math.inf
    timed_out: bool = False
    answered: bool = False
    reaped: bool = False
    flags: list[str] = field(default_factory=list)
    partial: bytes = b""


class Server:
    def __init__(self, config: Config, control_in: int, control_out: int) -> None:
        self.config = config
        self.pid = os.getpid()
        self.control_in = control_in
        self.control_out = control_out
        self.abi = landlock_abi() if config.landlock != "off" else 0
        self.selector = selectors.DefaultSelector()
        self.runs: dict[int, Run] = {}  # by pidfd, the spare included
        self.spare: Run | None = None
        self.pending = b""
        # Opened once and inherited by every child, which only has to add them to its ruleset.
        self.static_rules: list[tuple[int, int]] = []
        for path in config.read_only:
            self._add_static(path, FS_READ_FILE | FS_READ_DIR | FS_EXECUTE)
        for path in config.read_write:
            self._add_static(path, FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV)

    def _add_static(self, path: str, rights: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        if not os.path.isdir(path):
            rights &= FILE_RIGHTS
        self.static_rules.append((fd, rights))

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.control_out, data) :]

    def serve(self) -> None:
        self.selector.register(self.control_in, selectors.EVENT_READ, None)
        while True:
            if self.spare is None and all(run.answered for run in self.runs.values() if run.run_id is not None):
                # Forked ahead, in the quiet after an answer, so that the fork and the child's
                # first steps are off the next execution's clock.
                try:
                    self.spare = self._fork()
                except OSError:
                    pass  # out of processes for now: the next request forks for itself
            now = time.monotonic()
            deadlines = [
                run.deadline
                for run in self.runs.values()
                if run.run_id is not None and not (run.timed_out or run.answered)
            ]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            for key, _ in self.selector.select(timeout):
                if key.data is None:
                    if not self._read_requests():
                        self._shutdown()
                        return
                elif key.data.reaped:
                    continue  # an event from the same select() as its reaping
                elif key.fd == key.data.pidfd:
                    self._reap(key.data)
                else:
                    self._read_status(key.data)
            now = time.monotonic()
            for run in self.runs.values():
                if now >= run.deadline and not (run.timed_out or run.answered):
                    run.timed_out = True
                    _kill_group(run.pid)

    def _read_requests(self) -> bool:
        data = os.read(self.control_in, 1 << 16)
        if not data:
            return False
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            try:
                self._start(int(request["id"]), request["limits"])
            except OSError as exc:
                self.send({"id": request["id"], "error": f"could not start the execution: {exc}"})
        return True

    def _fork(self) -> Run:
        status_r, status_w = os.pipe()
        assign_r, assign_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(status_r)
            os.close(assign_w)
            child(self, status_w, assign_r)
        os.close(status_w)
        os.close(assign_r)
        try:
            # Also set here, so that a timeout's killpg can never race the child's own setpgid.
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child got there first, or already exited
        os.set_blocking(status_r, False)
        run = Run(pid, os.pidfd_open(pid), status_r, assign_w)
        self.runs[run.pidfd] = run
        self.selector.register(run.pidfd, selectors.EVENT_READ, run)
        return run

    def _start(self, run_id: int, limits: dict[str, Any]) -> None:
        run = self.spare or self._fork()
        self.spare = None
        run.run_id = run_id
        run.started = time.monotonic()
        run.deadline = run.started + float(limits["wall_seconds"])
        self.selector.register(run.status_fd, selectors.EVENT_READ, run)
        try:
            os.write(run.assign_fd, (json.dumps({"id": run_id, "limits": limits}) + "\n").encode())
        except BrokenPipeError:
            pass  # the child died waiting; reaping it answers for it
        os.close(run.assign_fd)
        run.assign_fd = -1
        if self.config.report_groups:
            self.send({"id": run_id, "pgid": run.pid})

    def _read_status(self, run: Run) -> None:
        """Flags from the execution's processes; the main one's last word is its exit code, which
        lets us answer ~1 ms before the kernel has torn the process down."""
        try:
            data = os.read(run.status_fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:  # every writer is gone; the pidfd tells the rest
            if run.status_fd in self.selector.get_map():
                self.selector.unregister(run.status_fd)
            return
        *lines, run.partial = (run.partial + data).split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            exit_report = text.split()
            if len(exit_report) == 4 and exit_report[:2] == ["exit", str(run.pid)] and not run.answered:
                _kill_group(run.pid)  # what it leaves running, and itself on its way out
                self._answer(run, int(exit_report[2]), None, float(exit_report[3]))
            elif len(run.flags) < 20:
                run.flags.append(text)

    def _reap(self, run: Run) -> None:
        # Kill what the code left running before reaping: the unreaped child keeps its process
        # group id from being reused, so this killpg cannot hit anyone else.
        _kill_group(run.pid)
        _, status, usage = os.wait4(run.pid, 0)
        if run.run_id is None:
            self.spare = None  # the spare died (killed from outside, say): fork another
        elif not run.answered:
            self._read_status(run)
            if not run.answered:
                exit_code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None
                killed_by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
                self._answer(run, exit_code, killed_by, usage.ru_utime + usage.ru_stime)
        run.reaped = True
        self.selector.unregister(run.pidfd)
        os.close(run.pidfd)
        if run.status_fd in self.selector.get_map():
            self.selector.unregister(run.status_fd)
        os.close(run.status_fd)
        if run.assign_fd >= 0:
            os.close(run.assign_fd)
        del self.runs[run.pidfd]

    def _answer(self, run: Run, exit_code: int | None, killed_by: int | None, cpu_seconds: float) -> None:
        run.answered = True
        self.send(
            {
                "id": run.run_id,
                "exit_code": exit_code,
                "signal": killed_by,
                "seconds": time.monotonic() - run.started,
                "cpu_seconds": cpu_seconds,
                "timed_out": run.timed_out,
                "flags": run.flags,
            }
        )

    def _shutdown(self) -> None:
        for run in self.runs.values():
            _kill_group(run.pid)
            os.waitpid(run.pid, 0)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- the child: everything below runs in the forked process ------------------------------------


def child(server: Server, status_fd: int, assign_fd: int) -> NoReturn:
    """Set up and run one execution; never returns into the server's loop. Everything before the
    assignment arrives is the same for every execution, and done while the child is the spare."""
    config = server.config
    try:
        os.setpgid(0, 0)
        if config.userns:
            _enter_user_namespace()
        # Die with the server, should it be killed: nothing else would end this execution.
        _check(_libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0), "prctl")
        if os.getppid() != server.pid:
            raise RuntimeError("the server died during set-up")
        assignment = _read_assignment(assign_fd)
        run_id, limits = int(assignment["id"]), assignment["limits"]
        others = 0 if config.userns else _processes_of_my_uid() - 1
        run_dir = os.path.join(config.scratch, str(run_id))
        os.mkdir(run_dir, 0o700)
        payload_path = os.path.join(config.scratch, f"{run_id}.json")
        with open(payload_path, "rb") as handle:
            payload = json.load(handle)
        os.unlink(payload_path)
        work = os.path.join(run_dir, "work")
        os.mkdir(work, 0o700)
        _write_files(work, payload["files"])
        _redirect(run_dir, payload["stdin"])
        del payload["files"], payload["stdin"]
        os.chdir(work)
        os.environ.update(HOME=work, TMPDIR=work)
        if server.abi:
            _landlock(server.abi, server.static_rules, work)
        _set_limits(limits, others)
        if config.seccomp:
            _seccomp(config.seccomp)
        os.closerange(3, status_fd)
        os.closerange(status_fd + 1, os.sysconf("SC_OPEN_MAX"))
        os.set_blocking(status_fd, False)  # a flooded pipe must not stall the code
        main_module = _prepare_interpreter(work, config.read_only + config.read_write, status_fd)
        gc.enable()
    except BaseException as exc:  # noqa: BLE001 - any set-up failure is reported, never raised
        _flag(status_fd, f"setup {type(exc).__name__}: {exc}")
        os._exit(SETUP_FAILED)
    _run_main(payload["code"], main_module, status_fd)


def _read_assignment(assign_fd: int) -> dict[str, Any]:
    """Block until the server hands this child an execution (end of file: the server is gone)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(assign_fd, 1 << 16)
        if not chunk:
            os._exit(0)
        data += chunk
    os.close(assign_fd)
    result: dict[str, Any] = json.loads(data)
    return result


def _enter_user_namespace() -> None:
    """A user namespace of our own, mapping only our uid: RLIMIT_NPROC then counts the processes of
    this execution alone, so a fork bomb in one execution cannot starve a concurrent one."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    # The creator of a user namespace holds every capability in it; the code needs none.
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    _check(_libc.capset(ctypes.byref(header), ctypes.byref((_CapData * 2)())), "capset")


def _processes_of_my_uid() -> int:
    """Processes of this uid, ourselves included: without a user namespace of our own,
    RLIMIT_NPROC counts them all, so the limit is set this far above them."""
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except FileNotFoundError:
                pass
    return count


def _write_files(work: str, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = os.path.normpath(os.path.join(work, name))
        if not path.startswith(work + os.sep):
            raise ValueError(f"file name {name!r} leaves the scratch directory")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def _redirect(run_dir: str, stdin: str) -> None:
    stdin_path = os.path.join(run_dir, "stdin")
    with open(stdin_path, "w", encoding="utf-8") as handle:
        handle.write(stdin)
    for target, name, flags in (
        (0, "stdin", os.O_RDONLY),
        (1, "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        fd = os.open(os.path.join(run_dir, name), flags, 0o600)
        os.dup2(fd, target)
        os.close(fd)


def _landlock(abi: int, static_rules: list[tuple[int, int]], work: str) -> None:
    """Allow reads of the interpreter and system libraries, writes to `work` only, no TCP, and
    (ABI 6) no signals or abstract sockets that reach outside this execution."""
    handled_fs = FS_RIGHTS_BY_ABI.get(abi, FS_RIGHTS_LATEST)
    attr = _RulesetAttr(handled_fs, 0, 0)
    size = 8
    if abi >= 4:
        attr.net, size = NET_BIND_TCP | NET_CONNECT_TCP, 16
    if abi >= 6:
        attr.scoped, size = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24
    ruleset = _check(
        _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0),
        "landlock_create_ruleset",
    )
    work_fd = os.open(work, os.O_PATH | os.O_CLOEXEC)
    for fd, rights in [*static_rules, (work_fd, handled_fs)]:
        rule = _PathBeneath(rights & handled_fs, fd)
        _check(
            _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0),
            "landlock_add_rule",
        )
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), 0), "prctl")
    _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)
    os.close(work_fd)


def _set_limits(limits: dict[str, Any], other_processes: int) -> None:
    cpu = max(1, math.ceil(float(limits["cpu_seconds"])))
    wanted = {
        # One second of grace between SIGXCPU and SIGKILL.
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (int(limits["memory_mb"]) << 20,) * 2,
        resource.RLIMIT_FSIZE: (int(limits["file_size_mb"]) << 20,) * 2,
        resource.RLIMIT_NPROC: (other_processes + int(limits["processes"]),) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in wanted.items():
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(which, (soft, hard))


def _seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), 0), "prctl")
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0), "seccomp")


def _flag(status_fd: int, text: str) -> None:
    """Tell the server about a limit or a violation; best effort (the pipe may be full)."""
    try:
        os.write(status_fd, (text.replace("\n", " ")[:300] + "\n").encode(errors="replace"))
    except OSError:
        pass


class _Auditor:
    """An audit hook that records the first attempt to reach the network or a path outside the
    execution's directory. It blocks nothing (Landlock, seccomp and the namespaces do that); it
    lets the result say "violation" even when the code catches the error and carries on."""

    def __init__(self, work: str, readable: list[str], status_fd: int) -> None:
        self.work = work
        self.readable = tuple(readable)
        self.writable = ("/dev/null",)
        self.status_fd = status_fd
        self.seen = False

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if self.seen:
            return
        if event == "socket.__new__" and args[1] != AF_UNIX:
            self._report(f"network access (an {ADDRESS_FAMILIES.get(args[1], f'address family {args[1]}')} socket)")
        elif event == "open" and not isinstance(args[0], int):
            flags = args[2] if isinstance(args[2], int) else 0
            writes = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            self._check_path(args[0], writes)
        elif event in ("os.listdir", "os.scandir") and not isinstance(args[0], int):
            self._check_path(args[0] if args[0] is not None else ".", writes=False)
        elif event in ("os.kill", "os.killpg"):
            self._check_signal(-args[0] if event == "os.killpg" else args[0])

    def _check_signal(self, target: int) -> None:
        """A signal may go to the execution's own processes only (`target` as kill(2) takes it)."""
        group = os.getpgrp()
        if target in (0, -group):
            return
        if target > 0:
            try:
                if os.getpgid(target) == group:
                    return
            except OSError:
                return  # no such process (or not visible): nothing to reach
        self._report(f"a signal to {'process' if target > 0 else 'process group'} {abs(target)} outside the execution")

    def _check_path(self, raw: Any, writes: bool) -> None:
        path = os.path.abspath(os.fsdecode(raw))
        if path == self.work or path.startswith(self.work + os.sep):
            real = os.path.realpath(path)
            if real == self.work or real.startswith(self.work + os.sep):
                return
        elif not writes and any(path == root or path.startswith(root + os.sep) for root in self.readable):
            return
        elif writes and path in self.writable:
            return
        self._report(f"{'a write to' if writes else 'a read of'} {path} outside the scratch directory")

    def _report(self, text: str) -> None:
        self.seen = True
        _flag(self.status_fd, f"violation {text}")


def _prepare_interpreter(work: str, readable: list[str], status_fd: int) -> types.ModuleType:
    """Make this forked interpreter look like a fresh `python main.py` started in `work`; the
    module to run the code in."""
    import io
    import random

    random.seed()  # the server's random state is shared by every fork otherwise
    sys.argv = [MAIN]
    sys.path[0:0] = [work]
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    module = types.ModuleType("__main__")
    module.__file__ = os.path.join(work, MAIN)
    sys.modules["__main__"] = module
    sys.addaudithook(_Auditor(work, readable, status_fd))
    return module


def _classify(exc: BaseException, status_fd: int) -> None:
    """Name the limit behind an uncaught exception, if one is."""
    if isinstance(exc, MemoryError):
        _flag(status_fd, "memory")
    elif isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        _flag(status_fd, "file_size")
    elif (isinstance(exc, OSError) and exc.errno == errno.EAGAIN) or (
        isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
    ):
        _flag(status_fd, "processes")
    elif isinstance(exc, PermissionError):
        _flag(status_fd, f"violation an operation the sandbox denies ({exc})")


def _run_main(code: str, module: types.ModuleType, status_fd: int) -> NoReturn:
    import atexit
    import linecache
    import traceback

    exit_code = 0
    try:
        # Tracebacks and inspect find the source here, though no main.py exists on disk.
        linecache.cache[MAIN] = (len(code), None, code.splitlines(True), MAIN)
        exec(compile(code, MAIN, "exec"), module.__dict__)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            exit_code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            exit_code = 1
    except BaseException as exc:  # noqa: BLE001 - the code's failure is its result
        _classify(exc, status_fd)
        # Without this frame of ours: the traceback reads as if the code ran as main.py.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        exit_code = 1
    # What the interpreter does at exit: join non-daemon threads, run atexit, flush. Each step may
    # fail under the very limit that ended the code, so each is best effort.
    threading = sys.modules.get("threading")  # no threads to join unless the code imported it
    steps = [threading._shutdown] if threading else []
    for step in [*steps, atexit._run_exitfuncs, sys.stdout.flush, sys.stderr.flush]:
        try:
            step()
        except OSError as exc:
            if exc.errno == errno.EFBIG:
                _flag(status_fd, "file_size")
        except BaseException:  # noqa: BLE001
            pass
    exit_code &= 0xFF
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    _flag(status_fd, f"exit {os.getpid()} {exit_code} {sum(u.ru_utime + u.ru_stime for u in usage)}")
    os._exit(exit_code)


def main() -> None:
    # The protocol owns fds 0 and 1; nothing printed by accident may corrupt it.
    control_in, control_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    received = b""
    while b"\n" not in received:
        chunk = os.read(control_in, 1 << 20)
        if not chunk:
            return
        received += chunk
    line, _, rest = received.partition(b"\n")
    config = Config.parse(line)
    # Set once here; each child only points HOME and TMPDIR at its own directory.
    os.environ.clear()
    os.environ.update(config.env)
    server = Server(config, control_in, control_out)
    server.pending = rest
    if config.landlock == "required" and server.abi < 1:
        server.send({"ready": False, "error": "the kernel has no Landlock (needs Linux 5.13+ with lsm=landlock)"})
        return
    for name in WARM_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    # What `site` would have given a normal `python main.py` (we run with -S to keep
    # site-packages off sys.path): exit(), quit(), help(), copyright.
    import site

    site.setquit()
    site.setcopyright()
    site.sethelper()
    # One malloc arena per thread reserves 64 MB of address space each, and RLIMIT_AS counts it:
    # eight threads would exhaust a 256 MB limit without allocating anything.
    _libc.mallopt(M_ARENA_MAX, 2)
    # Every object so far is shared with the children; keep the collector off them, so that a
    # child copies no page just to scan it (children turn the collector back on).
    gc.disable()
    gc.freeze()
    server.send({"ready": True, "landlock_abi": server.abi, "pid": os.getpid()})
    server.serve()


if __name__ == "__main__":
    main()
