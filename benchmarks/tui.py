"""The workbench on a large store: one page of the rollout browser through the socket, and the
workbench's CPU while a run streams metrics.

    .venv/bin/python benchmarks/tui.py [--rollouts 1000000] [--pages 40] [--stream-seconds 20]

1. With 1,000,000 rollouts stored, an engine serves the workspace (in this process). A headless
   workbench opens the rollout browser and pages through it (pages spread over the whole store,
   with and without a filter): time from the key press to the table showing the new page.
   p50/p95 (target p95 <= 50 ms).
2. The workbench runs in a child process while this process publishes a run's progress at 10
   steps/s and stores its metrics (as an engine following a run does). CPU seconds of the child
   over the stream's wall time (target <= 10% of one core).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from diagnose import RUN, build_store  # noqa: E402

from engine.daemon import serve  # noqa: E402
from engine.versions import VersionTree  # noqa: E402
from engine.workspace import init_workspace  # noqa: E402


class Engine:
    """The engine serving a workspace from a thread of this process."""

    def __init__(self, root: Path):
        self.root = root
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        async def go() -> None:
            self.loop, self.stop_event = asyncio.get_running_loop(), asyncio.Event()
            ready = asyncio.Event()
            task = asyncio.create_task(serve(self.root, ready, self.stop_event))
            await ready.wait()
            self.ready.set()
            await task

        asyncio.run(go())

    def start(self) -> Engine:
        self.thread.start()
        self.ready.wait(60)
        return self

    def stop(self) -> None:
        assert self.loop is not None and self.stop_event is not None
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(30)

    @property
    def server(self):  # type: ignore[no-untyped-def]
        import gc

        from engine.api.server import EngineServer

        return next(o for o in gc.get_objects() if isinstance(o, EngineServer))


def page_times(root: Path, pages: int, total: int) -> tuple[list[float], list[float]]:
    """Milliseconds per page, unfiltered and filtered (dead groups), through a headless app."""
    from textual.widgets import DataTable

    from evotui.tui.app import EvoApp
    from evotui.tui.screens.rollouts import RolloutsScreen

    async def scenario() -> tuple[list[float], list[float]]:
        app = EvoApp(root, start_engine=False)
        out: tuple[list[float], list[float]] = ([], [])
        async with app.run_test(size=(120, 40)) as pilot:
            while app.client is None:
                await pilot.pause(0.05)
            await pilot.press("o")
            await pilot.pause(0.5)
            screen = app.screen
            assert isinstance(screen, RolloutsScreen)
            table = screen.query_one("#rollout-table", DataTable)
            for times, group in ((out[0], None), (out[1], "dead")):
                screen.filter = {"group": group} if group else {}
                await screen.load_page(0).wait()  # the first page of a filter also counts its rows
                rows = screen.total or total
                for i in range(pages):
                    offset = (i * 7919) % max(rows // 50 - 1, 1) * 50  # pages spread over the matches
                    start = time.perf_counter()
                    await screen.load_page(offset).wait()
                    await pilot.pause(0)  # the table is drawn with the new page
                    times.append((time.perf_counter() - start) * 1000)
                    assert table.row_count > 0
        return out

    return asyncio.run(scenario())


def stream_cpu(engine: Engine, root: Path, seconds: float, steps_per_second: float = 10.0) -> float:
    """CPU seconds of a workbench process per wall second while a run streams."""
    script = f"""
import asyncio, resource, sys
from pathlib import Path
from evotui.tui.app import EvoApp
app = EvoApp(Path({str(root)!r}), start_engine=False)
async def main():
    async with app.run_test(size=(120, 40)) as pilot:
        while app.client is None:
            await pilot.pause(0.05)
        app.workbench.selected = "v1"
        app.workbench.load_version("v1")
        while not app.workbench.query_one("#curves").series:
            await pilot.pause(0.05)
        start = resource.getrusage(resource.RUSAGE_SELF)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the app keeps running while this waits
        end = resource.getrusage(resource.RUSAGE_SELF)
        points = len(app.workbench.query_one("#curves").series.get("reward", []))
        print(end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime, points, flush=True)
asyncio.run(main())
"""
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    store = engine.server.service.engine.store.cursor()
    first = int(store.query_one("SELECT coalesce(max(step), 0) FROM metrics WHERE run_id = ?", [RUN])[0]) + 1
    start = time.perf_counter()
    step = first
    while time.perf_counter() - start < seconds:
        store.upsert_metrics(RUN, [(step, "reward", 0.5 + 0.1 * ((step % 20) / 20)), (step, "entropy", 0.3)])
        engine.server.publish(
            "run",
            {
                "run_id": RUN,
                "version": "v1",
                "kind": "train",
                "state": "running",
                "step": step,
                "total_steps": 100000,
                "metrics": {"reward": 0.5},
                "error": None,
            },
        )
        step += 1
        time.sleep(max(0.0, start + (step - first) / steps_per_second - time.perf_counter()))
    wall = time.perf_counter() - start
    child.stdin.write("\n")
    child.stdin.flush()
    cpu, points = child.stdout.readline().split()
    child.wait(30)
    print(f"streamed {step - first} steps in {wall:.1f} s; the workbench's curve holds {points} points")
    return float(cpu) / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    args = parser.parse_args()
    console = Console()
    ws = init_workspace(Path(tempfile.mkdtemp(prefix="evotui-tui-")) / "ws")
    started = time.perf_counter()
    tree = VersionTree(ws.root)
    tree.create_base("v0")
    tree.create_child("v0", "v1", {"note.txt": "v1\n"}, "v1")
    store = build_store(ws.db_path, args.rollouts)
    total = store.count_rollouts()
    store.close()
    console.print(f"built {total:,} rollouts in {time.perf_counter() - started:.1f} s ({ws.root})")
    engine = Engine(ws.root).start()
    try:
        plain, dead = page_times(ws.root, args.pages, total)
        share = stream_cpu(engine, ws.root, args.stream_seconds)
    finally:
        engine.stop()

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else xs[0]

    table = Table(title=f"Workbench on {total:,} rollouts ({os.cpu_count()} cores)")
    for col in ("what", "p50", "p95", "target"):
        table.add_column(col)
    table.add_row("rollout page, fetch + render (ms)", f"{pct(plain, 50):.1f}", f"{pct(plain, 95):.1f}", "p95 <= 50")
    table.add_row("... filtered to dead groups (ms)", f"{pct(dead, 50):.1f}", f"{pct(dead, 95):.1f}", "p95 <= 50")
    table.add_row("workbench CPU while streaming 10 steps/s", f"{share:.1%}", "", "<= 10% of a core")
    console.print(table)
    ok = pct(plain, 95) <= 50 and pct(dead, 95) <= 50 and share <= 0.10
    console.print("[bold green]targets met[/]" if ok else "[bold red]targets missed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
