"""Builders of constructed runs for harness tests: every expected value is derived in the test."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.config import parse_config
from engine.harness.base import Context
from engine.harness.diagnose import Diagnosis, diagnose
from engine.runs.artifacts import ROLLOUT_SCHEMA
from engine.store import Store


@dataclass
class Rollout:
    reward: float
    correctness: float | None = None
    format: float | None = None
    truncated: bool = False
    length: int = 10
    completion: str | None = None
    calls: list[dict[str, Any]] | None = None  # tool-call trace
    turns: int | None = None


@dataclass
class RunBuilder:
    store: Store
    run_id: str = "v1-train-1"
    version: str = "v1"
    rows: list[dict[str, Any]] = field(default_factory=list)
    metric_rows: list[tuple[int, str, float]] = field(default_factory=list)

    def step(
        self,
        step: int,
        groups: Sequence[Sequence[Rollout]],
        split: str = "train",
        decoding: str = "sampled",
        first_sample: int = 0,  # evaluation numbers greedy 0, sampled passes 1, 2, ...
    ) -> RunBuilder:
        for g, group in enumerate(groups):
            for s, r in enumerate(group):
                components = {"correctness": r.correctness if r.correctness is not None else r.reward}
                if r.format is not None:
                    components["format"] = r.format
                self.rows.append(
                    {
                        "run_id": self.run_id,
                        "step": step,
                        "split": split,
                        "decoding": decoding,
                        "group_id": g,
                        "sample_idx": first_sample + s,
                        "task_id": f"t{g}",
                        "subset": "s",
                        "prompt": f"p{g}",
                        "completion": r.completion if r.completion is not None else f"c{step}-{g}-{s}",
                        "reward": r.reward,
                        "reward_components": list(components.items()),
                        "truncated": r.truncated,
                        "completion_length": r.length,
                        "turns": json.dumps([{}] * r.turns) if r.turns is not None else None,
                        "num_turns": r.turns,
                        "tool_calls": r.calls,
                    }
                )
        return self

    def metric(self, key: str, values: Sequence[float], start: int = 1) -> RunBuilder:
        self.metric_rows += [(start + i, key, v) for i, v in enumerate(values)]
        return self

    def save(self, steps: int) -> None:
        if not self.store.get_version(self.version):
            self.store.add_version("v0", None, "versions/v0", "a", state="promoted")
            self.store.add_version(self.version, "v0", f"versions/{self.version}", "b", state="trained")
        self.store.add_run(self.run_id, self.version, "train", "/nowhere", {}, steps)
        batch = pa.Table.from_pylist(self.rows, schema=ROLLOUT_SCHEMA)
        self.store.insert_rollouts("SELECT * FROM batch", batch=batch)
        if self.metric_rows:
            self.store.upsert_metrics(self.run_id, self.metric_rows)

    def diagnose(self, steps: int, window: int = 1, workspace: Path | None = None) -> Diagnosis:
        self.save(steps)
        return self.diagnose_saved(window, workspace)

    def diagnose_saved(self, window: int = 1, workspace: Path | None = None) -> Diagnosis:
        run = self.store.get_run(self.run_id)
        version = self.store.get_version(self.version)
        assert run is not None and version is not None
        config = parse_config('[workspace]\nname = "t"\n', Path("t.toml"))
        return diagnose(self.store, run, version, config, workspace, window=window)


def value(d: Diagnosis, metric: str) -> float | None:
    (f,) = [f for f in d.findings if f.metric == metric]
    return f.value


def severity(d: Diagnosis, metric: str) -> str:
    (f,) = [f for f in d.findings if f.metric == metric]
    return f.severity


def fired(d: Diagnosis) -> list[str]:
    return [r.rule for r in d.fired]


def call(tool: str, turn: int, ok: bool = True, files: Sequence[str] = ()) -> dict[str, Any]:
    return {"turn": turn, "tool": tool, "args": "", "ok": ok, "files": list(files)}


__all__ = ["Context", "Rollout", "RunBuilder", "call", "fired", "severity", "value"]
