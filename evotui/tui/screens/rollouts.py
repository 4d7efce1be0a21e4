"""The rollout browser: filter, page through and read the rollouts of every run.

Filtering and paging happen in the engine (SQL over the store): one `page_rollouts` call per page
of `PAGE_SIZE` rows, so a run with a million rollouts costs the same as one with six. The engine
counts the matches only for the first page (offset 0), so the screen keeps that total while paging.
The highlighted row's rollout is fetched whole (`rollout`) and handed to the `RolloutDetail` widget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from rich.cells import cell_len
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Header, Input, Label, Select, Static
from textual.worker import Worker

from engine.api.protocol import VERSION_NAME
from evotui.tui.widgets.page_table import Cell, Column, PageTable
from evotui.tui.widgets.rollout_detail import RolloutDetail

if TYPE_CHECKING:
    from evotui.tui.app import EvoApp

#: Rows of one page (one `page_rollouts` call).
#: How long the cursor rests on a row before its detail is fetched.
DETAIL_DELAY_SECONDS = 0.15
PAGE_SIZE = 50
#: Characters of the completion shown in the table (the engine sends at most 120).
COMPLETION_PREVIEW = 60

_NUMBER = r"-?(?:\d+\.?\d*|\.\d+)"
_RANGE = re.compile(rf"^(?P<lo>{_NUMBER})?\s*-\s*(?P<hi>{_NUMBER})?$")
_SINGLE = re.compile(rf"^{_NUMBER}$")

_ANY = "any"
_TRISTATE = [("any", _ANY), ("yes", "yes"), ("no", "no")]


class FilterError(ValueError):
    """A filter field that cannot be read; the message names the field and shows what to write."""

    def __init__(self, field_id: str, message: str) -> None:
        self.field_id = field_id
        super().__init__(message)


def parse_range(text: str, field: str, field_id: str, whole: bool) -> tuple[float | None, float | None]:
    """`"2-10"`, `"2-"`, `"-10"` or `"5"` (also with `..`: `"-1..0"`) -> (min, max); either may be None.

    A leading minus with nothing before it means "up to" (`-10` is "at most 10"), since steps are
    never negative and "up to" is the commoner question; write `-0.5..-0.5` for a negative exact value.
    """
    text = text.strip().replace("..", "-")
    if not text:
        return None, None
    if m := _RANGE.match(text):
        lo, hi = m["lo"], m["hi"]
    elif _SINGLE.match(text):
        lo = hi = text
    else:
        raise FilterError(field_id, f"{field} {text!r}: write min-max, e.g. 2-10, 2- (at least) or -10 (at most)")
    try:
        convert = int if whole else float
        out = (convert(lo) if lo else None, convert(hi) if hi else None)
    except ValueError:
        raise FilterError(field_id, f"{field} {text!r}: steps are whole numbers, e.g. 2-10") from None
    if out[0] is not None and out[1] is not None and out[0] > out[1]:
        raise FilterError(field_id, f"{field} {text!r}: the minimum is above the maximum")
    return out


def build_filter(
    version: str, steps: str, rewards: str, search: str, split: str, group: str, truncated: str, used_history: str
) -> dict[str, Any]:
    """The filter bar's text -> the `RolloutFilter` params of `page_rollouts` (only the fields set)."""
    out: dict[str, Any] = {}
    if version.strip():
        if not re.fullmatch(VERSION_NAME, version.strip()):
            raise FilterError("f-version", f"version {version.strip()!r}: write a version name like v3")
        out["version"] = version.strip()
    step_min, step_max = parse_range(steps, "step range", "f-step", whole=True)
    reward_min, reward_max = parse_range(rewards, "reward range", "f-reward", whole=False)
    for key, value in (
        ("step_min", step_min),
        ("step_max", step_max),
        ("reward_min", reward_min),
        ("reward_max", reward_max),
    ):
        if value is not None:
            out[key] = value
    if search.strip():
        if len(search.strip()) > 200:
            raise FilterError("f-search", "search text: at most 200 characters")
        out["search"] = search.strip()
    if split != _ANY:
        out["split"] = split
    if group != _ANY:
        out["group"] = group
    if truncated != _ANY:
        out["truncated"] = truncated == "yes"
    if used_history != _ANY:
        out["used_history"] = used_history == "yes"
    return out


