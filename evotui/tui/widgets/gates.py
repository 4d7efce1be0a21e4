"""Pending gates with their reports; the first one is the one the keys answer."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static


def report_lines(report: Any) -> list[str]:
    if isinstance(report, dict) and "proposals" in report:
        return [f"- {p['title']}" for p in report["proposals"]] or ["(no proposals)"]
    if isinstance(report, list):
        return [f"- {r['title']}: {r['backtest']['summary']}" for r in report]
    if isinstance(report, dict) and "verdict" in report:
        return [report["verdict"], f"proposed: {report['decision']}"]
    if isinstance(report, dict) and "rules" in report:
        return [f"{r['rule']}: {r['explanation']}" for r in report["rules"]] or ["no rule fired"]
    return []


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
        for line in report_lines(g["report"].get("report")):
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
