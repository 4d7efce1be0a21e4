"""Does a recipe move the policy? Train GRPO from one v0 under each arm's changes and compare on val.

Each arm is ``NAME=dotted.key=value,dotted.key=value`` over the workspace's config (the same
dotted paths an intervention edits). Arms train one after another in this process (never two
torch jobs at once), each from the same v0: the workspace's own ``models/v0``, or one warmed up
here when an arm changes ``domain.*`` or ``policy.*`` (arms with the same such changes share it).
Every arm is scored on val with the workspace's evaluation (greedy once, `[eval] sampled_seeds`
sampled passes, the same completion room for every policy) and compared with its v0 per task:
a paired 95% interval over val tasks. Val only: a probe helps choose a recipe, so it must not
read test.

    .venv/bin/python benchmarks/recipe_probe.py WS \\
        "hand=recipe.max_completion_length=64" \\
        "hand16=recipe.max_completion_length=64,recipe.prompts_per_step=16"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass(frozen=True)
class Arm:
    name: str
    edits: dict[str, Any]

    @property
    def base_edits(self) -> dict[str, Any]:
        """The changes that make a different v0 (data or policy), not a different recipe."""
        return {k: v for k, v in self.edits.items() if k.split(".")[0] in ("domain", "policy")}


def parse_arm(spec: str) -> Arm:
    name, sep, body = spec.partition("=")
    if not sep or not name or not body:
        raise SystemExit(f"arm {spec!r}: write NAME=dotted.key=value[,dotted.key=value]")
    edits: dict[str, Any] = {}
    for item in body.split(","):
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"arm {name!r}: {item!r} is not dotted.key=value")
        try:
            edits[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            edits[key.strip()] = raw  # a bare word: a string value such as dr_grpo
    return Arm(name, edits)


def per_task(batch: Any) -> dict[str, float]:
    """Mean correctness per val task over a batch's rows (one row greedy, several sampled)."""
    sums: dict[str, list[float]] = {}
    for task, components in zip(batch.task_id, batch.reward_components, strict=True):
        sums.setdefault(task, []).append(components.get("correctness", 0.0))
    return {task: float(np.mean(v)) for task, v in sums.items()}


