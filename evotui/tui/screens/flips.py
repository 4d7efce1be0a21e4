"""The flips of a version: the val tasks whose outcome changed against its parent, both answers side
by side.

A verdict says how far a score moved; the flips say on which tasks, and how the answers changed.
A person approving a promotion reads them here (or in the gate's report): a gain whose new right
answers look wrong (a sprayed list, a near miss, a reference that does not match) is seen at a
glance. The engine computes them (`flips`) on the version's primary decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import Worker

if TYPE_CHECKING:
    from evotui.tui.app import EvoApp

#: Characters of a prompt or an answer in a cell.
CELL = 48


def flips_summary(version: str, reply: dict[str, Any]) -> str:
    return (
        f"{version} vs its parent on val ({reply['decoding']}): {reply['to_right']} wrong → right, "
        f"{reply['to_wrong']} right → wrong, of {reply['tasks']} tasks"
    )


def _cell(text: str | None) -> str:
    flat = (text or "").strip().replace("\n", "⏎")
    return flat if len(flat) <= CELL else flat[: CELL - 1] + "…"


class FlipsScreen(Screen[None]):
    """One row per flipped task: which way, the prompt, the parent's answer, the version's, and
    the reference where the domain has one."""

    CSS_PATH = "screens.tcss"
    TITLE = "flips"
    BINDINGS = [
        Binding("r", "reload", "Reload", id="flips.reload"),
        Binding("escape", "back", "Back", id="flips.back"),
    ]

    def __init__(self, version: str | None = None) -> None:
        super().__init__()
        self.version = version
        self.reply: dict[str, Any] | None = None

    @property
    def evo(self) -> EvoApp:
        return cast("EvoApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("loading…", id="flips-status")
        table: DataTable[str] = DataTable(id="flips-table", cursor_type="row", zebra_stripes=True)
        table.add_columns("flip", "task", "prompt", "parent", "this version", "reference")
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#flips-table").focus()
        self.action_reload()

    def action_reload(self) -> None:
        if self.version is None:
            self._status("select a version in the workbench first")
            return
        self.load(self.version)

    def action_back(self) -> None:
        self.app.pop_screen()

    @work(exclusive=True, group="flips.load", exit_on_error=False)
    async def load(self, version: str) -> None:
        self._status(f"{version}: loading…")
        reply: dict[str, Any] = await self.evo.call("flips", version=version)
        self.reply = reply
        table = self.query_one("#flips-table", DataTable)
        table.clear()
        for f in reply["examples"]:
            way = "→ right" if f["direction"] == "to_right" else "→ wrong"
            table.add_row(
                way, f["task"], _cell(f["prompt"]), _cell(f["parent"]), _cell(f["child"]), _cell(f["reference"])
            )
        self._status(flips_summary(version, reply))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Worker.StateChanged does not bubble, so the app's one handler (the notice) is called from here.
        self.evo.on_worker_state_changed(event)
        if event.worker.error is not None:
            self._status(f"no flips for {self.version}: it needs an evaluation and a parent with one (r retries)")

    def _status(self, text: str) -> None:
        self.query_one("#flips-status", Static).update(text)
