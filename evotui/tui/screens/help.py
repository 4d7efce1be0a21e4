"""The help screen: every key of the app and of the screen below it."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", id="help.close")]

    def __init__(self, app: App[None]) -> None:
        super().__init__()
        self._owner = app

    def compose(self) -> ComposeResult:
        yield Static("[b]Keys[/b]  (escape closes)", id="help-title")
        yield DataTable(id="help-keys", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("key", "what", "where")
        below = self._owner.screen_stack[-2] if len(self._owner.screen_stack) > 1 else None
        seen: set[tuple[str, str]] = set()
        for where, source in (("everywhere", self._owner), ("this screen", below)):
            if source is None:
                continue
            for binding in source.BINDINGS:
                if isinstance(binding, Binding):  # hidden ones too: help lists every key
                    row = (binding.key, binding.description)
                    if row not in seen:
                        seen.add(row)
                        table.add_row(binding.key.replace(",", " / "), binding.description, where)
