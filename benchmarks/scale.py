"""What surviving and scaling out cost: checkpoints, resume, and Ray per branch.

On the sample workspace's policy (v0 with a short warm-up), GRPO runs of --steps steps through
the engine, one at a time:

(a) checkpoints: the run with `save_every = 0` and with `save_every = 1` (a checkpoint every
    step); s per save = the difference of wall times / steps; disk per checkpoint = the largest
    `trainer/checkpoint-N` seen while the run trains (a watcher thread);
(b) resume: the worker of a run that checkpoints every --save-every steps is killed (SIGKILL)
    at step --kill-at and started again by the engine: the time from the relaunch to its first
    new step, against a fresh worker's time from start to its first step (both include the
    process start and the model load; the difference is the checkpoint restore);
(c) Ray: the same run through a local Ray cluster (a head on 127.0.0.1, started here) against
    the local runner: the overhead per branch; then two branches at once on Ray (`train_many`)
    against the two one after the other locally.

Prints one table. Never run it while something else trains: two torch processes on two cores
slow each other down.

    .venv/bin/python benchmarks/scale.py [--steps 10] [--no-ray]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import git
from rich.console import Console
from rich.table import Table

from engine.config import CONFIG_FILE, WorkspaceConfig
from engine.core import Engine, VersionPlan
from engine.runs.runner import LocalRunner, Runner
from engine.store import RunRecord
from engine.versions import ACTOR
from engine.workspace import init_workspace

console = Console()


def recipe(config: WorkspaceConfig, **changes: Any) -> WorkspaceConfig:
    return config.model_copy(update={"recipe": config.recipe.model_copy(update=changes)})


def train(engine: Engine, config: WorkspaceConfig, name: str) -> tuple[RunRecord, float]:
    """One GRPO run from v0 with `config`, through the engine; its wall time."""
    v0 = engine.store.get_version("v0")
    assert v0 is not None and v0.checkpoint
    start = time.perf_counter()
    run = engine.training.execute(
        "v0", "train", config, engine.workspace.root / v0.checkpoint, engine.workspace.model_dir(name)
    )
    return run, time.perf_counter() - start


class CheckpointWatcher(threading.Thread):
    """The largest checkpoint directory seen under `trainer/` while a run trains."""

    def __init__(self, runs_dir: Path):
        super().__init__(daemon=True)
        self.runs_dir = runs_dir
        self.largest = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            for ckpt in self.runs_dir.glob("*/trainer/checkpoint-*"):
                try:
                    size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
                except OSError:  # rotated away while being read
                    continue
                self.largest = max(self.largest, size)


def median_step(run: RunRecord) -> float:
    """The median time between consecutive GRPO steps (worker's clock): one step, and its save."""
    from engine.runs.artifacts import EVENTS_FILE, read_events

    events = read_events(Path(run.run_dir) / EVENTS_FILE, 0)[0]
    ts = [e["ts"] for e in events if e["type"] == "metrics" and "reward" in e["values"]]
    return statistics.median(b - a for a, b in zip(ts, ts[1:], strict=False))


def step_seconds(run_dir: Path, after: str | None) -> float:
    """Seconds from the worker's first event (after the last `resume` when `after`) to its first
    step metric, by the worker's own clock: start-up, model (and checkpoint) load, first step."""
    from engine.runs.artifacts import EVENTS_FILE, read_events

    events = read_events(run_dir / EVENTS_FILE, 0)[0]
    if after is not None:
        last = max(i for i, e in enumerate(events) if e["type"] == after)
        events = events[last:]
    first_step = next(e for e in events if e["type"] == "metrics" and "reward" in e["values"])
    return float(first_step["ts"] - events[0]["ts"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps per run")
    parser.add_argument("--save-every", type=int, default=2, help="checkpoint interval of the resumed run (b)")
    parser.add_argument("--kill-at", type=int, default=5, help="the step whose end kills the worker (b)")
    parser.add_argument("--warmup-steps", type=int, default=50, help="warm-up steps of v0")
    parser.add_argument("--no-ray", action="store_true", help="skip (c)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="evotui-scale-"))
    workspace = init_workspace(root / "ws")
    text = re.sub(r"^steps = 300", f"steps = {args.warmup_steps}", workspace.config_path.read_text(), flags=re.M)
    workspace.config_path.write_text(text)
    repo = git.Repo(workspace.root)
    repo.index.add([CONFIG_FILE])
    repo.index.commit("benchmark settings", author=ACTOR, committer=ACTOR)
    rows: list[tuple[str, str, str]] = []

    with Engine(workspace, poll_seconds=0.2) as engine:
        console.print(f"building v0 ({args.warmup_steps} warm-up steps) in {workspace.root} ...")
        engine.ensure_base()
        base = recipe(engine.version_config("v0"), steps=args.steps)

        # (a) checkpoint cost
        without, plain = train(engine, recipe(base, save_every=0), "a-none")
        watcher = CheckpointWatcher(workspace.runs_dir)
        watcher.start()
        with_saves, saving = train(engine, recipe(base, save_every=1, keep_checkpoints=2), "a-every")
        watcher.done.set()
        step, step_saving = median_step(without), median_step(with_saves)
        rows.append(("(a) run, no checkpoints", f"{plain:.1f} s", f"median step {step:.2f} s"))
        rows.append(("(a) run, a checkpoint every step", f"{saving:.1f} s", f"median step {step_saving:.2f} s"))
        size = f"{watcher.largest / 2**20:.1f} MiB on disk"
        rows.append(("(a) per checkpoint (median step difference)", f"{step_saving - step:.2f} s", size))

        # (b) resume
        kills = root / "kills"
        kills.mkdir()
        engine.runner = LocalRunner(
            extra_env={"EVOTUI_KILL_AT": f"grpo-step:{args.kill_at}", "EVOTUI_KILL_ONCE": str(kills)}
        )
        run, wall = train(engine, recipe(base, save_every=args.save_every), "b-resumed")
        engine.runner = LocalRunner()
        fresh = step_seconds(Path(run.run_dir), None)
        resumed = step_seconds(Path(run.run_dir), "resume")
        back_to = args.kill_at - args.kill_at % args.save_every
        rows.append(("(b) fresh worker: model loaded to first step", f"{fresh:.1f} s", "after its imports"))
        rows.append(
            (
                "(b) relaunched worker: resume to first new step",
                f"{resumed:.1f} s",
                f"killed at step {args.kill_at}, resumed from {back_to}; whole run {wall:.1f} s vs {plain:.1f} s",
            )
        )

        # (c) Ray per branch
        if not args.no_ray:
            from engine.runs.ray_runner import RayRunner, local_cluster

            with local_cluster() as address:
                runner: Runner = RayRunner(address, cpus=1, gpus=0)
                engine.runner = runner
                _, on_ray = train(engine, recipe(base, save_every=0), "c-ray")
                engine.runner = LocalRunner()
                rows.append(("(c) one branch, local runner", f"{plain:.1f} s", "(a)'s run"))
                rows.append(("(c) one branch, Ray task, cpus = 1", f"{on_ray:.1f} s", f"{on_ray - plain:+.1f} s"))
                # Ray gives a task of N CPUs N torch threads (OMP_NUM_THREADS); the local worker takes all.
                engine.runner = RayRunner(address, cpus=2, gpus=0)
                _, on_ray2 = train(engine, recipe(base, save_every=0), "c-ray-2")
                rows.append(("(c) one branch, Ray task, cpus = 2", f"{on_ray2:.1f} s", f"{on_ray2 - plain:+.1f} s"))
                pair = _two_branches(engine, base, LocalRunner())
                engine.runner = RayRunner(address, cpus=1, gpus=0)
                pair_ray = _two_branches(engine, base, engine.runner)
                engine.runner = LocalRunner()
                rows.append(("(c) two branches, one after the other, local", f"{pair:.1f} s", ""))
                rows.append(("(c) two branches at once, Ray", f"{pair_ray:.1f} s", f"{pair / pair_ray:.2f}x"))

    table = Table(title=f"Checkpoints, resume and Ray ({args.steps} GRPO steps, sample policy)")
    for col in ("measure", "value", "note"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return 0


def _two_branches(engine: Engine, base: WorkspaceConfig, runner: Runner) -> float:
    """Two children of v0 trained through `train_many` (the coach's path for a parallel runner)."""
    names = []
    for _ in range(2):
        name = engine.next_version_name()
        text = engine.config_text("v0")
        text = re.sub(
            r"^(\[recipe\][^\[]*?)^steps = \d+", rf"\g<1>steps = {base.recipe.steps}", text, flags=re.M | re.S
        )
        engine.create_version(VersionPlan("v0", name, {CONFIG_FILE: text}, "none", "none", {}, "h", "c", "r"))
        names.append(name)
    engine.runner = runner
    start = time.perf_counter()
    if runner.parallel:
        engine.train_many(names)
    else:
        for name in names:
            engine.train(name)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
