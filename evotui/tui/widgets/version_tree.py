"""The version tree: states, verdicts and scores; highlighting a version selects it."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Tree

from evotui.tui.messages import VersionSelected

STATE_STYLE = {"promoted": "green", "rejected": "red", "failed": "red", "training": "yellow", "pruned": "dim"}


def version_label(v: dict[str, Any]) -> Text:
    text = Text(v["name"], style="bold")
    text.append(f" {v['state']}", style=STATE_STYLE.get(v["state"], ""))
    if v.get("val_greedy") is not None:
        text.append(f" {v['val_greedy']:.3f}/{v['val_sampled'] or 0:.3f}")
    if v.get("verdict") and v.get("parent"):
        text.append(f" {v['verdict']}", style="italic dim")
    return text


class VersionTreeView(Tree[str]):
    """Rebuilt from `list_versions` rows by `set_versions`; keeps the highlighted version."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("versions", **kw)
        self.show_root = False
        self.guide_depth = 2
        #: While set, the tree is being rebuilt and its cursor moved to this version: highlights
        #: on the way are the rebuild's, not a person's.
        self._settling: str | None = None

    def set_versions(self, rows: list[dict[str, Any]], selected: str | None) -> None:
        self.clear()
        nodes = {}
        for v in rows:  # parents come before children (versions are numbered in creation order)
            parent = nodes.get(v["parent"], self.root)
            nodes[v["name"]] = parent.add(version_label(v), data=v["name"], expand=True)
        for node in nodes.values():
            if not node.children:
                node.allow_expand = False
        if selected in nodes:
            self._settling = selected
            # Lines are laid out on refresh: before it, a node has no line to move to.
            self.call_after_refresh(self.move_cursor, nodes[selected])

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[str]) -> None:
        if event.node.data is None:
            return
        if self._settling is not None:
            if event.node.data == self._settling:
                self._settling = None
            return
        self.post_message(VersionSelected(event.node.data))
