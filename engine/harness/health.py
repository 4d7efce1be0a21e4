"""The health report of a version: diagnosis, trends, reward flow, and rollouts to read.

`build_report` returns plain data (the JSON form); `render_markdown` turns it into the text a
person reads. Everything is computed with SQL over the store.
"""

from __future__ import annotations

from typing import Any

from engine.harness.diagnose import Diagnosis
from engine.store import Store
from engine.verdict import flips

TREND_KEYS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "rewards/correctness/mean",
    "entropy",
    "completions/mean_length",
    "completions/clipped_ratio",
)
SAMPLE_LIMIT = 3


def _eval_run(store: Store, version: str) -> str | None:
    row = store.query_one(
        """SELECT r.id FROM runs r WHERE r.version = ? AND r.state = 'succeeded'
           AND EXISTS (SELECT 1 FROM rollouts o WHERE o.run_id = r.id AND o.split = 'val')
           ORDER BY r.ended_at DESC LIMIT 1""",
        [version],
    )
    return row[0] if row else None


def trends(store: Store, run_id: str, buckets: int = 5) -> dict[str, list[float | None]]:
    """Each metric averaged over `buckets` equal spans of the run's steps."""
    rows = store.query(
        f"""
        WITH m AS (SELECT key, value, ntile({int(buckets)}) OVER (PARTITION BY key ORDER BY step) AS b
                   FROM metrics WHERE run_id = ? AND list_contains(?, key))
        SELECT key, list(v ORDER BY b) FROM (SELECT key, b, avg(value) AS v FROM m GROUP BY key, b) GROUP BY key
        """,
        [run_id, list(TREND_KEYS)],
    )
    found = dict(rows)
    return {k: found[k] for k in TREND_KEYS if k in found}


def _last_eval_step(store: Store, run_id: str) -> int | None:
    row = store.query_one("SELECT max(step) FROM rollouts WHERE run_id = ? AND split = 'val'", [run_id])
    return row[0] if row else None


def reward_flow(
    store: Store, before_run: str, after_run: str, before_step: int | None = None, after_step: int | None = None
) -> dict[str, Any]:
    """Per val task, solved (greedy) before vs after: the 2x2 transition matrix and the tasks
    that regressed. Two versions (their runs' last evaluations), or two evaluation steps of one run."""
    before_step = _last_eval_step(store, before_run) if before_step is None else before_step
    after_step = _last_eval_step(store, after_run) if after_step is None else after_step
    rows = store.query(
        """
        WITH s AS (
            SELECT run_id, step, task_id, any_value(reward_components['correctness']) > 0 AS solved
            FROM rollouts WHERE split = 'val' AND decoding = 'greedy'
              AND ((run_id = $before AND step = $before_step) OR (run_id = $after AND step = $after_step))
            GROUP BY run_id, step, task_id
        )
        SELECT a.solved, b.solved, count(*), list(a.task_id ORDER BY a.task_id)
        FROM s a JOIN s b ON a.task_id = b.task_id
         AND a.run_id = $before AND a.step = $before_step AND b.run_id = $after AND b.step = $after_step
        GROUP BY a.solved, b.solved
        """,
        {"before": before_run, "after": after_run, "before_step": before_step, "after_step": after_step},
    )
    matrix = {f"{'solved' if a else 'unsolved'}->{'solved' if b else 'unsolved'}": n for a, b, n, _ in rows}
    regressed = next((tasks for a, b, _, tasks in rows if a and not b), [])
    return {"matrix": matrix, "regressed_tasks": regressed[:20]}


_CATEGORIES = {
    "format violated but answer right": "reward_components['correctness'] > 0 AND reward_components['format'] = 0",
    "long and failing": "reward_components['correctness'] = 0 ORDER BY completion_length DESC",
    "truncated": "truncated",
    "all tools succeeded yet reward 0": (
        "tool_calls IS NOT NULL AND reward = 0 AND NOT list_contains(list_transform(tool_calls, lambda c: c.ok), false)"
    ),
    "partial reward without tests run": (
        "tool_calls IS NOT NULL AND reward > 0 AND reward_components['correctness'] = 0"
        " AND NOT list_contains(list_transform(tool_calls, lambda c: c.tool), 'test')"
    ),
}


