"""Sandbox start-up cost: what one execution costs before the first line of policy code runs.

    .venv/bin/python benchmarks/sandbox.py [--runs 200]

Times `Sandbox.run_python("pass")` end to end in the engine (handing the code over, the zygote's
fork, the child's isolation set-up, exit, reading the outputs, removing the scratch directory):
median and p95 (target median <= 20 ms). Also the one-time cost of `Sandbox()` (probing the tiers,
starting the zygote, the canary), and for scale a bare `python -c pass` of the same interpreter.
`startup_times` is reused by benchmarks/domains.py.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from engine.sandbox import Sandbox, get_sandbox

TARGET_MEDIAN_MS = 20.0


def startup_times(n: int, sandbox: Sandbox | None = None) -> list[float]:
    """Milliseconds of `n` executions of `pass` (after a short warm-up), in the shared sandbox
    unless one is given."""
    sandbox = sandbox or get_sandbox()
    for _ in range(5):
        sandbox.run_python("pass")
    times = []
    for _ in range(n):
        start = time.perf_counter()
        result = sandbox.run_python("pass")
        times.append((time.perf_counter() - start) * 1000)
        if not result.ok:
            raise RuntimeError(f"`pass` failed in the sandbox: {result.detail}")
    return times


def bare_python_times(n: int, executable: str) -> list[float]:
    """Milliseconds of `python -c pass` as a subprocess, for scale."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([executable, "-c", "pass"], check=True)
        times.append((time.perf_counter() - start) * 1000)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="executions of `pass` timed")
    parser.add_argument("--bare-runs", type=int, default=30, help="`python -c pass` runs timed, for scale")
    args = parser.parse_args()
    console = Console()

    start = time.perf_counter()
    sandbox = Sandbox()
    setup_ms = (time.perf_counter() - start) * 1000
    try:
        times = startup_times(args.runs, sandbox)
        interpreter = sandbox.interpreter.executable
    finally:
        sandbox.close()
    bare = bare_python_times(args.bare_runs, interpreter)

    table = Table(title=f"Sandbox start-up per execution, tier {sandbox.tier} ({args.runs} runs)")
    for column in ("what", "median ms", "p95 ms", "target"):
        table.add_column(column)
    table.add_row(
        "run_python('pass'), end to end",
        f"{statistics.median(times):.1f}",
        f"{p95(times):.1f}",
        f"median <= {TARGET_MEDIAN_MS:g}",
    )
    table.add_row("Sandbox(): probe, zygote start, canary (once)", f"{setup_ms:.0f}", "", "")
    table.add_row("for scale: bare `python -c pass`", f"{statistics.median(bare):.1f}", f"{p95(bare):.1f}", "")
    console.print(table)
    ok = statistics.median(times) <= TARGET_MEDIAN_MS
    console.print("[bold green]targets met[/]" if ok else "[bold red]targets missed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
