"""What an engine that died left behind, settled when the next one opens the workspace."""

from __future__ import annotations

from pathlib import Path

from engine.core.deciding import Decisions
from engine.core.following import RunFollower
from engine.core.training import Training
from engine.harness.diagnose import load_diagnosis
from engine.runs import lock
from engine.runs.artifacts import run_outcome
from engine.runs.ingest import ingest_run


def recover(follower: RunFollower, training: Training, decisions: Decisions) -> None:
    """Runs it followed (ingest what they wrote; one whose worker still runs is left to be
    re-attached to, one whose worker died before its end is `interrupted`, to be resumed),
    versions whose training ended unseen, and decisions it had begun."""
    store = follower.store
    for run in store.list_runs():
        if run.state not in ("running", "queued") or lock.holder(Path(run.run_dir)) is not None:
            continue
        ingest_run(store, run.id, Path(run.run_dir))
        if run_outcome(Path(run.run_dir)) is None:
            follower.interrupt(run.id, "interrupted: its worker stopped while no engine watched")
        else:
            follower.finish(run.id, returncode=None)
    for version in store.list_versions():
        run = training.reader.train_run(version.name) if version.state == "training" else None
        if run is not None:  # trained while no engine watched, or before it could say so
            training.complete(run)
            if load_diagnosis(store, run.id) is None:
                training.judge.diagnose_run(run)
    decisions.redo()
