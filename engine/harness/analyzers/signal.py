"""Signal layer: is there a learning signal, and what is the optimizer doing with it?

Every line a finding is graded against is an entry of `engine.harness.thresholds` (most are the
defaults of the public EvoTrainer playbook), the one the rules read too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from engine.domains.judge import FALLBACK_RATIO, FALLBACKS_PREFIX
from engine.grpo import DEAD_STD
from engine.harness.base import Context, Finding, analyzer
from engine.harness.cutoffs import LEVEL
from engine.harness.thresholds import (
    CLIP_RATIO,
    CORRECTNESS_DEAD_GROUPS,
    DEAD_GROUPS,
    ENTROPY_RATIO,
    FILTER_KEEP_RATIO,
    JUDGE_FALLBACKS,
    KL_SPIKE,
    LENGTH_REWARD_CORR,
    LOSS_AT_ZERO,
    REWARD_MODE_SHARE,
    REWARD_SPREAD,
    TRUNCATION,
)
from engine.store import Store

_GROUPS = f"""
    WITH g AS (
        SELECT step, group_id, stddev_pop(reward) AS spread, stddev_pop(reward) < {DEAD_STD} AS dead,
               stddev_pop(coalesce(reward_components['correctness'], reward)) < {DEAD_STD} AS dead_correct
        FROM rollouts WHERE run_id = $run AND split = 'train'
        GROUP BY step, group_id
    ), last AS (SELECT max(step) - $window AS cut FROM g)
