"""The engine's core for one workspace: builds v0, creates versions, launches and follows runs,
ingests their artifacts, judges versions and records decisions.

Only the engine opens the workspace's DuckDB file. The coach, the daemon and the CLI drive this
class; it never prints: progress goes to a callback. What varies per call (the harness layers a
run is diagnosed with, the progress callback) is an argument, never state set from outside.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import tomli_w

from engine import faults
from engine.config import CONFIG_FILE, WorkspaceConfig, decode_config, parse_config
from engine.harness.diagnose import Diagnosis, diagnose, load_diagnosis, store_diagnosis
from engine.harness.loader import Harness, Layers, load_harness
from engine.runs import lock
from engine.runs.artifacts import EVENTS_FILE, LOG_FILE, SPEC_FILE, read_events, run_outcome
from engine.runs.ingest import ingest_run
from engine.runs.runner import AttachedWorker, RunHandle, Runner, make_runner
from engine.runs.spec import RunKind, RunSpec
from engine.store import RunRecord, Store, VersionRecord
from engine.verdict import Scores, Verdict, clean_split, compare_runs, flips, split_scores
from engine.versions import DECISIONS, VersionTree
from engine.workspace import Workspace

BASE = "v0"
#: Run states of a run that has not ended: it is followed, or taken up again, until it does.
UNFINISHED = ("queued", "running", "interrupted")
VERSION_FILE = "version.toml"


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


class Engine:
    def __init__(self, workspace: Workspace, runner: Runner | None = None, poll_seconds: float = 1.0):
        self.workspace = workspace
        self.config = workspace.load_config()
        self.tree = VersionTree(workspace.root)
        self.store = Store(workspace.db_path)
        self.runner = runner or make_runner(self.config.compute)
        self.poll_seconds = poll_seconds
        #: Set from another thread (the daemon shutting down) to interrupt the run being followed.
        self.stop_requested = threading.Event()
        self.recover()

    def view(self, store: Store) -> Engine:
        """This engine reading (and diagnosing) through `store`, another connection of the same
        database, for another thread of the engine process; it never launches runs."""
        other = object.__new__(Engine)
        other.__dict__.update(self.__dict__)
        other.store = store
        other.tree = VersionTree(self.workspace.root)  # a repository object of its own thread
        return other

    @classmethod
    def open(cls, root: Path | str, **kw: Any) -> Engine:
        return cls(Workspace.open(root), **kw)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recovery -----------------------------------------------------------------------------
    def recover(self) -> None:
        """Settle what an engine that died left behind: runs it followed (ingest what they wrote;
        one whose worker still runs is left to be re-attached to, one whose worker died before
        its end is `interrupted`, to be resumed), versions whose training ended unseen, and
        decisions it had begun."""
        for run in self.store.list_runs():
            if run.state not in ("running", "queued") or lock.holder(Path(run.run_dir)) is not None:
                continue
            ingest_run(self.store, run.id, Path(run.run_dir))
            if run_outcome(Path(run.run_dir)) is None:
                self._interrupt_run(run.id, "interrupted: its worker stopped while no engine watched")
            else:
                self._finish_run(run.id, returncode=None)
        for version in self.store.list_versions():
            run = self.train_run(version.name) if version.state == "training" else None
            if run is not None:  # trained while no engine watched, or before it could say so
                self._complete_training(run)
                if load_diagnosis(self.store, run.id) is None:
                    self.diagnose_run(run)
        self._redo_decisions()

    # -- versions -----------------------------------------------------------------------------
    def config_text(self, version: str) -> str:
        """The text of a version's workspace.toml (errors name it as `versions/vN:workspace.toml`)."""
        return decode_config(self.tree.read(version, CONFIG_FILE), self._config_label(version))

    def version_config(self, version: str) -> WorkspaceConfig:
        return parse_config(self.config_text(version), self._config_label(version), self.workspace.root)

    def _config_label(self, version: str) -> Path:
        return Path(f"{self.tree.branch(version)}:{CONFIG_FILE}")

    def next_version_name(self) -> str:
        names = {v.name for v in self.store.list_versions()} | set(self.tree.versions())
        n = 1 + max((int(v[1:]) for v in names), default=-1)
        return f"v{n}"

    def best_version(self) -> VersionRecord | None:
        return best_version(self.store.list_versions())

    def ensure_base(self, progress: ProgressFn | None = None, layers: Layers = None) -> VersionRecord:
        """v0: the embedded policy after its warm-up (or the configured pretrained model), evaluated."""
        base = self.store.get_version(BASE)
        if base is not None and base.state == "promoted" and base.checkpoint:
            return base
        if base is None:
            sha = self.tree.commit_of(BASE).hexsha if self.tree.exists(BASE) else self.tree.create_base(BASE)
            self.store.add_version(BASE, None, self.tree.branch(BASE), sha)
            self.store.add_event("version_created", {"parent": None}, version=BASE)
        config = self.version_config(BASE)
        out = self.workspace.model_dir(BASE)
        # The worker reads the policy's source from the config (a Hub id is not a path). A warm-up
        # that ended before an engine could promote v0 is not run again.
        if not any(r.kind == "warmup" and r.state == "succeeded" for r in self.store.list_runs(BASE)):
            self.execute(BASE, "warmup", config, model_in=None, model_out=out, progress=progress, layers=layers)
        self.store.update_version(BASE, checkpoint=str(out.relative_to(self.workspace.root)))
        self.decide(BASE, "promoted", "base policy")
        record = self.store.get_version(BASE)
        assert record is not None
        return record

    def create_version(self, plan: VersionPlan) -> VersionRecord:
        message = f"{plan.title}\n\nHypothesis: {plan.hypothesis}\nSuccess: {plan.success_criterion}\n"
        files = {
            **plan.files,
            VERSION_FILE: _version_toml(plan.name, plan.parent, plan.kind, plan.factor, plan.change, plan.hypothesis),
        }
        sha = self.tree.create_child(plan.parent, plan.name, files, message)
        intervention_id = f"{plan.name}-delta"
        with self.store.transaction():
            self.store.add_version(plan.name, plan.parent, self.tree.branch(plan.name), sha)
            self.store.add_intervention(
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
            self.store.update_version(plan.name, intervention_id=intervention_id)
            self.store.add_event("version_created", {"parent": plan.parent, "title": plan.title}, version=plan.name)
        record = self.store.get_version(plan.name)
        assert record is not None
        return record

    def train(self, version: str, progress: ProgressFn | None = None, layers: Layers = None) -> RunRecord:
        """Train a child version from its parent's checkpoint (GRPO), evaluate it, and diagnose the
        run with the harness `layers` (None: all); raises RunFailed if its run fails."""
        outcome = self.train_many([version], progress, layers)[version]
        if isinstance(outcome, RunFailed):
            raise outcome
        return outcome

    def train_many(
        self, versions: list[str], progress: ProgressFn | None = None, layers: Layers = None
    ) -> dict[str, RunRecord | RunFailed]:
        """`train` for several versions at once: their runs go to the runner together (in parallel
        on a Ray cluster; a local runner's workers share this machine) and are followed
        together. Each version's outcome: its run, or the RunFailed of a run that failed."""
        runs = [self._train_run(version, layers) for version in versions]
        outcomes: dict[str, RunRecord | RunFailed] = {}
        for run, update in self._run_all(runs, progress):
            try:
                outcomes[run.version] = self._conclude(run, update, progress, layers, "val")
            except RunFailed as exc:
                self.store.update_version(run.version, state="failed")
                outcomes[run.version] = exc
                continue
            self._complete_training(run)
        return outcomes

    def _train_run(self, version: str, layers: Layers) -> RunRecord:
        record = self.store.get_version(version)
        if record is None or record.parent is None:
            raise ValueError(f"{version} is not a trainable child version")
        parent = self.store.get_version(record.parent)
        if parent is None or not parent.checkpoint:
            raise ValueError(f"parent {record.parent} of {version} has no checkpoint")
        config = self.version_config(version)
        if layers is not None and "behavior" not in layers:
            # The collapse guard reads behavior; a harness without that layer does not have it.
            guard = config.recipe.collapse_guard.model_copy(update={"enabled": False})
            config = config.model_copy(update={"recipe": config.recipe.model_copy(update={"collapse_guard": guard})})
        self.store.update_version(version, state="training")
        out = self.workspace.model_dir(version)
        return self._run_record(version, "train", config, self.workspace.root / parent.checkpoint, out, "val")

    def _complete_training(self, run: RunRecord) -> None:
        """A train run succeeded: its version is trained, with its checkpoint and val scores."""
        spec = RunSpec.load(Path(run.run_dir))
        assert spec.model_out is not None
        checkpoint = str(spec.model_out.relative_to(self.workspace.root))
        self.store.update_version(run.version, state="trained", checkpoint=checkpoint)
        self._record_scores(run.version, run.id)

    def _paired(self, base: str, version: str) -> tuple[RunRecord, RunRecord, tuple[str, str]]:
        """What a comparison of `version` with `base` reads: both evaluation runs, and the split of
        each."""
        base_run, run = self.eval_run(base), self.eval_run(version)
        if base_run is None or run is None:
            raise ValueError(f"{base} or {version} has no evaluation yet")
        splits = ("val", "val")
        if self.version_config(base).domain != self.version_config(version).domain:
            # One of them changed the environment (e.g. closed a leak): val as each saw it is not
            # common ground, the clean replay is (a run without one was clean already).
            splits = (clean_split(self.store, base_run.id), clean_split(self.store, run.id))
        return base_run, run, splits

    def _parent(self, version: str) -> str:
        record = self.store.get_version(version)
        if record is None or record.parent is None:
            raise ValueError(f"{version} has no parent to be judged against")
        return record.parent

    def compare(self, base: str, version: str) -> Verdict:
        """`version` against `base` (its parent, or any evaluated version: a sibling control) on the
        val tasks both evaluated, by `version`'s protocol; stores nothing."""
        base_run, run, splits = self._paired(base, version)
        protocol = self.version_config(version).eval
        return compare_runs(
            self.store, base, base_run.id, version, run.id, splits, protocol.primary, protocol.guardrails
        )

    def judge(self, version: str) -> Verdict:
        """`version` against its parent, recorded on the version."""
        verdict = self.compare(self._parent(version), version)
        main = verdict.primary_delta
        self.store.update_version(
            version,
            verdict=verdict.label,
            verdict_delta=main.diff if main else None,
            verdict_floor=main.noise_floor if main else None,
        )
        self.store.add_event("verdict", {"label": verdict.label, "summary": verdict.summary()}, version=version)
        return verdict

    def flips(self, version: str, examples: int = 5) -> dict[str, Any]:
        """The val tasks whose outcome flipped between the version and its parent, on the primary
        decoding (`engine.verdict.flips`)."""
        parent_run, child_run, splits = self._paired(self._parent(version), version)
        primary = self.version_config(version).eval.primary
        return flips(self.store, parent_run.id, child_run.id, primary, splits, examples)

    def decide(self, version: str, decision: str, reason: str, case: dict[str, Any] | None = None) -> None:
        """Record a decision as one unit: the version tree's tag, the version's state, the event
        and the branch's `case` for the case memory (see `Store.record_case`). Its intent is
        stored first, so that an engine killed half-way redoes the rest on its next open."""
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
        recorded = self.tree.decision(version)
        if recorded is not None and recorded[0] != decision:
            raise ValueError(f"{version} is already {recorded[0]} in the version tree")
        self.store.add_event("decision_intent", {"decision": decision, "reason": reason, "case": case}, version=version)
        self._apply_decision(version, decision, reason, case)

    def _apply_decision(self, version: str, decision: str, reason: str, case: dict[str, Any] | None) -> None:
        if self.tree.decision(version) is None:  # else: tagged by an engine that stopped after it
            self.tree.decide(decision, version, reason)
        faults.point("decision-tag")
        with self.store.transaction():
            self.store.update_version(version, state=decision, decision_reason=reason, decided_at=_now())
            self.store.add_event("decision", {"decision": decision, "reason": reason}, version=version)
            if case is not None:
                self.store.record_case(version, case, decision, reason)

    def _redo_decisions(self) -> None:
        """Decisions whose intent was stored but whose version does not hold them yet."""
        rows = self.store.query(
            """WITH latest AS (
                   SELECT version, payload FROM events WHERE kind = 'decision_intent'
                   QUALIFY row_number() OVER (PARTITION BY version ORDER BY id DESC) = 1)
               SELECT l.version, l.payload FROM latest l JOIN versions v ON v.name = l.version
               WHERE v.state <> l.payload->>'decision'"""
        )
        for version, payload in rows:
            intent = json.loads(payload)
            self._apply_decision(version, intent["decision"], intent["reason"], intent.get("case"))

    def eval_run(self, version: str) -> RunRecord | None:
        """The version's latest succeeded run that evaluated it on val."""
        row = self.store.query_one(
            """
            SELECT r.id FROM runs r
            WHERE r.version = ? AND r.state = 'succeeded'
              AND EXISTS (SELECT 1 FROM rollouts o WHERE o.run_id = r.id AND o.split = 'val')
            ORDER BY r.ended_at DESC LIMIT 1
            """,
            [version],
        )
        return self.store.get_run(row[0]) if row else None

    def _record_scores(self, version: str, run_id: str) -> None:
        row = self.store.query_one(
            """
            SELECT avg(reward_components['correctness']) FILTER (WHERE decoding = 'greedy'),
                   avg(reward_components['correctness']) FILTER (WHERE decoding = 'sampled'),
                   count(DISTINCT task_id)
            FROM rollouts
            WHERE run_id = $run AND split = 'val'
              AND step = (SELECT max(step) FROM rollouts WHERE run_id = $run AND split = 'val')
            """,
            {"run": run_id},
        )
        if row and row[2]:
            self.store.update_version(version, val_greedy=row[0], val_sampled=row[1], val_n=row[2])

    # -- runs -----------------------------------------------------------------------------------
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
        run = self._run_record(version, kind, config, model_in, model_out, split)
        ((run, update),) = self._run_all([run], progress)
        return self._conclude(run, update, progress, layers, split)

    def _run_record(
        self,
        version: str,
        kind: RunKind,
        config: WorkspaceConfig,
        model_in: Path | None,
        model_out: Path | None,
        split: Literal["val", "test"],
    ) -> RunRecord:
        """The run to run: an unfinished one of the same version, kind and split (its engine
        stopped or died), taken up where it stands, or else a new one."""
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
        )
        spec.save(run_dir)
        self.store.add_run(run_id, version, kind, str(run_dir), spec.config.model_dump(mode="json"), spec.total_steps)
        record = self.store.get_run(run_id)
        assert record is not None
        return record

    def _conclude(
        self, run: RunRecord, update: RunUpdate, progress: ProgressFn | None, layers: Layers, split: str
    ) -> RunRecord:
        """A run that ended: its scores, its diagnosis, the last progress update; RunFailed if it failed."""
        faults.point("run-finished")
        if run.state == "succeeded":
            self._record_scores(run.version, run.id)  # a version's score is its latest evaluation
        if split == "val":
            self.diagnose_run(run, layers)
        update.state, update.error = run.state, run.error_tail
        if progress is not None:
            progress(update)
        if run.state != "succeeded":
            raise RunFailed(run)
        return run

    def _run_all(self, runs: list[RunRecord], progress: ProgressFn | None) -> list[tuple[RunRecord, RunUpdate]]:
        """Follow the runs' workers until each run ends, starting (or re-attaching to) them first.
        A worker that dies before its end (killed, out of memory) is started again, up to
        `[compute] max_retries` times, and resumes its run (a runner that retries on its own, Ray,
        is left to). Interrupted (Ctrl-C, the engine stopping), the workers are stopped and their
        runs left `interrupted`, to be resumed."""
        retries = 0 if self.runner.retries else self.config.compute.max_retries
        updates = {r.id: RunUpdate(r.id, r.version, r.kind, "running", total_steps=r.total_steps) for r in runs}
        live = {r.id: (r, self._launch(r)) for r in runs}
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
                    self._follow(run.id, Path(run.run_dir), updates[run.id], progress)
                    if returncode is None:
                        continue
                    reason = getattr(handle, "reason", None)
                    if run_outcome(Path(run.run_dir)) is None and returncode != 0 and attempts[run.id] < retries:
                        attempts[run.id] += 1
                        why = reason or f"worker exited with code {returncode}"
                        self.store.add_event("run_retried", {"reason": why, "attempt": attempts[run.id]}, run_id=run.id)
                        live[run.id] = (run, self._launch(run))
                        continue
                    ended[run.id] = self._finish_run(run.id, returncode, reason=reason)
                    del live[run.id]
                if live and self.stop_requested.is_set():
                    raise KeyboardInterrupt("the engine is stopping")
        except BaseException:
            for run, handle in live.values():
                handle.kill()
                handle.wait()
                self._follow(run.id, Path(run.run_dir), updates[run.id], progress)
                self._interrupt_run(run.id, "interrupted: the engine stopped following this run")
            raise
        return [(ended[r.id], updates[r.id]) for r in runs]

    def _launch(self, run: RunRecord) -> RunHandle:
        """A handle on the run's worker: the live one (of an engine that stopped), or a new one."""
        run_dir = Path(run.run_dir)
        holder = lock.holder(run_dir)
        if holder is not None and holder.pid is not None:
            handle: RunHandle = AttachedWorker(run_dir, holder.pid)
            kind = "run_attached"
        else:
            handle = self.runner.start(run_dir)
            kind = "run_started"
        self.store.update_run(run.id, state="running", pid=handle.pid, started_at=run.started_at or _now())
        self.store.add_event(kind, {"kind": run.kind, "pid": handle.pid}, run_id=run.id, version=run.version)
        return handle

    def _interrupt_run(self, run_id: str, reason: str) -> None:
        """A run stopped before its end, to be resumed: its version stays where it was."""
        run = self.store.get_run(run_id)
        assert run is not None
        with self.store.transaction():
            self.store.update_run(run_id, state="interrupted", error_tail=reason)
            self.store.add_event("run_interrupted", {"reason": reason}, run_id=run_id, version=run.version)

    def diagnose_run(self, run: RunRecord, layers: Layers = None) -> Diagnosis | None:
        """Run the harness over a finished run and store the diagnosis. A failure here is
        recorded as an event and never stops the engine."""
        if self.store.get_version(run.version) is None:
            return None
        try:
            diagnosis = self.diagnose_version(run.version, run, layers)
        except Exception as exc:  # noqa: BLE001 - the engine carries on without a diagnosis
            self.store.add_event("diagnosis_failed", {"error": f"{type(exc).__name__}: {exc}"}, run_id=run.id)
            return None
        self.store.add_event(
            "diagnosis",
            {"bottleneck": diagnosis.bottleneck.rule if diagnosis.bottleneck else None},
            run_id=run.id,
            version=run.version,
        )
        return diagnosis

    def _follow(self, run_id: str, run_dir: Path, update: RunUpdate, progress: ProgressFn | None) -> None:
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

    def _finish_run(self, run_id: str, returncode: int | None, reason: str | None = None) -> RunRecord:
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
            self.store.update_run(run_id, state="succeeded", ended_at=_now())
        else:
            tail = reason or ""
            if error is not None:
                tail = f"{tail}\n{error['traceback']}".strip()
            else:
                log = run_dir / LOG_FILE
                log_tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
                code = f"worker exited with code {returncode}" if returncode is not None else ""
                tail = "\n".join(x for x in (tail, code, log_tail) if x)
            self.store.update_run(run_id, state="failed", ended_at=_now(), error_tail=tail or "unknown failure")
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

    # -- reporting --------------------------------------------------------------------------------
    def train_curve_summary(self, run_id: str, window: int = 10) -> dict[str, tuple[float | None, float | None]]:
        """Mean of reward, dead-group ratio and truncation over the first and last `window` steps."""
        rows = self.store.query(
            """
            WITH m AS (
                SELECT key, step, value,
                       row_number() OVER (PARTITION BY key ORDER BY step) AS first_rank,
                       row_number() OVER (PARTITION BY key ORDER BY step DESC) AS last_rank
                FROM metrics
                WHERE run_id = ? AND key IN ('reward', 'frac_reward_zero_std', 'completions/clipped_ratio')
            )
            SELECT key, avg(value) FILTER (WHERE first_rank <= ?), avg(value) FILTER (WHERE last_rank <= ?)
            FROM m GROUP BY key
            """,
            [run_id, window, window],
        )
        return {key: (first, last) for key, first, last in rows}

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
        config = config or self.version_config(version)
        run = self.execute(
            version, "eval", config, self.workspace.root / record.checkpoint, None, progress=progress, split=split
        )
        return run, split_scores(self.store, run.id, split)

    def latest_run(self, version: str) -> RunRecord:
        """The run a version is diagnosed from: its last succeeded train run, else its warm-up."""
        runs = [r for r in self.store.list_runs(version) if r.state == "succeeded" and r.kind != "eval"]
        if not runs:
            raise ValueError(f"{version} has no succeeded run to diagnose")
        trained = [r for r in runs if r.kind == "train"]
        return (trained or runs)[-1]

    def diagnose_version(self, version: str, run: RunRecord | None = None, layers: Layers = None) -> Diagnosis:
        """Diagnose a version's latest run (or `run`) again, with the workspace's current harness
        limited to `layers`, and store it."""
        run = run or self.latest_run(version)
        record = self.store.get_version(version)
        if record is None:
            raise ValueError(f"no version {version!r} in this workspace")
        diagnosis = diagnose(self.store, run, record, self.version_config(version), harness=self.harness(layers))
        store_diagnosis(self.store, diagnosis)
        return diagnosis

    def diagnosis(self, run: RunRecord, layers: Layers = None) -> Diagnosis:
        """The run's stored diagnosis when the harness that made it is the current one (same
        workspace files, same layers); otherwise the run diagnosed again with the current one."""
        stored = load_diagnosis(self.store, run.id)
        if stored is not None and stored.harness_revision == self.harness(layers).revision:
            return stored
        return self.diagnose_version(run.version, run, layers)

    def harness(self, layers: Layers = None) -> Harness:
        """The workspace's harness as it is now (it evolves), limited to `layers` (None: all)."""
        harness = load_harness(self.workspace.root)
        return harness.only(layers) if layers is not None else harness

    def train_run(self, version: str) -> RunRecord | None:
        runs = [r for r in self.store.list_runs(version) if r.kind == "train" and r.state == "succeeded"]
        return runs[-1] if runs else None

    def latest_train_run_from(self, version: str) -> RunRecord | None:
        """The latest succeeded GRPO run that trained `version` or started from it (one of its
        children): what training does to this policy."""
        row = self.store.query_one(
            """SELECT r.id FROM runs r JOIN versions v ON v.name = r.version
               WHERE r.kind = 'train' AND r.state = 'succeeded' AND (v.name = ? OR v.parent = ?)
               ORDER BY r.ended_at DESC LIMIT 1""",
            [version, version],
        )
        return self.store.get_run(row[0]) if row else None


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


def version_score(greedy: float | None, sampled: float | None) -> float | None:
    """A version's val score for ranking: the mean of greedy and sampled correctness (whichever
    exist). The coach branches from the promoted version with the highest."""
    values = [x for x in (greedy, sampled) if x is not None]
    return sum(values) / len(values) if values else None


def best_version(versions: Iterable[VersionRecord]) -> VersionRecord | None:
    """The version the coach branches from: of the promoted versions that no promoted child has
    superseded (a promoted child beat its parent on evidence, on common ground even when it
    changed the environment its own val is scored in), the one with the highest `version_score`
    (ties: the older version)."""
    versions = list(versions)
    superseded = {v.parent for v in versions if v.state == "promoted" and v.parent is not None}
    promoted = [v for v in versions if v.state == "promoted" and v.name not in superseded]

    def rank(v: VersionRecord) -> tuple[float, int]:
        score = version_score(v.val_greedy, v.val_sampled)
        return (float("-inf") if score is None else score, -int(v.name[1:]))

    return max(promoted, key=rank, default=None)


def _now() -> datetime:
    return datetime.now()
