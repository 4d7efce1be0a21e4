"""How long a run's worker takes to start: a plain subprocess (cold) against a fork of the warm
fork server (`engine.runs.forkserver`).

Seconds from `LocalRunner.start(run_dir)` to the worker's first event in RUN_DIR/events.jsonl
(the warm-up's `start`, once its policy is built), and to its exit, for warm-ups of the tests'
tiny workspace (--warmup-steps steps), cold and warm in turn so that a change in the machine's
load falls on both. The first warm run of a process waits for the server's imports: it is shown
on its own row. Prints one table, with the load average before and after.

Never run it while something else trains: two torch processes on two cores slow each other down.

    .venv/bin/python benchmarks/worker_start.py [--runs 5] [--warmup-steps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from engine.config import parse_config
from engine.runs import forkserver
from engine.runs.artifacts import EVENTS_FILE
from engine.runs.runner import ForkedWorker, LocalRunner
from engine.runs.spec import RunSpec
from engine.workspace import template_dir
from tests.conftest import tiny_toml

console = Console(width=120)


def make_run(root: Path, name: str, warmup_steps: int) -> Path:
    text = tiny_toml((template_dir("sample") / "workspace.toml").read_text(), warmup_steps=warmup_steps)
    config = parse_config(text, root / "workspace.toml")
    run_dir = root / name
    # One torch thread: another process on the machine would make two spin (the start is the same).
    spec = RunSpec(run_id=name, version=name, kind="warmup", config=config, model_out=root / f"{name}-model", threads=1)
    spec.save(run_dir)
    return run_dir


def start_to_first_event(runner: LocalRunner, run_dir: Path) -> tuple[float, float, bool]:
    """Seconds to the first event, seconds to the exit, and whether the worker was forked warm."""
    events = run_dir / EVENTS_FILE
    start = time.perf_counter()
    handle = runner.start(run_dir)
    while not (events.exists() and events.stat().st_size > 0):
        if handle.poll() is not None:
            raise RuntimeError(f"the worker of {run_dir} exited with {handle.poll()} before its first event")
        time.sleep(0.005)
    first = time.perf_counter() - start
    code = handle.wait(timeout=600)
    if code != 0:
        raise RuntimeError(f"the worker of {run_dir} exited with {code}")
    return first, time.perf_counter() - start, isinstance(handle, ForkedWorker)


def row(label: str, samples: list[tuple[float, float]]) -> tuple[str, ...]:
    firsts, ends = [s[0] for s in samples], [s[1] for s in samples]
    return (
        label,
        str(len(samples)),
        f"{statistics.median(firsts):.2f}",
        f"{min(firsts):.2f} - {max(firsts):.2f}",
        f"{statistics.median(ends):.2f}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (after the first warm one)")
    parser.add_argument("--warmup-steps", type=int, default=5, help="warm-up steps per run")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="evotui-worker-start-"))
    load_before = os.getloadavg()
    cold, warm = LocalRunner(warm=False), LocalRunner()
    first_warm = start_to_first_event(warm, make_run(root, "warm-first", args.warmup_steps))
    assert first_warm[2], "the first warm run was not forked: the fork server did not start"
    samples: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    for i in range(args.runs):
        for kind, runner in (("cold", cold), ("warm", warm)):
            first, end, forked = start_to_first_event(runner, make_run(root, f"{kind}-{i}", args.warmup_steps))
            assert forked == (kind == "warm"), f"a {kind} run was {'forked' if forked else 'not forked'}"
            samples[kind].append((first, end))
    load_after = os.getloadavg()

    server = forkserver.current_server()
    table = Table(
        title=f"Worker start: runner.start() to first event ({args.warmup_steps}-step warm-ups of the tiny "
        f"workspace; {os.cpu_count()} CPUs, load {load_before[0]:.2f} before, {load_after[0]:.2f} after)"
    )
    for col in ("worker", "runs", "to first event (median s)", "min - max s", "to exit (median s)"):
        table.add_column(col)
    table.add_row(*row("cold (a subprocess)", samples["cold"]))
    table.add_row(*row("warm (forked)", samples["warm"]))
    table.add_row(*row("warm, first of the process", [first_warm[:2]]))
    console.print(table)
    speedup = statistics.median(s[0] for s in samples["cold"]) / statistics.median(s[0] for s in samples["warm"])
    console.print(f"warm starts {speedup:.1f}x sooner; server pid {server.pid if server else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