def samples(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for category, condition in _CATEGORIES.items():
        where, _, order = condition.partition(" ORDER BY ")
        rows = store.query(
            f"""SELECT concat_ws('/', run_id, split, step, group_id, sample_idx), prompt, completion, reward
                FROM rollouts WHERE run_id = ? AND split = 'train' AND ({where})
                ORDER BY {order or "step DESC"} LIMIT {SAMPLE_LIMIT}""",
            [run_id],
        )
        if rows:
            out[category] = [{"id": r[0], "prompt": r[1], "completion": r[2], "reward": r[3]} for r in rows]
    return out


def build_report(
    store: Store, version: str, diagnosis: Diagnosis, against: str | None = None, decoding: str = "sampled"
) -> dict[str, Any]:
    """A version's health report (`render_markdown`); against its parent (or `against`), the
    reward flow and the val tasks whose outcome flipped on `decoding` (the primary)."""
    record = store.get_version(version)
    if record is None:
        raise ValueError(f"no version {version!r}")
    against = against or record.parent
    report: dict[str, Any] = {
        "version": version,
        "parent": record.parent,
        "state": record.state,
        "verdict": record.verdict,
        "val_greedy": record.val_greedy,
        "val_sampled": record.val_sampled,
        "diagnosis": diagnosis.to_dict(),
        "trends": trends(store, diagnosis.run_id),
        "samples": samples(store, diagnosis.run_id),
    }
    mine, theirs = _eval_run(store, version), _eval_run(store, against) if against else None
    if mine and theirs:
        report["reward_flow"] = {"against": against, **reward_flow(store, theirs, mine)}
        report["flips"] = {"against": against, **flips(store, theirs, mine, decoding)}
    steps = [
        r[0]
        for r in store.query(
            "SELECT DISTINCT step FROM rollouts WHERE run_id = ? AND split = 'val' ORDER BY step", [diagnosis.run_id]
        )
    ]
    if len(steps) >= 2:  # evaluated every K steps: the flow within the run
        flow = reward_flow(store, diagnosis.run_id, diagnosis.run_id, steps[0], steps[-1])
        report["reward_flow_steps"] = {"from_step": steps[0], "to_step": steps[-1], **flow}
    return report


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def render_markdown(report: dict[str, Any]) -> str:
    d = report["diagnosis"]
    lines = [
        f"# Health report: {report['version']}",
        "",
        f"parent {report['parent'] or '—'} · state {report['state']} · verdict {report['verdict'] or '—'} · "
        f"val greedy {_fmt(report['val_greedy'])} · sampled {_fmt(report['val_sampled'])}",
        f"run {d['run_id']} · harness {d['harness_revision']}",
        "",
        "## Diagnosis",
        "",
        f"**Bottleneck:** {d['bottleneck'] or 'none'}",
        "",
    ]
    lines += [f"- **{r['rule']}** ({r['severity']}): {r['explanation']}" for r in d["rules"]] or ["- no rule fired"]
    if d["candidate_kinds"]:
        lines += ["", "Candidate interventions: " + "; ".join(d["candidate_kinds"])]
    for layer in ("score", "signal", "behavior", "version"):
        found = [f for f in d["findings"] if f["layer"] == layer]
        if not found:
            continue
        lines += ["", f"### {layer.capitalize()}", "", "| metric | value | severity | note |", "|---|---|---|---|"]
        lines += [
            f"| {f['metric']} | {_fmt(f['value'])} | {f['severity']} | {f['explanation'].replace('|', '/')} |"
            for f in found
        ]
    if report["trends"]:
        lines += ["", "## Trends (five spans of the run)", "", "| metric | trend |", "|---|---|"]
        lines += [f"| {k} | {' → '.join(_fmt(v) for v in vs)} |" for k, vs in report["trends"].items()]
    if "reward_flow" in report:
        flow = report["reward_flow"]
        lines += ["", f"## Reward flow on val (greedy), {flow['against']} → {report['version']}", ""]
        lines += [f"- {k}: {n}" for k, n in sorted(flow["matrix"].items())]
        if flow["regressed_tasks"]:
            lines.append(f"- regressed tasks: {', '.join(flow['regressed_tasks'])}")
    if "flips" in report:
        f = report["flips"]
        lines += [
            "",
            f"## Flips on val ({f['decoding']}), {f['against']} → {report['version']}",
            "",
            f"{f['to_right']} tasks wrong → right, {f['to_wrong']} right → wrong, of {f['tasks']}.",
        ]
        if f["examples"]:
            lines += ["", f"| | prompt | {f['against']} | {report['version']} | reference |", "|---|---|---|---|---|"]
            lines += [
                f"| {'→ right' if x['direction'] == 'to_right' else '→ wrong'} | `{_cell(x['prompt'])}` | "
                f"`{_cell(x['parent'])}` | `{_cell(x['child'])}` | {_cell(x['reference'] or '—')} |"
                for x in f["examples"]
            ]
    if "reward_flow_steps" in report:
        flow = report["reward_flow_steps"]
        lines += ["", f"## Reward flow on val (greedy), step {flow['from_step']} → step {flow['to_step']}", ""]
        lines += [f"- {k}: {n}" for k, n in sorted(flow["matrix"].items())]
    if report["samples"]:
        lines += ["", "## Rollouts to read"]
        for category, rows in report["samples"].items():
            lines += ["", f"### {category}", ""]
            for r in rows:
                prompt = r["prompt"].strip().replace("\n", " ")
                lines.append(f"- `{r['id']}` reward {_fmt(r['reward'])}: `{prompt}` → `{r['completion'][:160]}`")
    return "\n".join(lines) + "\n"


def _cell(text: str, limit: int = 60) -> str:
    flat = text.strip().replace("\n", " ").replace("|", "/").replace("`", "'")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