def fill_table(
    table: DataTable[Any],
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[str | Text]],
    keys: Sequence[str] | None = None,
) -> None:
    """Replace a table's columns and rows, each column as wide as its widest cell.

    Why not auto-width columns: a DataTable measures those on its own idle event, and Textual 8.2.8
    keys its line caches on a counter that this measuring does not bump, so lines drawn before it
    (a loaded machine, a page that arrives between frames) stay cut to the header's widths until the
    cursor passes over them. Widths known up front leave nothing to measure later.
    (Shared with the memory screen.)
    """
    widths = [cell_len(label) for _, label in columns]
    for row in rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], cell_len(value.plain if isinstance(value, Text) else value))
    current = [(str(c.key.value), c.width) for c in table.columns.values()]
    if [k for k, _ in current] == [k for k, _ in columns] and all(
        have >= need for (_, have), need in zip(current, widths, strict=True)
    ):
        # Same columns, wide enough: replace the rows only. Rebuilding the columns on every page
        # re-lays out the table and drops every cached line (most of a page's cost).
        table.clear()
    else:
        widths = [max(w, have) for w, (_, have) in zip(widths, current or [("", 0)] * len(widths), strict=True)]
        table.clear(columns=True)
        for (key, label), width in zip(columns, widths, strict=True):
            table.add_column(label, width=width, key=key)
    table.add_rows(rows) if keys is None else [
        table.add_row(*row, key=key) for row, key in zip(rows, keys, strict=True)
    ]


def rows_label(offset: int, shown: int, total: int | None) -> str:
    """`rows 51-100 of 1,234` (the total is known from the first page's count)."""
    of = f" of {total:,}" if total is not None else ""
    if shown == 0:
        return f"no rows{of}" if offset == 0 else f"no rows after {offset:,}{of}"
    return f"rows {offset + 1:,}-{offset + shown:,}{of}"


#: The table's columns (numbers right-aligned).
COLUMNS = [
    Column("run", "run"),
    Column("step", "step", "right"),
    Column("split", "split"),
    Column("group", "grp", "right"),
    Column("sample", "smp", "right"),
    Column("reward", "reward", "right"),
    Column("length", "len", "right"),
    Column("truncated", "trunc"),
    Column("completion", "completion"),
]


def table_row(r: dict[str, Any]) -> list[Cell]:
    """One `page_rollouts` row as the table's cells."""
    preview = str(r.get("completion") or "").replace("\n", " ")[:COMPLETION_PREVIEW]
    reward = r.get("reward")
    return [
        str(r["run_id"]),
        str(r["step"]),
        str(r["split"]),
        str(r["group_id"]),
        str(r["sample_idx"]),
        "-" if reward is None else f"{reward:.3f}",
        str(r.get("completion_length") or "-"),
        Text("yes", style="bold yellow") if r.get("truncated") else "",
        preview,
    ]


