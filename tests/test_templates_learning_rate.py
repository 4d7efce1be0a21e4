"""The learning rate sized from the update size: how far the policy's entropy drifted over the
parent's run against its own step-to-step noise (TRL's per-step `entropy`), the `small_updates`
rule that reads it, and `raise_lr` sized from it. The drift is checked against scipy's
`linregress`; every expected learning rate is computed here."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from scipy import stats

from engine.coach.backends.base import PlanningContext
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.interventions import FIXED, MAX_LR, RAISE_LR_BELOW, TEMPLATES, Facts, run_facts
from engine.config import CONFIG_FILE, parse_config
from engine.harness.analyzers.signal import metric_drift
from engine.harness.cutoffs import LEVEL
from engine.harness.thresholds import UPDATE_DRIFT
from engine.store import Store
from tests.harness_data import Rollout, RunBuilder, fired, value

STEPS = 30
TEXT = '[workspace]\nname = "t"\n[recipe]\nlearning_rate = 2e-5\n'
CONFIG = parse_config(TEXT, Path(CONFIG_FILE))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "evo.duckdb") as s:
        yield s


def palindrome(n: int, scale: float, seed: int) -> list[float]:
    """Noise whose least-squares slope on the step is exactly 0 (symmetric about the middle)."""
    rng = random.Random(seed)
    half = [rng.gauss(0, scale) for _ in range(n // 2)]
    return half + half[::-1]


def run(store: Store, entropy: list[float], reward: list[float], spread: bool = True) -> RunBuilder:
    """A run with groups that have reward spread (half right, half wrong) or none, and per-step
    entropy and reward as TRL logs them."""
    group = [Rollout(reward=float(s % 2 if spread else 0)) for s in range(8)]
    b = RunBuilder(store)
    for step in range(1, len(entropy) + 1):
        b.step(step, [group, group])
    return b.metric("entropy", entropy).metric("reward", reward)


def t_of(values: list[float]) -> tuple[float, float]:
    """(t of the slope, its two-sided critical value at the verdict's level), independently."""
    fit = stats.linregress(range(1, len(values) + 1), values)
    return fit.slope / fit.stderr, float(stats.t.ppf(1 - (1 - LEVEL) / 2, len(values) - 2))


def trend(slope: float, noise: list[float]) -> list[float]:
    return [0.6 + slope * (i + 1) + e for i, e in enumerate(noise)]


# -- the measurement -----------------------------------------------------------------------------
@pytest.mark.parametrize("slope", [0.0, 2e-4, -1e-3])
def test_the_drift_is_the_slopes_t_in_units_of_its_critical_value(store: Store, slope: float) -> None:
    rng = random.Random(5)
    entropy = [0.6 + slope * i + rng.gauss(0, 0.01) for i in range(1, STEPS + 1)]
    run(store, entropy, entropy).save(steps=STEPS)
    drift = metric_drift(store, "v1-train-1", "entropy")
    t, critical = t_of(entropy)
    assert drift is not None and drift.steps == STEPS
    assert drift.t == pytest.approx(t, rel=1e-6) and drift.critical == pytest.approx(critical)
    assert drift.units == pytest.approx(abs(t) / critical, rel=1e-6)
    assert metric_drift(store, "v1-train-1", "kl") is None  # not logged (beta = 0): no drift, not a zero one


# -- the trigger ---------------------------------------------------------------------------------
def test_small_updates_fires_when_neither_entropy_nor_reward_moved_beyond_noise(store: Store) -> None:
    entropy, reward = trend(0.0, palindrome(STEPS, 0.02, 1)), trend(0.0, palindrome(STEPS, 0.05, 2))
    d = run(store, entropy, reward).diagnose(steps=STEPS)
    assert UPDATE_DRIFT.crossed(abs(t_of(entropy)[0]) / t_of(entropy)[1])
    assert value(d, "signal.entropy_drift") == pytest.approx(0.0, abs=1e-6)
    assert "small_updates" in fired(d)


def test_small_updates_is_silent_when_the_entropy_moved(store: Store) -> None:
    entropy = trend(-3e-3, palindrome(STEPS, 0.005, 1))  # sharpening well beyond its noise
    t, critical = t_of(entropy)
    assert not UPDATE_DRIFT.crossed(abs(t) / critical)
    d = run(store, entropy, trend(0.0, palindrome(STEPS, 0.05, 2))).diagnose(steps=STEPS)
    assert value(d, "signal.entropy_drift") == pytest.approx(abs(t) / critical, rel=1e-6)
    assert "small_updates" not in fired(d)


def test_small_updates_is_silent_when_the_reward_rose(store: Store) -> None:
    reward = trend(5e-3, palindrome(STEPS, 0.01, 2))
    assert not UPDATE_DRIFT.crossed(abs(t_of(reward)[0]) / t_of(reward)[1])
    d = run(store, trend(0.0, palindrome(STEPS, 0.02, 1)), reward).diagnose(steps=STEPS)
    assert "small_updates" not in fired(d)


def test_small_updates_is_silent_without_reward_spread(store: Store) -> None:
    flat = trend(0.0, palindrome(STEPS, 0.02, 1))
    d = run(store, flat, flat, spread=False).diagnose(steps=STEPS)
    assert "small_updates" not in fired(d)


# -- the size ------------------------------------------------------------------------------------
def expected_lr(lr: float, t: float, critical: float) -> float:
    """The learning rate that brings |t| (which grows with the step under Adam) to the critical
    value, a |t| under 1 counting as 1; three significant digits."""
    return min(MAX_LR, float(f"{lr * critical / max(abs(t), 1.0):.3g}"))


@pytest.mark.parametrize(("slope", "scale"), [(0.0, 0.02), (1.2e-4, 0.004), (-1e-4, 0.004)])
def test_the_raise_brings_the_drift_to_its_critical_value(store: Store, slope: float, scale: float) -> None:
    entropy = trend(slope, palindrome(STEPS, scale, 3))
    run(store, entropy, entropy).save(steps=STEPS)
    facts = run_facts(store, "v1-train-1")
    t, critical = t_of(entropy)
    assert facts.entropy_drift is not None and abs(t) < critical  # inside its noise
    iv = TEMPLATES["raise_lr"].propose(CONFIG, ["rule:small_updates"], facts=facts)
    assert iv is not None
    assert iv.changes == {"recipe.learning_rate": pytest.approx(expected_lr(2e-5, t, critical))}
    assert "the update size" in iv.hypothesis and FIXED not in iv.hypothesis
    assert ("counts as 1" in iv.hypothesis) == (abs(t) < 1)


def test_no_raise_where_the_policy_moved_and_the_fixed_step_without_a_run(store: Store) -> None:
    entropy = trend(-3e-3, palindrome(STEPS, 0.005, 1))
    run(store, entropy, entropy).save(steps=STEPS)
    facts = run_facts(store, "v1-train-1")
    assert facts.entropy_drift is not None and not UPDATE_DRIFT.crossed(facts.entropy_drift.units)
    assert TEMPLATES["raise_lr"].propose(CONFIG, [], facts=facts) is None
    iv = TEMPLATES["raise_lr"].propose(CONFIG, [], facts=Facts())
    assert iv is not None and iv.changes == {"recipe.learning_rate": 4e-5} and FIXED in iv.hypothesis
    drawn = TEMPLATES["raise_lr"].propose(CONFIG, [], facts=facts, size=0.5)  # random search keeps its sizes
    assert drawn is not None and drawn.changes["recipe.learning_rate"] == float(f"{2e-5 * 2**0.5:.3g}")
    high = parse_config(f'[workspace]\nname = "t"\n[recipe]\nlearning_rate = {RAISE_LR_BELOW}\n', Path(CONFIG_FILE))
    assert TEMPLATES["raise_lr"].propose(high, [], facts=Facts()) is None


# -- the planner ---------------------------------------------------------------------------------
def test_the_planner_raises_the_learning_rate_when_small_updates_fires(store: Store) -> None:
    entropy, reward = trend(0.0, palindrome(STEPS, 0.02, 1)), trend(0.0, palindrome(STEPS, 0.05, 2))
    d = run(store, entropy, reward).diagnose(steps=STEPS)
    facts = run_facts(store, "v1-train-1")
    ctx = PlanningContext(parent="v0", parent_config=CONFIG, domain="math", diagnosis=d, facts=facts)
    (iv,) = [iv for iv in OfflinePlanner().propose(ctx).interventions if iv.template == "raise_lr"]
    assert "rule:small_updates" in iv.evidence
    t, critical = t_of(entropy)
    assert iv.changes == {"recipe.learning_rate": pytest.approx(expected_lr(2e-5, t, critical))}
