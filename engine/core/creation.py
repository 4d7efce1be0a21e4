"""Versions come into being: v0 at the workspace's commit, and a child from its `VersionPlan` (one
intervention on its parent, with its hypothesis), committed to the version tree and mirrored in
the store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import tomli_w

from engine.store import Store, VersionRecord
from engine.versions import VersionTree

BASE = "v0"
VERSION_FILE = "version.toml"


@dataclass(frozen=True)
class VersionPlan:
    """A proposed child version: its change and the record of why."""

    parent: str
    name: str
    files: dict[str, str]
    kind: str
    factor: str
    change: dict[str, Any]
    hypothesis: str
    success_criterion: str
    rollback: str
    round: int | None = None
    template: str | None = None
    source: str | None = None
    evidence: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        if not self.change:
            return f"{self.name}: GRPO from {self.parent} with its recipe"
        changes = ", ".join(f"{k} {v['from']!r} -> {v['to']!r}" for k, v in self.change.items())
        return f"{self.name}: {changes}"


def create_base(store: Store, tree: VersionTree) -> None:
    """v0 in the store (and in the version tree, unless an engine that stopped made its branch)."""
    sha = tree.commit_of(BASE).hexsha if tree.exists(BASE) else tree.create_base(BASE)
    store.add_version(BASE, None, tree.branch(BASE), sha)
    store.add_event("version_created", {"parent": None}, version=BASE)


def create_version(store: Store, tree: VersionTree, plan: VersionPlan) -> VersionRecord:
    """The plan's child: a branch of its own with the plan's files and its `version.toml`, and the
    version with its intervention in the store."""
    message = f"{plan.title}\n\nHypothesis: {plan.hypothesis}\nSuccess: {plan.success_criterion}\n"
    files = {
        **plan.files,
        VERSION_FILE: _version_toml(plan.name, plan.parent, plan.kind, plan.factor, plan.change, plan.hypothesis),
    }
    sha = tree.create_child(plan.parent, plan.name, files, message)
    intervention_id = f"{plan.name}-delta"
    with store.transaction():
        store.add_version(plan.name, plan.parent, tree.branch(plan.name), sha)
        store.add_intervention(
            intervention_id,
            plan.name,
            plan.kind,
            plan.factor,
            plan.change,
            plan.hypothesis,
            plan.success_criterion,
            plan.rollback,
            round=plan.round,
            template=plan.template,
            source=plan.source,
            evidence=plan.evidence,
        )
        store.update_version(plan.name, intervention_id=intervention_id)
        store.add_event("version_created", {"parent": plan.parent, "title": plan.title}, version=plan.name)
    record = store.get_version(plan.name)
    assert record is not None
    return record


def _version_toml(name: str, parent: str, kind: str, factor: str, change: dict[str, Any], hypothesis: str) -> str:
    doc = {
        "version": {"name": name, "parent": parent},
        "intervention": {
            "kind": kind,
            "factor": factor,
            "hypothesis": hypothesis,
            "change": json.dumps(change),
        },
    }
    return tomli_w.dumps(doc)
