"""Behavior layer: what the policy does, read from the stored turn and tool-call traces.

A trace (`rollouts.tool_calls`) is a typed list of calls, each
``{turn: int, tool: str, args: str, ok: bool, files: [str]}``; tool names of the
agentic protocol: search, read, edit, test, submit, git_log, git_show, git_diff. Domains without
traces still get the trace-free analyzers (format violations, completion diversity).
"""

from __future__ import annotations

from engine.domains.base import EDIT_TOOL, HISTORY_TOOLS, LOOK_TOOLS, TEST_TOOL
from engine.harness.base import Context, Finding, analyzer
from engine.harness.thresholds import (
    EDIT_FAILURES,
    FORMAT_VIOLATIONS,
    SELF_TEST,
    SOLUTION_DIVERSITY,
    TURNS_ECHO_TRAP,
    TURNS_GIVING_UP,
)

#: Edited-file sets become bit masks over a run's distinct edited files while they fit a UBIGINT.
MASK_BITS = 64


def _any_of(tools: tuple[str, ...]) -> str:
    """SQL: the trace uses any of `tools` (an OR of list_contains: twice as fast as list_has_any here)."""
    return "(" + " OR ".join(f"list_contains(tools, '{t}')" for t in tools) + ")"


def _first_of(tools: tuple[str, ...]) -> str:
    """SQL: the 1-based position of the first call of any of `tools`, 0 when there is none
    (`least` skips the NULL position of an absent tool)."""
    positions = ", ".join(f"list_position(tools, '{t}')" for t in tools)
    return f"coalesce(least({positions}), 0)"


def _last_of(tool: str) -> str:
    """SQL: the 1-based position of the last call of `tool`, 0 when there is none."""
    return f"coalesce(len(tools) + 1 - list_position(list_reverse(tools), '{tool}'), 0)"


# One row per traced train rollout: every behavior feature as a scalar, computed with list
# functions in one pass. `$files` lists the run's edited files so that an edited-file set
# becomes a bit mask (runs with more than MASK_BITS distinct files get no mask). The habits
# (`looked_first`, `tested_after_edit`) follow their one definition in `engine.domains.base`,
# the one the SWE reward components of the same names use.
FEATURES_SQL = f"""
WITH t AS (
    SELECT step, group_id, sample_idx, reward, completion_length, num_turns,
           coalesce(reward_components['correctness'], reward) AS success,
           tool_calls AS calls, list_transform(tool_calls, lambda c: c.tool) AS tools,
           flatten(list_transform(list_filter(tool_calls, lambda c: c.tool = '{EDIT_TOOL}'), lambda c: c.files))
               AS edited
    FROM rollouts WHERE run_id = $run AND split = 'train' AND tool_calls IS NOT NULL
), p AS (
    -- positions are 1-based, 0 when absent: the comparisons below stay two-valued
    SELECT *, {_first_of(LOOK_TOOLS)} AS first_look, {_first_of((EDIT_TOOL,))} AS first_edit,
           {_last_of(EDIT_TOOL)} AS last_edit, {_last_of(TEST_TOOL)} AS last_test
    FROM t
)
SELECT step, group_id, sample_idx, reward, success, completion_length,
       len(calls) AS n_calls,
       coalesce(num_turns, list_max(list_transform(calls, lambda c: c.turn)) + 1, 0) AS n_turns,
       len(list_filter(calls, lambda c: NOT c.ok)) AS n_failed,
       len(list_filter(tools, lambda x: x = '{EDIT_TOOL}')) AS n_edits,
       len(list_filter(calls, lambda c: c.tool = '{EDIT_TOOL}' AND NOT c.ok)) AS n_failed_edits,
       first_edit,
       list_contains(tools, '{TEST_TOOL}') AS tested,
       {_any_of(HISTORY_TOOLS)} AS used_history,
       calls[first_edit].turn AS first_edit_turn,  -- NULL without an edit (DuckDB lists start at 1)
       first_edit > 0 AND first_look > 0 AND first_look < first_edit AS looked_first,
       last_edit > 0 AND last_test > last_edit AS tested_after_edit,
       CASE WHEN len($files) <= {MASK_BITS} THEN coalesce(list_aggregate(
           list_transform(edited, lambda f: 1::UBIGINT << (list_position($files, f) - 1)::UBIGINT), 'bit_or'), 0)
       END AS edit_mask
FROM p
"""

