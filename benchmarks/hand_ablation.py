"""Which of its factors carries the hand recipe's gain? The bench's hand arm, once per factor.

A factor is one field that the workspace's `[bench] hand_recipe` sets to a value other than the
workspace's own `[recipe]` (each reward weight counts alone). The variants, each trained for the
whole budget in one version from the same v0 of one benchmark seed, exactly as `evotui bench`
trains its hand arm (`engine.bench.arms`: the seed's clone, leak switch, val and test sizes):

- **control**: no factor, v0 trained on unchanged;
- each factor alone;
- **hand**: all of them, the hand recipe itself.

Each is scored as the report scores an arm: on val played clean (without the leak) and on test,
with paired 95% intervals on test against v0, the control and the hand recipe.
With several seeds, each seed's table as it ends, then the seeds pooled: each task's score
averaged over the seeds (the test tasks are the same on every seed), the paired intervals
resampling tasks (not seeds). Run it on seeds the committed reports do not use (they use 7-9):
it explains a recipe, it must not become one more look at the reports' test tasks.

    .venv/bin/python benchmarks/hand_ablation.py WS --seeds 3,4,5
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def hand_factors(recipe: dict[str, Any], hand: dict[str, Any]) -> dict[str, Any]:
    """The hand recipe's changes to `recipe` (the workspace's `[recipe]` as a dict), one per
    field: ``{"learning_rate": 1e-4, "rewards.pass_fraction": 0.5}``; a reward the hand recipe
    leaves out of its `rewards` table is a change to weight 0."""
    out: dict[str, Any] = {}
    for key, value in hand.items():
        if key == "rewards":
            own = recipe.get("rewards", {})
            for name in sorted(own.keys() | value.keys()):
                if value.get(name, 0.0) != own.get(name, 0.0):
                    out[f"rewards.{name}"] = value.get(name, 0.0)
        elif recipe.get(key) != value:
            out[key] = value
    return out


def variant_recipe(recipe: dict[str, Any], factors: dict[str, Any]) -> dict[str, Any]:
    """A `[bench] hand_recipe` that makes exactly `factors` (from `hand_factors`)."""
    out: dict[str, Any] = {}
    for key, value in factors.items():
        if key.startswith("rewards."):
            out.setdefault("rewards", dict(recipe.get("rewards", {})))[key.removeprefix("rewards.")] = value
        else:
            out[key] = value
    return out


def pooled_per_task(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Each task's score averaged over the seeds, over the tasks every seed scored."""
    tasks = set.intersection(*(set(scores) for scores in per_seed))
    return {task: float(np.mean([scores[task] for scores in per_seed])) for task in sorted(tasks)}


def paired_text(parent: dict[str, float], child: dict[str, float]) -> str:
    """``+0.031 [-0.009, +0.075]``: the mean per-task difference over the tasks both scored, and
    its paired bootstrap 95% interval, as the benchmark's report computes them."""
    from engine.bench.report import paired

    d = paired(child, parent)
    return "no common task" if d is None else f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def _mean(values: list[float | None]) -> str:
    return "-" if any(v is None for v in values) else f"{np.mean(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--seeds", required=True, help="comma-separated benchmark seeds (not ones the reports use)")
    parser.add_argument("--quick", action="store_true", help="the bench's --quick sizes (a smoke run)")
    args = parser.parse_args(argv)
    try:
        seeds = [int(part) for part in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds {args.seeds!r}: write comma-separated integers, e.g. 3,4,5") from None
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from engine.bench.arms import TRAINED, ArmResult, BenchSettings, prepare_seed, run_arm
    from engine.workspace import STATE_DIR, Workspace

    ws = Workspace.open(args.workspace)
    config = ws.load_config()
    settings = BenchSettings.from_config(config, quick=args.quick, seeds=seeds, lanes=1)
    recipe = config.recipe.model_dump()
    factors = hand_factors(recipe, settings.hand_recipe)
    if not factors:
        raise SystemExit(f"{ws.config_path}: [bench] hand_recipe changes nothing in [recipe]; nothing to ablate")
    alone = {key: {key: value} for key, value in factors.items()} if len(factors) > 1 else {}
    variants = {"control": {}} | alone | {"hand": factors}
    run_root = ws.root / STATE_DIR / "bench" / f"ablation-{time.strftime('%Y%m%d-%H%M%S')}"
    console = Console(width=None if sys.stdout.isatty() else 200)  # a log file keeps every column

    def say(message: str) -> None:
        console.print(message, markup=False, highlight=False)

    def table(title: str, scores: dict[str, dict[str, float]], rows: dict[str, tuple[str, str, float]]) -> Table:
        """One row per variant: (clean val, test sampled, CPU s) and its per-task test scores."""
        out = Table(title=f"{ws.root.name}, {title}: the hand recipe's factors, {settings.budget_steps} steps each")
        for column in ("variant", "changes", "clean val sampled", "test sampled", "vs v0 (test)", "vs control (test)",
                       "vs hand (test)", "CPU s"):  # fmt: skip
            out.add_column(column, justify="left" if column in ("variant", "changes") else "right")
        for name, (val, test, cpu) in rows.items():
            changes = ", ".join(f"{k}={v}" for k, v in variants.get(name, {}).items())
            against = [
                paired_text(scores[a], scores[name]) if name not in (a, "v0") else "" for a in ("v0", "control", "hand")
            ]
            out.add_row(name, changes or ("-" if name == "v0" else "(none)"), val, test, *against, f"{cpu:.0f}")
        return out

    results: dict[int, dict[str, ArmResult]] = {}
    for seed in seeds:
        root = run_root / f"seed{seed}"
        results[seed] = {"v0": prepare_seed(ws.root, root, seed, settings, say, [])}
        for arm in TRAINED:  # the bench's copies for its own arms; the variants make theirs
            shutil.rmtree(root / arm)
        for name, chosen in variants.items():
            say(f"seed {seed}: variant {name}")
            shutil.copytree(root / "base", root / f"variant-{name}", symlinks=True)
            arm_settings = replace(settings, hand_recipe=variant_recipe(recipe, chosen))
            results[seed][name] = run_arm("hand", Workspace(root / f"variant-{name}"), seed, arm_settings, say)
        rows = {
            name: ("-" if r.clean_sampled is None else f"{r.clean_sampled:.3f} ±{r.clean_halfwidth or 0:.3f}",
                   f"{r.test_sampled:.3f}", r.cpu_seconds)
            for name, r in results[seed].items()
        }  # fmt: skip
        console.print(table(f"seed {seed}", {n: r.test_per_task for n, r in results[seed].items()}, rows))
    if len(seeds) > 1:
        names = list(results[seeds[0]])
        pooled = {n: pooled_per_task([results[k][n].test_per_task for k in seeds]) for n in names}
        rows = {
            n: (_mean([results[k][n].clean_sampled for k in seeds]), _mean([results[k][n].test_sampled for k in seeds]),
                sum(results[k][n].cpu_seconds for k in seeds))
            for n in names
        }  # fmt: skip
        console.print(table(f"seeds {args.seeds} pooled (per-task means)", pooled, rows))
    say(f"clones under {run_root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
