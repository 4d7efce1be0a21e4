"""The isolation tiers, strongest first, and how to start the zygote inside each.

- Tier A, "bwrap+seccomp": bubblewrap gives the zygote its own user, network, PID, IPC and mount
  namespaces, with a root that holds only /usr, the interpreter (its site-packages hidden) and the
  scratch directory; each child adds its own user namespace, Landlock (where the kernel has it),
  seccomp and rlimits. The network namespace has no interface but a downed loopback.
- Tier B, "landlock+seccomp" (no user namespaces, e.g. Ubuntu 24.04 or Docker's default profile):
  each child restricts itself with Landlock to its scratch directory and read-only system paths,
  plus seccomp and rlimits. Needs Landlock (Linux 5.13+).
- Tier C, "rlimits": a cleared environment and rlimits only. No network or file isolation at all;
  the sandbox refuses it unless the caller opts in, then warns on every execution.

When the engine runs as root, the sandboxed processes run as uid 65534 instead: RLIMIT_NPROC does
nothing for uid 0, and root reads every file.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

TIER_A, TIER_B, TIER_C = "bwrap+seccomp", "landlock+seccomp", "rlimits"
STRONG_TIERS = (TIER_A, TIER_B)
ALL_TIERS = (*STRONG_TIERS, TIER_C)
# nobody/nogroup: the spare uid that owns nothing.
SANDBOX_UID = SANDBOX_GID = 65534
# Where tier A mounts the scratch directory inside bubblewrap.
SCRATCH_INSIDE = "/scratch"
# Read-only system paths the code may read (and execute from), besides the interpreter.
SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime")
DEVICES_READ = ("/dev/urandom", "/dev/random", "/dev/zero")
DEVICES_WRITE = ("/dev/null",)
# The launcher's own PATH (unshare, mount, setpriv, bwrap); nothing from the engine's environment.
LAUNCH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class TierUnavailable(RuntimeError):
    """This tier cannot run here; the message says what is missing and how to fix it."""


@dataclass(frozen=True)
class Interpreter:
    """The Python the code runs under: the base interpreter behind the engine's (virtual)
    environment, so that nothing installed in the venv is importable inside."""

    executable: str
    prefix: str
    # Its site-packages directories: tier A hides them; everywhere they are off sys.path (-S).
    site_dirs: tuple[str, ...]

    @classmethod
    def find(cls, python: str | None = None) -> Interpreter:
        if python is None:
            executable = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
            prefix = os.path.realpath(sys.base_prefix)
        else:
            executable = os.path.realpath(python)
            prefix = os.path.dirname(os.path.dirname(executable))
        if not executable.startswith(prefix + os.sep):
            raise TierUnavailable(f"the interpreter {executable} is not inside its prefix {prefix}")
        patterns = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "local/lib/python3*/dist-packages")
        found = [path for pattern in patterns for path in glob.glob(os.path.join(prefix, pattern))]
        found += [p for p in (os.path.join(prefix, "lib/python3/dist-packages"),) if os.path.isdir(p)]
        return cls(executable, prefix, tuple(sorted(set(found))))


@dataclass
class Plan:
    """How to start the zygote for one tier, and what to tell it (see zygote.Config)."""

    tier: str
    argv: list[str]
    env: dict[str, str]
    user: int | None  # drop to this uid/gid on exec (engine running as root), else None
    scratch_inside: str  # the scratch directory as the zygote sees it
    read_only: list[str]
    landlock: str  # "required", "optional" (used where the kernel has it) or "off"
    seccomp: bool
    userns: bool
    # False where the code's stray processes outlive a killed zygote (no PID namespace).
    contained: bool = True
    notes: list[str] = field(default_factory=list)


def code_env(interpreter: Interpreter) -> dict[str, str]:
    """The code's whole environment, before HOME and TMPDIR (set to its scratch directory)."""
    return {
        "PATH": ":".join(dict.fromkeys([f"{interpreter.prefix}/bin", "/usr/bin", "/bin"])),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONIOENCODING": "utf-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        # See zygote.main: keeps threads of a subprocess from exhausting its address-space limit.
        "MALLOC_ARENA_MAX": "2",
    }


