"""An engine served from a thread of the test process, and a workspace with data to serve."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from textual.pilot import Pilot

from engine.api.client import EngineClient
from engine.api.server import EngineServer
from engine.coach.gates import Gates
from engine.coach.interventions import Intervention, apply
from engine.config import CONFIG_FILE
from engine.core import Engine, VersionPlan
from engine.daemon import serve, socket_path
from engine.workspace import Workspace
from tests.harness_data import Rollout, RunBuilder


class Served:
    """An engine serving a workspace from a thread of this process (its own event loop)."""

    def __init__(self, root: Path):
        self.root = root
        self.path = socket_path(root)
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        async def go() -> None:
            self.loop = asyncio.get_running_loop()
            self.stop_event = asyncio.Event()
            ready = asyncio.Event()
            task = asyncio.create_task(serve(self.root, ready, self.stop_event))
            await ready.wait()
            self.ready.set()
            await task

        try:
            asyncio.run(go())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
            self.ready.set()

    def start(self) -> Served:
        self.thread.start()
        assert self.ready.wait(20)
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        if self.loop is not None and self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(20)

    def client(self) -> EngineClient:
        return EngineClient(self.path)

    @property
    def server(self) -> EngineServer:
        """The running server object (to publish events or reach the engine's store)."""
        import gc

        (server,) = [o for o in gc.get_objects() if isinstance(o, EngineServer) and o.socket_path == self.path]
        return server


def populate(ws: Workspace) -> None:
    """v0 with a small train run (6 rollouts, two steps of reward metrics) and a pending gate."""
    with Engine.open(ws.root) as engine:
        sha = engine.tree.create_base("v0")
        engine.store.add_version("v0", None, "versions/v0", sha, state="promoted")
        builder = RunBuilder(engine.store, run_id="v0-train-1", version="v0")
        builder.step(1, [[Rollout(0.0), Rollout(1.0)], [Rollout(1.0), Rollout(1.0)]])
        builder.step(2, [[Rollout(0.0, truncated=True), Rollout(0.0)]]).metric("reward", [0.75, 0.0]).save(2)
        engine.store.update_run("v0-train-1", state="succeeded", ended_at="2026-01-01 00:00:00")
        Gates(engine.store).open(1, "after_design", "round1-design0", "Run 2 branch(es)?", {"proposals": []}, False)


def add_children(root: Path) -> None:
    """v1 and v2 from v0, each one intervention; two more pending gates."""
    with Engine.open(root) as engine:
        for name, lr in (("v1", 4e-5), ("v2", 1e-5)):
            iv = Intervention(kind="optimizer", changes={"recipe.learning_rate": lr}, hypothesis="h")
            text, _ = apply(iv, engine.config_text("v0"), Path(CONFIG_FILE))
            change = {"recipe.learning_rate": {"from": 2e-5, "to": lr}}
            engine.create_version(
                VersionPlan("v0", name, {CONFIG_FILE: text}, "optimizer", iv.factor, change, "h", "c", "r")
            )
        gates = Gates(engine.store)
        gates.open(1, "after_completion", "v1", "Prune v1?", {"verdict": "insufficient", "decision": "pruned"}, False)
        gates.open(1, "after_completion", "v2", "Prune v2?", {"verdict": "insufficient", "decision": "pruned"}, False)


async def until(pilot: Pilot[None], condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)
