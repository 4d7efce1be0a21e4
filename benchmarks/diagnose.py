"""Harness speed on a large store: the full diagnosis of one run with 1,000,000 rollouts
(groups of 8, with turn and tool-call traces), a reward backtest, and three metrics computed
by the harness's SQL vs a plain per-rollout Python implementation.

    .venv/bin/python benchmarks/diagnose.py [--rollouts 1000000] [--reps 3]

Targets on a 2-core machine: full diagnosis <= 3 s; SQL >= 20x faster than Python on the three
metrics (dead-group ratio, search-before-edit rate, solution diversity).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.table import Table

from engine.config import parse_config
from engine.harness.backtest import reward_backtest
from engine.harness.base import Context
from engine.harness.diagnose import diagnose
from engine.harness.loader import load_harness
from engine.runs.artifacts import ROLLOUT_SCHEMA, TOOL_CALL
from engine.store import Store

GROUP = 8
RUN = "v1-train-1"


def traces(rng: np.random.Generator, n: int) -> list[list[dict[str, object]]]:
    """`n` distinct tool-call traces to draw rollouts from."""
    tools = ["search", "read", "edit", "test", "submit", "git_log", "git_show"]
    files = ["calc.py", "util.py", "io.py", "main.py"]
    out = []
    for _ in range(n):
        length = int(rng.integers(2, 12))
        calls = [
            {
                "turn": t,
                "tool": str(rng.choice(tools)),
                "args": "",
                "ok": bool(rng.random() > 0.1),
                "files": [str(f) for f in rng.choice(files, size=int(rng.integers(0, 3)), replace=False)],
            }
            for t in range(length)
        ]
        out.append(calls)
    return out


def build_store(path: Path, n: int, seed: int = 0) -> Store:
    rng = np.random.default_rng(seed)
    steps = n // (GROUP * 125)
    groups = n // GROUP
    step = np.repeat(np.arange(1, steps + 1), n // steps)[:n]
    group_id = np.tile(np.repeat(np.arange(n // steps // GROUP), GROUP), steps)[:n]
    p = np.repeat(rng.beta(0.7, 0.7, groups), GROUP)  # per-group success rate: many dead groups
    correct = (rng.random(n) < p).astype(float)
    fmt = (rng.random(n) < 0.9).astype(float)
    close = np.where(correct == 1, 1.0, rng.random(n))
    pool = traces(rng, 64)
    pick = pa.array(rng.integers(0, len(pool), n))
    calls = pa.array(pool, pa.list_(TOOL_CALL)).take(pick)
    turns = pa.array([json.dumps([{}] * len(t)) for t in pool]).take(pick)
    num_turns = pa.array([len(t) for t in pool], pa.int32()).take(pick)
    keys = pa.array([["correctness", "format", "closeness"]] * n, pa.list_(pa.string()))
    values = pa.array(np.stack([correct, fmt, close], axis=1).tolist(), pa.list_(pa.float64()))
    batch = pa.table(
        {
            "run_id": pa.array([RUN] * n),
            "step": pa.array(step, pa.int32()),
            "split": pa.array(["train"] * n),
            "decoding": pa.array(["sampled"] * n),
            "group_id": pa.array(group_id, pa.int32()),
            "sample_idx": pa.array(np.tile(np.arange(GROUP), groups), pa.int32()),
            "task_id": pa.array((group_id % 1000).astype(str)),
            "subset": pa.array(["ops3"] * n),
            "prompt": pa.array(["Q:1+2\n"] * n),
            "completion": pa.array((rng.integers(0, 50, n)).astype(str)),
            "reward": pa.array(correct + 0.1 * fmt),
            "reward_components": pa.MapArray.from_arrays(
                pa.array(np.arange(0, 3 * n + 1, 3), pa.int32()), keys.flatten(), values.flatten()
            ),
            "truncated": pa.array(rng.random(n) < 0.05),
            "completion_length": pa.array(rng.integers(5, 200, n), pa.int32()),
            "turns": turns,
            "num_turns": num_turns,
            "tool_calls": calls,
        }
    ).cast(ROLLOUT_SCHEMA)
    store = Store(path)
    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    store.add_version("v1", "v0", "versions/v1", "b", state="trained")
    store.add_run(RUN, "v1", "train", "/bench", {}, steps)
    store.insert_rollouts("SELECT * FROM batch", batch=batch)
    metric_rows = [
        (s, key, float(v))
        for s in range(1, steps + 1)
        for key, v in (("reward", 0.5 + s / steps / 10), ("entropy", 1 - s / steps / 2), ("loss", 0.1), ("kl", 0.01))
    ]
    store.upsert_metrics(RUN, metric_rows)
    return store


def python_three(store: Store) -> dict[str, float]:
    """The plain way: fetch rows, loop in Python."""
    rows = store.query(
        f"SELECT step, group_id, sample_idx, reward, to_json(tool_calls)::VARCHAR FROM rollouts WHERE run_id = '{RUN}'"
    )
    rewards: dict[tuple[int, int], list[float]] = defaultdict(list)
    edited: dict[tuple[int, int], list[set[str]]] = defaultdict(list)
    searched_first = editing = 0
    for step, group, _, reward, calls_json in rows:
        rewards[(step, group)].append(reward)
        calls = json.loads(calls_json)  # the plain way: traces as JSON text
        tools = [c["tool"] for c in calls]
        if "edit" in tools:
            editing += 1
            first_edit = tools.index("edit")
            searched_first += "search" in tools[:first_edit]
        edited[(step, group)].append({f for c in calls if c["tool"] == "edit" for f in c["files"]})
    dead = sum(statistics.pstdev(v) < 1e-3 for v in rewards.values()) / len(rewards)
    similarities = []
    for sets in edited.values():
        for a, b in itertools.combinations(sets, 2):
            union = a | b
            similarities.append(len(a & b) / len(union) if union else 1.0)
    return {
        "dead_group_ratio": dead,
        "search_before_edit": searched_first / editing,
        "solution_diversity": 1 - sum(similarities) / len(similarities),
    }


def sql_three(ctx: Context) -> dict[str, float]:
    """The same three metrics through the harness's own analyzers."""
    from engine.harness.analyzers.behavior import habits, solution_diversity
    from engine.harness.analyzers.signal import dead_groups

    found = {f.metric: f.value for f in [*dead_groups(ctx), *habits(ctx), solution_diversity(ctx)] if f is not None}
    ctx.close()
    return {
        "dead_group_ratio": found["signal.dead_group_ratio"],
        "search_before_edit": found["behavior.search_before_edit_rate"],
        "solution_diversity": found["behavior.solution_diversity"],
    }