EDITED_FILES_SQL = f"""
SELECT coalesce(list(DISTINCT f ORDER BY f), []) FROM (
    SELECT unnest(flatten(list_transform(list_filter(tool_calls, lambda c: c.tool = '{EDIT_TOOL}'), lambda c: c.files)))
        AS f
    FROM rollouts WHERE run_id = $run AND split = 'train' AND tool_calls IS NOT NULL
)
"""


def _features(ctx: Context) -> str | None:
    """The features, computed once per diagnosis into a temporary table of scalars (writing the
    nested lists themselves would cost more than computing them)."""
    if not ctx.has_traces():
        return None
    if "files" not in ctx.params:
        (ctx.params["files"],) = ctx.q1(EDITED_FILES_SQL)
    return ctx.materialize("behavior", FEATURES_SQL)


@analyzer("tool_use", "behavior")
def tool_use(ctx: Context) -> list[Finding]:
    """Tool calls per rollout and per tool, tool-failure rate, and edit failures (above the
    `EDIT_FAILURES` line: poor edit quality)."""
    f = _features(ctx)
    if f is None:
        return []
    n, calls, failed, edits, failed_edits = ctx.q1(
        f"SELECT count(*), sum(n_calls), sum(n_failed), sum(n_edits), sum(n_failed_edits) FROM {f}"
    )
    out = [
        Finding("behavior.tool_calls_per_rollout", calls / n, "info", f"{calls / n:.2f} tool calls per rollout"),
        Finding(
            "behavior.tool_failure_rate",
            failed / calls if calls else 0.0,
            "info",
            f"{failed} of {calls} tool calls failed",
        ),
    ]
    per_tool = ctx.q(
        # Unnest the tool names only: unnesting the whole structs (with their file lists) is 10x slower.
        """SELECT tool, count(*) FROM (SELECT unnest(list_transform(tool_calls, lambda c: c.tool)) AS tool
           FROM rollouts WHERE run_id = $run AND split = 'train' AND tool_calls IS NOT NULL) GROUP BY tool"""
    )
    for tool, count in per_tool:
        out.append(Finding(f"behavior.tool.{tool}", count / n, "info", f"{tool}: {count / n:.2f} per rollout"))
    rate = failed_edits / edits if edits else None
    out.append(
        Finding(
            "behavior.edit_failure_rate",
            rate,
            explanation=f"{failed_edits} of {edits} edits failed" if edits else "no edits",
            **EDIT_FAILURES.grade(rate),
        )
    )
    return out


@analyzer("habits", "behavior")
def habits(ctx: Context) -> list[Finding]:
    """Self-test rate (warning below the `SELF_TEST` line), search-before-edit and edit-then-test
    rates (shares of the rollouts that edited; `engine.domains.base` defines both habits),
    first-edit turn."""
    f = _features(ctx)
    if f is None:
        return []
    self_test, search_first, test_after, first_edit_turn = ctx.q1(
        f"""
        SELECT avg(tested::INT),
               avg(looked_first::INT) FILTER (WHERE first_edit > 0),
               avg(tested_after_edit::INT) FILTER (WHERE first_edit > 0),
               avg(first_edit_turn) FILTER (WHERE first_edit > 0)
        FROM {f}
        """
    )
    return [
        Finding(
            "behavior.self_test_rate",
            self_test,
            explanation=f"{self_test:.0%} of rollouts ran the tests",
            **SELF_TEST.grade(self_test),
        ),
        Finding(
            "behavior.search_before_edit_rate",
            search_first,
            "info",
            "share of editing rollouts that searched or read before the first edit",
        ),
        Finding(
            "behavior.edit_then_test_rate",
            test_after,
            "info",
            "share of editing rollouts that ran the tests after the last edit",
        ),
        Finding("behavior.first_edit_turn", first_edit_turn, "info", "mean turn of the first edit"),
    ]


