"""The dead-group aware group filter, shared by training (the worker) and the filter backtest, so
that a backtest predicts exactly what a run with the same settings would keep.

The EMA threshold is part of each checkpoint (`state` / `restore`): a resumed run goes on from
the threshold it had at its checkpoint's step, as an uninterrupted run would."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.config import GroupFilterConfig


@dataclass
class GroupFilter:
    """Keep a step's groups whose reward spread (population std) is above the threshold, at most
    the `keep_ratio` share of them (largest spread first); with `ema`, the threshold follows an
    exponential moving average of each step's median spread."""

    std_threshold: float
    keep_ratio: float | None = None
    ema: float | None = None
    threshold: float = field(init=False)

    def __post_init__(self) -> None:
        self.threshold = self.std_threshold

    @classmethod
    def from_config(cls, cfg: GroupFilterConfig) -> GroupFilter | None:
        if not cfg.enabled:
            return None
        return cls(cfg.std_threshold, cfg.keep_ratio if cfg.keep_ratio < 1 else None, cfg.ema or None)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the filter (JSON): the threshold the EMA has reached."""
        return {"threshold": self.threshold}

    def restore(self, state: dict[str, Any]) -> None:
        self.threshold = float(state["threshold"])

    def keep(self, spreads: np.ndarray) -> np.ndarray:
        """A boolean mask over one step's groups; updates the EMA threshold."""
        spreads = np.asarray(spreads, dtype=float)
        if self.ema is not None:
            self.threshold = self.ema * self.threshold + (1 - self.ema) * float(np.median(spreads))
        keep = spreads > self.threshold
        if self.keep_ratio is not None:
            rank = np.empty(len(spreads), dtype=int)
            rank[np.argsort(-spreads, kind="stable")] = np.arange(len(spreads))
            keep &= rank < max(1, int(round(self.keep_ratio * len(spreads))))
        return keep
