"""Version layer: where this version stands in its lineage."""

from __future__ import annotations

from engine.harness.base import Context, Finding, analyzer

FAILED_VERDICTS = ("regressed", "insufficient evidence", "mixed")


@analyzer("lineage", "version")
def lineage(ctx: Context) -> list[Finding]:
    """Deltas to the parent and to the best promoted version, consecutive failures along the
    lineage (2: gates switch on, 3: escalate), and the intervention kinds tried so far."""
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
    out.append(
        Finding(
            "version.consecutive_failures",
            float(streak),
            "critical" if streak >= 3 else "warning" if streak >= 2 else "info",
            f"{streak} consecutive version(s) without improvement in this lineage",
            threshold=2.0,
        )
    )
    kinds = ctx.q("SELECT i.kind, count(*) FROM interventions i JOIN versions v ON v.intervention_id = i.id GROUP BY 1")
    if kinds:
        tried = ", ".join(f"{k} x{n}" for k, n in sorted(kinds))
        out.append(Finding("version.intervention_kinds", float(len(kinds)), "info", f"interventions so far: {tried}"))
    return out
