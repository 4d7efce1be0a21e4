"""Version layer: do the answers the verifier accepts agree, with each other and with the parent's?

A task with one right answer has one accepted answer up to equivalence. Evaluation stores each
answer's canonical final answer (`answer_key`, `engine.domains.audit`) where the domain's tasks have
one right answer, reference or not. Over the primary decoding of the latest val evaluations of the
version and its parent, on the tasks both answered, this analyzer reads each verifier gain twice
more, with the test the verdict uses (`engine.harness.cutoffs`):

- with each other: per task, only the accepted answers that agree with the version's most common
  accepted answer there count. A verifier gain that is no gain counted so was built on accepted
  answers that contradict each other (`version.agreement.self`);
- with the parent: on the tasks where the parent had accepted answers, only the child's accepted
  answers that the parent also gave count. A gain there that is no gain counted so was built on
  answers the parent never had accepted (`version.agreement.parent`).

Either is critical, and the `answer_agreement` rule turns it into a block, with examples. What
agreement cannot see: a wrong answer given consistently on a task the parent never solved (only a
reference tells it from a right one: the audit), and tasks with many right answers (code, open
text), where it does not apply and says so in words.
"""

from __future__ import annotations

import numpy as np

from engine.harness.analyzers.audit import short
from engine.harness.analyzers.version import LATEST_EVALUATED_RUNS
from engine.harness.base import Context, Finding, analyzer
from engine.harness.cutoffs import PairedGain, unsupported
from engine.harness.thresholds import ACCEPTED

#: Examples of disagreeing accepted answers in a finding.
EXAMPLES = 3

_ACCEPTED = f"coalesce(o.reward_components['correctness'], o.reward) {ACCEPTED.op} {ACCEPTED.value}"

_ANSWERS = f"""
    WITH latest AS ({LATEST_EVALUATED_RUNS})
    SELECT l.version = $version AS mine, o.task_id, o.prompt, o.completion, o.answer_key AS key,
           {_ACCEPTED} AS accepted
    FROM latest l JOIN rollouts o ON o.run_id = l.run_id
    WHERE o.split = 'val' AND o.decoding = $decoding
    QUALIFY o.step = max(o.step) OVER (PARTITION BY l.version)
"""

#: Per version and task: passes, accepted answers, those agreeing with the version's most common
#: accepted answer, those the parent also accepted, and whether the parent accepted any.
_PER_TASK = """
    WITH keys AS (SELECT mine, task_id, prompt, key, count(*) AS n FROM {answers} WHERE accepted GROUP BY ALL),
    theirs AS (SELECT task_id, prompt, list(key) AS keys FROM keys WHERE NOT mine GROUP BY ALL),
    top AS (SELECT mine, task_id, prompt, max(n) AS n FROM keys GROUP BY ALL)
    SELECT a.mine, a.task_id, a.prompt, count(*) AS passes,
           count(*) FILTER (WHERE a.accepted) AS accepted,
           any_value(coalesce(top.n, 0)) AS agreeing,
           count(*) FILTER (WHERE a.accepted AND list_contains(theirs.keys, a.key)) AS as_parent,
           any_value(theirs.keys IS NOT NULL) AS anchored,
           count(*) FILTER (WHERE a.key IS NULL) AS unkeyed
    FROM {answers} a
    LEFT JOIN top USING (mine, task_id, prompt)
    LEFT JOIN theirs USING (task_id, prompt)
    GROUP BY ALL ORDER BY a.task_id, a.prompt
"""

#: Tasks where the child's accepted answers disagree with each other.
_SELF_EXAMPLES = """
    SELECT prompt, list_sort(list_distinct(list(key))) FROM {answers} WHERE mine AND accepted
    GROUP BY task_id, prompt HAVING count(DISTINCT key) > 1 ORDER BY task_id LIMIT {limit}
"""

#: The child's accepted answers the parent never gave on a task where it had accepted some.
_PARENT_EXAMPLES = """
    SELECT c.prompt, c.completion, list_sort(list_distinct(list(p.key))) AS theirs
    FROM {answers} c JOIN {answers} p USING (task_id, prompt)
    WHERE c.mine AND c.accepted AND NOT p.mine AND p.accepted
    GROUP BY c.task_id, c.prompt, c.completion, c.key
    HAVING NOT list_contains(list(p.key), c.key)
    ORDER BY c.task_id LIMIT {limit}
"""


