"""Ingesting a run directory into the store, idempotently.

The byte offset of the event log already ingested is kept in the store; metrics are upserted
on (run, step, key) and each rollout file is recorded once, so ingesting again after a restart,
or from offset 0, duplicates nothing. A relaunched worker's `resume` event says from which step
it redoes the run: what the store holds after that step is dropped before what it redoes comes in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import faults
from engine.runs.artifacts import EVENTS_FILE, metric_rows, read_events
from engine.store import Store


@dataclass
class IngestReport:
    events: list[dict[str, Any]] = field(default_factory=list)
    metric_rows: int = 0
    rollout_rows: int = 0


def ingest_run(store: Store, run_id: str, run_dir: Path) -> IngestReport:
    offset = store.events_offset(run_id)
    events, new_offset = read_events(run_dir / EVENTS_FILE, offset)
    report = IngestReport(events=events)
    if not events:
        return report
    # One transaction per poll: the offset moves only together with what it covers.
    with store.transaction():
        for resume, segment in _segments(events):
            if resume is not None:  # a relaunched worker redoes what came after its checkpoint
                store.forget_after(run_id, int(resume["step"]), bool(resume.get("final")))
            report.metric_rows += store.upsert_metrics(run_id, metric_rows(segment))
            files = [(run_dir / e["file"], e["file"], int(e["rows"])) for e in segment if e.get("type") == "rollouts"]
            report.rollout_rows += store.ingest_rollout_files(run_id, files)
            for e in segment:
                if e.get("type") == "stopped":  # the collapse guard ended training early (once per run)
                    _record_stop(store, run_id, e)
        faults.point("ingest")
        store.set_events_offset(run_id, new_offset)
    return report


def _segments(events: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any] | None, list[dict[str, Any]]]]:
    """The events in the order they must be applied: split at each `resume` event, which comes
    with the events up to the next one."""
    resume: dict[str, Any] | None = None
    segment: list[dict[str, Any]] = []
    for e in events:
        if e.get("type") == "resume":
            yield resume, segment
            resume, segment = e, []
        else:
            segment.append(e)
    yield resume, segment


def _record_stop(store: Store, run_id: str, event: dict[str, Any]) -> None:
    known = "SELECT count(*) FROM events WHERE run_id = ? AND kind = 'stopped_early'"
    if not store.query_one(known, [run_id])[0]:  # type: ignore[index]
        run = store.get_run(run_id)
        payload = {"step": event["step"], "reason": event["reason"]}
        store.add_event("stopped_early", payload, run_id=run_id, version=run.version if run else None)
