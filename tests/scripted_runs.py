"""A runner that writes what a worker would, from a script instead of a policy: fast, seeded loops.

`ScriptedRunner(quality, form)` implements the engine's runner interface. For each run it writes
the real artifacts (`events.jsonl`, rollout Parquet files through `RolloutBatch`) that the engine
ingests, judges and diagnoses like any run's: GRPO steps of train groups, then the val evaluation
(greedy and the sampled passes of `[eval]`). A version answers a task correctly with probability
`quality(version)`, and writes its answers as `form(version, domain, task, correct)`.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from pathlib import Path

from engine.domains import make_domain
from engine.domains.base import Domain, Task
from engine.runs.artifacts import EVENTS_FILE, EventLog, RolloutBatch, write_rollouts
from engine.runs.evaluate import add_completion
from engine.runs.spec import RunSpec

Quality = Callable[[str], float]
Form = Callable[[str, Domain, Task, bool], str]


def demonstrated(version: str, domain: Domain, task: Task, correct: bool, off: int = 1) -> str:
    """The domain's own demonstration; a wrong one ends in a final answer `off` from the right one
    (the math form)."""
    text = domain.demonstration(task)
    if correct:
        return text
    head, _, answer = text.rpartition("A:")
    return f"{head}A:{int(answer) + off}"


class Finished:
    """The handle of a run that already ended (the script runs inside `start`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def kill(self) -> None:
        pass


class ScriptedRunner:
    parallel = False
    retries = False

    def __init__(self, quality: Quality, form: Form = demonstrated, greedy: Quality | None = None) -> None:
        self.quality = quality
        self.form = form
        #: The quality of greedy decoding, where it differs from the sampled passes' (`quality`).
        self.greedy = greedy

    def start(self, run_dir: Path) -> Finished:
        spec = RunSpec.load(run_dir)
        domain = make_domain(spec.config.domain, spec.workspace)
        weights = spec.config.recipe.rewards
        rng = random.Random(spec.run_id)
        p = self.quality(spec.version)
        events = EventLog(run_dir / EVENTS_FILE)
        events.write("start", total_steps=spec.total_steps)

        greedy = self.greedy(spec.version) if self.greedy is not None else p

        def batch(step: int, split: str, decoding: str, tasks: list[Task], samples: int, first: int) -> None:
            out = RolloutBatch(spec.run_id, step, split, decoding)
            q = greedy if decoding == "greedy" else p
            for g, task in enumerate(tasks):
                for s in range(samples):
                    text = self.form(spec.version, domain, task, rng.random() < q)
                    add_completion(out, domain, weights, task, (text, False, len(text)), g, first + s)
            name = f"{split}-{decoding}-{first}-{step:06d}"
            events.write("rollouts", step=step, split=split, file=write_rollouts(run_dir, name, out), rows=len(out))

        recipe, train = spec.config.recipe, list(domain.tasks("train"))
        for step in range(1, spec.total_steps + 1 if spec.kind == "train" else 1):
            tasks = rng.sample(train, recipe.prompts_per_step)
            batch(step, "train", "sampled", tasks, recipe.num_generations, 0)
            events.write("metrics", step=step, values={"reward": p, "loss": 0.01})
        final = spec.total_steps
        val = list(domain.tasks("val"))
        batch(final, "val", "greedy", val, 1, 0)
        for k in range(1, spec.config.eval.sampled_seeds + 1):
            batch(final, "val", "sampled", val, 1, k)
        if spec.model_out is not None:
            spec.model_out.mkdir(parents=True, exist_ok=True)
        events.write("end", status="succeeded")
        events.close()
        # The pid of a process that has ended: the engine may signal a run's process group, so
        # the handle must never name a live one (nor 0 or -1, which mean this group or all).
        done = subprocess.Popen(["true"], start_new_session=True)
        done.wait()
        return Finished(done.pid)
