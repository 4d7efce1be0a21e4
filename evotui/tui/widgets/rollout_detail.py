"""One rollout in full: prompt, completion, reward components, turns and tool calls, and its group.

The widget only renders what the rollout browser hands it (the engine's `rollout` reply); it never
fetches. Everything from the rollout is appended as plain `Text`, never as markup, because prompts
and completions are model text and may contain square brackets that Rich would read as tags.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

#: Characters of a group sibling's completion shown on its one line (the engine sends 120).
SIBLING_PREVIEW = 72


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _section(title: str) -> Text:
    return Text(f"── {title}", style="bold cyan")


def _plain(text: Any) -> Text:
    return Text("" if text is None else str(text))


def _turn_text(turn: Any) -> str:
    """A turn as one readable line: chat turns as `role: content`, anything else as compact JSON."""
    if isinstance(turn, dict) and "content" in turn:
        role = turn.get("role", "?")
        return f"{role}: {turn['content']}"
    return json.dumps(turn, default=str, ensure_ascii=False)


def _header(r: dict[str, Any]) -> Text:
    head = Text()
    head.append(str(r.get("id", "")), style="bold")
    head.append(f"   reward {_number(r.get('reward'))}", style="bold green" if (r.get("reward") or 0) > 0 else "bold")
    head.append(f"   length {_number(r.get('completion_length'))}")
    if r.get("num_turns") is not None:
        head.append(f"   turns {r['num_turns']}")
    if r.get("truncated"):
        head.append("   truncated", style="bold yellow")
    if r.get("task_id") is not None:
        head.append(f"\ntask {r['task_id']}", style="dim")
        if r.get("subset"):
            head.append(f" · subset {r['subset']}", style="dim")
    return head


def _components(components: dict[str, float]) -> RenderableType:
    if not components:
        return Text("  (none recorded)", style="dim")
    table = Table.grid(padding=(0, 2))
    table.add_column(style="cyan")
    table.add_column(justify="right")
    for name, value in components.items():
        table.add_row(f"  {name}", _number(value))
    return table


def _calls(calls: list[dict[str, Any]]) -> RenderableType:
    table = Table.grid(padding=(0, 1))
    for _ in range(4):
        table.add_column()
    for c in calls:
        ok = Text("ok", style="green") if c.get("ok") else Text("FAILED", style="bold red")
        files = ", ".join(c.get("files") or []) or "-"
        args = str(c.get("args") or "")
        table.add_row(f"  turn {c.get('turn')}", Text(str(c.get("tool"))), ok, Text(f"files: {files}"))
        if args:
            table.add_row("", Text(args, style="dim"), "", "")
    return table


def _group(r: dict[str, Any]) -> RenderableType:
    mine = r.get("sample_idx")
    table = Table.grid(padding=(0, 2))
    table.add_column()
    table.add_column(justify="right")
    table.add_column()
    for g in r.get("group") or []:
        here = g.get("sample_idx") == mine
        preview = str(g.get("completion") or "").replace("\n", " ")[:SIBLING_PREVIEW]
        table.add_row(
            Text(f"{'▸' if here else ' '} {g.get('sample_idx')}", style="bold" if here else ""),
            _number(g.get("reward")),
            Text(preview, style="" if here else "dim"),
        )
    return table


def render_rollout(r: dict[str, Any]) -> Group:
    """The whole rollout as one renderable (also what the tests and snapshots see)."""
    parts: list[RenderableType] = [_header(r)]
    parts += [_section("reward components"), _components(r.get("components") or {})]
    parts += [_section("prompt"), _plain(r.get("prompt"))]
    parts += [_section("completion"), _plain(r.get("completion"))]
    turns = r.get("turns")
    if turns:
        parts.append(_section(f"turns ({len(turns)})"))
        parts += [Text(f"  {i}  {_turn_text(t)}") for i, t in enumerate(turns, 1)]
    calls = r.get("calls")
    if calls:
        failed = sum(1 for c in calls if not c.get("ok"))
        parts += [_section(f"tool calls ({len(calls)}, {failed} failed)"), _calls(calls)]
    group = r.get("group") or []
    parts += [_section(f"group ({len(group)} samples)"), _group(r)]
    return Group(*parts)


class RolloutDetail(Static):
    """The selected rollout, or a line that says why there is none."""

    DEFAULT_CSS = """
    RolloutDetail {
        width: 1fr;
        height: auto;
        padding: 0 1;
    }
    """

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rollout: dict[str, Any] | None = None

    def show(self, rollout: dict[str, Any]) -> None:
        self.rollout = rollout
        self.update(render_rollout(rollout))

    def clear(self, reason: str) -> None:
        self.rollout = None
        self.update(Text(reason, style="dim"))
