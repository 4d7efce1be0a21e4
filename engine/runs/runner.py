"""Launching run workers and following them until they end.

The runner interface is what a scheduler would implement later (accelerate launch, Ray); the
local runner starts ``python -m engine.runs.worker RUN_DIR`` as a child process in its own
session, with output to a file (a pipe could fill up and stall the worker).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from engine.runs.artifacts import LOG_FILE


class RunHandle(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class Runner(Protocol):
    def start(self, run_dir: Path) -> RunHandle: ...


class LocalRunner:
    """One subprocess per run on this machine."""

    def __init__(self, python: str = sys.executable, extra_env: dict[str, str] | None = None):
        self.python = python
        self.extra_env = extra_env or {}

    def start(self, run_dir: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **self.extra_env}
        with open(run_dir / LOG_FILE, "ab") as log:
            return subprocess.Popen(
                [self.python, "-m", "engine.runs.worker", str(run_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
