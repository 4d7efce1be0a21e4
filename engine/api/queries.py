"""Read models for clients: what the socket API returns, computed in SQL over the store.

Functions here take a `Store` (a cursor of the engine's database, one per server thread) and
return JSON-ready values. Rollouts are paged in the order they were recorded (DuckDB keeps
insertion order, so OFFSET skips without sorting: a few ms at any depth of a million rows, where
an ORDER BY costs 80-200 ms a page); the total is a separate count, asked with the first page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from engine.api.protocol import ROLLOUT_ID, ProtocolError, RolloutFilter
from engine.coach.memory import Memory
from engine.coach.skills import SkillLibrary
from engine.grpo import DEAD_STD
from engine.harness.analyzers.behavior import HISTORY_TOOLS
from engine.store import Store

#: Metric keys a client can plot (TRL's names), in the order of the metric picker.
CURVE_KEYS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "entropy",
    "completions/mean_length",
    "completions/clipped_ratio",
    "clip_ratio/region_mean",
    "kl",
    "filter/keep_ratio",
)


def _rows(store: Store, sql: str, params: Any = None) -> list[dict[str, Any]]:
    cur = store.con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def versions(store: Store) -> list[dict[str, Any]]:
    return _rows(
        store,
        """
        SELECT v.name, v.parent, v.state, v.verdict, v.val_greedy, v.val_sampled, v.val_n, v.decision_reason,
               v.verdict_delta, v.verdict_floor,
               v.checkpoint, v.created_at::VARCHAR AS created_at, i.kind, i.factor, i.template, i.hypothesis,
               i.change::VARCHAR AS change, i.round
        FROM versions v LEFT JOIN interventions i ON i.id = v.intervention_id
        ORDER BY CAST(substr(v.name, 2) AS INTEGER)
        """,
    )


def version(store: Store, name: str) -> dict[str, Any]:
    rows = [v for v in versions(store) if v["name"] == name]
    if not rows:
        raise ProtocolError("not_found", f"no version {name!r}")
    out = rows[0]
    out["change"] = json.loads(out["change"]) if out["change"] else {}
    out["runs"] = _rows(
        store,
        "SELECT id, kind, state, total_steps, started_at::VARCHAR AS started_at, ended_at::VARCHAR AS ended_at"
        " FROM runs WHERE version = ? ORDER BY started_at NULLS LAST, id",
        [name],
    )
    return out


def diagnosis(store: Store, name: str) -> dict[str, Any] | None:
    """The latest stored diagnosis of a version: rules and findings by layer and severity."""
    head = _rows(
        store,
        """SELECT id, run_id, harness_revision, bottleneck, rules::VARCHAR AS rules, created_at::VARCHAR AS created_at
           FROM diagnoses WHERE version = ? ORDER BY created_at DESC LIMIT 1""",
        [name],
    )
    if not head:
        return None
    d = head[0]
    d["rules"] = json.loads(d["rules"])
    d["findings"] = _rows(
        store,
        """SELECT layer, metric, value, threshold, severity, explanation, analyzer, provenance,
                  evidence::VARCHAR AS evidence
           FROM findings WHERE diagnosis_id = ?
           ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,
                    list_position(['score', 'signal', 'behavior', 'version'], layer), idx""",
        [d["id"]],
    )
    for f in d["findings"]:
        f["evidence"] = json.loads(f["evidence"])
    return d


def runs(store: Store) -> list[dict[str, Any]]:
    return _rows(
        store,
        "SELECT id, version, kind, state, total_steps, started_at::VARCHAR AS started_at,"
        " ended_at::VARCHAR AS ended_at, error_tail FROM runs ORDER BY started_at NULLS LAST, id",
    )


def metrics(store: Store, run_id: str, keys: list[str], after_step: int) -> dict[str, list[tuple[int, float]]]:
    """Series of a run, as {key: [(step, value), ...]}, for steps after `after_step`."""
    rows = store.query(
        """SELECT key, list([step, value] ORDER BY step) FROM metrics
           WHERE run_id = $run AND step > $after AND value IS NOT NULL AND (len($keys) = 0 OR list_contains($keys, key))
           GROUP BY key""",
        {"run": run_id, "after": after_step, "keys": keys},
    )
    return {key: [(int(s), float(v)) for s, v in series] for key, series in rows}


_TRAIN_ID = "concat_ws('/', r.run_id, r.split, r.step, r.group_id, r.sample_idx)"


def _where(f: RolloutFilter) -> tuple[str, dict[str, Any]]:
    clauses, params = ["TRUE"], {}
    # `is not None`: an empty name matches nothing; it does not lift the filter.
    if f.run_id is not None:
        clauses.append("r.run_id = $run_id")
        params["run_id"] = f.run_id
    if f.version is not None:
        clauses.append("r.run_id IN (SELECT id FROM runs WHERE version = $version)")
        params["version"] = f.version
    for field, op in (("step_min", ">="), ("step_max", "<="), ("reward_min", ">="), ("reward_max", "<=")):
        value = getattr(f, field)
        if value is not None:
            column = "step" if field.startswith("step") else "reward"
            clauses.append(f"r.{column} {op} ${field}")
            params[field] = value
    if f.split:
        clauses.append("r.split = $split")
        params["split"] = f.split
    if f.truncated is not None:
        clauses.append("r.truncated = $truncated")
        params["truncated"] = f.truncated
    if f.used_history is not None:
        has = " OR ".join(
            f"list_contains(list_transform(r.tool_calls, lambda c: c.tool), '{t}')" for t in HISTORY_TOOLS
        )
        clauses.append(f"coalesce({has}, false) = $used_history")
        params["used_history"] = f.used_history
    if f.search:
        clauses.append("(contains(r.prompt, $search) OR contains(r.completion, $search))")
        params["search"] = f.search
    if f.group:
        clauses.append(f"r.group_std < {DEAD_STD}" if f.group == "dead" else f"r.group_std >= {DEAD_STD}")
    return " AND ".join(clauses), params


def page_rollouts(store: Store, f: RolloutFilter, offset: int, limit: int) -> dict[str, Any]:
    where, params = _where(f)
    rows = _rows(
        store,
        f"""SELECT {_TRAIN_ID} AS id, r.run_id, r.split, r.step, r.group_id, r.sample_idx, r.task_id, r.reward,
                   r.truncated, r.completion_length, r.num_turns, left(r.completion, 120) AS completion
            FROM rollouts r WHERE {where}
            LIMIT {int(limit)} OFFSET {int(offset)}""",
        params,
    )
    return {"offset": offset, "limit": limit, "rows": rows}


def count_rollouts(store: Store, f: RolloutFilter) -> int:
    where, params = _where(f)
    row = store.query_one(f"SELECT count(*) FROM rollouts r WHERE {where}", params)
    return int(row[0]) if row else 0


def rollout(store: Store, rollout_id: str) -> dict[str, Any]:
    """One rollout whole: prompt, completion, turns, tool calls, reward components, and its group."""
    if not re.fullmatch(ROLLOUT_ID, rollout_id):  # RolloutParams checks it; a direct caller may not have
        raise ProtocolError("bad_request", f"rollout id {rollout_id!r} is not run/split/step/group/sample")
    parts = rollout_id.split("/")
    run_id, split, step, group, sample = parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4])
    key = {"run": run_id, "split": split, "step": step, "group": group}
    rows = _rows(
        store,
        """SELECT sample_idx, task_id, subset, prompt, completion, reward, truncated, completion_length,
                  num_turns, turns::VARCHAR AS turns, to_json(tool_calls)::VARCHAR AS calls
           FROM rollouts WHERE run_id = $run AND split = $split AND step = $step AND group_id = $group
           ORDER BY sample_idx""",
        key,
    )
    mine = [r for r in rows if r["sample_idx"] == sample]
    if not mine:
        raise ProtocolError("not_found", f"no rollout {rollout_id!r}")
    out = mine[0]
    out["components"] = _map(store, run_id, split, step, group, sample)
    out["turns"] = json.loads(out["turns"]) if out["turns"] else None
    out["calls"] = json.loads(out["calls"]) if out["calls"] else None
    out["id"] = rollout_id
    out["group"] = [
        {"sample_idx": r["sample_idx"], "reward": r["reward"], "completion": r["completion"][:120]} for r in rows
    ]
    return out


def _map(store: Store, run_id: str, split: str, step: int, group: int, sample: int) -> dict[str, float]:
    row = store.query_one(
        """SELECT map_keys(reward_components), map_values(reward_components) FROM rollouts
           WHERE run_id = ? AND split = ? AND step = ? AND group_id = ? AND sample_idx = ?""",
        [run_id, split, step, group, sample],
    )
    return dict(zip(row[0], row[1], strict=True)) if row else {}


def gates(store: Store, pending_only: bool = True) -> list[dict[str, Any]]:
    rows = _rows(
        store,
        f"""SELECT id, round, kind, subject, question, report::VARCHAR AS report, forced, state, feedback,
                   created_at::VARCHAR AS created_at FROM gates {"WHERE state = 'pending'" if pending_only else ""}
            ORDER BY created_at""",
    )
    for g in rows:
        g["report"] = json.loads(g["report"])
    return rows


def memory(store: Store, root: Path) -> dict[str, Any]:
    """Skill cards, case memory, the version ledger and the retrieval trace."""
    cards, problems = SkillLibrary(root).load_valid()
    mem = Memory(store)
    return {
        "skills": [c.to_dict() for c in cards],
        "skill_problems": problems,
        "cases": _rows(
            store,
            "SELECT id AS version, signature, domain, parent, kind, template, factor, verdict, decision, outcome,"
            " retracted FROM cases ORDER BY created_at",
        ),
        "ledger": mem.ledger(),
        "retrievals": mem.retrievals(),
    }
