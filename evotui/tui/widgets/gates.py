"""Pending gates with their reports; the first one is the one the keys answer."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from engine.coach.reports import gate_report_lines


def gates_text(gates: list[dict[str, Any]]) -> Text:
    pending = [g for g in gates if g["state"] == "pending"]
    if not pending:
        return Text("no gate waits", style="dim")
    text = Text()
    for i, g in enumerate(pending):
        text.append(
            f"{g['id']} {g['kind']}{' (forced)' if g['forced'] else ''}\n", style="bold yellow" if i == 0 else ""
        )
        text.append(f"{g['question']}\n")
        for line in gate_report_lines(g["report"].get("report"), detail=False):
            text.append(f"  {line}\n", style="dim")
    text.append("a approve · e revise · x abort", style="italic")
    return text


class GatesView(Static):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.pending: list[dict[str, Any]] = []

    def show(self, gates: list[dict[str, Any]]) -> None:
        self.pending = [g for g in gates if g["state"] == "pending"]
        self.update(gates_text(gates))