@analyzer("turns", "behavior")
def turns(ctx: Context) -> list[Finding]:
    """Turns per episode: a mean below `TURNS_GIVING_UP` is giving up, above `TURNS_ECHO_TRAP` an
    echo trap (both critical); first vs last window."""
    f = _features(ctx)
    if f is None:
        return []
    mean, first, last = ctx.window_means(f"SELECT step, n_turns FROM {f}", "n_turns")
    if mean is None:
        return []
    giving_up, echo_trap = TURNS_GIVING_UP.severity(mean), TURNS_ECHO_TRAP.severity(mean)
    severity = giving_up if giving_up != "info" else echo_trap
    why = "giving up" if giving_up != "info" else "echo trap" if echo_trap != "info" else "in range"
    return [
        Finding(
            "behavior.turns_mean",
            mean,
            severity,
            f"{mean:.1f} turns per episode ({why})",
            threshold=TURNS_GIVING_UP.value,
        ),
        Finding(
            "behavior.turns_trend",
            last / first if first else None,
            "info",
            f"turns {first:.1f} -> {last:.1f} (first -> last window)",
        ),
    ]


@analyzer("solution_diversity", "behavior")
def solution_diversity(ctx: Context) -> Finding | None:
    """1 - mean pairwise Jaccard similarity of the edited-file sets within a group (warning below
    the `SOLUTION_DIVERSITY` line)."""
    f = _features(ctx)
    if f is None:
        return None
    # Edited-file sets become bit masks over the run's files (one bit per distinct file), so each
    # of the 28 pairs of a group of 8 costs two popcounts instead of three list operations.
    if len(ctx.params["files"]) <= MASK_BITS:
        (similarity,) = ctx.q1(
            f"""
            SELECT avg(CASE WHEN (a.edit_mask | b.edit_mask) = 0 THEN 1.0
                            ELSE bit_count(a.edit_mask & b.edit_mask) / bit_count(a.edit_mask | b.edit_mask) END)
            FROM {f} a JOIN {f} b
              ON a.step = b.step AND a.group_id = b.group_id AND a.sample_idx < b.sample_idx
            """
        )
    else:  # too many files for a mask: compare the sets themselves
        (similarity,) = ctx.q1(
            f"""
            WITH s AS (
                SELECT step, group_id, sample_idx, list_distinct(flatten(list_transform(
                    list_filter(tool_calls, lambda c: c.tool = '{EDIT_TOOL}'), lambda c: c.files))) AS e
                FROM rollouts WHERE run_id = $run AND split = 'train' AND tool_calls IS NOT NULL
            )
            SELECT avg(CASE WHEN len(list_distinct(list_concat(a.e, b.e))) = 0 THEN 1.0
                            ELSE len(list_intersect(a.e, b.e)) / len(list_distinct(list_concat(a.e, b.e))) END)
            FROM s a JOIN s b ON a.step = b.step AND a.group_id = b.group_id AND a.sample_idx < b.sample_idx
            """
        )
    if similarity is None:
        return None
    diversity = 1 - similarity
    return Finding(
        "behavior.solution_diversity",
        diversity,
        explanation=f"solution diversity {diversity:.2f} (1 - mean pairwise Jaccard of edited files)",
        **SOLUTION_DIVERSITY.grade(diversity),
    )


