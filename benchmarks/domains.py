"""The domains with the embedded policy: GRPO seconds per step for each, SWE episodes per second,
and the sandbox's start-up cost per execution.

    .venv/bin/python benchmarks/domains.py [--steps 6] [--episodes 64] [--sandbox-runs 200]

For each domain (math, code, swe) a workspace is made from its template and v0 is warmed up
briefly (the speed of a step depends on what the policy writes, so an untrained policy would
mislead). Then a GRPO run of `--steps` steps with the template's recipe: seconds per step from
the step timestamps, the first step left out (it builds the optimizer and caches). SWE episodes
per second: `--episodes` sampled episodes of the warmed-up policy on val, lockstep batched, with
their sandboxed test runs. Sandbox: `run_python("pass")` repeated (target: median <= 20 ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sandbox import startup_times  # noqa: E402

from engine.domains import make_domain  # noqa: E402
from engine.policy.pretrained import save_policy  # noqa: E402
from engine.policy.tiny import build_tiny_policy, warmup_policy  # noqa: E402
from engine.runs.artifacts import EventLog, read_events  # noqa: E402
from engine.runs.episodes import play  # noqa: E402
from engine.runs.spec import RunSpec  # noqa: E402
from engine.runs.worker import build_grpo_trainer  # noqa: E402
from engine.workspace import init_workspace  # noqa: E402

TEMPLATES = {"math": "sample", "code": "code", "swe": "swe"}


def measure(domain_name: str, steps: int, warmup_steps: int, episodes: int) -> dict[str, float]:
    ws = init_workspace(Path(tempfile.mkdtemp(prefix=f"evotui-bench-{domain_name}-")) / "ws", TEMPLATES[domain_name])
    cfg = ws.load_config()
    domain = make_domain(cfg.domain, ws.root)
    model, tokenizer = build_tiny_policy(cfg.policy.embedded, domain)
    started = time.perf_counter()
    warmup_policy(model, tokenizer, domain, cfg.policy.warmup.model_copy(update={"steps": warmup_steps}))
    out: dict[str, float] = {"warmup_s": time.perf_counter() - started, "parameters": model.num_parameters()}
    v0 = ws.root / "v0-model"
    save_policy(model, tokenizer, v0)
    if domain_name == "swe":
        tasks = list(domain.tasks("val"))[:episodes]
        started = time.perf_counter()
        played = play(
            model,
            tokenizer,
            domain,
            tasks,
            max_tokens=cfg.recipe.max_completion_length,
            do_sample=True,
            clean=True,  # type: ignore[arg-type]
        )
        out["episodes_per_s"] = len(played) / (time.perf_counter() - started)
        out["turns"] = statistics.mean(r.episode.turns for r in played)
    config = cfg.model_copy(update={"recipe": cfg.recipe.model_copy(update={"steps": steps})})
    run_dir = ws.root / "bench-run"
    spec = RunSpec(
        run_id="bench",
        version="v1",
        kind="train",
        config=config,
        model_in=v0,
        model_out=run_dir / "out",
        workspace=ws.root,
    )
    spec.save(run_dir)
    events = EventLog(run_dir / "events.jsonl")
    trainer = build_grpo_trainer(spec, run_dir, events)
    trainer.train()
    events.close()
    logged, _ = read_events(run_dir / "events.jsonl", 0)
    stamps = [e["ts"] for e in logged if e["type"] == "metrics"]
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    out["s_per_step"] = statistics.median(gaps) if gaps else float("nan")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup-steps", type=int, default=120)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--sandbox-runs", type=int, default=200)
    parser.add_argument("--domains", default="math,code,swe")
    args = parser.parse_args()
    console = Console()
    results = {}
    for name in args.domains.split(","):
        console.print(f"[bold]{name}[/]: warming up v0 and training {args.steps} GRPO steps…")
        results[name] = measure(name, args.steps, args.warmup_steps, args.episodes)
    sandbox = startup_times(args.sandbox_runs)
    table = Table(title="Domains with the embedded policy (2-core CPU)")
    for col in ("what", "figure", "target"):
        table.add_column(col)
    for name, r in results.items():
        table.add_row(f"{name}: GRPO seconds per step", f"{r['s_per_step']:.2f}", "")
        table.add_row(f"{name}: policy parameters", f"{r['parameters']:,.0f}", "")
    if "swe" in results:
        r = results["swe"]
        table.add_row("swe: episodes per second (sampled, batched)", f"{r['episodes_per_s']:.1f}", "")
        table.add_row("swe: mean turns per episode", f"{r['turns']:.1f}", "")
    median = statistics.median(sandbox)
    p95 = statistics.quantiles(sandbox, n=20)[-1]
    table.add_row("sandbox start-up per execution, median (ms)", f"{median:.1f}", "<= 20")
    table.add_row("sandbox start-up per execution, p95 (ms)", f"{p95:.1f}", "")
    console.print(table)
    console.print("[bold green]targets met[/]" if median <= 20 else "[bold red]targets missed[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
