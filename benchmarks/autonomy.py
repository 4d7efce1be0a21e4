"""The autonomy benchmark: `evotui bench` on a workspace made from a template.

    .venv/bin/python benchmarks/autonomy.py [--template sample|code|swe] [--quick] [--workspace WS] [--check]

Without --workspace, a fresh workspace from the template (default swe; its `[bench]` section:
budget, seeds, leak rate, hand recipe, transfer template) in a temporary folder. Prints the main
table, the findings and a plot per arm (the CLI's output), then the report's path.

--check exits non-zero unless the report has its table and every finding section, every arm has
a test score, the full loop promoted no version against which a blocking rule stood (the rule
the coach decides by), and the run kept to its time budget (quick: 10 minutes, full: 60). CI runs
`--quick --check`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVOTUI = [str(Path(sys.executable).parent / "evotui")]
SECTIONS = ("main", "reach", "rl_pays", "hand", "leak", "efficiency", "backtest", "transfer", "compute")


def check(bench_dir: Path, seconds: float, quick: bool) -> list[str]:
    """What is wrong with a finished benchmark (empty: nothing)."""
    problems = []
    report = (bench_dir / "report.md").read_text(encoding="utf-8")
    data = json.loads((bench_dir / "results.json").read_text(encoding="utf-8"))
    if "| arm | test greedy |" not in report:
        problems.append("report.md has no main table")
    names = [f["name"] for f in data["findings"]]
    if names != list(SECTIONS):
        problems.append(f"findings are {names}, expected {list(SECTIONS)}")
    for f in data["findings"]:
        if f"## {f['title']}" not in report:
            problems.append(f"report.md lacks the section {f['title']!r}")
    seeds = data["settings"]["seeds"]
    arms = {(r["seed"], r["arm"]) for r in data["results"]}
    for seed in seeds:
        for arm in ("base", "hand", "score-only", "random", "full"):
            if (seed, arm) not in arms:
                problems.append(f"seed {seed}: no result for arm {arm}")
    for r in data["results"]:
        if r["test_sampled"] is None:
            problems.append(f"seed {r['seed']}, {r['arm']}: no test score")
        if r["arm"] not in ("full", "random"):  # the arms the full harness decides for
            continue
        for v in r["versions"]:
            # The same rule the coach decides by (engine.harness.rules.BLOCKING_RULES, critical).
            if v["decision"] == "promoted" and v["blocking"] and v["parent"] is not None:
                problems.append(f"seed {r['seed']}: {r['arm']} promoted {v['name']} despite {v['blocking']}")
    problems += check_lanes(bench_dir, data)
    limit = 600 if quick else 3600
    if seconds > limit:
        problems.append(f"took {seconds:.0f} s, over the {limit} s budget")
    return problems


def check_lanes(bench_dir: Path, data: dict) -> list[str]:
    """With lanes, every job kept its output and every run of a training arm ran on its lane's
    share of the cores (the threads its worker recorded as it started)."""
    from engine.bench.lanes import threads_per_lane

    lanes = data["settings"]["lanes"]
    if lanes is None or lanes < 2:
        return []
    problems = []
    for r in data["results"]:
        log = bench_dir / f"seed{r['seed']}" / "lanes" / f"{r['arm']}.log"
        if not log.is_file():
            problems.append(f"seed {r['seed']}, {r['arm']}: no job output at {log}")
        if r["arm"] == "base":
            continue
        events = Path(r["workspace"]) / ".evotrainer" / "runs"
        starts = [
            json.loads(line)
            for path in events.glob("v[1-9]*/events.jsonl")
            for line in path.read_text(encoding="utf-8").splitlines()
            if '"type":"start"' in line
        ]
        threads = {e.get("threads") for e in starts}
        if not starts or threads != {threads_per_lane(lanes)}:
            problems.append(f"seed {r['seed']}, {r['arm']}: runs on {threads} threads, not {threads_per_lane(lanes)}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="The CI-sized run (one seed, a few steps per arm).")
    parser.add_argument("--template", default="swe", help="The template of a fresh workspace: sample, code or swe.")
    parser.add_argument("--workspace", type=Path, help="An existing workspace (default: a fresh one).")
    parser.add_argument("--check", action="store_true", help="Fail unless the report is complete and consistent.")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ws = args.workspace
    if ws is None:
        ws = Path(tempfile.mkdtemp(prefix="evotui-autonomy-")) / "ws"
        subprocess.run([*EVOTUI, "init", str(ws), "--from", args.template], check=True, env=env, cwd=ROOT)
    started = time.perf_counter()
    command = [*EVOTUI, "bench", str(ws)] + (["--quick"] if args.quick else [])
    done = subprocess.run(command, env=env, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return done.returncode
    bench_dir = max((ws / ".evotrainer" / "bench").iterdir(), key=lambda p: p.name)
    print(f"{'quick' if args.quick else 'full'} benchmark: {seconds / 60:.1f} minutes; {bench_dir / 'report.md'}")
    if args.check:
        problems = check(bench_dir, seconds, args.quick)
        for p in problems:
            print(f"check failed: {p}")
        if problems:
            return 1
        print("check passed: table, every finding section, test scores, no blocked promotion, lanes, time budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
