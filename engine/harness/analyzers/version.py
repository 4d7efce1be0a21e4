"""Version layer: where this version stands in its lineage."""

from __future__ import annotations

import numpy as np

from engine.harness.base import Context, Finding, analyzer
from engine.verdict import paired_bootstrap

FAILED_VERDICTS = ("regressed", "insufficient evidence", "mixed")

# The latest succeeded run with a val evaluation of the version and of its parent.
LATEST_EVALUATED_RUNS = """
    SELECT DISTINCT ON (r.version) o.run_id, r.version FROM rollouts o JOIN runs r ON r.id = o.run_id
    WHERE r.version IN ($version, $parent) AND r.state = 'succeeded' AND o.split = 'val'
    ORDER BY r.version, r.ended_at DESC
"""


@analyzer("lineage", "version")
def lineage(ctx: Context) -> list[Finding]:
    """Deltas to the parent and to the best promoted version, consecutive failures along the
    lineage (graded against the workspace's own ``[coach]`` gates_after_failures, a warning, and
    escalate_after, critical: the counts at which the coach forces gates and escalates), and the
    intervention kinds tried so far."""
    v = ctx.version
    out: list[Finding] = []
    scores = ctx.q(
        "SELECT name, parent, state, verdict, (val_greedy + val_sampled) / 2 FROM versions ORDER BY created_at"
    )
    by_name = {name: (parent, state, verdict, score) for name, parent, state, verdict, score in scores}
    mine = by_name.get(v.name, (None, None, None, None))[3]
    if v.parent and mine is not None and by_name.get(v.parent, (None,) * 4)[3] is not None:
        delta = mine - by_name[v.parent][3]
        out.append(Finding("version.delta_to_parent", delta, "info", f"{delta:+.3f} val correctness vs {v.parent}"))
    promoted = [(s, n) for n, (_, st, _, s) in by_name.items() if st == "promoted" and s is not None]
    if promoted and mine is not None:
        best_score, best = max(promoted)
        out.append(
            Finding("version.delta_to_best", mine - best_score, "info", f"{mine - best_score:+.3f} vs best {best}")
        )
    streak, name = 0, v.name
    while (
        name in by_name and by_name[name][2] in FAILED_VERDICTS or (name in by_name and by_name[name][1] == "rejected")
    ):
        streak += 1
        name = by_name[name][0]
    escalate, gates = ctx.config.coach.escalate_after, ctx.config.coach.gates_after_failures
    out.append(
        Finding(
            "version.consecutive_failures",
            float(streak),
            "critical" if streak >= escalate else "warning" if streak >= gates else "info",
            f"{streak} consecutive version(s) without improvement in this lineage",
            threshold=float(gates),
        )
    )
    kinds = ctx.q("SELECT i.kind, count(*) FROM interventions i JOIN versions v ON v.intervention_id = i.id GROUP BY 1")
    if kinds:
        tried = ", ".join(f"{k} x{n}" for k, n in sorted(kinds))
        out.append(Finding("version.intervention_kinds", float(len(kinds)), "info", f"interventions so far: {tried}"))
    return out


@analyzer("clean_protocol", "version")
def clean_protocol(ctx: Context) -> list[Finding]:
    """Where the environment can leak (val is also played clean, split ``clean``): how much of the
    val score is not reproduced without the leak (val - clean, per task, mean of greedy and
    sampled), for this version and against its parent. A gap that grows with the version is a
    gain made by reading the answer, not by the skill; its paired 95% interval is reported."""
    rows = ctx.q(
        f"""
        WITH latest AS ({LATEST_EVALUATED_RUNS}),
        scored AS (
            SELECT l.version, o.split, o.decoding, o.task_id, o.step,
                   avg(o.reward_components['correctness']) AS c
            FROM latest l JOIN rollouts o ON o.run_id = l.run_id
            WHERE o.split IN ('val', 'clean')
            GROUP BY l.version, o.split, o.decoding, o.task_id, o.step
            QUALIFY o.step = max(o.step) OVER (PARTITION BY l.version, o.split)
        )
        SELECT v.version, v.task_id, avg(v.c - k.c) AS gap
        FROM scored v JOIN scored k USING (version, decoding, task_id)
        WHERE v.split = 'val' AND k.split = 'clean'
        GROUP BY v.version, v.task_id ORDER BY v.task_id
        """,
        {"version": ctx.version.name, "parent": ctx.version.parent or ""},
    )
    gaps: dict[str, dict[str, float]] = {}
    for version, task, gap in rows:
        gaps.setdefault(version, {})[task] = gap
    mine = gaps.get(ctx.version.name)
    if not mine:
        return []
    gap = float(np.mean(list(mine.values())))
    out = [
        Finding(
            "version.clean_gap",
            gap,
            "info",
            f"val correctness {gap:+.3f} above the clean environment's on {len(mine)} tasks",
        )
    ]
    theirs = gaps.get(ctx.version.parent or "")
    tasks = sorted(mine.keys() & theirs.keys()) if theirs else []
    if tasks:
        child, parent = np.array([mine[t] for t in tasks]), np.array([theirs[t] for t in tasks])
        low, high = paired_bootstrap(parent, child)
        delta = float((child - parent).mean())
        out += [
            Finding(
                "version.clean_gap_delta",
                delta,
                "info",
                f"val - clean gap {parent.mean():+.3f} -> {child.mean():+.3f} vs {ctx.version.parent} "
                f"(95% interval {low:+.3f} to {high:+.3f})",
            ),
            Finding("version.clean_gap_delta_low", low, "info", f"the gap delta's 95% interval starts at {low:+.3f}"),
        ]
    return out
