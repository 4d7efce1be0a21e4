"""Launching runs and following their workers to the end: a worker is started, or re-attached to
when one already holds the run's lock (`engine.runs.lock`); what it writes is ingested as it comes,
and the run ends as its own event log says. A worker that dies before its end is started again
(`[compute] max_retries`); one that exits with `lock.EXIT_LOCKED` found the run held by another
worker, which is followed instead: that exit is neither a retry nor a failure.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

from engine.config import WorkspaceConfig
from engine.runs import lock
from engine.runs.artifacts import EVENTS_FILE, LOG_FILE, SPEC_FILE, read_events, run_outcome
from engine.runs.ingest import ingest_run
from engine.runs.runner import AttachedWorker, RunHandle, Runner
from engine.runs.spec import RunKind, RunSpec
from engine.store import RunRecord, Store
from engine.workspace import Workspace

#: Run states of a run that has not ended: it is followed, or taken up again, until it does.
UNFINISHED = ("queued", "running", "interrupted")


@dataclass
class RunUpdate:
    """What a progress display needs after each poll of a run."""

    run_id: str
    version: str
    kind: str
    state: str  # running, succeeded, failed
    step: int = 0
    total_steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None


ProgressFn = Callable[[RunUpdate], None]


class RunFailed(RuntimeError):
    def __init__(self, run: RunRecord):
        self.run = run
        super().__init__(f"run {run.id} of {run.version} failed:\n{run.error_tail or '(no error output)'}")


class RunFollower:
    """Starts (or re-attaches to) the workers of runs and follows them until each run ends.

    It owns the runner and reads `stop_requested` (set from another thread, the daemon shutting
    down) to interrupt the runs it follows."""

    def __init__(
        self,
        store: Store,
        workspace: Workspace,
        runner: Runner,
        max_retries: int,
        poll_seconds: float,
        stop_requested: threading.Event,
    ):
        self.store = store
        self.workspace = workspace
        self.runner = runner
        self.max_retries = max_retries
        self.poll_seconds = poll_seconds
        self.stop_requested = stop_requested

    def record(
        self,
        version: str,
        kind: RunKind,
        config: WorkspaceConfig,
        model_in: Path | None,
        model_out: Path | None,
        split: Literal["val", "test"],
        resume_from: Path | None = None,
        reference: Path | None = None,
    ) -> RunRecord:
        """The run to run: an unfinished one of the same version, kind and split (its engine
        stopped or died), taken up where it stands, or else a new one (a continuation: resuming
        from `resume_from`, with the KL term's `reference`; see `RunSpec`)."""
        for run in reversed(self.store.list_runs(version)):
            if run.kind == kind and run.state in UNFINISHED and (Path(run.run_dir) / SPEC_FILE).exists():
                if RunSpec.load(Path(run.run_dir)).split == split:
                    return run
        run_id = f"{version}-{kind}-{len(self.store.list_runs(version)) + 1}"
        run_dir = self.workspace.runs_dir / run_id
        spec = RunSpec(
            run_id=run_id,
            version=version,
            kind=kind,
            config=config,
            model_in=model_in,
            model_out=model_out,
            workspace=self.workspace.root,
            split=split,
            resume_from=resume_from,
            reference=reference,
        )
        spec.save(run_dir)
        self.store.add_run(run_id, version, kind, str(run_dir), spec.config.model_dump(mode="json"), spec.total_steps)
        record = self.store.get_run(run_id)
        assert record is not None
        return record

    def run_all(self, runs: list[RunRecord], progress: ProgressFn | None) -> list[tuple[RunRecord, RunUpdate]]:
        """Follow the runs' workers until each run ends, starting (or re-attaching to) them first.
        A worker that dies before its end (killed, out of memory) is started again, up to
        `[compute] max_retries` times, and resumes its run (a runner that retries on its own, Ray,
        is left to). A worker that found the run held by another (`lock.EXIT_LOCKED`) hands the
        run to the holder, which is followed instead. Interrupted (Ctrl-C, the engine stopping),
        the workers are stopped and their runs left `interrupted`, to be resumed."""
        retries = 0 if self.runner.retries else self.max_retries
        updates = {r.id: RunUpdate(r.id, r.version, r.kind, "running", total_steps=r.total_steps) for r in runs}
        live = {r.id: (r, self.launch(r)) for r in runs}
        attempts = dict.fromkeys(live, 0)
        ended: dict[str, RunRecord] = {}
        try:
            while live:
                for run, handle in list(live.values()):
                    # Waiting on the process (not sleeping) notices its exit at once.
                    try:
                        returncode: int | None = handle.wait(timeout=self.poll_seconds / len(live))
                    except subprocess.TimeoutExpired:
                        returncode = None
                    self.follow(run.id, Path(run.run_dir), updates[run.id], progress)
                    if returncode is None:
                        continue
                    if returncode == lock.EXIT_LOCKED:
                        live[run.id] = (run, self.reattach(run))
                        continue
                    reason = getattr(handle, "reason", None)
                    if run_outcome(Path(run.run_dir)) is None and returncode != 0 and attempts[run.id] < retries:
                        attempts[run.id] += 1
                        why = reason or f"worker exited with code {returncode}"
                        self.store.add_event("run_retried", {"reason": why, "attempt": attempts[run.id]}, run_id=run.id)
                        live[run.id] = (run, self.launch(run))
                        continue
                    ended[run.id] = self.finish(run.id, returncode, reason=reason)
                    del live[run.id]
                if live and self.stop_requested.is_set():
                    raise KeyboardInterrupt("the engine is stopping")
        except BaseException:
            for run, handle in live.values():
                handle.kill()
                handle.wait()
                self.follow(run.id, Path(run.run_dir), updates[run.id], progress)
                self.interrupt(run.id, "interrupted: the engine stopped following this run")
            raise
        return [(ended[r.id], updates[r.id]) for r in runs]

    def launch(self, run: RunRecord) -> RunHandle:
        """A handle on the run's worker: the live one (of an engine that stopped), or a new one."""
        run_dir = Path(run.run_dir)
        holder = lock.holder(run_dir)
        if holder is not None and holder.pid is not None:
            handle: RunHandle = AttachedWorker(run_dir, holder.pid)
            kind = "run_attached"
        else:
            handle = self.runner.start(run_dir)
            kind = "run_started"
        self.store.update_run(run.id, state="running", pid=handle.pid, started_at=run.started_at or datetime.now())
        self.store.add_event(kind, {"kind": run.kind, "pid": handle.pid}, run_id=run.id, version=run.version)
        return handle

    def reattach(self, run: RunRecord) -> RunHandle:
        """The run's worker exited with `lock.EXIT_LOCKED`: another worker (started between the
        lock's check and this start, or by another engine) holds the run and trains it. The run
        stays `running` and the holder is followed through the lock; once the holder lets go,
        the run ends as the run's own events say (its `end`, its `error`, or neither: a holder
        that died before its end, retried or failed like any such worker). A holder that let go
        already is followed the same way: its end is read at once."""
        holder = lock.holder(Path(run.run_dir))
        handle = AttachedWorker(Path(run.run_dir), holder.pid if holder is not None else None)
        self.store.update_run(run.id, state="running", pid=handle.pid)
        self.store.add_event(
            "run_attached",
            {"kind": run.kind, "pid": handle.pid, "reason": "its worker found another worker holding the run"},
            run_id=run.id,
            version=run.version,
        )
        return handle

    def follow(self, run_id: str, run_dir: Path, update: RunUpdate, progress: ProgressFn | None) -> None:
        """Ingest what the run's worker wrote since the last poll and tell `progress`."""
        report = ingest_run(self.store, run_id, run_dir)
        for event in report.events:
            kind = event.get("type")
            if kind == "start" and event.get("total_steps"):
                update.total_steps = int(event["total_steps"])
            elif kind == "metrics":
                update.step = max(update.step, int(event["step"]))
                update.metrics.update(event["values"])
        if progress is not None and report.events:
            progress(update)

    def finish(self, run_id: str, returncode: int | None, reason: str | None = None) -> RunRecord:
        """End a run whose worker exited (`returncode`; None: it ended unseen) as its event log
        says: succeeded with its `end`, else failed with the traceback of its `error`, or the exit
        code and the tail of its log. A failed train run fails its version."""
        run = self.store.get_run(run_id)
        assert run is not None
        run_dir = Path(run.run_dir)
        ended = error = None
        for event in read_events(run_dir / EVENTS_FILE, 0)[0]:
            if event.get("type") == "end":
                ended = event
            elif event.get("type") == "error":
                error = event
        succeeded = ended is not None and returncode in (0, None)
        if succeeded:
            self.store.update_run(run_id, state="succeeded", ended_at=datetime.now())
        else:
            tail = reason or ""
            if error is not None:
                tail = f"{tail}\n{error['traceback']}".strip()
            else:
                log = run_dir / LOG_FILE
                log_tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
                code = f"worker exited with code {returncode}" if returncode is not None else ""
                tail = "\n".join(x for x in (tail, code, log_tail) if x)
            self.store.update_run(run_id, state="failed", ended_at=datetime.now(), error_tail=tail or "unknown failure")
            if run.version and (v := self.store.get_version(run.version)) and v.state == "training":
                self.store.update_version(run.version, state="failed")
        self.store.add_event(
            "run_finished",
            {"state": "succeeded" if succeeded else "failed"},
            run_id=run_id,
            version=run.version,
        )
        final = self.store.get_run(run_id)
        assert final is not None
        return final

    def interrupt(self, run_id: str, reason: str) -> None:
        """A run stopped before its end, to be resumed: its version stays where it was."""
        run = self.store.get_run(run_id)
        assert run is not None
        with self.store.transaction():
            self.store.update_run(run_id, state="interrupted", error_tail=reason)
            self.store.add_event("run_interrupted", {"reason": reason}, run_id=run_id, version=run.version)