@analyzer("answer_agreement", "version")
def answer_agreement(ctx: Context) -> list[Finding]:
    """The verifier's gain against the gains of the agreeing answers alone (see the module)."""
    parent = ctx.version.parent
    if not parent:
        return []
    decoding = ctx.config.eval.primary
    answers = ctx.materialize(
        "agreement_answers", _ANSWERS, {"version": ctx.version.name, "parent": parent, "decoding": decoding}
    )
    rows = ctx.q(_PER_TASK.format(answers=answers))
    if not rows:
        return []
    mine = {(r[1], r[2]): r[3:] for r in rows if r[0]}
    theirs = {(r[1], r[2]): r[3:] for r in rows if not r[0]}
    tasks = sorted(mine.keys() & theirs.keys())
    if not tasks:
        return []
    if any(mine[t][5] or theirs[t][5] for t in tasks):
        return [Finding("version.agreement.none", None, "info", _no_agreement(ctx, parent, mine, tasks))]

    def share(side: dict, column: int, among: list) -> np.ndarray:
        return np.array([side[t][column] / side[t][0] for t in among], dtype=float)

    verifier = PairedGain.of(share(theirs, 1, tasks), share(mine, 1, tasks))
    agreeing = PairedGain.of(share(theirs, 2, tasks), share(mine, 2, tasks))
    anchored = [t for t in tasks if mine[t][4]]
    where = f"{decoding} val vs {parent}"
    findings = [
        _finding(
            "self",
            verifier,
            agreeing,
            f"{where} on {len(tasks)} tasks: verifier {verifier}, counting only the accepted answers that agree "
            f"with each other {agreeing}; accepted answers that disagree with their task's most common one "
            f"{_disagreeing(theirs, tasks):.0%} -> {_disagreeing(mine, tasks):.0%}",
        )
    ]
    if len(anchored) >= 2:
        # The parent agrees with itself by definition: its accepted answers are what the child's are held to.
        on_anchor = PairedGain.of(share(theirs, 1, anchored), share(mine, 1, anchored))
        as_parent = PairedGain.of(share(theirs, 1, anchored), share(mine, 3, anchored))
        findings.append(
            _finding(
                "parent",
                on_anchor,
                as_parent,
                f"{where} on the {len(anchored)} tasks where {parent} had accepted answers: verifier {on_anchor}, "
                f"counting only the answers {parent} also gave {as_parent}",
            )
        )
    return [_with_examples(ctx, f, answers, parent) if f.severity == "critical" else f for f in findings]


def _finding(which: str, verifier: PairedGain, agreeing: PairedGain, explanation: str) -> Finding:
    rests = unsupported(verifier, agreeing)
    if rests:
        with_what = "each other" if which == "self" else "the parent's"
        explanation = f"the verifier's gain is not a gain of answers that agree with {with_what}: {explanation}"
    return Finding(
        f"version.agreement.{which}", agreeing.delta, "critical" if rests else "info", explanation, threshold=0.0
    )


def _with_examples(ctx: Context, finding: Finding, answers: str, parent: str) -> Finding:
    if finding.metric.endswith(".self"):
        rows = ctx.q(_SELF_EXAMPLES.format(answers=answers, limit=EXAMPLES))
        shown = "; ".join(f"{short(p, 24)} -> {' | '.join(short(k, 20) for k in keys)}" for p, keys in rows)
    else:
        rows = ctx.q(_PARENT_EXAMPLES.format(answers=answers, limit=EXAMPLES))
        shown = "; ".join(f"{short(p, 24)} -> {short(c)} ({parent} accepted {', '.join(k)})" for p, c, k in rows)
    return Finding(
        finding.metric,
        finding.value,
        finding.severity,
        f"{finding.explanation}. Accepted, not agreeing: {shown or 'none to show'}",
        threshold=finding.threshold,
    )


def _disagreeing(side: dict, tasks: list) -> float:
    accepted = sum(side[t][1] for t in tasks)
    return sum(side[t][1] - side[t][2] for t in tasks) / accepted if accepted else 0.0


def _no_agreement(ctx: Context, parent: str, mine: dict, tasks: list) -> str:
    if all(mine[t][5] for t in tasks):
        return (
            f"no agreement check: the {ctx.config.domain.name} tasks can have many right answers "
            "(the domain does not declare one right answer per task)"
        )
    made = f"{parent}'s or {ctx.version.name}'s evaluation"
    return f"no agreement check: {made} has answers without a key (made before keys?)"
