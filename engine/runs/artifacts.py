"""What a run worker leaves in its run directory, and how the engine reads it back.

- ``spec.json``: the run's specification (written by the engine before launch).
- ``events.jsonl``: append-only event log, one JSON object per line, flushed per step.
- ``rollouts/*.parquet``: rollout batches, each written to a temporary name and then renamed,
  so a reader never sees half a file.
- ``worker.log``: the worker's stdout and stderr.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

EVENTS_FILE = "events.jsonl"
SPEC_FILE = "spec.json"
LOG_FILE = "worker.log"
ROLLOUT_DIR = "rollouts"

#: One tool call of a multi-turn episode (the `tool_calls` column is a list of these).
TOOL_CALL = pa.struct(
    [
        ("turn", pa.int32()),
        ("tool", pa.string()),
        ("args", pa.string()),
        ("ok", pa.bool_()),
        ("files", pa.list_(pa.string())),
    ]
)

ROLLOUT_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int32()),
        ("split", pa.string()),
        ("decoding", pa.string()),
        ("group_id", pa.int32()),
        ("sample_idx", pa.int32()),
        ("task_id", pa.string()),
        ("subset", pa.string()),
        ("prompt", pa.string()),
        ("completion", pa.string()),
        ("reward", pa.float64()),
        ("reward_components", pa.map_(pa.string(), pa.float64())),
        ("truncated", pa.bool_()),
        ("completion_length", pa.int32()),
        ("turns", pa.string()),
        ("num_turns", pa.int32()),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("reference", pa.string()),
        ("audit", pa.bool_()),
        ("answer_key", pa.string()),
    ]
)


@dataclass
class RolloutBatch:
    """Column lists of one batch of rollouts (one GRPO step, or one evaluation)."""

    run_id: str
    step: int
    split: str
    decoding: str
    group_id: list[int] = field(default_factory=list)
    sample_idx: list[int] = field(default_factory=list)
    task_id: list[str] = field(default_factory=list)
    subset: list[str] = field(default_factory=list)
    prompt: list[str] = field(default_factory=list)
    completion: list[str] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    reward_components: list[dict[str, float]] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    completion_length: list[int] = field(default_factory=list)
    #: Multi-turn domains only (else left empty): the turns as JSON, their count, the tool calls.
    turns: list[str | None] = field(default_factory=list)
    num_turns: list[int | None] = field(default_factory=list)
    tool_calls: list[list[dict[str, Any]] | None] = field(default_factory=list)
    #: Evaluation only (else left empty): the task's reference answer and the verifier audit's
    #: reading of the completion (None: no audit applies), `engine.domains.audit`.
    reference: list[str | None] = field(default_factory=list)
    audit: list[bool | None] = field(default_factory=list)
    #: Evaluation of a one-answer domain only: the completion's canonical final answer
    #: (`engine.domains.audit.answer_key`), what the agreement of accepted answers compares.
    answer_key: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.task_id)

    def to_arrow(self) -> pa.Table:
        n = len(self)
        columns = {
            "run_id": [self.run_id] * n,
            "step": [self.step] * n,
            "split": [self.split] * n,
            "decoding": [self.decoding] * n,
            "group_id": self.group_id,
            "sample_idx": self.sample_idx,
            "task_id": self.task_id,
            "subset": self.subset,
            "prompt": self.prompt,
            "completion": self.completion,
            "reward": self.reward,
            "reward_components": [list(c.items()) for c in self.reward_components],
            "truncated": self.truncated,
            "completion_length": self.completion_length,
            "turns": self.turns or [None] * n,
            "num_turns": self.num_turns or [None] * n,
            "tool_calls": self.tool_calls or [None] * n,
            "reference": self.reference or [None] * n,
            "audit": self.audit or [None] * n,
            "answer_key": self.answer_key or [None] * n,
        }
        return pa.Table.from_pydict(columns, schema=ROLLOUT_SCHEMA)


def write_rollouts(run_dir: Path, name: str, batch: RolloutBatch) -> str:
    """Write a batch as ``rollouts/<name>.parquet`` atomically; returns the path relative to run_dir."""
    out_dir = run_dir / ROLLOUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{name}.parquet"
    tmp = out_dir / f".{name}.parquet.tmp"
    pq.write_table(batch.to_arrow(), tmp, compression="zstd")
    os.replace(tmp, final)
    return f"{ROLLOUT_DIR}/{final.name}"


class EventLog:
    """Append-only JSON-lines writer; every event is flushed so the engine can follow along.
    Without a path (a rank other than 0 of a multi-GPU run), events are dropped."""

    def __init__(self, path: Path | None):
        self.path = path
        if path is None:
            self._fh: IO[str] = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            return
        # A worker killed mid-line left half an event: end it, so the next event stays whole.
        torn = path.exists() and path.stat().st_size > 0 and _last_byte(path) != b"\n"
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if torn:
            self._fh.write("\n")

    def write(self, type: str, **payload: Any) -> None:
        record = {"type": type, "ts": time.time(), **payload}
        self._fh.write(json.dumps(record, separators=(",", ":"), default=_jsonable) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete events after byte `offset`, and the offset after the last complete line.

    A line still being written (no newline yet) is left for the next call; a line that is not
    JSON (a worker killed mid-write) is skipped, never fatal.
    """
    if not path.exists():
        return [], offset
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    events = []
    for line in data[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events, offset + end + 1


def run_outcome(run_dir: Path) -> str | None:
    """How a run's worker ended, from its event log: "end", "error", or None (it has not)."""
    kinds = {e.get("type") for e in read_events(run_dir / EVENTS_FILE, 0)[0]}
    return "end" if "end" in kinds else "error" if "error" in kinds else None


def worker_cpu_seconds(run_dir: Path) -> float:
    """The CPU seconds a run's workers reported as they ended (each retry's too); 0 while none
    has. A worker forked from the engine's fork server is no child of the process that asked for
    the run, so only it can say what it spent."""
    ends = (e for e in read_events(run_dir / EVENTS_FILE, 0)[0] if e.get("type") in ("end", "error"))
    return sum(float(e.get("cpu_seconds") or 0.0) for e in ends)


def metric_rows(events: Sequence[dict[str, Any]]) -> list[tuple[int, str, float | None]]:
    rows: list[tuple[int, str, float | None]] = []
    for event in events:
        if event.get("type") == "metrics":
            step = int(event["step"])
            rows.extend((step, key, None if value is None else float(value)) for key, value in event["values"].items())
    return rows