"""


@analyzer("dead_groups", "signal")
def dead_groups(ctx: Context) -> list[Finding]:
    """Share of GRPO groups whose reward std < DEAD_STD, over the run and over its last window; and
    the share whose binary correctness alone has no spread (other components may give the total
    reward a spread that teaches nothing about correctness)."""
    overall, recent, n_groups, correct = ctx.q1(
        _GROUPS
        + """SELECT avg(dead::INT), avg(dead::INT) FILTER (WHERE step > (SELECT cut FROM last)), count(*),
                    avg(dead_correct::INT) FROM g"""
    )
    if not n_groups:
        return []
    worst = ctx.q(_GROUPS + "SELECT step FROM g GROUP BY step ORDER BY avg(dead::INT) DESC, step LIMIT 5")
    examples = ctx.q(
        _GROUPS
        + """SELECT concat_ws('/', $run, 'train', g.step, g.group_id, 0) FROM g
             WHERE dead ORDER BY g.step DESC, g.group_id LIMIT 5"""
    )
    return [
        Finding(
            "signal.dead_group_ratio",
            overall,
            explanation=f"{overall:.0%} of {n_groups} groups had no reward spread (last window {recent:.0%})",
            steps=tuple(r[0] for r in worst),
            rollouts=tuple(r[0] for r in examples),
            **DEAD_GROUPS.grade(recent),
        ),
        Finding("signal.dead_group_ratio_recent", recent, **DEAD_GROUPS.grade(recent)),
        Finding(
            "signal.correctness_dead_group_ratio",
            correct,
            explanation=f"{correct:.0%} of {n_groups} groups had no spread in binary correctness (all right or all"
            f" wrong; {overall:.0%} had none in the total reward)",
            rollouts=tuple(
                r[0]
                for r in ctx.q(
                    _GROUPS
                    + """SELECT concat_ws('/', $run, 'train', g.step, g.group_id, 0) FROM g
                         WHERE dead_correct ORDER BY g.step DESC, g.group_id LIMIT 5"""
                )
            ),
            **CORRECTNESS_DEAD_GROUPS.grade(correct),
        ),
    ]


@analyzer("reward_spread", "signal")
def reward_spread(ctx: Context) -> Finding | None:
    """Mean within-group reward std (warning below the `REWARD_SPREAD` line)."""
    (spread,) = ctx.q1(_GROUPS + "SELECT avg(spread) FROM g") or (None,)
    if spread is None:
        return None
    return Finding(
        "signal.reward_spread",
        spread,
        explanation=f"mean within-group reward std {spread:.3f}",
        **REWARD_SPREAD.grade(spread),
    )


@analyzer("reward_components", "signal")
def reward_components(ctx: Context) -> list[Finding]:
    """Mean, std and distinct values of every reward component, and the share of the most common
    total reward (one discrete value dominating means little signal)."""
    rows = ctx.q(
        """
        SELECT e.key, avg(e.value), stddev_pop(e.value), count(DISTINCT e.value)
        FROM (SELECT unnest(map_entries(reward_components)) AS e FROM rollouts
              WHERE run_id = $run AND split = 'train')
        GROUP BY e.key ORDER BY e.key
        """
    )
    out = [
        Finding(
            f"signal.component.{key}.mean",
            mean,
            "info",
            f"{key}: mean {mean:.3f}, std {std:.3f}, {distinct} distinct value(s)",
        )
        for key, mean, std, distinct in rows
    ]
    mode = ctx.q1(
        """
        SELECT max(n) / sum(n), arg_max(reward, n) FROM (
            SELECT reward, count(*) AS n FROM rollouts WHERE run_id = $run AND split = 'train' GROUP BY reward
        )
        """
    )
    if mode and mode[0] is not None:
        out.append(
            Finding(
                "signal.reward_mode_share",
                mode[0],
                explanation=f"{mode[0]:.0%} of train rollouts have the same total reward ({mode[1]:g})",
                **REWARD_MODE_SHARE.grade(mode[0]),
            )
        )
    return out


@analyzer("judge_fallbacks", "signal")
def judge_fallbacks(ctx: Context) -> Finding | None:
    """Share of episodes the Claude judge could not score, so the offline rubric scored them
    instead (warning above the `JUDGE_FALLBACKS` line), with the kinds of failure. Only runs whose
    reward weighs the Claude judge log it."""
    ratio, n_steps, worst = ctx.q1(
        """SELECT avg(value), count(*), max_by(step, value, 5) FILTER (WHERE value > 0) FROM metrics
           WHERE run_id = $run AND key = $ratio AND value IS NOT NULL""",
        {"ratio": FALLBACK_RATIO},
    )
    if not n_steps:
        return None
    kinds = ctx.q(
        """SELECT substr(key, length($prefix) + 1), sum(value)::BIGINT FROM metrics
           WHERE run_id = $run AND starts_with(key, $prefix) GROUP BY 1 ORDER BY 2 DESC, 1""",
        {"prefix": FALLBACKS_PREFIX},
    )
    why = ", ".join(f"{kind} x{n}" for kind, n in kinds) or "no failures"
    return Finding(
        "signal.judge_fallback_ratio",
        ratio,
        explanation=f"the Claude judge could not score {ratio:.0%} of episodes (mean of {n_steps} steps); the "
        f"offline rubric scored them instead ({why})",
        steps=tuple(sorted(worst or ())),
        **JUDGE_FALLBACKS.grade(ratio),
    )


#: A run's turn limit (`domain.max_turns`, multi-turn domains) read from its stored config; `r` is
#: the run. An episode out of turns is a truncated one that took this many actions (one cut by the
#: token budget, or ended without a submit, took fewer).
RUN_MAX_TURNS = "try_cast(r.config->'domain'->>'max_turns' AS INTEGER)"


@analyzer("truncation", "signal")
def truncation(ctx: Context) -> list[Finding]:
    """Share of train completions cut by max_completion_length (or, in a multi-turn domain, by the
    turn limit), graded on the last window (`TRUNCATION`); and, where the run has a turn limit, the
    share of the truncated episodes that ran out of turns (the out_of_turns rule)."""
    out: list[Finding] = []
    rate, recent = ctx.q1(
        """
        SELECT avg(truncated::INT),
               avg(truncated::INT) FILTER (WHERE step > (SELECT max(step) FROM rollouts
                                                          WHERE run_id = $run AND split = 'train') - $window)
        FROM rollouts WHERE run_id = $run AND split = 'train'
        """
    ) or (None, None)
    if rate is None:
        return out
    out.append(
        Finding(
            "signal.truncation_rate",
            rate,
            explanation=f"{rate:.1%} of completions truncated (last window {recent:.1%})",
            rollouts=ctx.example_rollouts("truncated"),
            **TRUNCATION.grade(recent),
        )
    )
    turns = ctx.q1(
        f"""
        SELECT any_value({RUN_MAX_TURNS}), count(*), count(*) FILTER (WHERE o.num_turns >= {RUN_MAX_TURNS})
        FROM rollouts o JOIN runs r ON r.id = o.run_id
        WHERE o.run_id = $run AND o.split = 'train' AND o.truncated AND o.num_turns IS NOT NULL
        """
    )
    limit, cut, out_of_turns = turns or (None, 0, 0)
    if limit is not None and cut:
        out.append(
            Finding(
                "signal.out_of_turns_share",
                out_of_turns / cut,
                "info",
                f"{out_of_turns} of {cut} truncated episodes ran out of their {limit} turns; the rest ran out of tokens"
                " or ended without a submit",
                rollouts=ctx.example_rollouts(f"truncated AND num_turns >= {int(limit)}"),
            )
        )
    return out


@analyzer("length_dynamics", "signal")
def length_dynamics(ctx: Context) -> list[Finding]:
    """Completion length: P50/P90, first vs last window, and its correlation with reward
    (above the `LENGTH_REWARD_CORR` line, the policy may be paid for length)."""
    row = ctx.q1(
        """
        WITH r AS (SELECT * FROM rollouts WHERE run_id = $run AND split = 'train'),
             b AS (SELECT min(step) + $window AS first_cut, max(step) - $window AS last_cut FROM r)
        SELECT quantile_cont(completion_length, 0.5), quantile_cont(completion_length, 0.9),
               avg(completion_length) FILTER (WHERE step < (SELECT first_cut FROM b)),
               avg(completion_length) FILTER (WHERE step > (SELECT last_cut FROM b)),
               corr(completion_length, reward)
        FROM r
        """
    )
    if not row or row[0] is None:
        return []
    p50, p90, first, last, corr = row
    return [
        Finding("signal.length_p50", p50, "info", f"completion length P50 {p50:.0f}, P90 {p90:.0f} tokens"),
        Finding("signal.length_p90", p90, "info"),
        Finding(
            "signal.length_trend",
            (last / first) if first else None,
            "info",
            f"mean completion length {first:.1f} -> {last:.1f} tokens (first -> last window)",
        ),
        Finding(
            "signal.length_reward_corr",
            corr,
            explanation=f"corr(length, reward) = {corr:.2f}" if corr is not None else "length or reward constant",
            **LENGTH_REWARD_CORR.grade(corr),
        ),
    ]


@dataclass(frozen=True)
class Drift:
    """How far a per-step metric moved over a run against its own step-to-step noise: the
    least-squares slope of its value on the step, the slope's t statistic, and the two-sided
    critical value of that t at the verdict's level (Student's t, steps - 2 degrees of freedom)."""

    key: str
    steps: int
    slope: float
    t: float
    critical: float

    @property
    def units(self) -> float:
        """|t| in units of the critical value: below 1 (`UPDATE_DRIFT`) the drift is inside its noise."""
        return abs(self.t) / self.critical

    def __str__(self) -> str:
        return (
            f"{self.key} drifted {self.slope:+.3g} a step over {self.steps} steps, t = {self.t:+.2f} against the"
            f" {LEVEL:.0%} critical value {self.critical:.2f}"
        )


#: The regression of one metric on the step, in one pass (DuckDB's regr_* aggregates), as one
#: struct: a store without the metric answers a struct of zeros and NULLs.
_DRIFT = """
    SELECT {'n': regr_count(value, step), 'slope': regr_slope(value, step), 'sxx': regr_sxx(value, step),
            'syy': regr_syy(value, step), 'sxy': regr_sxy(value, step)}
    FROM metrics WHERE run_id = $run AND key = $key AND value IS NOT NULL AND isfinite(value)
