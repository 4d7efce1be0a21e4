"""The engine's core for one workspace: `Engine`, a facade over the parts that do its jobs.

- `creation`: versions come into being (v0, a child from its `VersionPlan`);
- `following`: runs launched (or re-attached to) and followed to their end, ingesting as they go;
- `training`: v0's warm-up, a child's GRPO run, an evaluation, each run, scored and diagnosed;
- `judging`: val scores, verdicts, flips, diagnoses (`Judge`);
- `deciding`: decisions recorded as one unit, redone after a crash;
- `recovery`: what an engine that died left behind, settled on open;
- `reading`: what the engine reads about versions and runs (`Reader`).

Only the engine opens the workspace's DuckDB file. The coach, the daemon and the CLI drive the
`Engine`; it never prints: progress goes to a callback. What varies per call (the harness layers a
run is diagnosed with, the progress callback) is an argument, never state set from outside.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Literal

from engine.config import WorkspaceConfig
from engine.core.creation import BASE, VERSION_FILE, VersionPlan, create_version
from engine.core.deciding import Decisions
from engine.core.following import UNFINISHED, ProgressFn, RunFailed, RunFollower, RunUpdate
from engine.core.judging import Judge
from engine.core.reading import Reader, best_version, version_score, yardsticks
from engine.core.recovery import recover
from engine.core.training import Training
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import Layers
from engine.runs.runner import Runner, make_runner
from engine.store import RunRecord, Store, VersionRecord
from engine.verdict import Scores, Verdict
from engine.versions import VersionTree
from engine.workspace import Workspace

__all__ = [
    "BASE",
    "UNFINISHED",
    "VERSION_FILE",
    "Engine",
    "Judge",
    "ProgressFn",
    "Reader",
    "RunFailed",
    "RunUpdate",
    "VersionPlan",
    "best_version",
    "version_score",
    "yardsticks",
]


class Engine:
    """One workspace's engine: its store connection and version tree, shared by the parts it
    holds (`reader`, `judging`, `decisions`, `follower`, `training`), and the runner and stop
    flag, which only the `follower` uses."""

    def __init__(self, workspace: Workspace, runner: Runner | None = None, poll_seconds: float = 1.0):
        self.workspace = workspace
        self.config = workspace.load_config()
        self.tree = VersionTree(workspace.root)
        self.store = Store(workspace.db_path)
        #: Set from another thread (the daemon shutting down) to interrupt the run being followed.
        self.stop_requested = threading.Event()
        self.reader = Reader(self.store, self.tree, workspace.root)
        self.judging = Judge(self.reader)
        self.decisions = Decisions(self.store, self.tree)
        self.follower = RunFollower(
            self.store,
            workspace,
            runner or make_runner(self.config.compute),
            self.config.compute.max_retries,
            poll_seconds,
            self.stop_requested,
        )
        self.training = Training(workspace, self.judging, self.follower, self.decisions)
        self.recover()

    def view(self, store: Store) -> Judge:
        """A judge for another thread of the engine process: it reads (and diagnoses) through
        `store`, that thread's connection of the same database, and a version tree of its own (a
        repository object is not shared between threads). It holds neither the runner nor the
        stop flag: it never launches runs."""
        return Judge(Reader(store, VersionTree(self.workspace.root), self.workspace.root))

    @classmethod
    def open(cls, root: Path | str, **kw: Any) -> Engine:
        return cls(Workspace.open(root), **kw)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def recover(self) -> None:
        """Settle what an engine that died left behind (`engine.core.recovery`)."""
        recover(self.follower, self.training, self.decisions)

    @property
    def runner(self) -> Runner:
        return self.follower.runner

    @runner.setter
    def runner(self, runner: Runner) -> None:
        self.follower.runner = runner  # benchmarks/scale.py measures one engine under several runners

    # -- versions (`creation`, `reading`) ------------------------------------------------------
    def create_version(self, plan: VersionPlan) -> VersionRecord:
        return create_version(self.store, self.tree, plan)

    def config_text(self, version: str) -> str:
        return self.reader.config_text(version)

    def version_config(self, version: str) -> WorkspaceConfig:
        return self.reader.version_config(version)

    def next_version_name(self) -> str:
        return self.reader.next_version_name()

    def best_version(self) -> VersionRecord | None:
        return self.reader.best_version()

    def eval_run(self, version: str) -> RunRecord | None:
        return self.reader.eval_run(version)

    def train_run(self, version: str) -> RunRecord | None:
        return self.reader.train_run(version)

    def latest_run(self, version: str) -> RunRecord:
        return self.reader.latest_run(version)

    def latest_train_run_from(self, version: str) -> RunRecord | None:
        return self.reader.latest_train_run_from(version)

    def train_curve_summary(self, run_id: str, window: int = 10) -> dict[str, tuple[float | None, float | None]]:
        return self.reader.train_curve_summary(run_id, window)

    # -- runs (`training`) ----------------------------------------------------------------------
    def ensure_base(self, progress: ProgressFn | None = None, layers: Layers = None) -> VersionRecord:
        return self.training.ensure_base(progress, layers)

    def train(self, version: str, progress: ProgressFn | None = None, layers: Layers = None) -> RunRecord:
        """Train a child version from its parent's checkpoint (GRPO), evaluate it, and diagnose the
        run with the harness `layers` (None: all); raises RunFailed if its run fails."""
        outcome = self.training.train_many([version], progress, layers)[version]
        if isinstance(outcome, RunFailed):
            raise outcome
        return outcome

    def train_many(
        self, versions: list[str], progress: ProgressFn | None = None, layers: Layers = None
    ) -> dict[str, RunRecord | RunFailed]:
        return self.training.train_many(versions, progress, layers)

    def evaluate(
        self,
        version: str,
        split: Literal["val", "test"] = "test",
        progress: ProgressFn | None = None,
        config: WorkspaceConfig | None = None,
    ) -> tuple[RunRecord, Scores]:
        return self.training.evaluate(version, split, progress, config)

    # -- judging and deciding (`judging`, `deciding`) -------------------------------------------
    def compare(self, base: str, version: str) -> Verdict:
        return self.judging.compare(base, version)

    def judge(self, version: str) -> Verdict:
        return self.judging.judge(version)

    def flips(self, version: str, examples: int = 5) -> dict[str, Any]:
        return self.judging.flips(version, examples)

    def diagnose_version(self, version: str, run: RunRecord | None = None, layers: Layers = None) -> Diagnosis:
        return self.judging.diagnose_version(version, run, layers)

    def diagnosis(self, run: RunRecord, layers: Layers = None) -> Diagnosis:
        return self.judging.diagnosis(run, layers)

    def decide(self, version: str, decision: str, reason: str, case: dict[str, Any] | None = None) -> None:
        self.decisions.decide(version, decision, reason, case)
