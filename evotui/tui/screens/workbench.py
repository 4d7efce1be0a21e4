"""The workbench: version tree | live GRPO curves | diagnosis and pending gates, side by side."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static
from textual.worker import Worker

from evotui.tui.messages import GateAction, VersionSelected
from evotui.tui.screens.confirm import ConfirmScreen, FeedbackScreen
from evotui.tui.widgets.curves import Curves
from evotui.tui.widgets.diagnosis import DiagnosisView
from evotui.tui.widgets.gates import GatesView
from evotui.tui.widgets.version_tree import VersionTreeView

if TYPE_CHECKING:
    from evotui.tui.app import EvoApp

#: How often new metrics are fetched while a run streams (events in between only mark it dirty).
CURVE_REFRESH_SECONDS = 1.0


class WorkbenchScreen(Screen[None]):
    BINDINGS = [
        Binding("a", "gate('approve')", "Approve", id="workbench.approve"),
        Binding("e", "gate('revise')", "Revise", id="workbench.revise"),
        Binding("x", "gate('abort')", "Abort", id="workbench.abort"),
        Binding("s", "start", "Start coach", id="workbench.start"),
        Binding("t", "stop", "Stop coach", id="workbench.stop", show=False),
        Binding("right_square_bracket,period", "metric(1)", "Next metric", id="workbench.next_metric"),
        Binding("left_square_bracket,comma", "metric(-1)", "Prev metric", id="workbench.prev_metric", show=False),
        Binding("f5", "reload", "Reload", id="workbench.reload", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.selected: str | None = None
        self.run_id: str | None = None
        self.curves_dirty = False
        self.versions: list[dict[str, Any]] = []
        self.activity: str | None = None
        #: Follow the run in progress until a person selects a version in the tree.
        self.following = True

    @property
    def evo(self) -> EvoApp:
        return cast("EvoApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="workbench"):
            with Vertical(id="left"):
                yield VersionTreeView(id="tree")
                yield Static("", id="version-info")
            with Vertical(id="center"):
                yield Curves(id="curves")
                yield Static("connecting to the engine…", id="activity")
            with Vertical(id="right"):
                with VerticalScroll(id="gates-box"):
                    yield GatesView("", id="gates")
                with VerticalScroll(id="diagnosis-box"):
                    yield DiagnosisView("", id="diagnosis")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(CURVE_REFRESH_SECONDS, self._flush_curves)

    # -- from the app (attributes down) -------------------------------------------------------------
    def engine_ready(self) -> None:
        self.query_one("#activity", Static).update("connected · s starts the coach · ? lists the keys")
        self.reload()

    def engine_event(self, event: str, data: dict[str, Any]) -> None:
        if event == "coach":
            self.query_one("#activity", Static).update(Text(data.get("message", ""), overflow="ellipsis"))
            if data.get("kind") in ("decision", "verdict", "round", "proposal", "waiting"):
                self.load_versions()
            # The coach records a gate's answer after taking it: what it says next is after that.
            self.refresh_gates()
        elif event == "gate":
            self.app.bell()
            self.refresh_gates()
        elif event == "coach_state":
            self.reload()

    def run_progress(self, data: dict[str, Any]) -> None:
        """A run moved: if it is the one shown, fetch its new points at the next refresh tick.
        Until a person picks a version in the tree, the workbench follows the run in progress."""
        if data.get("version") not in {v["name"] for v in self.versions}:
            self.load_versions()
        if self.following and data.get("version") and data["version"] != self.selected:
            self.selected = data["version"]
            self.load_versions()  # the tree's cursor moves to it, and its detail and curve load
        if self.run_id is None or data["run_id"] == self.run_id or data.get("version") == self.selected:
            if data["run_id"] != self.run_id and data.get("version") == self.selected:
                self.run_id = data["run_id"]
                self.load_run(self.run_id)
            self.curves_dirty = True
        step, total = data.get("step", 0), data.get("total_steps") or "?"
        # Shown at the next tick with the new points: a stream of events costs one repaint a tick.
        self.activity = f"{data['run_id']} {data['state']} step {step}/{total}"

    def reload(self) -> None:
        self.load_versions()
        self.refresh_gates()

    def refresh_gates(self) -> None:
        self.load_gates()

    # -- workers (the app owns the connection) ---------------------------------------------------------
    @work(exclusive=True, group="versions", exit_on_error=False)
    async def load_versions(self) -> None:
        self.versions = await self.evo.call("list_versions")
        if self.selected is None and self.versions:
            self.selected = self.versions[-1]["name"]
        self.query_one(VersionTreeView).set_versions(self.versions, self.selected)
        if self.selected:
            self.load_version(self.selected)

    @work(exclusive=True, group="version", exit_on_error=False)
    async def load_version(self, name: str) -> None:
        detail = await self.evo.call("version", version=name)
        self.query_one("#version-info", Static).update(_version_info(detail))
        runs = [r for r in detail["runs"] if r["kind"] in ("train", "warmup")]
        run_id = runs[-1]["id"] if runs else None
        if run_id != self.run_id or not self.query_one(Curves).series:
            self.run_id = run_id
            self.load_run(run_id)
        self.query_one(DiagnosisView).show(await self.evo.call("diagnosis", version=name))

    @work(exclusive=True, group="metrics", exit_on_error=False)
    async def load_run(self, run_id: str | None) -> None:
        series = await self.evo.call("metrics", run_id=run_id) if run_id else {}
        self.query_one(Curves).show_run(run_id, series)

    @work(exclusive=True, group="metrics-delta", exit_on_error=False)
    async def fetch_new_points(self) -> None:
        curves = self.query_one(Curves)
        if curves.run_id is None:
            return
        curves.extend(await self.evo.call("metrics", run_id=curves.run_id, after_step=curves.last_step))

    @work(exclusive=True, group="gates", exit_on_error=False)
    async def load_gates(self) -> None:
        self.query_one(GatesView).show(await self.evo.call("gates"))

    def _flush_curves(self) -> None:
        if self.activity is not None:
            self.query_one("#activity", Static).update(self.activity)
            self.activity = None
        if self.curves_dirty and self.evo.client is not None:
            self.curves_dirty = False
            self.fetch_new_points()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Worker.StateChanged does not bubble: hand it to the app's one handler (the notice).
        self.evo.on_worker_state_changed(event)

    # -- from the widgets (messages up) -------------------------------------------------------------
    def on_version_selected(self, message: VersionSelected) -> None:
        self.following = False  # a person chose: stay on their version
        if message.version != self.selected:
            self.selected = message.version
            self.load_version(message.version)

    # -- actions ---------------------------------------------------------------------------------------
    def action_metric(self, step: int) -> None:
        self.query_one(Curves).cycle(step)

    def action_reload(self) -> None:
        self.reload()

    def action_gate(self, verb: str) -> None:
        pending = self.query_one(GatesView).pending
        if not pending:
            self.notify("no gate waits")
            return
        gate = pending[0]

        def send(feedback: str) -> None:
            def confirmed(yes: bool | None) -> None:
                if yes:
                    self.post_message(GateAction(gate["id"], verb, feedback))

            what = f"{verb} {gate['id']} ({gate['kind']})" + (f" with: {feedback}" if feedback else "")
            self.app.push_screen(ConfirmScreen(f"{what.capitalize()}?"), confirmed)

        if verb == "revise":
            self.app.push_screen(
                FeedbackScreen(f"Revise {gate['id']}: {gate['question']}"),
                lambda text: send(text) if text else None,
            )
        else:
            send("")

    def action_start(self) -> None:
        def confirmed(yes: bool | None) -> None:
            if yes:
                self.start_coach()

        self.app.push_screen(ConfirmScreen("Start the coach for one more version? (gates ask here)"), confirmed)

    @work(group="coach", exit_on_error=False)
    async def start_coach(self) -> None:
        await self.evo.call("start", versions=1, auto_approve=False)
        self.notify("the coach is running")

    @work(group="coach", exit_on_error=False)
    async def action_stop(self) -> None:
        await self.evo.call("stop")
        self.notify("the coach stops at its next gate or between runs")


def _version_info(v: dict[str, Any]) -> Text:
    text = Text()
    text.append(f"{v['name']}", style="bold")
    text.append(f" {v['state']}")
    if v.get("verdict"):
        text.append(f" · {v['verdict']}")
    change = v.get("change") or {}
    if isinstance(change, str):
        change = json.loads(change)
    for key, c in change.items():
        text.append(f"\nΔ {key}: {c['from']} → {c['to']}", style="cyan")
    if v.get("diff_files"):
        text.append(f"\nfiles: {', '.join(v['diff_files'])}", style="dim")
    if v.get("decision_reason") and v.get("parent"):
        text.append(f"\nwhy: {v['decision_reason']}", style="dim")
    return text
