"""Ingesting a run directory into the store, idempotently.

The byte offset of the event log already ingested is kept in the store; metrics are upserted
on (run, step, key) and each rollout file is recorded once, so ingesting again after a restart,
or from offset 0, duplicates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    files = [(run_dir / e["file"], e["file"], int(e["rows"])) for e in events if e.get("type") == "rollouts"]
    # One transaction per poll: the offset moves only together with what it covers.
    with store.transaction():
        report.metric_rows = store.upsert_metrics(run_id, metric_rows(events))
        report.rollout_rows = store.ingest_rollout_files(run_id, files)
        for e in events:
            if e.get("type") == "stopped":  # the collapse guard ended training early (once per run)
                known = "SELECT count(*) FROM events WHERE run_id = ? AND kind = 'stopped_early'"
                if not store.query_one(known, [run_id])[0]:  # type: ignore[index]
                    run = store.get_run(run_id)
                    payload = {"step": e["step"], "reason": e["reason"]}
                    store.add_event("stopped_early", payload, run_id=run_id, version=run.version if run else None)
        store.set_events_offset(run_id, new_offset)
    return report
