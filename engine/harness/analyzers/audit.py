"""Version layer: does this version's gain survive a second opinion on its accepted answers?

Evaluation stores, beside the verifier's reward, the verifier audit's reading of every answer
whose task has a reference (`engine.domains.audit`). Over the primary decoding of the latest val
evaluations of the version and its parent, on the tasks both answered, this analyzer compares
two paired differences with the same test the verdict uses (`engine.harness.cutoffs`): per task,
the verifier's correctness, and the audit's. A verifier gain whose audited twin is not itself a
gain (its interval reaches 0 or below) rests on answers the audit refuses: a critical finding,
which the `verifier_audit` rule turns into a block, with examples. Where no audit applies (no
reference answers: code, SWE, a custom domain without answers) it says so in words, never a pass.
"""

from __future__ import annotations

import numpy as np

from engine.harness.analyzers.version import LATEST_EVALUATED_RUNS
from engine.harness.base import Context, Finding, analyzer
from engine.harness.cutoffs import PairedGain, unsupported
from engine.harness.thresholds import ACCEPTED

#: Examples of accepted answers the audit refused, in the finding.
EXAMPLES = 3

#: SQL: the verifier accepted the answer (`ACCEPTED`).
_ACCEPTED = f"coalesce(reward_components['correctness'], reward) {ACCEPTED.op} {ACCEPTED.value}"

_PER_TASK = f"""
    WITH latest AS ({LATEST_EVALUATED_RUNS}),
    last AS (
        SELECT l.version, o.* FROM latest l JOIN rollouts o ON o.run_id = l.run_id
        WHERE o.split = 'val' AND o.decoding = $decoding
        QUALIFY o.step = max(o.step) OVER (PARTITION BY l.version)
    )
    SELECT version, task_id, prompt,
           avg(coalesce(reward_components['correctness'], reward)) AS verifier,
           avg(audit::INT) AS audit, count(*) FILTER (WHERE audit IS NULL) AS unaudited,
           count(*) FILTER (WHERE {_ACCEPTED}) AS accepted,
           count(*) FILTER (WHERE {_ACCEPTED} AND NOT audit) AS refused
    FROM last GROUP BY ALL
"""

_EXAMPLES = f"""
    WITH latest AS ({LATEST_EVALUATED_RUNS})
    SELECT o.prompt, o.completion, o.reference
    FROM latest l JOIN rollouts o ON o.run_id = l.run_id
    WHERE l.version = $version AND o.split = 'val' AND o.decoding = $decoding AND NOT o.audit
      AND {_ACCEPTED}
    ORDER BY o.step DESC, o.group_id, o.sample_idx LIMIT {EXAMPLES}
"""


def short(text: str, limit: int = 60) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= limit else "..." + flat[-limit:]


@analyzer("verifier_audit", "version")
def verifier_audit(ctx: Context) -> list[Finding]:
    """The verifier's gain against the audit's on the primary decoding (see the module)."""
    parent = ctx.version.parent
    if not parent:
        return []
    decoding = ctx.config.eval.primary
    rows = ctx.q(_PER_TASK, {"version": ctx.version.name, "parent": parent, "decoding": decoding})
    per: dict[str, dict[tuple[str, str], tuple[float, float | None, int, int, int]]] = {}
    for version, task, prompt, verifier, audit, unaudited, accepted, refused in rows:
        per.setdefault(version, {})[(task, prompt)] = (verifier, audit, unaudited, accepted, refused)
    mine, theirs = per.get(ctx.version.name), per.get(parent)
    if not mine or not theirs:
        return []
    tasks = sorted(mine.keys() & theirs.keys())
    if not tasks or any(mine[t][2] or theirs[t][2] for t in tasks):
        why = "no audit: "
        if all(mine[t][2] for t in tasks):
            why += f"the {ctx.config.domain.name} tasks carry no reference answer and the domain supplies no audit"
        else:
            why += f"{parent}'s or {ctx.version.name}'s evaluation has answers without an audit (made before audits?)"
        return [Finding("version.audit.none", None, "info", why)]

    def shares(rows: dict[tuple[str, str], tuple[float, float | None, int, int, int]]) -> float:
        accepted = sum(rows[t][3] for t in tasks)
        return sum(rows[t][4] for t in tasks) / accepted if accepted else 0.0

    refused_child, refused_parent = shares(mine), shares(theirs)

    def reading(rows: dict[tuple[str, str], tuple[float, float | None, int, int, int]], column: int) -> np.ndarray:
        return np.array([float(rows[t][column] or 0.0) for t in tasks])

    verifier = PairedGain.of(reading(theirs, 0), reading(mine, 0))
    audited = PairedGain.of(reading(theirs, 1), reading(mine, 1))
    rests = unsupported(verifier, audited)
    explanation = (
        f"{decoding} val vs {parent} on {len(tasks)} tasks: verifier {verifier}, audit {audited}; "
        f"accepted answers the audit refuses {refused_parent:.0%} -> {refused_child:.0%}"
    )
    if rests:
        examples = ctx.q(_EXAMPLES, {"version": ctx.version.name, "parent": parent, "decoding": decoding})
        shown = "; ".join(f"{short(p, 24)} -> {short(c)} (reference {r})" for p, c, r in examples)
        explanation = f"the verifier's gain is not the audit's: {explanation}. Accepted, refused: {shown}"
    return [
        Finding("version.audit.gain", audited.delta, "critical" if rests else "info", explanation, threshold=0.0),
        Finding(
            "version.audit.refused_share",
            refused_child - refused_parent,
            "info",
            f"share of accepted {decoding} answers the audit refuses: {refused_parent:.1%} -> {refused_child:.1%}",
        ),
    ]
