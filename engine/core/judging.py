"""Judging versions: a version's val scores, its verdict against its parent (or a control), the
tasks that flipped, and the harness's diagnosis of its runs.

A `Judge` reads and writes through its `Reader`'s store connection and version tree. The engine
has one; another thread of the engine process gets one of its own (`Engine.view`): a judge never
launches runs, so it needs neither the runner nor the engine's stop flag.
"""

from __future__ import annotations

from typing import Any

from engine.core.reading import Reader
from engine.harness.diagnose import Diagnosis, diagnose, load_diagnosis, store_diagnosis
from engine.harness.loader import Harness, Layers, load_harness
from engine.store import RunRecord
from engine.verdict import Verdict, clean_split, compare_runs, flips


class Judge:
    def __init__(self, reader: Reader):
        self.reader = reader
        self.store = reader.store

    # -- scores and verdicts ------------------------------------------------------------------
    def record_scores(self, version: str, run_id: str) -> None:
        """The version's val scores from `run_id`'s last val evaluation (a version's score is its
        latest evaluation)."""
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

    def compare(self, base: str, version: str) -> Verdict:
        """`version` against `base` (its parent, or any evaluated version: a sibling control) on the
        val tasks both evaluated, by `version`'s protocol; stores nothing."""
        base_run, run, splits = self._paired(base, version)
        protocol = self.reader.version_config(version).eval
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
        primary = self.reader.version_config(version).eval.primary
        return flips(self.store, parent_run.id, child_run.id, primary, splits, examples)

    def _paired(self, base: str, version: str) -> tuple[RunRecord, RunRecord, tuple[str, str]]:
        """What a comparison of `version` with `base` reads: both evaluation runs, and the split of
        each."""
        base_run, run = self.reader.eval_run(base), self.reader.eval_run(version)
        if base_run is None or run is None:
            raise ValueError(f"{base} or {version} has no evaluation yet")
        splits = ("val", "val")
        if self.reader.version_config(base).domain != self.reader.version_config(version).domain:
            # One of them changed the environment (e.g. closed a leak): val as each saw it is not
            # common ground, the clean replay is (a run without one was clean already).
            splits = (clean_split(self.store, base_run.id), clean_split(self.store, run.id))
        return base_run, run, splits

    def _parent(self, version: str) -> str:
        record = self.store.get_version(version)
        if record is None or record.parent is None:
            raise ValueError(f"{version} has no parent to be judged against")
        return record.parent

    # -- diagnosis ------------------------------------------------------------------------------
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

    def diagnose_version(self, version: str, run: RunRecord | None = None, layers: Layers = None) -> Diagnosis:
        """Diagnose a version's latest run (or `run`) again, with the workspace's current harness
        limited to `layers`, and store it."""
        run = run or self.reader.latest_run(version)
        record = self.store.get_version(version)
        if record is None:
            raise ValueError(f"no version {version!r} in this workspace")
        config = self.reader.version_config(version)
        diagnosis = diagnose(self.store, run, record, config, harness=self.harness(layers))
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
        harness = load_harness(self.reader.root)
        return harness.only(layers) if layers is not None else harness
