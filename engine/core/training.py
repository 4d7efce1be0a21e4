"""Training and evaluating versions: v0's warm-up, a child's GRPO run from its parent's checkpoint
(resuming the parent's training where only the steps differ: `engine.runs.continuation`), an
evaluation of a checkpoint, each run to its end (`RunFollower`), then scored and diagnosed (`Judge`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from engine import faults
from engine.config import WorkspaceConfig
from engine.core.creation import BASE, create_base
from engine.core.deciding import Decisions
from engine.core.following import ProgressFn, RunFailed, RunFollower, RunUpdate
from engine.core.judging import Judge
from engine.harness.loader import Layers
from engine.runs.continuation import continues_training, kept_checkpoint
from engine.runs.spec import RunKind, RunSpec
from engine.store import RunRecord, VersionRecord
from engine.verdict import Scores, split_scores
from engine.workspace import Workspace


class Training:
    def __init__(self, workspace: Workspace, judge: Judge, follower: RunFollower, decisions: Decisions):
        self.workspace = workspace
        self.judge = judge
        self.reader = judge.reader
        self.store = judge.store
        self.follower = follower
        self.decisions = decisions

    def ensure_base(self, progress: ProgressFn | None = None, layers: Layers = None) -> VersionRecord:
        """v0: the embedded policy after its warm-up (or the configured pretrained model), evaluated."""
        base = self.store.get_version(BASE)
        if base is not None and base.state == "promoted" and base.checkpoint:
            return base
        if base is None:
            create_base(self.store, self.reader.tree)
        config = self.reader.version_config(BASE)
        out = self.workspace.model_dir(BASE)
        # The worker reads the policy's source from the config (a Hub id is not a path). A warm-up
        # that ended before an engine could promote v0 is not run again.
        if not any(r.kind == "warmup" and r.state == "succeeded" for r in self.store.list_runs(BASE)):
            self.execute(BASE, "warmup", config, model_in=None, model_out=out, progress=progress, layers=layers)
        self.store.update_version(BASE, checkpoint=str(out.relative_to(self.workspace.root)))
        self.decisions.decide(BASE, "promoted", "base policy")
        record = self.store.get_version(BASE)
        assert record is not None
        return record

    def train_many(
        self, versions: list[str], progress: ProgressFn | None = None, layers: Layers = None
    ) -> dict[str, RunRecord | RunFailed]:
        """Train child versions from their parents' checkpoints (GRPO), evaluate them, and diagnose
        their runs with the harness `layers` (None: all). Their runs go to the runner together (in
        parallel on a Ray cluster; a local runner's workers share this machine) and are followed
        together. Each version's outcome: its run, or the RunFailed of a run that failed."""
        runs = [self._train_run(version, layers) for version in versions]
        outcomes: dict[str, RunRecord | RunFailed] = {}
        for run, update in self.follower.run_all(runs, progress):
            try:
                outcomes[run.version] = self._conclude(run, update, progress, layers, "val")
            except RunFailed as exc:
                self.store.update_version(run.version, state="failed")
                outcomes[run.version] = exc
                continue
            self.complete(run)
        return outcomes

    def complete(self, run: RunRecord) -> None:
        """A train run succeeded: its version is trained, with its checkpoint and val scores."""
        spec = RunSpec.load(Path(run.run_dir))
        assert spec.model_out is not None
        checkpoint = str(spec.model_out.relative_to(self.workspace.root))
        self.store.update_version(run.version, state="trained", checkpoint=checkpoint)
        self.judge.record_scores(run.version, run.id)

    def execute(
        self,
        version: str,
        kind: RunKind,
        config: WorkspaceConfig,
        model_in: Path | None,
        model_out: Path | None,
        progress: ProgressFn | None = None,
        layers: Layers = None,
        split: Literal["val", "test"] = "val",
    ) -> RunRecord:
        """Run one run to its end and diagnose it with the harness `layers` (None: all); raises
        RunFailed if it fails. An eval run of the test split is not diagnosed: nothing that
        decides reads test."""
        run = self.follower.record(version, kind, config, model_in, model_out, split)
        ((run, update),) = self.follower.run_all([run], progress)
        return self._conclude(run, update, progress, layers, split)

    def evaluate(
        self,
        version: str,
        split: Literal["val", "test"] = "test",
        progress: ProgressFn | None = None,
        config: WorkspaceConfig | None = None,
    ) -> tuple[RunRecord, Scores]:
        """Evaluate a version's checkpoint on `split` in an eval run of its own (test: what
        `evotui eval --split test` and the benchmark's report ask for; no decision reads it),
        under its own config or `config` (the benchmark plays test in its leaky environment)."""
        record = self.store.get_version(version)
        if record is None or not record.checkpoint:
            raise ValueError(f"{version} has no checkpoint to evaluate (train it first)")
        config = config or self.reader.version_config(version)
        run = self.execute(
            version, "eval", config, self.workspace.root / record.checkpoint, None, progress=progress, split=split
        )
        return run, split_scores(self.store, run.id, split)

    def _train_run(self, version: str, layers: Layers) -> RunRecord:
        record = self.store.get_version(version)
        if record is None or record.parent is None:
            raise ValueError(f"{version} is not a trainable child version")
        parent = self.store.get_version(record.parent)
        if parent is None or not parent.checkpoint:
            raise ValueError(f"parent {record.parent} of {version} has no checkpoint")
        config = self.reader.version_config(version)
        model_in = self.workspace.root / parent.checkpoint
        resume_from, reference = self._continuation(parent, config, model_in)
        if layers is not None and "behavior" not in layers:
            # The collapse guard reads behavior; a harness without that layer does not have it.
            guard = config.recipe.collapse_guard.model_copy(update={"enabled": False})
            config = config.model_copy(update={"recipe": config.recipe.model_copy(update={"collapse_guard": guard})})
        self.store.update_version(version, state="training")
        out = self.workspace.model_dir(version)
        return self.follower.record(version, "train", config, model_in, out, "val", resume_from, reference)

    def _continuation(
        self, parent: VersionRecord, config: WorkspaceConfig, model_in: Path
    ) -> tuple[Path | None, Path | None]:
        """Where a child resumes its parent's training (`continues_training`), and its KL term's
        reference, that of the parent's run; (None, None): it starts afresh from the parent's
        weights (another change, or a parent whose run kept no checkpoint: v0, a stopped run)."""
        if not continues_training(self.reader.version_config(parent.name), config):
            return None, None
        kept = kept_checkpoint(model_in)
        run = self.reader.train_run(parent.name)
        if kept is None or run is None:
            return None, None
        spec = RunSpec.load(Path(run.run_dir))
        return kept, spec.reference or spec.model_in

    def _conclude(
        self, run: RunRecord, update: RunUpdate, progress: ProgressFn | None, layers: Layers, split: str
    ) -> RunRecord:
        """A run that ended: its scores, its diagnosis, the last progress update; RunFailed if it failed."""
        faults.point("run-finished")
        if run.state == "succeeded":
            self.judge.record_scores(run.version, run.id)  # a version's score is its latest evaluation
        if split == "val":
            self.judge.diagnose_run(run, layers)
        update.state, update.error = run.state, run.error_tail
        if progress is not None:
            progress(update)
        if run.state != "succeeded":
            raise RunFailed(run)
        return run
