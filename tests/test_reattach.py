"""A worker that finds its run held by another worker exits with `EXIT_LOCKED` and does nothing; the
engine then follows the holder to its end: no retry, no failure, the holder's outcome."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from engine.core import Engine
from engine.runs import lock
from engine.runs.artifacts import LOG_FILE
from engine.runs.runner import LocalRunner, LocalWorker
from engine.store import Store
from engine.workspace import Workspace
from tests.conftest import commit_workspace_toml, until

#: A worker of the run that is not the engine's: it takes the run's lock, and once told to, writes
#: the run's artifacts (a scripted evaluation that ends) and lets go by exiting.
HOLDER = """
import sys, time
from pathlib import Path
from engine.runs import lock
from tests.scripted_runs import ScriptedRunner

run_dir, release = Path(sys.argv[1]), Path(sys.argv[2])
held = lock.acquire(run_dir)
print("holding", flush=True)
deadline = time.monotonic() + 300
while not release.exists():
    assert time.monotonic() < deadline, "never released"
    time.sleep(0.05)
ScriptedRunner(lambda version: 0.5).start(run_dir)
"""


class RacedRunner(LocalRunner):
    """Starts the real worker on a run that another process took after the engine found its lock
    free and before the worker could take it: the worker finds the lock held."""

    def __init__(self, release: Path):
        super().__init__(warm=False)  # a worker process of its own, whose exit code is its own
        self.release = release
        self.holder: subprocess.Popen[bytes] | None = None
        self.worker: LocalWorker | None = None
        self.run_dir = Path()

    def start(self, run_dir: Path) -> LocalWorker:
        assert self.holder is None, "the engine started a worker again"
        self.run_dir = run_dir
        root = Path(__file__).resolve().parent.parent  # `tests.scripted_runs` imports from here
        self.holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(run_dir), str(self.release)],
            cwd=root,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.holder.stdout is not None and self.holder.stdout.readline() == b"holding\n"
        worker = super().start(run_dir)
        assert isinstance(worker, LocalWorker)
        self.worker = worker
        return worker


def run_events(store: Store, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = store.query("SELECT kind, payload FROM events WHERE run_id = ? ORDER BY id", [run_id])
    return [(kind, json.loads(payload) if payload else {}) for kind, payload in rows]


def test_a_worker_that_finds_its_run_held_hands_the_run_to_the_holder(
    tiny_workspace: Workspace, tmp_path: Path
) -> None:
    # No retries: before, the engine took exit 75 for a crash and failed the run at once.
    with tiny_workspace.config_path.open("a") as f:
        f.write("\n[compute]\nmax_retries = 0\n")
    commit_workspace_toml(tiny_workspace, "no retries")
    runner = RacedRunner(tmp_path / "release")
    with Engine(tiny_workspace, runner=runner, poll_seconds=0.05) as engine:
        assert engine.config.compute.max_retries == 0
        outcome: dict[str, Any] = {}

        def build_v0() -> None:
            try:
                outcome["v0"] = engine.ensure_base()
            except BaseException as exc:  # noqa: BLE001 - the test thread reports it
                outcome["error"] = exc

        thread = threading.Thread(target=build_v0)
        thread.start()
        store = engine.store.cursor()  # this thread's own connection

        def attached() -> bool:
            return any(kind == "run_attached" for kind, _ in run_events(store, "v0-warmup-1"))

        try:
            until(lambda: not thread.is_alive() or attached(), 300)
            assert "error" not in outcome, outcome.get("error")
            # The engine's worker has exited with lock.EXIT_LOCKED while the holder holds the run and
            # trains on: the run is followed, neither failed nor retried.
            assert runner.worker is not None and runner.worker.returncode == lock.EXIT_LOCKED
            assert "not starting a second one" in (runner.run_dir / LOG_FILE).read_text()
            holder = lock.holder(runner.run_dir)
            assert runner.holder is not None and holder is not None and holder.pid == runner.holder.pid
            run = store.get_run("v0-warmup-1")
            assert run is not None and run.state == "running" and run.pid == runner.holder.pid
        finally:
            (tmp_path / "release").touch()
            thread.join(300)
            store.close()
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
        assert runner.holder is not None and runner.holder.wait(60) == 0

        # The run ends as the holder ended it; v0 is built from it.
        (run,) = engine.store.list_runs("v0")
        assert (run.kind, run.state, run.error_tail) == ("warmup", "succeeded", None)
        assert outcome["v0"].state == "promoted"
        events = [(k, payload) for k, payload in run_events(engine.store, run.id) if k.startswith("run_")]
        assert [k for k, _ in events] == ["run_started", "run_attached", "run_finished"]
        assert events[-1][1] == {"state": "succeeded"}
