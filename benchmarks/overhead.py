"""Engine overhead over bare TRL: the same GRPO run (a) bare and (b) through the engine.

(a) a fresh Python process builds TRL's GRPOTrainer with the domain's reward functions, trains,
    saves the checkpoint and evaluates on val (nothing recorded);
(b) the engine launches its worker for the same spec: every rollout recorded to Parquet, metrics
    to the event log, the engine polling and ingesting into DuckDB as it goes, then the same
    checkpoint and evaluation, ingested too.
Arms alternate within each repetition. Prints a table and the ratio of median wall times b/a
(target <= 1.05).

    .venv/bin/python benchmarks/overhead.py [--steps 40] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def bare(run_dir: Path) -> None:
    """Arm (a), run in its own process: plain TRL, no recording."""
    import torch
    from trl import GRPOTrainer

    from engine.domains import make_domain
    from engine.policy.pretrained import load_policy, save_policy
    from engine.runs.evaluate import evaluate
    from engine.runs.spec import RunSpec
    from engine.runs.worker import grpo_args, grpo_dataset

    spec = RunSpec.load(run_dir)
    cfg = spec.config
    domain = make_domain(cfg.domain)
    tasks = {t.task_id: t for t in domain.tasks("train")}

    def component_fn(name: str):  # type: ignore[no-untyped-def]
        component = domain.reward_components[name]

        def reward(completions: list[str], task_id: list[str], **kw: object) -> list[float]:
            return [component(tasks[t], c) for t, c in zip(task_id, completions, strict=True)]

        reward.__name__ = name
        return reward

    names = list(domain.reward_components)
    assert spec.model_in is not None and spec.model_out is not None
    model, tokenizer = load_policy(spec.model_in)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[component_fn(n) for n in names],
        args=grpo_args(cfg.recipe, run_dir / "trainer", [cfg.recipe.rewards.get(n, 0.0) for n in names]),
        train_dataset=grpo_dataset(domain),
    )
    trainer.train()
    save_policy(trainer.model, tokenizer, spec.model_out)
    with torch.no_grad():
        evaluate(
            trainer.model,
            tokenizer,
            domain,
            cfg.recipe.rewards,
            cfg.recipe.max_completion_length,
            cfg.eval.sampled_seeds,
            cfg.eval.temperature,
            spec.run_id,
            trainer.state.global_step,
            cfg.recipe.seed,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps per run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the pair (a, b)")
    parser.add_argument("--warmup-steps", type=int, default=100, help="warm-up steps of the shared v0")
    parser.add_argument("--bare", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare(args.bare)
        return 0

    from engine.core import Engine
    from engine.runs.spec import RunSpec
    from engine.versions import ACTOR
    from engine.workspace import init_workspace

    console = Console()
    root = Path(tempfile.mkdtemp(prefix="evotui-overhead-"))
    workspace = init_workspace(root / "ws")
    text = workspace.config_path.read_text()
    text = text.replace("steps = 300", f"steps = {args.warmup_steps}").replace("steps = 150", f"steps = {args.steps}")
    workspace.config_path.write_text(text)
    import git

    repo = git.Repo(workspace.root)
    repo.index.add(["workspace.toml"])
    repo.index.commit("benchmark settings", author=ACTOR, committer=ACTOR)

    timings: dict[str, list[float]] = {"a: bare TRL": [], "b: engine worker + ingest": []}
    with Engine(workspace) as engine:
        console.print(f"building v0 ({args.warmup_steps} warm-up steps) in {workspace.root} ...")
        v0 = engine.ensure_base()
        config = engine.version_config("v0")
        model_in = workspace.root / (v0.checkpoint or "")
        for rep in range(args.reps):
            order = ("a", "b") if rep % 2 == 0 else ("b", "a")
            for arm in order:
                if arm == "a":
                    run_dir = root / f"bare-{rep}"
                    RunSpec(
                        run_id=f"bare-{rep}",
                        version="v0",
                        kind="train",
                        config=config,
                        model_in=model_in,
                        model_out=run_dir / "model",
                    ).save(run_dir)
                    start = time.perf_counter()
                    subprocess.run(
                        [sys.executable, __file__, "--bare", str(run_dir)],
                        check=True,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    timings["a: bare TRL"].append(time.perf_counter() - start)
                else:
                    start = time.perf_counter()
                    engine.training.execute("v0", "train", config, model_in, workspace.model_dir(f"bench-{rep}"))
                    timings["b: engine worker + ingest"].append(time.perf_counter() - start)
                console.print(f"rep {rep + 1}/{args.reps} arm {arm}: {list(timings.values())[arm == 'b'][-1]:.1f} s")
        rows = engine.store.count_rollouts()

    table = Table(title=f"GRPO {args.steps} steps x {config.recipe.batch_size} completions, {args.reps} reps")
    table.add_column("arm")
    table.add_column("median s", justify="right")
    table.add_column("min s", justify="right")
    table.add_column("max s", justify="right")
    for arm, values in timings.items():
        table.add_row(arm, f"{statistics.median(values):.2f}", f"{min(values):.2f}", f"{max(values):.2f}")
    console.print(table)
    a, b = (statistics.median(v) for v in timings.values())
    pairs = [y / x for x, y in zip(*timings.values(), strict=True)]
    console.print(f"rollouts ingested by the engine: {rows}")
    console.print(f"per-pair ratios b/a: {', '.join(f'{r:.3f}' for r in pairs)}")
    console.print(f"[bold]ratio b/a (medians): {b / a:.3f}[/]  (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
