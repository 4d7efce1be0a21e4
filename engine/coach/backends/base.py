"""What a reasoning backend sees and returns.

The coach gathers a `PlanningContext` (the diagnosis of the version it branches from, the version
ledger, matching cases and skills, literature hits, a person's revise feedback) and asks its
backend for proposals: `Intervention`s plus a rationale. The offline planner and the Claude backend
implement the same protocol; the coach records every model call (tokens, errors) it reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from engine.coach.interventions import Facts, Intervention
from engine.config import WorkspaceConfig
from engine.harness.diagnose import Diagnosis


class BackendError(RuntimeError):
    """A backend could not give a usable answer (the coach falls back to offline and records why)."""


@dataclass
class PlanningContext:
    """Everything a backend may reason from. Never the test tasks; of the val tasks, only the
    flips of the parent's own verdict (the tasks its change turned, both answers), which the
    verdict had already read and a person reads at the gate."""

    parent: str
    parent_config: WorkspaceConfig
    domain: str
    #: The diagnosis of the run the round reasons from, or None (nothing to diagnose yet).
    diagnosis: Diagnosis | None
    #: The ledger, oldest first: {name, parent, kind, factor, template, verdict, decision, reason}.
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Case memory entries whose signature matches this diagnosis.
    cases: list[dict[str, Any]] = field(default_factory=list)
    #: Skill cards whose trigger matches (`SkillCard.to_dict()`), own domain first.
    skills: list[dict[str, Any]] = field(default_factory=list)
    #: Literature hits for the bottleneck: {doc, title, score, excerpt}.
    literature: list[dict[str, Any]] = field(default_factory=list)
    #: Revise answers a person gave at gates, newest last.
    feedback: list[str] = field(default_factory=list)
    #: Catalog templates already tried from this parent (a new round must differ) ...
    tried_templates: list[str] = field(default_factory=list)
    #: ... and the factors (dotted config paths, a reward composition as one) they changed.
    tried_factors: list[str] = field(default_factory=list)
    escalated: bool = False
    branches: int = 2
    #: What the store says about the parent's training beyond the diagnosis (e.g. hopeless prompts).
    facts: Facts = field(default_factory=Facts)
    #: The parent's flips against its own parent (`engine.verdict.flips`, a few examples each way),
    #: or None for the base version.
    flips: dict[str, Any] | None = None
    #: What this workspace's branches showed each template gains against its control, with this
    #: round's Thompson draw (`engine.coach.bandit`), highest draw first.
    ranking: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Proposals:
    interventions: list[Intervention]
    rationale: str
    backend: str
    #: The round's Thompson ranking the proposals were made with (`PlanningContext.ranking`).
    ranking: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ModelCall:
    """One request to a model: what the coach stores (never the key, never the prompt's secrets)."""

    backend: str
    model: str
    purpose: str
    input_tokens: int = 0
    output_tokens: int = 0
    ok: bool = True
    error: str | None = None
    seconds: float = 0.0


#: An analyzer's name: a Python identifier that is also a file name (`<ws>/harness/<name>.py`).
ANALYZER_NAME = r"^[a-z][a-z0-9_]{2,40}$"


def analyzer_name(*parts: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """A valid analyzer name from free text (a metric, a template, a model's suggestion): lower
    case, runs of other characters to one underscore, starting with a letter, at most 41
    characters, and not in `taken` (a numbered suffix when it is)."""
    slug = re.sub(r"[^a-z0-9]+", "_", "_".join(parts).lower()).strip("_")
    if not slug[:1].isalpha():
        slug = f"a_{slug}" if slug else "analyzer"
    base = slug[:41].rstrip("_").ljust(3, "0")
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"_{n}"
        name = base[: 41 - len(suffix)].rstrip("_") + suffix
    return name


class AnalyzerSpec(BaseModel):
    """A proposed analyzer as data: one SQL query over `completions` that gives one number.

    `completions` holds the rollouts of one run (train rollouts when the harness diagnoses a run
    and when past versions validate it; one sampled val pass when a version is probed against its
    parent) with every column of `rollouts` plus `text` (what the policy wrote: the completion, or
    a multi-turn episode's actions) and `correct` (the correctness component, or a positive reward).
    The query reads nothing else and returns one row with one numeric column. Harness evolution
    renders an adopted spec into a workspace analyzer file; nothing else is executed.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=ANALYZER_NAME)
    layer: Literal["score", "signal", "behavior", "version"]
    sql: str = Field(min_length=10)
    explanation: str = Field(min_length=1, description="What the number means, one line.")
    #: "mean": compared between versions as a ratio of means; "share": a value in [0, 1] compared
    #: as a difference. Either counts beyond the parent's own pass-to-pass spread
    #: (`engine.harness.cutoffs`).
    kind: Literal["mean", "share"] = "mean"
    threshold: float | None = None
    higher_is: Literal["better", "worse"] = "better"
    template: str = ""
    source: str = "planner"


class Backend(Protocol):
    name: str
    #: Model calls made since the coach last collected them.
    calls: list[ModelCall]

    def propose(self, ctx: PlanningContext) -> Proposals: ...

    def propose_analyzer(self, anomaly: dict[str, Any], ctx: PlanningContext) -> list[AnalyzerSpec]: ...
