"""What changed between two versions: the git diff of their branches in the version tree.

The versions to compare default to the selected version's parent (a) and the version itself (b),
which is the one question a person asks most ("what did this intervention change?"); any two
versions can be picked instead. The diff is computed by the engine (`diff`), never by opening
the repository here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.syntax import Syntax
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, ScrollableContainer
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, Select, Static
from textual.worker import Worker

if TYPE_CHECKING:
    from evotui.tui.app import EvoApp


def diff_summary(a: str, b: str, diff: str) -> str:
    """`v0 → v1: 2 files, +3 -1` from the unified diff text."""
    files = added = removed = 0
    for line in diff.splitlines():
        if line.startswith("diff --git"):
            files += 1
        elif line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    if files == 0:
        return f"{a} → {b}: no differences"
    return f"{a} → {b}: {files} file{'s' if files != 1 else ''}, +{added} -{removed}"


def default_pair(versions: list[dict[str, Any]], version: str | None) -> tuple[str, str] | None:
    """(parent, version) for the given version, or for the newest when it is unknown or None."""
    by_name = {v["name"]: v for v in versions}
    if not versions:
        return None
    b = version if version in by_name else versions[-1]["name"]
    return by_name[b].get("parent") or b, b


class DiffScreen(Screen[None]):
    """Two version pickers and the diff between them, highlighted."""

    CSS_PATH = "screens.tcss"
    TITLE = "diff"
    BINDINGS = [
        Binding("a", "pick('a')", "From", id="diff.pick_a"),
        Binding("b", "pick('b')", "To", id="diff.pick_b"),
        Binding("s", "swap", "Swap", id="diff.swap"),
        Binding("r", "reload", "Reload", id="diff.reload"),
        Binding("escape", "back", "Back", id="diff.back"),
    ]

    def __init__(self, version: str | None = None) -> None:
        super().__init__()
        self.version = version
        self.pair: tuple[str, str] | None = None
        self.diff_text = ""

    @property
    def evo(self) -> EvoApp:
        return cast("EvoApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="diff-pickers", classes="filters filter-row"):
            yield Label("from", classes="filter-label")
            yield Select[str]([], prompt="version", id="diff-a", compact=True, classes="filter-select")
            yield Label("to", classes="filter-label")
            yield Select[str]([], prompt="version", id="diff-b", compact=True, classes="filter-select")
        yield Static("loading versions…", id="diff-status")
        with ScrollableContainer(id="diff-box"):
            yield Static("", id="diff-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#diff-box").focus()
        self.load_versions()

    # -- fetching -------------------------------------------------------------------------------
    @work(exclusive=True, group="diff.versions", exit_on_error=False)
    async def load_versions(self) -> None:
        versions: list[dict[str, Any]] = await self.evo.call("list_versions")
        pair = default_pair(versions, self.version)
        if pair is None:
            self._status("no versions yet")
            return
        options = [(v["name"], v["name"]) for v in versions]
        for side, name in zip(("a", "b"), pair, strict=True):
            select = self._select(side)
            select.set_options(options)
            select.value = name
        self.compare(*pair)

    @work(exclusive=True, group="diff.diff", exit_on_error=False)
    async def load_diff(self, a: str, b: str) -> None:
        self._status(f"{a} → {b}: loading…")
        reply = await self.evo.call("diff", a=a, b=b)
        self.diff_text = reply["diff"]
        text = self.query_one("#diff-text", Static)
        if self.diff_text.strip():
            text.update(Syntax(self.diff_text, "diff", theme="monokai", background_color="default"))
        else:
            why = "pick two different versions (a / b)" if a == b else "the two versions have the same files"
            text.update(Text(why, style="dim"))
        self._status(diff_summary(a, b, self.diff_text))
        self.query_one("#diff-box", ScrollableContainer).scroll_home(animate=False)

    def compare(self, a: str, b: str, force: bool = False) -> None:
        """Load the diff of a and b unless it is the one on screen (each picker announces its value)."""
        if (a, b) != self.pair or force:
            self.pair = (a, b)
            self.load_diff(a, b)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Worker.StateChanged does not bubble, so the app's one handler (the notice) is called from here.
        self.evo.on_worker_state_changed(event)
        if event.worker.error is not None:
            self._status("could not load the diff; r retries")

    # -- the pickers ----------------------------------------------------------------------------
    def _select(self, side: str) -> Select[str]:
        return cast("Select[str]", self.query_one(f"#diff-{side}", Select))

    def _picked(self) -> tuple[str, str] | None:
        a, b = self._select("a").value, self._select("b").value
        if isinstance(a, str) and isinstance(b, str):
            return a, b
        return None

    @on(Select.Changed, "#diff-pickers Select")
    def _picker_changed(self) -> None:
        picked = self._picked()
        if picked is not None and self.pair is not None:
            self.compare(*picked)

    def _status(self, text: str) -> None:
        self.query_one("#diff-status", Static).update(text)

    # -- actions --------------------------------------------------------------------------------
    def action_pick(self, side: str) -> None:
        self._select(side).focus()

    def action_swap(self) -> None:
        picked = self._picked()
        if picked is None:
            return
        a, b = picked
        self._select("a").value, self._select("b").value = b, a
        self.compare(b, a)

    def action_reload(self) -> None:
        picked = self._picked()
        if picked is None:
            self.load_versions()
        else:
            self.compare(*picked, force=True)

    def action_back(self) -> None:
        self.dismiss()