def sandbox_ids() -> tuple[int, int]:
    """The uid and gid the code runs as: 65534 under root, else the engine's own."""
    if os.geteuid() == 0:
        return SANDBOX_UID, SANDBOX_GID
    return os.getuid(), os.getgid()


def reachable_by_others(path: str) -> bool:
    """Whether an unrelated uid can get to `path`: every directory on the way searchable by all."""
    current = Path(path)
    for directory in [current, *current.parents]:
        try:
            mode = os.stat(directory).st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return True


def plan_tier(tier: str, interpreter: Interpreter, scratch: Path, zygote_argv: list[str]) -> Plan:
    """The way to start the zygote in `tier`, or TierUnavailable saying why there is none."""
    uid, gid = sandbox_ids()
    as_root = os.geteuid() == 0
    env = code_env(interpreter)
    if tier == TIER_A:
        return _plan_bubblewrap(interpreter, scratch, zygote_argv, env, uid, gid, as_root)
    if tier in (TIER_B, TIER_C):
        strong = tier == TIER_B
        notes = []
        user: int | None = uid if as_root else None
        if as_root and not reachable_by_others(interpreter.prefix):
            if strong:
                raise TierUnavailable(
                    f"the interpreter under {interpreter.prefix} is out of reach of uid {uid} (a parent "
                    "directory is not searchable by others): install Python outside /root, or use bubblewrap"
                )
            user = None
            notes.append("the code runs as root: the process limit does not apply and it can read every file")
        return Plan(
            tier=tier,
            argv=[interpreter.executable, "-I", "-S", *zygote_argv],
            env=env,
            user=user,
            scratch_inside=str(scratch),
            read_only=[*SYSTEM_PATHS, interpreter.prefix, *DEVICES_READ],
            landlock="required" if strong else "off",
            seccomp=strong,
            userns=False,
            contained=False,
            notes=notes,
        )
    raise ValueError(f"unknown sandbox tier {tier!r}; known: {', '.join(ALL_TIERS)}")


def _plan_bubblewrap(
    interpreter: Interpreter,
    scratch: Path,
    zygote_argv: list[str],
    env: dict[str, str],
    uid: int,
    gid: int,
    as_root: bool,
) -> Plan:
    bwrap = shutil.which("bwrap", path=LAUNCH_PATH + ":" + os.environ.get("PATH", ""))
    if bwrap is None:
        raise TierUnavailable("bubblewrap is not installed: apt-get install bubblewrap")
    prefix = interpreter.prefix
    # Under root the sandbox uid must reach the interpreter; /root is usually mode 0700, so bind
    # the prefix into a reachable place first, in a mount namespace of the launcher's own.
    source = prefix
    launcher: list[str] = []
    if as_root and not reachable_by_others(prefix):
        tools = {name: shutil.which(name, path=LAUNCH_PATH) for name in ("unshare", "mount", "setpriv", "sh")}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise TierUnavailable(f"{', '.join(missing)} not found (util-linux): apt-get install util-linux")
        source = str(scratch.parent / "python")
        os.makedirs(source, mode=0o755, exist_ok=True)
        script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        launcher = [
            str(tools["unshare"]),
            "--mount",
            "--propagation",
            "private",
            "--",
            str(tools["sh"]),
            "-c",
            script,
            "sh",
            prefix,
            source,
            str(tools["setpriv"]),
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--",
        ]
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--ro-bind-try",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--ro-bind-try",
        "/etc/localtime",
        "/etc/localtime",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    if prefix != "/usr" and not prefix.startswith("/usr/"):
        argv += ["--ro-bind", source, prefix]
    for site in interpreter.site_dirs:
        argv += ["--tmpfs", site, "--remount-ro", site]
    argv += ["--bind", str(scratch), SCRATCH_INSIDE, "--chdir", SCRATCH_INSIDE]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += [interpreter.executable, "-I", "-S", *zygote_argv]
    return Plan(
        tier=TIER_A,
        argv=launcher + argv,
        env={"PATH": LAUNCH_PATH},
        user=None if launcher or not as_root else uid,
        scratch_inside=SCRATCH_INSIDE,
        read_only=[*SYSTEM_PATHS, prefix, *DEVICES_READ],
        landlock="optional",
        seccomp=True,
        userns=True,
    )
