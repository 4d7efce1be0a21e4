"""What a reasoning backend sees and returns.

The coach gathers a `PlanningContext` (the diagnosis of the version it branches from, the version
ledger, matching cases and skills, literature hits, a person's revise feedback) and asks its
backend for proposals: `Intervention`s plus a rationale. The offline planner and the Claude backend
implement the same protocol; the coach records every model call (tokens, errors) it reports.
"""

from __future__ import annotations

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
    """Everything a backend may reason from. Never the sample tasks themselves."""

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


@dataclass
class Proposals:
    interventions: list[Intervention]
    rationale: str
    backend: str


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


class AnalyzerSpec(BaseModel):
    """A proposed analyzer as data: one SQL query over the store that gives one number for a run.

    The SQL may use ``$run`` (the run's id) and must return one row with one numeric column.
    Harness evolution renders it into a workspace analyzer file; nothing else is executed.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{2,40}$")
    layer: Literal["score", "signal", "behavior", "version"]
    sql: str = Field(min_length=10)
    explanation: str = Field(min_length=1, description="What the number means, one line.")
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
