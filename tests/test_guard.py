"""The collapse guard: when it stops a run, and the path of its reason from the worker to the
coach's decision (event, ingest, finding, rule, rejection)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.coach.loop import proposed_decision
from engine.config import CollapseGuardConfig, RecipeConfig
from engine.runs import checkpoint_state
from engine.runs.artifacts import EVENTS_FILE, EventLog, RolloutBatch, read_events
from engine.runs.group_filter import GroupFilter
from engine.runs.guard import CollapseGuard, StepStats, step_stats
from engine.runs.ingest import ingest_run
from engine.runs.worker import _GuardCallback
from engine.store import Store
from engine.verdict import Delta, Verdict
from tests.harness_data import Rollout, RunBuilder, fired, severity, value


def stats(one_step: float, correct: float = 0.2, distinct: float = 1.0) -> StepStats:
    return StepStats(one_step, correct, distinct)


def test_step_stats_count_one_turn_episodes_and_distinct_completions_per_group() -> None:
    s = step_stats([1, 3, None, 1], [1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "c"], group=2)
    assert s.one_step == pytest.approx(2 / 4)  # None (no trace) is not a one-turn episode
    assert s.correct == pytest.approx(1 / 4)
    assert s.distinct == pytest.approx((1 / 2 + 2 / 2) / 2)


def test_the_guard_stops_when_one_turn_episodes_double_past_the_share_without_a_gain() -> None:
    guard = CollapseGuard(CollapseGuardConfig(one_step_share=0.3, window=2))
    shares = [0.1, 0.1, 0.2, 0.3, 0.4]
    reasons = [guard.observe(stats(s)) for s in shares]
    # Windows of 2: at step 4 the last window is (0.2, 0.3) = 0.25 < 0.3; at step 5, 0.35 >= 0.3
    # and >= 2 x the first window's 0.1.
    assert reasons[:4] == [None] * 4
    assert reasons[4] is not None and "10% -> 35%" in reasons[4]


@pytest.mark.parametrize(
    ("shares", "correct", "enabled"),
    [
        ([0.2, 0.2, 0.4, 0.4], [0.2] * 4, True),  # exactly twice the baseline: stops
        ([0.25, 0.25, 0.4, 0.4], [0.2] * 4, True),  # under twice the baseline
        ([0.0, 0.0, 0.5, 0.5], [0.2, 0.2, 0.3, 0.3], True),  # correctness rose: a faster right answer
        ([0.0, 0.0, 0.5, 0.5], [0.2] * 4, False),  # switched off
    ],
)
def test_the_guard_at_its_edges(shares: list[float], correct: list[float], enabled: bool) -> None:
    guard = CollapseGuard(CollapseGuardConfig(enabled=enabled, one_step_share=0.3, window=2))
    reasons = [guard.observe(stats(s, c)) for s, c in zip(shares, correct, strict=True)]
    expected_stop = enabled and shares[-1] >= 2 * shares[0] and correct[-1] <= correct[0]
    assert (reasons[-1] is not None) == expected_stop
    assert reasons[:-1] == [None] * (len(shares) - 1)


def test_a_guard_restored_from_its_state_goes_on_as_if_never_stopped(tmp_path: Path) -> None:
    config = CollapseGuardConfig(one_step_share=0.3, window=2)
    shares = [0.0, 0.1, 0.0, 0.2, 0.4, 0.6, 0.6]
    whole = CollapseGuard(config)
    reasons = [whole.observe(stats(s)) for s in shares]
    stop = next(i for i, r in enumerate(reasons) if r is not None)
    group_filter = GroupFilter(1e-3, ema=0.5)
    group_filter.keep(np.array([0.0, 0.5, 1.0]))
    for cut in range(len(shares) + 1):  # a checkpoint after `cut` steps, through its file
        first = CollapseGuard(config)
        for s in shares[:cut]:
            first.observe(stats(s))
        checkpoint_state.save(tmp_path / f"{cut}.json", cut, first, group_filter)
        resumed, resumed_filter = CollapseGuard(config), GroupFilter(1e-3, ema=0.5)
        assert checkpoint_state.restore(tmp_path / f"{cut}.json", cut, resumed, resumed_filter)
        assert resumed == first and resumed_filter.threshold == group_filter.threshold
        assert [resumed.observe(stats(s)) for s in shares[cut:]] == reasons[cut:]
        assert resumed.stopped == reasons[stop]
    # Once stopped, a guard stays stopped with its reason.
    assert whole.observe(stats(0.0)) == reasons[stop] == whole.stopped
    with pytest.raises(ValueError, match="saved at step 3 but its checkpoint is step 4"):
        checkpoint_state.restore(tmp_path / "3.json", 4, CollapseGuard(config), None)
    assert not checkpoint_state.restore(tmp_path / "none.json", 3, CollapseGuard(config), None)  # an older checkpoint


def _batch(step: int, turns: list[int], correct: list[float]) -> RolloutBatch:
    batch = RolloutBatch(run_id="v1-train-1", step=step, split="train", decoding="sampled")
    batch.num_turns += turns
    batch.reward_components += [{"correctness": c} for c in correct]
    batch.completion += [f"c{step}-{i}-{t}" for i, t in enumerate(turns)]
    return batch


def test_the_worker_callback_ends_training_with_a_stopped_event(tmp_path: Path) -> None:
    recipe = RecipeConfig(num_generations=2, collapse_guard=CollapseGuardConfig(one_step_share=0.5, window=1))
    recorder = SimpleNamespace(agentic=True, last_batch=None)
    events = EventLog(tmp_path / EVENTS_FILE)
    callback = _GuardCallback(recipe, recorder, events)  # type: ignore[arg-type]
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    recorder.last_batch = _batch(1, [4, 5, 1, 6], [0.0, 1.0, 0.0, 0.0])  # 1 of 4 in one turn
    callback.on_step_end(None, SimpleNamespace(global_step=1), control)
    callback.on_step_end(None, SimpleNamespace(global_step=2), control)  # same batch: not counted again
    assert not control.should_training_stop and len(callback.guard.history) == 1
    recorder.last_batch = _batch(2, [1, 1, 1, 6], [0.0, 0.0, 0.0, 0.0])  # 3 of 4
    callback.on_step_end(None, SimpleNamespace(global_step=3), control)
    # It stops, and has this step saved (which keeps the stop); the event comes once that is done.
    assert control.should_training_stop and control.should_save
    assert not [e for e in read_events(tmp_path / EVENTS_FILE, 0)[0] if e["type"] == "stopped"]
    callback.on_save(None, SimpleNamespace(global_step=3), control)
    callback.on_save(None, SimpleNamespace(global_step=3), control)  # said once
    events.close()
    (stopped,) = [e for e in read_events(tmp_path / EVENTS_FILE, 0)[0] if e["type"] == "stopped"]
    assert stopped["step"] == 3 and "25% -> 75%" in stopped["reason"]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "evo.duckdb") as s:
        yield s


def test_a_stopped_run_is_diagnosed_and_rejected_whatever_it_scores(store: Store, tmp_path: Path) -> None:
    b = RunBuilder(store).step(1, [[Rollout(reward=float(i % 2)) for i in range(8)]])
    b.save(4)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reason = "collapse: one-turn episodes 0% -> 60% of the first and last 2 steps"
    (run_dir / EVENTS_FILE).write_text(json.dumps({"type": "stopped", "step": 3, "reason": reason}) + "\n")
    ingest_run(store, "v1-train-1", run_dir)
    store.set_events_offset("v1-train-1", 0)
    ingest_run(store, "v1-train-1", run_dir)  # ingesting again adds no second event
    (count,) = store.query_one("SELECT count(*) FROM events WHERE kind = 'stopped_early'")  # type: ignore[misc]
    assert count == 1
    d = b.diagnose_saved()
    assert value(d, "behavior.stopped_early") == 3 and severity(d, "behavior.stopped_early") == "critical"
    assert fired(d)[0] == "stopped_early"
    # Even a gain beyond the noise floor does not save it.
    parent = np.zeros(100)
    child = np.r_[np.ones(60), np.zeros(40)]
    gain = Verdict("v0", "v1", 100, (Delta("sampled", parent.mean(), child.mean(), 0.5, 0.7),))
    decision, why = proposed_decision(gain, d)
    assert decision == "rejected" and why.startswith("stopped early: the collapse guard stopped the run at step 3")
