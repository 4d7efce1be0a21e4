"""The diagnosis of the selected version: rules that fired, then findings by layer and severity."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}


def diagnosis_text(d: dict[str, Any] | None, limit: int = 40) -> Text:
    if not d:
        return Text("no diagnosis yet", style="dim")
    text = Text()
    text.append(f"{d['run_id']}\n", style="bold")
    if not d["rules"]:
        text.append("no rule fired\n", style="green")
    for r in d["rules"]:
        text.append(f"{r['rule']} ", style=SEVERITY_STYLE.get(r["severity"], ""))
        text.append(f"{r['explanation']}\n")
    layer = None
    for f in d["findings"][:limit]:
        if f["layer"] != layer:
            layer = f["layer"]
            text.append(f"\n{layer}\n", style="bold underline")
        value = "—" if f["value"] is None else f"{f['value']:.3g}"
        text.append(f" {f['severity'][0].upper()} ", style=SEVERITY_STYLE.get(f["severity"], ""))
        text.append(f"{f['metric'].split('.', 1)[-1]} {value}\n")
    return text


class DiagnosisView(Static):
    def show(self, diagnosis: dict[str, Any] | None) -> None:
        self.update(diagnosis_text(diagnosis))
