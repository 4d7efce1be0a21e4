"""Partial credit where binary correctness leaves groups without spread: the `sparse_correctness`
rule (the dead-group lines read on correctness alone), the weight of `continuous_correctness`
sized from the spread the continuous component adds, and the offline planner proposing it.
Every expected figure is computed here from the rows the test wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.coach.backends.base import PlanningContext
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.interventions import CONTINUOUS, FIXED, TEMPLATES, apply, run_facts
from engine.config import CONFIG_FILE, parse_config
from engine.grpo import DEAD_STD
from engine.harness.base import Finding, Findings
from engine.harness.rules import sparse_correctness
from engine.harness.thresholds import CORRECTNESS_DEAD_GROUPS, DEAD_GROUPS
from engine.store import Store
from tests.harness_data import Rollout, RunBuilder, fired, severity, value
from tests.test_coach import diagnosis_of

CODE_TEXT = '[workspace]\nname = "t"\n[domain]\nname = "code"\n[recipe.rewards]\ncorrectness = 1.0\nformat = 0.1\n'
CODE = parse_config(CODE_TEXT, Path(CONFIG_FILE))

#: One group: (correctness, format, pass_fraction) per sample.
Group = list[tuple[float, float, float]]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "evo.duckdb") as s:
        yield s


def builder(store: Store, groups: list[Group]) -> RunBuilder:
    """A code run's train step: each sample's total is correctness + 0.1 x format (the recipe's),
    and pass_fraction is logged beside them at weight 0, as a real run logs every component."""
    b = RunBuilder(store).step(
        1, [[Rollout(reward=c + 0.1 * f, correctness=c, format=f) for c, f, _ in group] for group in groups]
    )
    extra = [pf for group in groups for _, _, pf in group]
    for row, pf in zip(b.rows, extra, strict=True):
        row["reward_components"] = [*row["reward_components"], ("pass_fraction", pf)]
    return b


def groups_dead_on_correctness(n_dead: int, n_live: int) -> list[Group]:
    """Groups all wrong (a format slip keeps the total alive, pass fractions vary) and groups where
    one sample in eight passes every test."""
    dead = [[(0.0, float(s % 2), (s % 3) / 2) for s in range(8)] for _ in range(n_dead)]
    live = [[(float(s == 0), 1.0, 1.0 if s == 0 else 0.5) for s in range(8)] for _ in range(n_live)]
    return dead + live


def dead_share(groups: list[Group], at: int) -> float:
    """The share of groups whose column `at` has no spread (population std, `DEAD_STD`)."""
    return float(np.mean([np.std([s[at] for s in g]) < DEAD_STD for g in groups]))


# -- the trigger ---------------------------------------------------------------------------------
def test_sparse_correctness_fires_where_correctness_is_dead_and_the_total_is_not(store: Store) -> None:
    groups = groups_dead_on_correctness(n_dead=6, n_live=4)
    d = builder(store, groups).diagnose(steps=1)
    share = dead_share(groups, 0)
    total = [[c + 0.1 * f for c, f, _ in g] for g in groups]
    assert share > DEAD_GROUPS.critical and not any(np.std(g) < DEAD_STD for g in total)
    assert value(d, "signal.correctness_dead_group_ratio") == pytest.approx(share)
    assert severity(d, "signal.correctness_dead_group_ratio") == "critical"
    assert "sparse_correctness" in fired(d)
    # The total reward has spread everywhere: the rule that reads it says nothing.
    assert value(d, "signal.dead_group_ratio") == 0 and "insufficient_signal" not in fired(d)


def test_sparse_correctness_is_silent_where_correctness_splits_the_groups(store: Store) -> None:
    groups = groups_dead_on_correctness(n_dead=2, n_live=8)
    d = builder(store, groups).diagnose(steps=1)
    assert not CORRECTNESS_DEAD_GROUPS.crossed(dead_share(groups, 0))
    assert severity(d, "signal.correctness_dead_group_ratio") == "info"
    assert "sparse_correctness" not in fired(d)


def test_the_rule_fires_exactly_where_the_finding_is_graded() -> None:
    # In the style of test_thresholds: the finding's severity and the rule's firing agree at the line.
    t = CORRECTNESS_DEAD_GROUPS
    for x in sorted({line + d for line in (t.value, t.critical) for d in (-1e-6, 0.0, 1e-6)}):
        graded = t.severity(x)
        result = sparse_correctness(Findings([Finding(t.metric or "", x, graded, threshold=t.value)]), None)  # type: ignore[arg-type]
        assert (result is not None) == (graded != "info"), x
        assert result is None or result.severity == graded


# -- the size ------------------------------------------------------------------------------------
def expected_weight(groups: list[Group], correctness: float) -> tuple[float, float]:
    """(the matching weight, what is proposed): correctness's mean spread over the groups it splits
    over pass_fraction's mean spread over the dead groups where it varies, at most correctness's
    weight, to two significant digits."""
    live = [np.std([s[0] for s in g]) for g in groups if np.std([s[0] for s in g]) >= DEAD_STD]
    revived = [
        np.std([s[2] for s in g])
        for g in groups
        if np.std([s[0] for s in g]) < DEAD_STD and np.std([s[2] for s in g]) >= DEAD_STD
    ]
    matched = correctness * float(np.mean(live)) / float(np.mean(revived))
    return matched, float(f"{min(correctness, matched):.2g}")


def test_the_weight_gives_a_revived_group_the_spread_of_a_live_one(store: Store) -> None:
    # Dead groups where pass fractions split half 0, half 1 (spread 0.5); live ones with one
    # correct in eight (spread about 0.33): the weight matches them below correctness's weight.
    dead = [[(0.0, 1.0, float(s % 2)) for s in range(8)] for _ in range(6)]
    live = [[(float(s == 0), 1.0, 1.0 if s == 0 else 0.5) for s in range(8)] for _ in range(4)]
    builder(store, dead + live).save(steps=1)
    facts = run_facts(store, "v1-train-1")
    (seen,) = [x for x in facts.partial_credit if x.component == "pass_fraction"]
    assert (seen.groups, seen.dead, seen.revived) == (10, 6, 6)
    matched, weight = expected_weight(dead + live, 1.0)
    assert matched < 1.0
    iv = TEMPLATES["continuous_correctness"].propose(CODE, ["rule:sparse_correctness"], facts=facts)
    assert iv is not None and iv.changes == {
        "recipe.rewards": {"correctness": 1.0, "format": 0.1, "pass_fraction": weight}
    }
    assert "the spread it adds" in iv.hypothesis and FIXED not in iv.hypothesis and "capped" not in iv.hypothesis
    apply(iv, CODE_TEXT, Path(CONFIG_FILE))  # a valid child


def test_partial_credit_never_weighs_more_than_correctness(store: Store) -> None:
    # Failing samples pass nearly the same share of tests (0.4 or 0.5): a small spread to match.
    dead = [[(0.0, 1.0, 0.4 + 0.1 * (s % 2)) for s in range(8)] for _ in range(6)]
    live = [[(float(s == 0), 1.0, 1.0 if s == 0 else 0.5) for s in range(8)] for _ in range(4)]
    groups = dead + live
    builder(store, groups).save(steps=1)
    facts = run_facts(store, "v1-train-1")
    matched, weight = expected_weight(groups, 1.0)
    assert matched > 1.0 and weight == 1.0
    iv = TEMPLATES["continuous_correctness"].propose(CODE, [], facts=facts)
    assert iv is not None and iv.changes["recipe.rewards"]["pass_fraction"] == weight
    assert "capped at correctness's weight" in iv.hypothesis


def test_a_component_that_revives_no_dead_group_is_not_proposed(store: Store) -> None:
    dead = [[(0.0, float(s % 2), 0.25) for s in range(8)] for _ in range(6)]  # pass fraction constant
    live = [[(float(s < 4), 1.0, 1.0 if s < 4 else 0.25) for s in range(8)] for _ in range(4)]
    builder(store, dead + live).save(steps=1)
    facts = run_facts(store, "v1-train-1")
    (seen,) = facts.partial_credit
    assert seen.dead == 6 and seen.revived == 0
    assert TEMPLATES["continuous_correctness"].propose(CODE, [], facts=facts) is None
    # Without the run's groups (or drawn at random), the catalog's fixed step, saying so.
    iv = TEMPLATES["continuous_correctness"].propose(CODE, [])
    assert iv is not None and iv.changes["recipe.rewards"]["pass_fraction"] == 0.5 and FIXED in iv.hypothesis
    drawn = TEMPLATES["continuous_correctness"].propose(CODE, [], facts=facts, size=2.0)
    assert drawn is not None and drawn.changes["recipe.rewards"]["pass_fraction"] == 1.0
    assert "random draw" in drawn.hypothesis


def test_every_continuous_counterpart_is_a_component_of_its_domain() -> None:
    from engine.domains import reward_component_names

    offered = {n for d in ("math", "code", "swe") for n in reward_component_names(d) or ()}
    assert set(CONTINUOUS) <= offered


# -- the planner ---------------------------------------------------------------------------------
def test_the_planner_answers_sparse_correctness_with_partial_credit(store: Store) -> None:
    groups = groups_dead_on_correctness(n_dead=6, n_live=4)
    d = builder(store, groups).diagnose(steps=1)
    facts = run_facts(store, "v1-train-1")
    ctx = PlanningContext(parent="v0", parent_config=CODE, domain="code", diagnosis=d, facts=facts)
    chosen = OfflinePlanner().propose(ctx).interventions
    partial = [iv for iv in chosen if iv.template == "continuous_correctness"]
    assert partial and "rule:sparse_correctness" in partial[0].evidence
    assert partial[0].changes["recipe.rewards"]["pass_fraction"] == expected_weight(groups, 1.0)[1]
    # Nothing fired, nothing asks for it: the general templates are proposed instead.
    quiet = PlanningContext(parent="v0", parent_config=CODE, domain="code", diagnosis=diagnosis_of([]), facts=facts)
    assert "continuous_correctness" not in [iv.template for iv in OfflinePlanner().propose(quiet).interventions]
