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
Run it on a seed the committed reports do not use (they use 7-9): it explains a recipe, it must
not become one more look at the reports' test tasks.

    .venv/bin/python benchmarks/hand_ablation.py WS --seed 3
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--seed", type=int, required=True, help="the benchmark seed (not one the reports use)")
    parser.add_argument("--quick", action="store_true", help="the bench's --quick sizes (a smoke run)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from engine.bench.arms import TRAINED, BenchSettings, prepare_seed, run_arm
    from engine.verdict import paired_bootstrap
    from engine.workspace import STATE_DIR, Workspace

    ws = Workspace.open(args.workspace)
    config = ws.load_config()
    settings = BenchSettings.from_config(config, quick=args.quick, seeds=[args.seed], lanes=1)
    recipe = config.recipe.model_dump()
    factors = hand_factors(recipe, settings.hand_recipe)
    if not factors:
        raise SystemExit(f"{ws.config_path}: [bench] hand_recipe changes nothing in [recipe]; nothing to ablate")
    alone = {key: {key: value} for key, value in factors.items()} if len(factors) > 1 else {}
    variants = {"control": {}} | alone | {"hand": factors}
    root = ws.root / STATE_DIR / "bench" / f"ablation-{time.strftime('%Y%m%d-%H%M%S')}" / f"seed{args.seed}"
    console = Console(width=None if sys.stdout.isatty() else 200)  # a log file keeps every column

    def say(message: str) -> None:
        console.print(message, markup=False, highlight=False)

    base = prepare_seed(ws.root, root, args.seed, settings, say, [])
    for arm in TRAINED:  # the bench's copies for its own arms; the variants make theirs
        shutil.rmtree(root / arm)
    results = {"v0": base}
    for name, chosen in variants.items():
        say(f"seed {args.seed}: variant {name}")
        shutil.copytree(root / "base", root / f"variant-{name}", symlinks=True)
        arm_settings = replace(settings, hand_recipe=variant_recipe(recipe, chosen))
        results[name] = run_arm("hand", Workspace(root / f"variant-{name}"), args.seed, arm_settings, say)

    def paired(name: str, against: str) -> str:
        a, b = results[against].test_per_task, results[name].test_per_task
        if name in (against, "v0"):
            return ""
        tasks = sorted(a.keys() & b.keys())
        x, y = np.array([a[t] for t in tasks]), np.array([b[t] for t in tasks])
        low, high = paired_bootstrap(x, y)
        return f"{(y - x).mean():+.3f} [{low:+.3f}, {high:+.3f}]"

    steps = settings.budget_steps
    table = Table(title=f"{ws.root.name}, seed {args.seed}: the hand recipe's factors, {steps} steps each from v0")
    for column in ("variant", "changes", "clean val sampled", "test sampled", "vs v0 (test)", "vs control (test)",
                   "vs hand (test)", "CPU s"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("variant", "changes") else "right")
    for name, r in results.items():
        chosen = variants.get(name, {})
        changes = ", ".join(f"{k}={v}" for k, v in chosen.items()) or ("-" if name == "v0" else "(none)")
        val = "-" if r.clean_sampled is None else f"{r.clean_sampled:.3f} ±{r.clean_halfwidth or 0:.3f}"
        table.add_row(name, changes, val, f"{r.test_sampled:.3f}", paired(name, "v0"), paired(name, "control"),
                      paired(name, "hand"), f"{r.cpu_seconds:.0f}")  # fmt: skip
    console.print(table)
    say(f"clones under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