@analyzer("history_use", "behavior")
def history_use(ctx: Context) -> list[Finding]:
    """Use of history commands (git log/show/diff) and success with vs without them (a large
    gap means success may come from reading the answer out of history: a leak)."""
    f = _features(ctx)
    if f is None:
        return []
    share, with_history, without, n_with, examples = ctx.q1(
        f"""
        SELECT avg(used_history::INT), avg(success) FILTER (WHERE used_history),
               avg(success) FILTER (WHERE NOT used_history), count(*) FILTER (WHERE used_history),
               -- the latest successful rollouts that used history, as evidence (same pass)
               max_by(concat_ws('/', $run, 'train', step, group_id, sample_idx), step, 5)
                   FILTER (WHERE used_history AND success > 0)
        FROM {f}
        """
    )
    gap = (with_history - without) if with_history is not None and without is not None else None
    return [
        Finding("behavior.history_use_rate", share, "info", f"{share:.1%} of rollouts used history commands"),
        Finding(
            "behavior.history_success_gap",
            gap,
            "info",
            f"success {with_history:.2f} with history commands ({n_with} rollouts) vs {without:.2f} without"
            if gap is not None
            else "history commands used by all or none",
            rollouts=tuple(examples or ()),
        ),
    ]


@analyzer("collapse_guard", "behavior")
def collapse_guard(ctx: Context) -> list[Finding]:
    """Whether the collapse guard stopped the run early (the step; its reason as explanation)."""
    rows = ctx.q(
        """
        SELECT (payload->>'step')::INT, payload->>'reason' FROM events
        WHERE run_id = $run AND kind = 'stopped_early' ORDER BY id LIMIT 1
        """
    )
    if not rows:
        return []
    step, reason = rows[0]
    return [
        Finding(
            "behavior.stopped_early",
            float(step),
            "critical",
            f"the collapse guard stopped the run at step {step} of {ctx.run.total_steps}: {reason}",
            steps=(step,),
        )
    ]


@analyzer("behavior_by_outcome", "behavior")
def behavior_by_outcome(ctx: Context) -> list[Finding]:
    """Tool calls and self-testing in successful vs failed rollouts."""
    f = _features(ctx)
    if f is None:
        return []
    rows = ctx.q(f"SELECT success > 0, avg(n_calls), avg(tested::INT), count(*) FROM {f} GROUP BY 1 ORDER BY 1")
    return [
        Finding(
            f"behavior.{'success' if ok else 'failure'}.tool_calls",
            calls,
            "info",
            f"{'successful' if ok else 'failed'} rollouts ({n}): {calls:.2f} tool calls, {tested:.0%} tested",
        )
        for ok, calls, tested, n in rows
    ]


@analyzer("format", "behavior")
def format_violations(ctx: Context) -> Finding | None:
    """Share of train completions failing the domain's format check (warning above the
    `FORMAT_VIOLATIONS` line)."""
    row = ctx.q1(
        """SELECT avg((reward_components['format'] = 0)::INT) FROM rollouts
           WHERE run_id = $run AND split = 'train' AND reward_components['format'] IS NOT NULL"""
    )
    if not row or row[0] is None:
        return None
    return Finding(
        "behavior.format_violation_rate",
        row[0],
        explanation=f"{row[0]:.1%} of completions fail the format check",
        rollouts=ctx.example_rollouts("reward_components['format'] = 0"),
        **FORMAT_VIOLATIONS.grade(row[0]),
    )


@analyzer("completion_diversity", "behavior")
def completion_diversity(ctx: Context) -> list[Finding]:
    """Distinct completions per group (1.0: all different), first vs last window."""
    mean, first, last = ctx.window_means(
        """SELECT step, count(DISTINCT completion) / count(*) AS d FROM rollouts
           WHERE run_id = $run AND split = 'train' GROUP BY step, group_id""",
        "d",
    )
    if mean is None or first is None or last is None:
        return []
    return [
        Finding("behavior.completion_diversity", mean, "info", f"{mean:.2f} distinct completions per group sample"),
        Finding(
            "behavior.completion_diversity_trend",
            last - first,
            "info",
            f"completion diversity {first:.2f} -> {last:.2f} (first -> last window)",
        ),
    ]
