"""The coach's memory: skill cards, case memory, the version ledger and the retrieval trace.

One `memory` call loads all four (they are small: one row per version, case, card or planning
round), so switching tabs never waits on the engine; `r` fetches them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static, TabbedContent, TabPane
from textual.worker import Worker

from evotui.tui.screens.rollouts import fill_table

if TYPE_CHECKING:
    from evotui.tui.app import EvoApp

#: The columns of each tab's table.
COLUMNS = {
    "skills": ("id", "trigger", "template", "domains", "validations"),
    "cases": ("version", "signature", "kind", "template", "verdict", "decision", "outcome"),
    "ledger": ("version", "parent", "kind", "factor", "state", "verdict", "reason"),
    "retrievals": ("round", "source", "query", "hits", "adopted"),
}

#: Longest text in a table cell; the full text of a skill is in the card below its table.
CELL_CHARS = 60


def cell(value: Any, limit: int = CELL_CHARS) -> str:
    """A table cell: lists joined, None as "-", long text cut with an ellipsis."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | tuple):
        value = ", ".join(str(v) for v in value)
    text = str(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def card_text(card: dict[str, Any]) -> RenderableType:
    """A skill card's title, outcome, validations and body (what the table row cannot hold)."""
    head = Text()
    head.append(f"{card.get('title', card.get('id', ''))}\n", style="bold")
    head.append("expected: ", style="dim")
    head.append(f"{card.get('expected_outcome', '')}\n")
    changes = (card.get("intervention") or {}).get("changes")
    if changes:
        head.append("changes: ", style="dim")
        head.append(", ".join(f"{k} = {v}" for k, v in changes.items()) + "\n")
    validations = card.get("validation") or []
    head.append(f"validated {len(validations)} time(s)\n", style="bold cyan")
    for v in validations:
        rest = {k: x for k, x in v.items() if k not in ("version", "parent", "verdict")}
        extra = ", ".join(f"{k} {cell(x, 24)}" for k, x in rest.items())
        head.append(f"  {v.get('version')} from {v.get('parent') or '-'}: {v.get('verdict')}")
        head.append(f"  {extra}\n" if extra else "\n", style="dim")
    body = str(card.get("body") or "").strip()
    return Group(head, Text(body) if body else Text("(no body)", style="dim"))


def _validations(entries: list[dict[str, Any]]) -> str:
    """How many versions validated a card; those flagged since are retracted (a card with none
    standing is never retrieved)."""
    retracted = sum(1 for v in entries if v.get("retracted"))
    return f"{len(entries)}, {retracted} retracted" if retracted else str(len(entries))


def _case_value(case: dict[str, Any], key: str) -> Any:
    if key == "decision" and case.get("retracted"):
        return f"{case['decision']} (retracted: {case['retracted']})"
    return case.get(key)


class MemoryScreen(Screen[None]):
    """Four tabs over one `memory` reply; 1-4 switch tabs, r reloads."""

    CSS_PATH = "screens.tcss"
    TITLE = "memory"
    BINDINGS = [
        Binding("1", "tab('skills')", "Skills", id="memory.skills"),
        Binding("2", "tab('cases')", "Cases", id="memory.cases"),
        Binding("3", "tab('ledger')", "Ledger", id="memory.ledger"),
        Binding("4", "tab('retrievals')", "Retrievals", id="memory.retrievals"),
        Binding("r", "reload", "Reload", id="memory.reload"),
        Binding("escape", "back", "Back", id="memory.back"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, Any] = {}

    @property
    def evo(self) -> EvoApp:
        return cast("EvoApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(id="memory-tabs", initial="skills"):
            with TabPane("1 Skills", id="skills"):
                yield Static("", id="skills-note", classes="tab-note")
                yield DataTable(id="skills-table", cursor_type="row", zebra_stripes=True)
                with VerticalScroll(id="skill-card-box"):
                    yield Static("", id="skill-card")
            with TabPane("2 Cases", id="cases"):
                yield Static("", id="cases-note", classes="tab-note")
                yield DataTable(id="cases-table", cursor_type="row", zebra_stripes=True)
            with TabPane("3 Ledger", id="ledger"):
                yield Static("", id="ledger-note", classes="tab-note")
                yield DataTable(id="ledger-table", cursor_type="row", zebra_stripes=True)
            with TabPane("4 Retrievals", id="retrievals"):
                yield Static("", id="retrievals-note", classes="tab-note")
                yield DataTable(id="retrievals-table", cursor_type="row", zebra_stripes=True)
        yield Static("loading…", id="memory-status")
        yield Footer()

    def on_mount(self) -> None:
        for tab in COLUMNS:
            self._rows(tab, [])
        self.table("skills").focus()
        self.load()

    def table(self, tab: str) -> DataTable[Any]:
        return self.query_one(f"#{tab}-table", DataTable)

    # -- fetching -------------------------------------------------------------------------------
    @work(exclusive=True, group="memory.load", exit_on_error=False)
    async def load(self) -> None:
        self._status("loading…")
        self.data = await self.evo.call("memory")
        self._fill()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Worker.StateChanged does not bubble, so the app's one handler (the notice) is called from here.
        self.evo.on_worker_state_changed(event)
        if event.worker.error is not None:
            self._status("could not load the memory; r retries")

    # -- showing --------------------------------------------------------------------------------
    def _fill(self) -> None:
        d = self.data
        skills, cases, ledger, retrievals = d["skills"], d["cases"], d["ledger"], d["retrievals"]
        self._rows(
            "skills",
            [
                (
                    c["id"],
                    cell(c.get("trigger") or ["(general)"]),
                    cell((c.get("intervention") or {}).get("template") or (c.get("intervention") or {}).get("kind")),
                    cell(c.get("domains")),
                    _validations(c.get("validation") or []),
                )
                for c in skills
            ],
            [c["id"] for c in skills],
        )
        problems = d.get("skill_problems") or []
        note = f"{len(skills)} card(s)" if skills else "no skill cards yet: a promoted version writes one"
        if problems:
            note += f"; {len(problems)} unreadable: " + "; ".join(problems)
        self._note("skills", note)
        if skills:
            self._show_card(skills[0]["id"])
        else:
            self.query_one("#skill-card", Static).update("")
        case_keys = ("version", "signature", "kind", "template", "verdict", "decision", "outcome")
        self._rows("cases", [tuple(cell(_case_value(c, k)) for k in case_keys) for c in cases])
        self._note("cases", f"{len(cases)} case(s)" if cases else "no cases yet: each decided version adds one")
        ledger_keys = ("name", "parent", "kind", "factor", "state", "verdict", "reason")
        self._rows("ledger", [tuple(cell(v.get(k)) for k in ledger_keys) for v in ledger])
        self._note("ledger", f"{len(ledger)} version(s), oldest first")
        self._rows(
            "retrievals",
            [
                (
                    cell(r.get("round")),
                    cell(r.get("source")),
                    cell(r.get("query")),
                    str(len(r.get("hits") or [])),
                    cell(r.get("adopted")),
                )
                for r in retrievals
            ],
        )
        self._note(
            "retrievals",
            f"{len(retrievals)} retrieval(s)" if retrievals else "no retrievals yet: the coach records one per round",
        )
        self._status(
            f"{len(skills)} skills · {len(cases)} cases · {len(ledger)} versions · {len(retrievals)} retrievals"
        )

    def _rows(self, tab: str, rows: list[tuple[str, ...]], keys: list[str] | None = None) -> None:
        fill_table(self.table(tab), [(name, name) for name in COLUMNS[tab]], rows, keys)

    def _note(self, tab: str, text: str) -> None:
        self.query_one(f"#{tab}-note", Static).update(Text(text))

    def _status(self, text: str) -> None:
        self.query_one("#memory-status", Static).update(text)

    def _show_card(self, card_id: str) -> None:
        for card in self.data.get("skills", []):
            if card["id"] == card_id:
                self.query_one("#skill-card", Static).update(card_text(card))

    @on(DataTable.RowHighlighted, "#skills-table")
    def _skill_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self._show_card(event.row_key.value)

    # -- actions --------------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self.table(tab).focus()

    def action_reload(self) -> None:
        self.load()

    def action_back(self) -> None:
        self.dismiss()
