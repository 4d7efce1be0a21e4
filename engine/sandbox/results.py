"""What a caller asks of the sandbox (`Limits`) and what it gets back (`SandboxResult`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Reason = Literal["timeout", "cpu", "memory", "file_size", "processes", "violation", "exit", "error"]


@dataclass(frozen=True)
class Limits:
    """Per-execution limits. Each is enforced by the kernel (rlimits) except `wall_seconds`,
    which the sandbox enforces by killing the execution's whole process group."""

    wall_seconds: float = 5.0
    # Rounded up to whole seconds (an rlimit's unit); SIGKILL follows SIGXCPU a second later.
    cpu_seconds: float = 2.0
    # Address space of each process, the interpreter's own ~30 MB included.
    memory_mb: int = 256
    # Largest file the code may write, its stdout and stderr included.
    file_size_mb: int = 8
    # Processes and threads of the execution at once, its main process included.
    processes: int = 16
    # Bytes of stdout and of stderr kept in the result; the rest is cut with a note.
    output_bytes: int = 64_000

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")
        if self.memory_mb < 64:
            raise ValueError(f"Limits.memory_mb must be at least 64 (the interpreter needs ~35), got {self.memory_mb}")

    def as_message(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one execution; `reason` says why it was not ok."""

    ok: bool  # exit code 0 and no limit hit, no violation seen
    exit_code: int | None  # None when killed by a signal
    stdout: str
    stderr: str
    reason: Reason | None  # None when ok
    detail: str  # one human line, e.g. "killed after 5.0 s wall time"
    seconds: float  # wall time of the execution
    tier: str  # which isolation tier ran it