def paired(child: dict[str, float], parent: dict[str, float]) -> tuple[float, float, float]:
    """(child mean, difference, 95% half-width) over the tasks both were scored on: the verdict's
    own paired bootstrap, so a probe's floor is the one a version would be judged by."""
    from engine.verdict import paired_bootstrap

    tasks = sorted(child.keys() & parent.keys())
    a, b = np.array([parent[t] for t in tasks]), np.array([child[t] for t in tasks])
    low, high = paired_bootstrap(a, b)
    return float(b.mean()), float((b - a).mean()), (high - low) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("arms", nargs="+", help="NAME=dotted.key=value[,dotted.key=value]")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch

    from engine.coach.interventions import edit_toml
    from engine.config import CONFIG_FILE, WorkspaceConfig
    from engine.domains import make_domain
    from engine.policy.pretrained import load_policy, save_policy
    from engine.policy.tiny import build_tiny_policy, warmup_policy
    from engine.runs.artifacts import EventLog
    from engine.runs.evaluate import evaluate
    from engine.runs.spec import RunSpec
    from engine.runs.worker import build_grpo_trainer

    torch.set_num_threads(args.threads)
    ws = args.workspace.resolve()
    text = (ws / CONFIG_FILE).read_text(encoding="utf-8")
    arms = [parse_arm(a) for a in args.arms]
    scratch = Path(tempfile.mkdtemp(prefix="recipe-probe-"))
    console = Console(width=None if sys.stdout.isatty() else 200)  # a log file keeps every column

    def config(edits: dict[str, Any]) -> WorkspaceConfig:
        try:
            return WorkspaceConfig.model_validate(tomllib.loads(edit_toml(text, edits)))
        except ValueError as exc:
            raise SystemExit(f"{ws / CONFIG_FILE} with {edits}: {exc}") from exc

    eval_seconds: list[float] = []

    def score(model: Any, tokenizer: Any, cfg: WorkspaceConfig) -> tuple[dict[str, float], dict[str, float], float]:
        start = time.perf_counter()
        result = evaluate(
            model, tokenizer, make_domain(cfg.domain, ws), cfg.recipe.rewards,
            max_new_tokens=cfg.eval.max_completion_length, sampled_seeds=cfg.eval.sampled_seeds,
            temperature=cfg.eval.temperature, run_id="probe", step=0, seed=cfg.recipe.seed, split="val",
        )  # fmt: skip
        eval_seconds.append(time.perf_counter() - start)
        return per_task(result.greedy), per_task(result.sampled), float(np.mean(result.sampled.completion_length))

    bases: dict[str, tuple[Path, dict[str, float], dict[str, float]]] = {}
    rows: list[tuple[Any, ...]] = []

    def base_for(arm: Arm) -> tuple[Path, dict[str, float], dict[str, float]]:
        key = json.dumps(arm.base_edits, sort_keys=True)
        if key not in bases:
            cfg = config(arm.base_edits)
            path = ws / ".evotrainer" / "models" / "v0"
            if arm.base_edits or not path.exists():
                domain = make_domain(cfg.domain, ws)
                model, tokenizer = build_tiny_policy(cfg.policy.embedded, domain, seed=cfg.policy.warmup.seed)
                warmup_policy(model, tokenizer, domain, cfg.policy.warmup)
                path = scratch / f"v0-{len(bases)}"
                save_policy(model, tokenizer, path)
            model, tokenizer = load_policy(path)
            greedy, sampled, length = score(model, tokenizer, cfg)
            bases[key] = (path, greedy, sampled)
            changes = json.dumps(arm.base_edits) if arm.base_edits else "-"
            means = float(np.mean(list(greedy.values()))), float(np.mean(list(sampled.values())))
            rows.append(("v0", changes, 0, 0.0, eval_seconds[-1], means[0], None, means[1], None, length))
        return bases[key]

    for arm in arms:
        v0, base_greedy, base_sampled = base_for(arm)
        cfg = config(arm.edits)
        run_dir = scratch / arm.name
        run_dir.mkdir(parents=True)
        spec = RunSpec(run_id=arm.name, version=arm.name, kind="train", config=cfg, model_in=v0,
                       model_out=run_dir / "model", workspace=ws)  # fmt: skip
        start = time.perf_counter()
        trainer = build_grpo_trainer(spec, run_dir, EventLog(run_dir / "events.jsonl"))
        trainer.train()
        seconds = time.perf_counter() - start
        greedy, sampled, length = score(trainer.model, trainer.processing_class, cfg)
        g, s = paired(greedy, base_greedy), paired(sampled, base_sampled)
        changes = ", ".join(f"{k}={v}" for k, v in arm.edits.items())
        rows.append((arm.name, changes, trainer.state.global_step, seconds, eval_seconds[-1], g[0], g[1:], s[0], s[1:],
                     length))  # fmt: skip

    table = Table(title=f"GRPO from v0 on {ws.name}: val, paired 95% intervals against each arm's v0")
    columns = ("arm", "changes", "steps", "train s", "eval s", "greedy", "Δ greedy", "sampled", "Δ sampled", "length")
    for column in columns:
        table.add_column(column, justify="left" if column in ("arm", "changes") else "right")

    def delta(d: tuple[float, float] | None) -> str:
        return "" if d is None else f"{d[0]:+.3f} ±{d[1]:.3f}"

    for name, changes, steps, seconds, eval_s, greedy_mean, dg, sampled_mean, ds, length in rows:
        table.add_row(name, changes, str(steps), f"{seconds:.0f}", f"{eval_s:.0f}", f"{greedy_mean:.3f}", delta(dg),
                      f"{sampled_mean:.3f}", delta(ds), f"{length:.1f}")  # fmt: skip
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