class RolloutsScreen(Screen[None]):
    """A filter bar, a page of rollouts, and the highlighted rollout in full."""

    CSS_PATH = "screens.tcss"
    TITLE = "rollouts"
    # Side by side when there is room for a readable table and a readable detail.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]
    BINDINGS = [
        Binding("n", "next_page", "Next page", id="rollouts.next_page"),
        Binding("p", "previous_page", "Prev page", id="rollouts.previous_page"),
        # Priority: the table's own pagedown only moves its cursor within the 50 rows on screen.
        Binding("pagedown", "next_page", "Next page", id="rollouts.next_page_key", show=False, priority=True),
        Binding("pageup", "previous_page", "Prev page", id="rollouts.previous_page_key", show=False, priority=True),
        Binding("f", "apply_filters", "Filter", id="rollouts.apply_filters"),
        Binding("slash", "focus_filters", "Edit filters", id="rollouts.focus_filters", show=False),
        Binding("z", "zoom", "Zoom detail", id="rollouts.zoom"),
        Binding("r", "reload", "Reload", id="rollouts.reload", show=False),
        Binding("escape", "back", "Back", id="rollouts.back"),
    ]

    def __init__(self, version: str | None = None) -> None:
        super().__init__()
        self.version = version
        self.filter: dict[str, Any] = {"version": version} if version else {}
        self.page_offset = 0
        self.total: int | None = None
        self.rows: list[dict[str, Any]] = []
        self.detail_id: str | None = None
        self._detail_timer: Timer | None = None

    @property
    def evo(self) -> EvoApp:
        return cast("EvoApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="rollout-filters", classes="filters"):
            with Horizontal(classes="filter-row"):
                yield Label("version", classes="filter-label")
                yield Input(self.version or "", placeholder="any", id="f-version", compact=True)
                yield Label("step", classes="filter-label")
                yield Input(placeholder="min-max", id="f-step", compact=True)
                yield Label("reward", classes="filter-label")
                yield Input(placeholder="min-max", id="f-reward", compact=True)
                yield Label("find", classes="filter-label")
                yield Input(placeholder="text in prompt or completion", id="f-search", compact=True)
            with Horizontal(classes="filter-row"):
                yield Label("split", classes="filter-label")
                yield self._select(
                    "f-split", [("any", _ANY), ("train", "train"), ("val", "val"), ("clean", "clean"), ("test", "test")]
                )
                yield Label("group", classes="filter-label")
                yield self._select("f-group", [("any", _ANY), ("dead", "dead"), ("live", "live")])
                yield Label("truncated", classes="filter-label")
                yield self._select("f-truncated", _TRISTATE)
                yield Label("history", classes="filter-label")
                yield self._select("f-history", _TRISTATE)
        with Horizontal(id="rollouts-body"):
            yield PageTable(COLUMNS, id="rollout-table")
            # Scroll containers refuse to be maximized unless asked (ALLOW_MAXIMIZE = False).
            with VerticalScroll(id="rollout-detail-box", can_maximize=True):
                yield RolloutDetail("", id="rollout-detail")
        yield Static("loading…", id="rollout-status")
        yield Footer()

    @staticmethod
    def _select(widget_id: str, options: list[tuple[str, str]]) -> Select[str]:
        return Select(options, value=_ANY, allow_blank=False, id=widget_id, compact=True, classes="filter-select")

    def on_mount(self) -> None:
        self.query_one(RolloutDetail).clear("no rollout selected")
        self.query_one("#rollout-table", PageTable).focus()
        self.load_page(0)

    # -- reading the filter bar -----------------------------------------------------------------
    def read_filter(self) -> dict[str, Any]:
        def text(widget_id: str) -> str:
            return self.query_one(f"#{widget_id}", Input).value

        def choice(widget_id: str) -> str:
            return str(self.query_one(f"#{widget_id}", Select).value)

        return build_filter(
            text("f-version"),
            text("f-step"),
            text("f-reward"),
            text("f-search"),
            choice("f-split"),
            choice("f-group"),
            choice("f-truncated"),
            choice("f-history"),
        )

    def apply_filters(self, force: bool = False) -> None:
        """Read the bar and load the first page; a bar that did not change reloads only when forced
        (a Select announces its initial value once mounted, which must not cost a request)."""
        for field in self.query(".filters Input"):
            field.remove_class("-invalid")
        try:
            new = self.read_filter()
        except FilterError as exc:
            self.query_one(f"#{exc.field_id}", Input).add_class("-invalid")
            self.notify(str(exc), title="filter not applied", severity="error", timeout=8)
            return
        if new == self.filter and not force:
            return
        self.filter = new
        self.total = None
        self.load_page(0)

    @on(Input.Submitted, ".filters Input")
    def _input_submitted(self) -> None:
        self.apply_filters(force=True)

    @on(Select.Changed, ".filters Select")
    def _select_changed(self) -> None:
        # A Select is one deliberate choice, so it applies at once (no `f` needed).
        self.apply_filters()

    # -- fetching -------------------------------------------------------------------------------
    @work(exclusive=True, group="rollouts.page", exit_on_error=False)
    async def load_page(self, offset: int) -> None:
        self.page_offset = offset
        self._status(f"loading {self._expected_rows(offset)}…")
        page = await self.evo.call("page_rollouts", filter=self.filter, offset=offset, limit=PAGE_SIZE)
        if page.get("total") is not None:
            self.total = int(page["total"])
        self.rows = page["rows"]
        self._fill_table()

    @work(exclusive=True, group="rollouts.detail", exit_on_error=False)
    async def load_detail(self, rollout_id: str) -> None:
        rollout = await self.evo.call("rollout", rollout_id=rollout_id)
        self.query_one(RolloutDetail).show(rollout)
        self.query_one("#rollout-detail-box", VerticalScroll).scroll_home(animate=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Worker.StateChanged does not bubble, so the app's one handler (the notice) is called from here.
        self.evo.on_worker_state_changed(event)
        if event.worker.group == "rollouts.page" and event.worker.error is not None:
            self._status(f"could not load {self._expected_rows(self.page_offset)}; r retries")

    # -- showing --------------------------------------------------------------------------------
    def _fill_table(self) -> None:
        table = self.query_one("#rollout-table", PageTable)
        self.detail_id = None
        table.show([table_row(r) for r in self.rows], [r["id"] for r in self.rows])  # highlights row 0
        self._status(self._page_text())
        if not self.rows:
            self.query_one(RolloutDetail).clear("no rollout matches these filters")

    def _expected_rows(self, offset: int) -> str:
        """The rows a page being fetched will hold, as far as the last count knows."""
        shown = PAGE_SIZE if self.total is None else max(0, min(PAGE_SIZE, self.total - offset))
        return rows_label(offset, shown, self.total)

    def _page_text(self) -> str:
        label = rows_label(self.page_offset, len(self.rows), self.total)
        if self.total:
            pages = (self.total + PAGE_SIZE - 1) // PAGE_SIZE
            label += f"  ·  page {self.page_offset // PAGE_SIZE + 1} of {pages:,}"
        return label

    def _status(self, text: str) -> None:
        # The status line is one row whatever it says: no layout for it.
        self.query_one("#rollout-status", Static).update(text, layout=False)

    def _show_detail(self, rollout_id: str) -> None:
        """Load the detail once the cursor rests: paging or scrolling through rows does not fetch
        and lay out a detail for every row it passes (a page costs a table, not a table and a
        detail)."""
        if rollout_id == self.detail_id:
            return
        self.detail_id = rollout_id
        if self._detail_timer is not None:
            self._detail_timer.stop()
        self._detail_timer = self.set_timer(DETAIL_DELAY_SECONDS, lambda: self._load_rested(rollout_id))

    def _load_rested(self, rollout_id: str) -> None:
        if rollout_id == self.detail_id:
            self.load_detail(rollout_id)

    @on(PageTable.RowHighlighted, "#rollout-table")
    def _row_highlighted(self, event: PageTable.RowHighlighted) -> None:
        self._show_detail(event.key)

    @on(PageTable.RowSelected, "#rollout-table")
    def _row_selected(self) -> None:
        self.query_one("#rollout-detail-box").focus()

    # -- actions --------------------------------------------------------------------------------
    def action_next_page(self) -> None:
        if self.total is not None and self.page_offset + PAGE_SIZE >= self.total:
            self.notify("this is the last page", timeout=2)
            return
        self.load_page(self.page_offset + PAGE_SIZE)

    def action_previous_page(self) -> None:
        if self.page_offset == 0:
            self.notify("this is the first page", timeout=2)
            return
        self.load_page(max(0, self.page_offset - PAGE_SIZE))

    def action_apply_filters(self) -> None:
        self.apply_filters(force=True)

    def action_focus_filters(self) -> None:
        self.query_one("#f-search", Input).focus()

    def action_reload(self) -> None:
        self.detail_id = None
        self.load_page(self.page_offset)

    def action_zoom(self) -> None:
        if self.maximized is not None:
            self.minimize()
        else:
            box = self.query_one("#rollout-detail-box", VerticalScroll)
            self.maximize(box, container=False)
            box.focus()

    def action_back(self) -> None:
        if self.maximized is not None:
            self.minimize()
        else:
            self.dismiss()
