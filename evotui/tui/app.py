"""The workbench app: owns the engine connection, routes messages between screens.

The app is the only owner of the socket client. Screens fetch through `app.call(...)` from their
workers and hand results down to their widgets; widgets only render and post messages up.
If no engine serves the workspace, the app starts one (detached: closing the app leaves it
training); if the engine goes away, the app says so and reconnects by itself.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.worker import Worker, WorkerState

from engine.api.client import AsyncEngineClient, EngineError, EngineUnavailable
from engine.api.protocol import Event
from engine.daemon import socket_path, spawn
from evotui.tui.messages import EngineConnected, EngineDisconnected, EngineEvent, GateAction, RunProgress
from evotui.tui.screens.help import HelpScreen
from evotui.tui.screens.workbench import WorkbenchScreen


def tune_gc() -> None:
    """Keep the cyclic collector's full passes out of the frames, once the workbench is up.

    What is alive then (modules, the stylesheet, the workbench's widgets) lives as long as the
    process; frozen, a full pass no longer walks it (one took ~150 ms here, then ~55 ms). A larger
    first threshold makes every pass rarer: full passes had come every ~10 pages of the rollout
    browser and were most of its slowest pages (benchmarks/tui.py).
    """
    gc.freeze()
    gc.set_threshold(7000, 10, 10)


class EvoApp(App[None]):
    CSS_PATH = "evotui.tcss"
    TITLE = "evotui"
    BINDINGS = [
        Binding("q", "quit", "Quit", id="quit"),
        Binding("question_mark,f1", "help", "Help", id="help"),
        Binding("w", "workbench", "Workbench", id="workbench"),
        Binding("o", "rollouts", "Rollouts", id="rollouts"),
        Binding("m", "memory", "Memory", id="memory"),
        Binding("D", "diff", "Diff", id="diff"),
        # Not in the footer (it is full at 80 columns): `?` lists it, and the README.
        Binding("F", "flips", "Flips", id="flips", show=False),
    ]

    def __init__(self, workspace: Path, start_engine: bool = True, reconnect_delay: float = 0.5):
        super().__init__()
        self.workspace = workspace
        self.start_engine = start_engine
        self.reconnect_delay = reconnect_delay
        self.client: AsyncEngineClient | None = None
        self.hello: dict[str, Any] = {}
        self.workbench = WorkbenchScreen()

    def on_mount(self) -> None:
        self.push_screen(self.workbench)
        self.connect_engine()

    def on_ready(self) -> None:
        if not self.is_headless:  # a process of its own (tests run many apps in one process)
            tune_gc()

    # -- the engine connection ------------------------------------------------------------------
    @work(exclusive=True, group="engine", exit_on_error=False)
    async def connect_engine(self) -> None:
        path = socket_path(self.workspace)
        reconnected = False
        attempts = 0
        while True:
            client = AsyncEngineClient(path, on_event=self._engine_event)
            try:
                await client.connect()
                hello = await client.call("hello")
                await client.call("subscribe")
            except (TimeoutError, EngineUnavailable, EngineError):
                attempts += 1
                if self.start_engine and attempts == 1:
                    try:
                        await asyncio.to_thread(spawn, self.workspace)
                    except RuntimeError as exc:
                        self.notify(str(exc), title="the engine did not start", severity="error", timeout=30)
                await asyncio.sleep(self.reconnect_delay)
                continue
            self.client, self.hello, attempts = client, hello, 0
            self.post_message(EngineConnected(hello, reconnected))
            await client.closed.wait()
            self.client = None
            self.post_message(EngineDisconnected("the engine closed the connection"))
            reconnected = True

    def _engine_event(self, event: Event) -> None:
        if event.event == "run":
            self.post_message(RunProgress(event.data))
        else:
            self.post_message(EngineEvent(event.event, event.data))

    async def call(self, method: str, **params: Any) -> Any:
        """One request to the engine (for screens' workers)."""
        if self.client is None:
            raise EngineUnavailable("not connected to the engine (reconnecting)")
        return await self.client.call(method, **params)

    # -- routing ---------------------------------------------------------------------------------
    def on_engine_connected(self, message: EngineConnected) -> None:
        what = "reconnected to" if message.reconnected else "connected to"
        self.notify(f"{what} the engine (pid {message.hello['pid']})", timeout=4)
        self.sub_title = f"{message.hello['name']} · engine pid {message.hello['pid']}"
        self.workbench.engine_ready()

    def on_engine_disconnected(self, message: EngineDisconnected) -> None:
        self.sub_title = "engine connection lost: reconnecting"
        self.notify(f"{message.reason}; reconnecting", severity="warning", timeout=6)

    def on_engine_event(self, message: EngineEvent) -> None:
        self.workbench.engine_event(message.event, message.data)

    def on_run_progress(self, message: RunProgress) -> None:
        self.workbench.run_progress(message.data)

    def on_gate_action(self, message: GateAction) -> None:
        self.answer_gate(message.gate, message.verb, message.feedback)

    @work(group="gates", exit_on_error=False)
    async def answer_gate(self, gate: str, verb: str, feedback: str) -> None:
        result = await self.call("answer_gate", gate=gate, verb=verb, feedback=feedback)
        taken = "the coach goes on" if result["taken_by"] == "coach" else "the next run goes on from there"
        self.notify(f"gate {gate}: {verb} ({taken})")
        self.workbench.refresh_gates()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Every failed worker becomes a visible notice; the app never dies on one."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            text = error.message if isinstance(error, EngineError) else f"{type(error).__name__}: {error}"
            self.notify(text, title=f"{event.worker.name or 'request'} failed", severity="error", timeout=8)

    # -- actions ---------------------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen(self))

    def action_workbench(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def action_rollouts(self) -> None:
        from evotui.tui.screens.rollouts import RolloutsScreen

        self._switch(RolloutsScreen(version=self.workbench.selected))

    def action_memory(self) -> None:
        from evotui.tui.screens.memory import MemoryScreen

        self._switch(MemoryScreen())

    def action_diff(self) -> None:
        from evotui.tui.screens.diff import DiffScreen

        self._switch(DiffScreen(self.workbench.selected))

    def action_flips(self) -> None:
        from evotui.tui.screens.flips import FlipsScreen

        self._switch(FlipsScreen(self.workbench.selected))

    def _switch(self, screen: Any) -> None:
        self.action_workbench()
        self.push_screen(screen)