def timed(fn, reps: int):  # type: ignore[no-untyped-def]
    times, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    path = Path(tempfile.mkdtemp(prefix="evotui-diagnose-")) / "evo.duckdb"
    start = time.perf_counter()
    store = build_store(path, args.rollouts)
    console.print(f"built {store.count_rollouts():,} rollouts in {time.perf_counter() - start:.1f} s ({path})")
    run, version = store.get_run(RUN), store.get_version("v1")
    assert run is not None and version is not None
    config = parse_config('[workspace]\nname = "bench"\n', Path("bench.toml"))
    harness = load_harness(None)

    t_diag, diagnosis = timed(lambda: diagnose(store, run, version, config, harness=harness), args.reps)
    weights = {"correctness": 1.0, "closeness": 0.5}
    t_backtest, backtest = timed(lambda: reward_backtest(store, RUN, weights), args.reps)
    t_sql, sql = timed(lambda: sql_three(Context(store, run, version, config, window=10)), args.reps)
    t_py, py = timed(lambda: python_three(store), 1)

    table = Table(title=f"Harness on {store.count_rollouts():,} rollouts (median of {args.reps})")
    for col in ("what", "seconds", "target"):
        table.add_column(col)
    table.add_row(f"full diagnosis ({len(diagnosis.findings)} findings)", f"{t_diag:.2f}", "<= 3 s")
    table.add_row("reward backtest (+0.5 closeness)", f"{t_backtest:.2f}", "")
    table.add_row("3 metrics, harness SQL", f"{t_sql:.2f}", "")
    table.add_row("3 metrics, per-rollout Python", f"{t_py:.2f}", "")
    table.add_row("speed-up", f"{t_py / t_sql:.1f}x", ">= 20x")
    console.print(table)
    for key in sql:
        console.print(f"{key}: SQL {sql[key]:.6f}  Python {py[key]:.6f}")
        assert abs(sql[key] - py[key]) < 1e-9, key
    console.print(
        f"backtest: dead {backtest.dead_before:.3f} -> {backtest.dead_after:.3f}, revived {backtest.revived:.3f}"
    )
    ok = t_diag <= 3.0 and t_py / t_sql >= 20
    console.print("[bold green]targets met[/]" if ok else "[bold red]targets missed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
