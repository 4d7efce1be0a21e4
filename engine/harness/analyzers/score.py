"""Score layer: the primary metric on held-out data, with its noise floor; per-subset scores;
binary correctness during training."""

from __future__ import annotations

import numpy as np

from engine.harness.base import Context, Finding, analyzer
from engine.harness.thresholds import SUBSET_MIN_TASKS
from engine.verdict import BOOTSTRAP_SAMPLES

PRIMARY = "correctness"


@analyzer("val_score", "score")
def val_score(ctx: Context) -> list[Finding]:
    """Val correctness (greedy and sampled) of the run's last evaluation, with a 95% bootstrap
    interval over tasks as the noise floor."""
    rows = ctx.q(
        """
        SELECT decoding, task_id, avg(reward_components[$primary])
        FROM rollouts
        WHERE run_id = $run AND split = 'val'
          AND step = (SELECT max(step) FROM rollouts WHERE run_id = $run AND split = 'val')
        GROUP BY decoding, task_id ORDER BY decoding, task_id
        """,
        {"primary": PRIMARY},
    )
    out = []
    for decoding in ("greedy", "sampled"):
        values = np.array([r[2] for r in rows if r[0] == decoding and r[2] is not None], dtype=float)
        if not len(values):
            continue
        rng = np.random.default_rng(0)
        means = values[rng.integers(0, len(values), (BOOTSTRAP_SAMPLES, len(values)))].mean(axis=1)
        low, high = np.quantile(means, [0.025, 0.975])
        out.append(
            Finding(
                f"score.val_{decoding}",
                float(values.mean()),
                "info",
                f"val {decoding} {values.mean():.3f} (95% interval {low:.3f}-{high:.3f}, {len(values)} tasks)",
            )
        )
        out.append(Finding(f"score.noise_floor_{decoding}", float((high - low) / 2), "info"))
    return out


@analyzer("subsets", "score")
def subsets(ctx: Context) -> list[Finding]:
    """Greedy val correctness per subset (e.g. problem size); a subset never solved over at least
    `SUBSET_MIN_TASKS` tasks is a warning."""
    rows = ctx.q(
        """
        SELECT subset, avg(reward_components[$primary]), count(*)
        FROM rollouts
        WHERE run_id = $run AND split = 'val' AND decoding = 'greedy' AND subset IS NOT NULL
          AND step = (SELECT max(step) FROM rollouts WHERE run_id = $run AND split = 'val')
        GROUP BY subset ORDER BY subset
        """,
        {"primary": PRIMARY},
    )
    return [
        Finding(
            f"score.subset.{subset}",
            acc,
            SUBSET_MIN_TASKS.severity(n) if acc == 0 else "info",
            f"{subset}: {acc:.3f} on {n} tasks",
        )
        for subset, acc, n in rows
    ]


@analyzer("train_correctness", "score")
def train_correctness(ctx: Context) -> list[Finding]:
    """Binary correctness in the train rollouts, first vs last window (the honest counterpart
    of the shaped total reward)."""
    mean, first, last = ctx.window_means(
        "SELECT step, reward_components[$primary] AS c FROM rollouts WHERE run_id = $run AND split = 'train'",
        "c",
        {"primary": PRIMARY},
    )
    if mean is None or first is None or last is None:
        return []
    return [
        Finding("score.train_correctness", mean, "info", f"train correctness {mean:.3f}"),
        Finding(
            "score.train_correctness_trend",
            last - first,
            "info",
            f"train correctness {first:.3f} -> {last:.3f} (first -> last window)",
        ),
    ]
