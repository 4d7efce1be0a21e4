"""The sandbox, attacked for real: every escape below is a genuine attempt that must fail and be
reported with a reason; the positive tests check that ordinary code still just works.

On a machine with neither bubblewrap nor a reachable interpreter for Landlock, no strong tier
exists and the attack tests are skipped with the sandbox's own explanation (CI installs
bubblewrap in .ci/setup, so there they run).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.sandbox import Limits, Sandbox, SandboxResult, SandboxUnavailable, get_sandbox, tiers
from engine.sandbox.tiers import STRONG_TIERS, TIER_A, TIER_B, TIER_C, Plan

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "sk-ant-canary-4f1c9e0b7d"
LIMITS = Limits(wall_seconds=4.0, cpu_seconds=1.0, memory_mb=256, file_size_mb=4, processes=16)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """One strong sandbox for the module; the engine's environment holds a secret all along (so
    also when a test makes the sandbox restart its zygote)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANTHROPIC_API_KEY", API_KEY)
        try:
            box = Sandbox(LIMITS)
        except SandboxUnavailable as exc:
            pytest.skip(f"no strong sandbox tier on this machine: {exc}")
        with box:
            yield box


@pytest.fixture(scope="module")
def planted() -> Iterator[Path]:
    """A secret outside any scratch directory that file modes alone would let anyone read, in a
    directory anyone may write: only the sandbox's own layers stand between the code and them."""
    directory = Path(tempfile.mkdtemp(prefix="evotui-planted-", dir="/tmp"))
    os.chmod(directory, 0o777)
    secret = directory / "shadow"
    secret.write_text("root:$6$planted-secret-hash:19000:0:99999:7:::\n")
    os.chmod(secret, 0o644)
    yield secret
    shutil.rmtree(directory, ignore_errors=True)


def assert_blocked(result: SandboxResult, reason: str = "violation") -> None:
    assert not result.ok, result
    assert result.reason == reason, result
    assert result.detail, result


def attempt(action: str) -> str:
    """Code that tries `action` and says whether it worked, so a test sees the real outcome and
    not only the sandbox's verdict."""
    indented = "\n".join("    " + line for line in action.strip().splitlines())
    return (
        f"import os, socket, sys\ntry:\n{indented}\n    print('ESCAPED')\n"
        "except OSError as exc:\n    print('denied:', exc)\n"
    )


# --- ordinary code ---------------------------------------------------------------------------------


