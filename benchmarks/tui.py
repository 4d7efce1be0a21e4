"""The workbench on a large store: one page of the rollout browser through the socket, and the
workbench's CPU while a run streams metrics.

    .venv/bin/python benchmarks/tui.py [--rollouts 1000000] [--pages 60] [--stream-seconds 20]

The engine serves the workspace from this process; the workbench runs as a child process on a
pseudo-terminal of 120x40, so every frame is rendered to escape codes and written, as in use.

1. With 1,000,000 rollouts stored, the workbench opens the rollout browser and pages through it
   (pages spread over the whole store, with and without a filter): time from the request to the
   first frame written after the page is in the table. p50/p95 (target p95 <= 50 ms). Between
   pages it rests as a reader would, the highlighted rollout's detail loads, and that detail is
   timed apart.
2. This process publishes a run's progress at 10 steps/s and stores its metrics (as an engine
   following a run does) while the workbench shows the run's curves: CPU seconds of the workbench
   over the stream's wall time (target <= 10% of one core).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import pty
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

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


class Terminal:
    """A workbench process on a pseudo-terminal of 120x40, as a person runs it (frames are rendered
    to escape codes and written, unlike a headless test app); its output is read and dropped."""

    def __init__(self, mode: str, root: Path, *args: str):
        self.result = Path(tempfile.mkdtemp(prefix="evotui-tui-bench-")) / "result.json"
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--child", mode, str(root), str(self.result), *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=ROOT,
            start_new_session=True,
            env={**os.environ, "TERM": "xterm-256color"},
        )
        os.close(slave)
        self.tail = b""
        self.reader = threading.Thread(target=self._drain, args=(master,), daemon=True)
        self.reader.start()

    def _drain(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                break
            if not data:
                break
            self.tail = (self.tail + data)[-4000:]
        os.close(fd)

    def wait_for(self, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.child.poll() is not None or time.monotonic() > deadline:
                self.child.kill()
                raise RuntimeError(f"the workbench stopped early:\n{self.tail.decode(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def results(self, timeout: float = 600) -> object:
        self.wait_for(self.result, timeout)
        self.child.wait(30)
        return json.loads(self.result.read_text())


def page_times(root: Path, pages: int) -> dict[str, list[float]]:
    """Milliseconds per page (unfiltered, then filtered to dead groups), per rollout detail, and the
    parts of a page: until it is in the table, and the request alone."""
    names = ("plain", "dead", "detail", "filled", "request")
    return dict(zip(names, Terminal("pages", root, str(pages)).results(), strict=True))  # type: ignore[call-overload]


def stream_cpu(engine: Engine, root: Path, seconds: float, steps_per_second: float = 10.0) -> float:
    """CPU seconds of a workbench process per wall second while a run streams."""
    term = Terminal("stream", root)
    ready = term.result.with_suffix(".ready")
    term.wait_for(ready, 120)
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
    term.result.with_suffix(".stop").touch()
    cpu, points = term.results()  # type: ignore[misc]
    print(f"streamed {step - first} steps in {wall:.1f} s; the workbench's curve holds {points} points")
    return float(cpu) / wall


def child(mode: str, root: Path, result: Path, args: list[str]) -> None:
    """The workbench on this process's terminal, with a probe on the frames it writes."""
    from evotui.tui.app import EvoApp
    from evotui.tui.screens.rollouts import DETAIL_DELAY_SECONDS, RolloutsScreen
    from evotui.tui.widgets.page_table import PageTable

    class Probed(EvoApp):
        CSS_PATH = str(Path(sys.modules[EvoApp.__module__].__file__ or "").parent / str(EvoApp.CSS_PATH))

        def on_ready(self) -> None:
            super().on_ready()
            assert self._driver is not None
            write, self.frames, self.frame = self._driver.write, [0.0], asyncio.Event()
            self.requests: dict[str, list[float]] = {}

            def probe(data: str) -> None:
                write(data)
                self.frames.append(time.perf_counter())
                self.frame.set()

            self._driver.write = probe  # type: ignore[method-assign]
            self.run_worker(self.bench())

        async def call(self, method: str, **params: Any) -> Any:
            start = time.perf_counter()
            try:
                return await super().call(method, **params)
            finally:
                self.requests.setdefault(method, []).append((time.perf_counter() - start) * 1000)

        async def frame_after(self, moment: float) -> float:
            """When the first frame after `moment` was written."""
            while self.frames[-1] <= moment:
                self.frame.clear()
                await self.frame.wait()
            return next(t for t in self.frames if t > moment)

        async def bench(self) -> None:
            while self.client is None:
                await asyncio.sleep(0.05)
            out = await (self.pages(int(args[0])) if mode == "pages" else self.stream())
            result.write_text(json.dumps(out))
            self.exit()

        async def pages(self, pages: int) -> list[list[float]]:
            self.action_rollouts()
            await asyncio.sleep(1.0)
            screen = self.screen
            assert isinstance(screen, RolloutsScreen)
            table = screen.query_one("#rollout-table", PageTable)
            out: list[list[float]] = [[], [], [], []]
            for times, group in ((out[0], None), (out[1], "dead")):
                screen.filter = {"group": group} if group else {}
                await screen.load_page(0).wait()  # the first page of a filter also counts its rows
                rows = screen.total or 1
                for i in range(pages):
                    offset = (i * 7919) % max(rows // 50 - 1, 1) * 50  # pages spread over the matches
                    start = time.perf_counter()
                    await screen.load_page(offset).wait()
                    filled = time.perf_counter()
                    times.append((await self.frame_after(filled) - start) * 1000)
                    out[3].append((filled - start) * 1000)
                    assert table.row_count > 0 and table.keys[0] == screen.rows[0]["id"]
                    await asyncio.sleep(DETAIL_DELAY_SECONDS + 0.15)  # the reader rests; the detail loads
                    start = time.perf_counter()
                    await screen.load_detail(table.keys[table.cursor_row]).wait()
                    out[2].append((await self.frame_after(time.perf_counter()) - start) * 1000)
            return [*out, self.requests["page_rollouts"]]

        async def stream(self) -> list[float]:
            self.workbench.selected = "v1"
            self.workbench.load_version("v1")
            curves = self.workbench.query_one("#curves")
            while not curves.series:  # type: ignore[attr-defined]
                await asyncio.sleep(0.05)
            start = resource.getrusage(resource.RUSAGE_SELF)
            result.with_suffix(".ready").touch()
            while not result.with_suffix(".stop").exists():
                await asyncio.sleep(0.2)
            end = resource.getrusage(resource.RUSAGE_SELF)
            points = len(curves.series.get("reward", []))  # type: ignore[attr-defined]
            return [end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime, points]

    Probed(root, start_engine=False).run()


def main() -> int:
    if len(sys.argv) >= 5 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=60)
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
        times = page_times(ws.root, args.pages)
        share = stream_cpu(engine, ws.root, args.stream_seconds)
    finally:
        engine.stop()

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else xs[0]

    table = Table(title=f"Workbench on {total:,} rollouts ({os.cpu_count()} cores)")
    for col in ("what", "p50", "p95", "target"):
        table.add_column(col)
    for label, key, target in (
        ("rollout page, fetch + render (ms)", "plain", "p95 <= 50"),
        ("... filtered to dead groups (ms)", "dead", "p95 <= 50"),
        ("... of which until the page is in the table", "filled", ""),
        ("... of which the request (socket + SQL)", "request", ""),
        ("rollout detail, fetch + render (ms)", "detail", ""),
    ):
        table.add_row(label, f"{pct(times[key], 50):.1f}", f"{pct(times[key], 95):.1f}", target)
    table.add_row("workbench CPU while streaming 10 steps/s", f"{share:.1%}", "", "<= 10% of a core")
    console.print(table)
    ok = pct(times["plain"], 95) <= 50 and pct(times["dead"], 95) <= 50 and share <= 0.10
    console.print("[bold green]targets met[/]" if ok else "[bold red]targets missed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
