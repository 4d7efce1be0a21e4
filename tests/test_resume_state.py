"""A worker killed and resumed from its checkpoint goes on with the collapse guard and the group
filter as they were at that checkpoint's step, and a run the guard stopped stays stopped.

Real GRPO steps of the tiny math policy through `worker.run_train` (its real checkpoints, its
real resume); only the episodes the guard reads are scripted, as in tests/test_guard.py: each
step's real batch is shown to the guard as the scripted episodes of that step, so the collapse
is the same on every replay of a step. A kill is a `faults.point` that raises, in this process:
the trainer and everything it held in memory are dropped, and the run is resumed by a second
`run_train` from what is on disk, as a relaunched worker would (`test_survive.py` kills real
worker processes; a scripted collapse cannot reach into one).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from engine import faults
from engine.config import CONFIG_FILE, WorkspaceConfig, parse_config
from engine.domains import make_domain
from engine.policy.pretrained import save_policy
from engine.policy.tiny import build_tiny_policy, warmup_policy
from engine.runs import checkpoint_state, worker
from engine.runs.artifacts import EVENTS_FILE, EventLog, RolloutBatch, read_events
from engine.runs.guard import CollapseGuard, StepStats
from engine.runs.spec import RunSpec
from engine.workspace import template_dir
from tests.conftest import tiny_toml

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY, EMA = 9, 2, 0.5
#: One-turn episodes (of GROUP) at each step 1..STEPS: a collapse that sets in slowly. Correctness
#: stays 0, so only the one-turn share decides.
GROUP = 8
ONE_TURN = [0, 1, 0, 1, 2, 4, 6, 6, 6]
#: Run B is killed on reaching this step's kill point (before its checkpoint would be saved).
KILL_STEP = 4


def scripted(step: int) -> RolloutBatch:
    """What the guard sees of step `step`: GROUP episodes, ONE_TURN[step - 1] of them of one turn."""
    batch = RolloutBatch(run_id="scripted", step=step, split="train", decoding="sampled")
    ones = ONE_TURN[step - 1]
    batch.num_turns += [1] * ones + [4] * (GROUP - ones)
    batch.reward_components += [{"correctness": 0.0}] * GROUP
    batch.completion += [f"s{step}-{i}" for i in range(GROUP)]
    return batch


class ScriptedEpisodes:
    """The guard's view of the run's recorder: the scripted episodes of the step it last recorded."""

    agentic = True

    def __init__(self, recorder: Any):
        self.recorder = recorder

    @property
    def last_batch(self) -> RolloutBatch | None:
        real = self.recorder.last_batch
        return None if real is None else scripted(real.step)


class ScriptedGuardCallback(worker._GuardCallback):
    def __init__(self, recipe: Any, recorder: Any, events: EventLog):
        super().__init__(recipe, ScriptedEpisodes(recorder), events)


class Killed(BaseException):
    """The worker dies here (what SIGKILL would do, short of ending the test's process)."""


def step_stats_of(step: int) -> StepStats:
    ones = ONE_TURN[step - 1]
    return StepStats(one_step=ones / GROUP, correct=0.0, distinct=1.0)


def guard_stop(first_step: int, config: WorkspaceConfig) -> int | None:
    """The step at which a guard that starts empty before `first_step` stops the script (None: never)."""
    guard = CollapseGuard(config.recipe.collapse_guard)
    return next((s for s in range(first_step, STEPS + 1) if guard.observe(step_stats_of(s))), None)


def config_text() -> str:
    text = tiny_toml((template_dir("sample") / "workspace.toml").read_text(), grpo_steps=STEPS)
    head, sep, tail = text.partition("[recipe.rewards]")
    text = f"{head}save_every = {SAVE_EVERY}\nkeep_checkpoints = 2\n\n{sep}{tail}"
    section = re.search(r"^\[recipe\.group_filter\][^\[]*", text, flags=re.M)
    assert section is not None
    enabled = section[0].replace("enabled = false", "enabled = true").replace("ema = 0.0", f"ema = {EMA}")
    assert enabled != section[0]
    return text.replace(section[0], enabled)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[WorkspaceConfig, Path]:
    """The tiny config and a warmed-up v0 (its groups have reward spread for the filter to follow)."""
    root = tmp_path_factory.mktemp("resume")
    config = parse_config(config_text(), root / CONFIG_FILE)
    domain = make_domain(config.domain)
    model, tokenizer = build_tiny_policy(config.policy.embedded, domain, seed=config.policy.warmup.seed)
    # The tests' warm-up steps on a quarter of their batch: half the time, and (measured) still
    # every GRPO group with reward spread, so the filter's EMA follows real medians.
    warmup_policy(model, tokenizer, domain, config.policy.warmup.model_copy(update={"batch_size": 8}))
    save_policy(model, tokenizer, root / "v0")
    return config, root / "v0"


@pytest.fixture
def scripted_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_GuardCallback", ScriptedGuardCallback)


class KillAt:
    """`kill_at(name, n)`: the next run dies the n-th time it reaches `faults.point(name)`."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.left = 0

    def __call__(self, name: str, n: int) -> None:
        self.name, self.left = name, n

    def point(self, name: str) -> None:
        if name == self.name:
            self.left -= 1
            if self.left == 0:
                self.name = None
                raise Killed(name)


@pytest.fixture
def kill_at(monkeypatch: pytest.MonkeyPatch) -> KillAt:
    killer = KillAt()
    monkeypatch.setattr(faults, "point", killer.point)
    return killer


def train(spec: RunSpec, run_dir: Path, resuming: bool = False) -> None:
    events = EventLog(run_dir / EVENTS_FILE)
    try:
        worker.run_train(spec, run_dir, events, resuming)
    finally:
        events.close()


def new_run(setup: tuple[WorkspaceConfig, Path], tmp_path: Path, name: str) -> tuple[RunSpec, Path]:
    config, v0 = setup
    run_dir = tmp_path / name
    spec = RunSpec(
        run_id=name, version="v1", kind="train", config=config, model_in=v0, model_out=tmp_path / f"{name}-v1"
    )
    spec.save(run_dir)
    return spec, run_dir


def events_of(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir / EVENTS_FILE, 0)[0] if e["type"] == kind]


def thresholds(run_dir: Path) -> dict[int, float]:
    """The filter's logged threshold at each step (a replayed step: its latest)."""
    return {
        e["step"]: e["values"]["filter/threshold"]
        for e in events_of(run_dir, "metrics")
        if "filter/threshold" in e["values"]
    }


def ema_oracle(run_dir: Path, config: WorkspaceConfig, steps: int) -> list[float]:
    """The threshold after each of steps 1..`steps` of one uninterrupted pass over the run's stored
    train groups, by the definition: ema x previous + (1 - ema) x the step's median population std."""
    threshold, out = config.recipe.group_filter.std_threshold, []
    for step in range(1, steps + 1):
        table = pq.read_table(run_dir / "rollouts" / f"train-{step:06d}.parquet", columns=["group_id", "reward"])
        rewards = table.column("reward").to_numpy()
        groups = table.column("group_id").to_numpy()
        spreads = [float(np.std(rewards[groups == g])) for g in np.unique(groups)]
        threshold = EMA * threshold + (1 - EMA) * float(np.median(spreads))
        out.append(threshold)
    return out


def test_kill_and_resume_keeps_the_guard_and_the_filter_and_a_stop(
    setup: tuple[WorkspaceConfig, Path], tmp_path: Path, scripted_guard: None, kill_at: KillAt
) -> None:
    config = setup[0]
    window = config.recipe.collapse_guard.window
    stop = guard_stop(1, config)
    assert stop is not None and 2 * window <= stop < STEPS  # it stops the run, not its end
    # The kill: after a checkpoint, before the guard's windows are full; a guard that started
    # empty after that checkpoint would stop elsewhere (or never), so the test can tell.
    checkpoint = (KILL_STEP - 1) // SAVE_EVERY * SAVE_EVERY
    assert 0 < checkpoint < KILL_STEP - 1 < 2 * window
    assert guard_stop(checkpoint + 1, config) != stop

    # A: uninterrupted until the guard stops it; killed during its final evaluation.
    spec_a, run_a = new_run(setup, tmp_path, "a")
    kill_at("eval", 1)
    with pytest.raises(Killed):
        train(spec_a, run_a)
    (stopped_a,) = events_of(run_a, "stopped")
    assert stopped_a["step"] == stop
    assert worker.last_checkpoint(run_a / worker.TRAINER_DIR) == run_a / worker.TRAINER_DIR / f"checkpoint-{stop}"

    # (c) Resumed, A stays stopped: it resumes from the stop's checkpoint as a finished run,
    # says again why it stopped, trains no step, and goes on to its evaluation.
    before = len(read_events(run_a / EVENTS_FILE, 0)[0])
    train(spec_a, run_a, resuming=True)
    after = read_events(run_a / EVENTS_FILE, 0)[0][before:]
    assert [e["type"] for e in after][:2] == ["resume", "stopped"]
    assert (after[0]["step"], after[0]["final"]) == (stop, True)
    assert (after[1]["step"], after[1]["reason"]) == (stop, stopped_a["reason"])
    assert not [e for e in after if e["type"] in ("start", "rollouts") and e.get("split", "train") == "train"]
    assert {e["step"] for e in after if e["type"] in ("metrics", "checkpoint")} == {stop}
    assert (spec_a.model_out / "model.safetensors").is_file()  # type: ignore[operator]

    # B: the same run, killed on reaching step KILL_STEP.
    spec_b, run_b = new_run(setup, tmp_path, "b")
    kill_at("grpo-step", KILL_STEP)
    with pytest.raises(Killed):
        train(spec_b, run_b)
    assert not events_of(run_b, "stopped")
    assert worker.last_checkpoint(run_b / worker.TRAINER_DIR) == run_b / worker.TRAINER_DIR / f"checkpoint-{checkpoint}"
    # The checkpoint keeps the state of its own step, not of the steps after it the dead worker ran.
    saved = json.loads(checkpoint_state.state_file(run_b / worker.TRAINER_DIR / f"checkpoint-{checkpoint}").read_text())
    assert saved["step"] == checkpoint and len(saved["guard"]["history"]) == checkpoint
    assert saved["guard"]["stopped"] is None
    assert saved["group_filter"]["threshold"] == pytest.approx(ema_oracle(run_b, config, checkpoint)[-1], abs=1e-12)
    assert max(thresholds(run_b)) == KILL_STEP - 1  # the dead worker had gone past it

    # (a) Resumed, B is stopped by the guard at the step A was, for the same reason.
    train(spec_b, run_b, resuming=True)
    resumes = events_of(run_b, "resume")
    assert [(e["step"], e["final"]) for e in resumes] == [(checkpoint, False)]
    (stopped_b,) = events_of(run_b, "stopped")
    assert (stopped_b["step"], stopped_b["reason"]) == (stop, stopped_a["reason"])

    # (b) The filter's threshold after the resume is the one an uninterrupted run has at the same
    # step: by the definition, over the run's stored groups, and as run A logged it (the same
    # seed: the same groups, also after a resume, which restores TRL's RNG state).
    logged_b = thresholds(run_b)
    assert sorted(logged_b) == list(range(1, stop + 1))
    oracle = ema_oracle(run_b, config, stop)
    assert [logged_b[s] for s in range(1, stop + 1)] == pytest.approx(oracle, abs=1e-12)
    assert logged_b == pytest.approx(thresholds(run_a), abs=1e-12)
    # ... which a filter that started afresh at the resume would not have had.
    assert oracle[checkpoint - 1] != pytest.approx(config.recipe.group_filter.std_threshold, abs=1e-12)