def test_correct_code_returns_stdout_and_records_the_tier(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import math\nprint(math.factorial(10))")
    assert result.ok and result.reason is None and result.exit_code == 0
    assert result.stdout == "3628800\n"
    assert sandbox.tier in STRONG_TIERS
    assert result.tier == sandbox.tier
    assert 0 < result.seconds < LIMITS.wall_seconds


def test_files_are_readable_importable_and_stdin_arrives(sandbox: Sandbox) -> None:
    files = {"data/numbers.txt": "1 2 3\n", "solution.py": "def double(x):\n    return 2 * x\n"}
    code = (
        "import solution\n"
        "numbers = [int(n) for n in open('data/numbers.txt').read().split()]\n"
        "print(sum(solution.double(n) for n in numbers) + int(input()))\n"
    )
    result = sandbox.run_python(code, files, stdin="100\n")
    assert result.ok, result
    assert result.stdout == "112\n"


def test_failures_of_the_code_are_results(sandbox: Sandbox) -> None:
    crashed = sandbox.run_python("1 / 0")
    assert crashed.reason == "exit" and crashed.exit_code == 1
    assert "ZeroDivisionError" in crashed.detail and 'File "main.py", line 1' in crashed.stderr
    exited = sandbox.run_python("import sys\nprint('partial')\nsys.exit(3)")
    assert (exited.reason, exited.exit_code, exited.stdout) == ("exit", 3, "partial\n")
    assert sandbox.run_python("def broken(:").reason == "exit"
    assert sandbox.run_python("exit(0)").ok  # site's builtins are there, as in `python main.py`


def test_scratch_directories_do_not_persist_or_meet(sandbox: Sandbox) -> None:
    first = sandbox.run_python("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())")
    assert first.ok, first
    earlier = first.stdout.strip()
    second = sandbox.run_python(
        f"import os\nprint(sorted(os.listdir('.')), os.getcwd() != {earlier!r}, os.path.exists({earlier!r}))"
    )
    assert second.ok, second
    assert second.stdout == "[] True False\n"
    assert list(sandbox._scratch.iterdir()) == []


def test_output_beyond_the_limit_is_cut(sandbox: Sandbox) -> None:
    result = sandbox.run_python("print('x' * 50_000)", limits=Limits(output_bytes=1000))
    assert result.ok
    assert result.stdout.startswith("x" * 1000) and "more bytes cut" in result.stdout
    assert len(result.stdout) < 1100


def test_concurrent_calls_from_threads(sandbox: Sandbox) -> None:
    results: dict[int, SandboxResult] = {}

    def work(i: int) -> None:
        results[i] = sandbox.run_python(f"import time\ntime.sleep(0.1)\nprint({i} * {i})")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {i: r.stdout for i, r in results.items()} == {i: f"{i * i}\n" for i in range(6)}
    assert all(r.ok for r in results.values())


def test_zygote_restarts_after_being_killed(sandbox: Sandbox) -> None:
    assert sandbox.run_python("print(1)").ok
    zygote = sandbox._zygote
    assert zygote is not None
    os.kill(zygote.process.pid, signal.SIGKILL)
    # Wait until it is gone: on a loaded machine the dying server could still answer one more.
    zygote.process.wait(timeout=30)
    result = sandbox.run_python("print(2)")
    assert result.ok and result.stdout == "2\n", result
    assert sandbox._zygote is not zygote


def test_venv_packages_and_base_site_packages_are_not_importable(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import sys\nprint(sys.path)\nimport rich")
    assert result.reason == "exit" and "ModuleNotFoundError" in result.stderr
    assert ".venv" not in result.stdout and "site-packages" not in result.stdout
    for site in sandbox.interpreter.site_dirs:
        found = sandbox.run_python(f"import sys\nsys.path.append({site!r})\nimport pytest")
        assert not found.ok and "pytest" not in found.stdout


# --- network ---------------------------------------------------------------------------------------


def test_tcp_connect_to_localhost_is_blocked(sandbox: Sandbox) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        result = sandbox.run_python(attempt(f"socket.create_connection(('127.0.0.1', {port}), timeout=2)"))
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert_blocked(result)
    assert "denied" in result.stdout and "ESCAPED" not in result.stdout
    assert "network" in result.detail


def test_tcp_connect_to_an_external_address_is_blocked(sandbox: Sandbox) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed, so nothing would leave even on a failure.
    result = sandbox.run_python(attempt("socket.create_connection(('192.0.2.1', 80), timeout=2)"))
    assert_blocked(result)
    assert "ESCAPED" not in result.stdout


def test_udp_is_blocked(sandbox: Sandbox) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind(("127.0.0.1", 0))
        receiver.setblocking(False)
        port = receiver.getsockname()[1]
        code = f"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('127.0.0.1', {port}))"
        result = sandbox.run_python(attempt(code))
        with pytest.raises(BlockingIOError):
            receiver.recv(16)
    assert_blocked(result)
    assert "ESCAPED" not in result.stdout


def test_an_uncaught_network_error_is_a_violation_too(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import urllib.request\nurllib.request.urlopen('http://192.0.2.1/', timeout=2)")
    assert_blocked(result)


# --- files and secrets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["planted", "repo pyproject", "home directory", "home file"],
)
def test_reads_outside_the_scratch_directory_are_blocked(sandbox: Sandbox, planted: Path, target: str) -> None:
    home = Path.home()
    # What the home directory holds, but for the way to the interpreter (bound into the sandbox).
    home_names = [name for name in os.listdir(home) if not sandbox.interpreter.prefix.startswith(str(home / name))]
    action, secrets = {
        "planted": (f"print(open({str(planted)!r}).read())", ["planted-secret-hash"]),
        "repo pyproject": (f"print(open({str(ROOT / 'pyproject.toml')!r}).read())", ["[project]"]),
        "home directory": (f"print(os.listdir({str(home)!r}))", [repr(name) for name in home_names]),
        "home file": (f"print(open({str(home / '.bashrc')!r}).read())", _first_line(home / ".bashrc")),
    }[target]
    result = sandbox.run_python(attempt(action))
    assert_blocked(result)
    assert "ESCAPED" not in result.stdout
    assert not [secret for secret in secrets if secret in result.stdout]


def _first_line(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return lines[:1]


def test_the_api_key_never_reaches_the_code(sandbox: Sandbox) -> None:
    assert os.environ["ANTHROPIC_API_KEY"] == API_KEY
    code = (
        "import os\n"
        "print('env', dict(os.environ))\n"
        "for path in [f'/proc/{os.getppid()}/environ', '/proc/1/environ', '/proc/self/environ']:\n"
        "    try:\n"
        "        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(path, 'denied:', exc)\n"
        "for entry in os.listdir('/proc') if os.access('/proc', os.R_OK) else []:\n"
        "    try:\n"
        "        print(entry, open(f'/proc/{entry}/environ', 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = sandbox.run_python(code)
    assert API_KEY not in result.stdout + result.stderr
    assert "ANTHROPIC" not in result.stdout
    assert_blocked(result)


def test_writes_outside_the_scratch_directory_are_blocked(sandbox: Sandbox, planted: Path) -> None:
    outside = planted.parent / "written-by-sandbox.txt"
    result = sandbox.run_python(attempt(f"open({str(outside)!r}, 'w').write('escaped')"))
    assert_blocked(result)
    assert not outside.exists()
    for path in ("/tmp/escaped.txt", "/escaped.txt", "/usr/escaped.txt"):
        assert_blocked(sandbox.run_python(attempt(f"open({path!r}, 'w').write('x')")))


def test_a_symlink_out_of_the_scratch_directory_leads_nowhere(sandbox: Sandbox, planted: Path) -> None:
    result = sandbox.run_python(attempt(f"os.symlink({str(planted)!r}, 'link')\nprint(open('link').read())"))
    assert "planted-secret-hash" not in result.stdout
    assert not result.ok


# --- processes and limits --------------------------------------------------------------------------


def test_fork_bomb_hits_the_process_limit(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.run_python("import os\nwhile True:\n    os.fork()")
    assert_blocked(result, "processes")
    assert time.monotonic() - started < LIMITS.wall_seconds + 2
    assert sandbox.run_python("print('alive')").ok


def test_memory_bomb_hits_the_memory_limit(sandbox: Sandbox) -> None:
    result = sandbox.run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(10 << 20))")
    assert_blocked(result, "memory")


def test_endless_loop_hits_the_cpu_limit(sandbox: Sandbox) -> None:
    # A generous wall time: on a busy machine one CPU second can take more than one second.
    result = sandbox.run_python("while True:\n    pass", limits=Limits(wall_seconds=20, cpu_seconds=1))
    assert_blocked(result, "cpu")
    assert "CPU time" in result.detail


def test_sleeping_forever_hits_the_wall_time_limit(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import time\ntime.sleep(60)", limits=Limits(wall_seconds=1.0))
    assert_blocked(result, "timeout")
    assert "1 s wall time" in result.detail
    assert 1.0 <= result.seconds < 2.5


def test_big_file_hits_the_file_size_limit(sandbox: Sandbox) -> None:
    result = sandbox.run_python("open('big.bin', 'wb').write(b'x' * (20 << 20))")
    assert_blocked(result, "file_size")


def test_leaving_the_process_group_is_blocked(sandbox: Sandbox) -> None:
    caught = sandbox.run_python(attempt("os.setsid()"))
    assert "denied" in caught.stdout and "ESCAPED" not in caught.stdout
    assert_blocked(sandbox.run_python("import os\nos.setsid()"))
    spawned = sandbox.run_python(
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'pass'], start_new_session=True)"
    )
    assert_blocked(spawned)


def test_processes_left_running_are_killed(sandbox: Sandbox) -> None:
    marker = "sandbox-straggler-7c2d"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        "print('started')\n"
    )
    result = sandbox.run_python(code)
    assert result.ok and result.stdout == "started\n", result
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and _processes_with(marker):
        time.sleep(0.05)
    assert not _processes_with(marker)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_killing_the_zygote_from_inside_is_blocked(sandbox: Sandbox) -> None:
    result = sandbox.run_python(attempt("import signal\nos.kill(os.getppid(), signal.SIGKILL)"))
    assert_blocked(result)
    assert sandbox.run_python("print('still here')").ok


# --- tiers, set-up, API ----------------------------------------------------------------------------


def test_landlock_tier_blocks_the_same_escapes(planted: Path) -> None:
    """Tier B on its own, with a system interpreter the sandbox uid can reach."""
    python = shutil.which("python3", path="/usr/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3 to run tier B with")
    try:
        box = Sandbox(LIMITS, tier=TIER_B, python=python)
    except SandboxUnavailable as exc:
        pytest.skip(f"tier {TIER_B} unavailable here: {exc}")
    with box:
        assert box.tier == TIER_B
        assert box.run_python("print(6 * 7)").stdout == "42\n"
        assert_blocked(box.run_python(attempt("socket.create_connection(('127.0.0.1', 9), timeout=2)")))
        read = box.run_python(attempt(f"print(open({str(planted)!r}).read())"))
        assert_blocked(read)
        assert "planted-secret-hash" not in read.stdout
        outside = planted.parent / "written-by-tier-b.txt"
        assert_blocked(box.run_python(attempt(f"open({str(outside)!r}, 'w').write('x')")))
        assert not outside.exists()
        assert_blocked(box.run_python("import os\nwhile True:\n    os.fork()"), "processes")
        assert_blocked(box.run_python(attempt("print(open(f'/proc/{os.getppid()}/environ').read())")))


def test_weak_tier_is_refused_unless_accepted_then_warned_about(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EVOTUI_SANDBOX_ALLOW_WEAK", raising=False)
    with pytest.raises(SandboxUnavailable, match="allow_weak=True") as refused:
        Sandbox(tier=TIER_C)
    assert "EVOTUI_SANDBOX_ALLOW_WEAK=1" in str(refused.value)
    with caplog.at_level(logging.WARNING, logger="engine.sandbox"), Sandbox(tier=TIER_C, allow_weak=True) as weak:
        caplog.clear()
        result = weak.run_python("print('weak')")
        assert result.ok and result.tier == TIER_C
        assert any("NO network or file-system isolation" in r.message for r in caplog.records)


def test_unavailable_sandbox_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.sandbox.tiers.shutil.which", lambda *args, **kwargs: None)
    with pytest.raises(SandboxUnavailable) as missing:
        Sandbox(tier=TIER_A)
    message = str(missing.value)
    assert "apt-get install bubblewrap" in message and "allow_weak=True" in message


def test_a_tier_whose_canary_escapes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: a tier that claims isolation but runs without any is caught by the canary."""
    real_plan = tiers.plan_tier

    def leaky(tier: str, *args: object) -> Plan:
        plan = real_plan(TIER_C, *args)  # type: ignore[arg-type]
        plan.tier = tier
        return plan

    monkeypatch.setattr("engine.sandbox.sandbox.plan_tier", leaky)
    with pytest.raises(SandboxUnavailable, match="failed its canary"):
        Sandbox(tier=TIER_B)


def test_caller_errors_raise(sandbox: Sandbox) -> None:
    for name in ("/etc/passwd", "../up.txt", "a/../../b", ""):
        with pytest.raises(ValueError, match="relative path"):
            sandbox.run_python("pass", {name: "x"})
    with pytest.raises(ValueError, match="wall_seconds"):
        Limits(wall_seconds=0)
    with pytest.raises(ValueError, match="unknown sandbox tier"):
        Sandbox(tier="chroot")


def test_get_sandbox_is_shared(sandbox: Sandbox) -> None:
    shared = get_sandbox()
    assert shared is get_sandbox()
    assert shared.run_python("print('shared')").stdout == "shared\n"