"""


def metric_drift(store: Store, run_id: str, key: str) -> Drift | None:
    """The drift of metric `key` over run `run_id`'s steps (None with fewer than three steps: a
    slope and its noise need them). The one definition that the `optimizer` analyzer reports and
    the coach sizes a learning rate from."""
    row = store.query_one(_DRIFT, {"run": run_id, "key": key})
    fit = row[0] if row else None
    if not fit or fit["n"] is None or fit["sxx"] is None:
        return None
    dof = int(fit["n"]) - 2
    if dof < 1 or not fit["sxx"] > 0:
        return None
    slope, sxx = float(fit["slope"]), float(fit["sxx"])
    residual = max(0.0, float(fit["syy"]) - float(fit["sxy"]) ** 2 / sxx)  # round-off can make it negative
    error = math.sqrt(residual / dof / sxx)
    if error > 0:
        t = slope / error
    else:  # a perfect line: no drift at all, or a drift beyond any noise
        t = 0.0 if slope == 0 else math.copysign(math.inf, slope)
    return Drift(key, int(fit["n"]), slope, t, float(stats.t.ppf((1 + LEVEL) / 2, dof)))


def _drift_finding(ctx: Context, key: str, metric: str) -> Finding | None:
    drift = metric_drift(ctx.store, ctx.run_id, key)
    if drift is None:
        return None
    return Finding(
        metric,
        drift.units,
        "info",
        f"{drift}: {drift.units:.2f} critical values",
    )


def _trend(ctx: Context, key: str) -> tuple[float | None, float | None]:
    source = "SELECT step, value FROM metrics WHERE run_id = $run AND key = $key AND value IS NOT NULL"
    _, first, last = ctx.window_means(source, "value", {"key": key})
    return first, last


@analyzer("optimizer", "signal")
def optimizer(ctx: Context) -> list[Finding]:
    """Entropy collapse, KL spikes, clipping, loss stuck at zero, and the reward trend."""
    keys = ctx.metric_keys()
    out: list[Finding] = []
    if "entropy" in keys:
        first, last = _trend(ctx, "entropy")
        ratio = last / first if first else None
        out.append(
            Finding(
                "signal.entropy_ratio",
                ratio,
                explanation=f"entropy {first:.3f} -> {last:.3f} (first -> last window)"
                if first and last is not None
                else "",
                **ENTROPY_RATIO.grade(ratio),
            )
        )
    if "kl" in keys:
        spike = ctx.q1(
            """SELECT max(value), median(value), arg_max(step, value) FROM metrics
               WHERE run_id = $run AND key = 'kl'"""
        )
        peak, median, at = spike
        ratio = peak / median if median else None
        out.append(
            Finding(
                "signal.kl_spike",
                ratio,
                explanation=f"KL peaks at {peak:.4f} (step {at}), {ratio:.1f}x its median" if ratio else "KL flat",
                steps=(at,) if at is not None else (),
                **KL_SPIKE.grade(ratio),
            )
        )
    if "clip_ratio/region_mean" in keys:
        (clip,) = ctx.q1("SELECT avg(value) FROM metrics WHERE run_id = $run AND key = 'clip_ratio/region_mean'")
        out.append(
            Finding("signal.clip_ratio", clip, explanation=f"mean clipped share {clip:.3f}", **CLIP_RATIO.grade(clip))
        )
    if "loss" in keys:
        # Dead training: the last window's loss and gradient are both zero.
        stuck = ctx.q1(
            """
            WITH b AS (SELECT max(step) - $window AS cut FROM metrics WHERE run_id = $run)
            SELECT max(abs(value)) FILTER (WHERE key = 'loss'), max(abs(value)) FILTER (WHERE key = 'grad_norm')
            FROM metrics WHERE run_id = $run AND step > (SELECT cut FROM b)
            """
        )
        loss, grad = stuck
        dead = LOSS_AT_ZERO.crossed(loss) and (grad is None or LOSS_AT_ZERO.crossed(grad))
        out.append(
            Finding(
                "signal.loss_stuck_at_zero",
                1.0 if dead else 0.0,
                "critical" if dead else "info",
                "loss and gradient are zero in the last window: nothing is being learned" if dead else "",
            )
        )
    if "reward" in keys:
        first, last = _trend(ctx, "reward")
        if first is not None and last is not None:
            out.append(Finding("signal.reward_trend", last - first, "info", f"reward {first:.3f} -> {last:.3f}"))
    # How far the policy moved, against noise (the small_updates rule): its entropy, and its reward.
    for key in ("entropy", "reward"):
        if key in keys and (drift := _drift_finding(ctx, key, f"signal.{key}_drift")) is not None:
            out.append(drift)
    if "filter/keep_ratio" in keys:
        (keep,) = ctx.q1("SELECT avg(value) FROM metrics WHERE run_id = $run AND key = 'filter/keep_ratio'")
        out.append(
            Finding(
                "signal.filter_keep_ratio",
                keep,
                explanation=f"the group filter kept {keep:.0%} of groups",
                **FILTER_KEEP_RATIO.grade(keep),
            )
        )
    return out
