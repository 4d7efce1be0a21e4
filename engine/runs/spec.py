"""The specification of one run, written by the engine into the run directory before launch."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from engine.config import WorkspaceConfig
from engine.runs.artifacts import SPEC_FILE

RunKind = Literal["warmup", "train", "eval"]


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    version: str
    kind: RunKind
    config: WorkspaceConfig
    #: Checkpoint to start from; None for a warm-up (it builds or loads v0 from `config.policy`).
    model_in: Path | None = None
    #: Where the trained policy (or v0) is saved; None for an eval run.
    model_out: Path | None = None
    #: Torch intra-op threads for the worker (None: torch's default).
    threads: int | None = None
    #: The workspace directory (a custom domain's code lives in it).
    workspace: Path | None = None
    #: The split a run evaluates: val (every run), or test (an eval run `evotui eval --split test` asks for).
    split: Literal["val", "test"] = "val"
    #: A train run that continues its parent's training (`engine.runs.continuation`): the parent's
    #: kept final checkpoint, which it resumes from and trains `recipe.steps` more steps after.
    resume_from: Path | None = None
    #: The reference policy of the KL term (`recipe.beta`) when it is not `model_in`: a continuation
    #: keeps its lineage's, the policy the lineage's first segment started from.
    reference: Path | None = None

    @property
    def total_steps(self) -> int:
        if self.kind == "train":
            return self.config.recipe.steps
        if self.kind == "warmup":
            return self.config.warmup_steps
        return 0

    def save(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Unset fields stay unset, so that the worker reads the config as the engine does (a
        # pretrained policy's warm-up runs only when its steps were written out).
        (run_dir / SPEC_FILE).write_text(self.model_dump_json(indent=2, exclude_unset=True), encoding="utf-8")

    @classmethod
    def load(cls, run_dir: Path) -> RunSpec:
        return cls.model_validate_json((run_dir / SPEC_FILE).read_text(encoding="utf-8"))
