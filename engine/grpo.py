"""GRPO quantities that training, the harness, backtests, the API and the benchmark all read.

Each is defined here once and imported everywhere it is used, so a threshold cannot drift
between the analyzer that reports it and the filter that acts on it.
"""

from __future__ import annotations

#: A GRPO group whose reward std (population) is below this gives every sample the same
#: advantage: it teaches nothing ("dead"). TRL's `frac_reward_zero_std` counts exactly-zero std.
DEAD_STD = 1e-3

#: A group filter that keeps less than this share of a step's groups leaves too little gradient
#: (the `over_filtering` rule; a filter backtest predicting less is contradicted).
MIN_KEEP_RATIO = 0.3
