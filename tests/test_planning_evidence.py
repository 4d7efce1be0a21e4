"""Proposals from evidence: magnitudes sized from the parent's data, a ranking that learns which
changes paid against their control (Thompson sampling), random search as a baseline, and the
control that every round runs."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from engine.coach import bandit
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.backends.random_search import SPREAD, RandomPlanner
from engine.coach.interventions import (
    FIXED,
    MAX_GENERATIONS,
    TARGET_DEAD,
    TEMPLATES,
    Facts,
    Intervention,
    apply,
    control,
    dead_share,
    run_facts,
)
from engine.coach.reports import gate_report_lines
from engine.config import CONFIG_FILE
from engine.core import Engine
from engine.domains.base import Domain, Task
from engine.store import Store
from evotui.cli import app
from tests.scripted_runs import ScriptedRunner
from tests.test_audit import hack_workspace
from tests.test_coach import CONFIG, context, rule

PARENT = '[workspace]\nname = "t"\n'  # the text CONFIG was parsed from


# -- sized from evidence -------------------------------------------------------------------------
class Rows:
    """A store's two queries over synthetic train rollouts: per-task successes and lengths."""

    def __init__(self, lengths: list[tuple[int, bool]], success: list[tuple[int, int]], budget: int | None = None):
        self.lengths, self.success, self.budget = lengths, success, budget

    def query_one(self, sql: str, params: Any = None) -> tuple[Any, ...]:
        return ([], len(self.success), [], [list(x) for x in self.success])

    def query(self, sql: str, params: Any = None) -> list[tuple[int, bool, int | None]]:
        return [(n, cut, self.budget) for n, cut in self.lengths]


def censored(budget: int, n: int, shape: float, scale: float, seed: int) -> list[tuple[int, bool]]:
    """`n` completion lengths from a log-normal, truncated at `budget` (as the sampler cuts them)."""
    draws = stats.lognorm.rvs(shape, scale=scale, size=n, random_state=seed)
    return [(min(budget, max(1, round(x))), x >= budget) for x in draws]


@pytest.mark.parametrize(("shape", "scale"), [(0.5, 30.0), (0.3, 22.0)])
def test_the_completion_budget_is_sized_from_the_lengths_the_parent_needed(shape: float, scale: float) -> None:
    budget = 28
    rows = censored(budget, 2000, shape, scale, seed=1)
    facts = run_facts(Rows(rows, [(1, 2)]), "run")  # type: ignore[arg-type]
    assert facts.lengths is not None and facts.lengths.budget == budget
    assert facts.lengths.truncated == sum(cut for _, cut in rows)
    truth = stats.lognorm.ppf(0.95, shape, scale=scale)
    assert abs(facts.lengths.q95 - truth) <= 0.1 * truth  # the censored fit recovers what was cut off
    config = CONFIG.model_copy(update={"recipe": CONFIG.recipe.model_copy(update={"max_completion_length": budget})})
    iv = TEMPLATES["longer_budget"].propose(config, [], facts=facts)
    assert iv is not None and iv.changes == {"recipe.max_completion_length": facts.lengths.q95}
    assert "log-normal" in iv.hypothesis and FIXED not in iv.hypothesis


def test_a_budget_that_already_covers_the_lengths_is_not_lengthened() -> None:
    rows = censored(200, 2000, 0.3, 22.0, seed=2)  # almost none reach 200 tokens
    rows[0] = (200, True)
    facts = run_facts(Rows(rows, [(1, 2)]), "run")  # type: ignore[arg-type]
    assert facts.lengths is not None and facts.lengths.q95 < 200
    config = CONFIG.model_copy(update={"recipe": CONFIG.recipe.model_copy(update={"max_completion_length": 200})})
    assert TEMPLATES["longer_budget"].propose(config, [], facts=facts) is None
    # Without the lengths, the catalog's fixed step, and the hypothesis says so.
    iv = TEMPLATES["longer_budget"].propose(config, [])
    assert iv is not None and iv.changes == {"recipe.max_completion_length": 300} and FIXED in iv.hypothesis


def test_episodes_cut_short_by_their_turns_do_not_lengthen_the_token_budget() -> None:
    """An agentic run: a quarter of the episodes ran out of turns at 40-80 tokens, far below the
    budget of 200; no completion reached it, so the budget does not bind and no longer one is
    proposed (the SWE benchmark's 200 -> 300 trained the control's model)."""
    rows = censored(10_000, 600, 0.4, 30.0, seed=3)
    rng = random.Random(4)
    rows += [(rng.randint(40, 80), True) for _ in range(200)]
    facts = run_facts(Rows(rows, [(1, 2)], budget=200), "run")  # type: ignore[arg-type]
    assert facts.lengths is not None and facts.lengths.budget == 200 and facts.lengths.truncated == 0
    config = CONFIG.model_copy(update={"recipe": CONFIG.recipe.model_copy(update={"max_completion_length": 200})})
    assert TEMPLATES["longer_budget"].propose(config, [], facts=facts) is None
    # The same lengths cut at the budget itself are censored there, and the budget is sized.
    at_budget = run_facts(Rows([(n, cut) for n, cut in censored(60, 800, 0.4, 50.0, seed=3)], [(1, 2)], 60), "run")  # type: ignore[arg-type]
    assert at_budget.lengths is not None and at_budget.lengths.truncated > 0 and at_budget.lengths.q95 > 60


def test_the_group_size_is_the_smallest_whose_predicted_dead_share_clears_the_rule() -> None:
    draw = random.Random(3)
    rates = [0.0] * 30 + [draw.uniform(0.05, 0.95) for _ in range(40)] + [1.0] * 30
    success = tuple((sum(draw.random() < p for _ in range(8)), 8) for p in rates)
    facts = Facts(task_success=success)
    iv = TEMPLATES["more_generations"].propose(CONFIG, [], facts=facts)
    assert iv is not None
    g = iv.changes["recipe.num_generations"]
    assert dead_share(success, CONFIG.recipe.num_generations) > TARGET_DEAD  # the rule's condition
    assert dead_share(success, g) <= TARGET_DEAD < dead_share(success, g - 1) or g == MAX_GENERATIONS
    assert "predicted dead share" in iv.hypothesis
    # Tasks never solved stay dead at any size: then the largest size, saying no size reaches it.
    hopeless = Facts(task_success=((0, 64),) * 100)
    iv = TEMPLATES["more_generations"].propose(CONFIG, [], facts=hopeless)
    assert iv is not None and iv.changes == {"recipe.num_generations": MAX_GENERATIONS}
    assert "no group size reaches" in iv.hypothesis


# -- random search -------------------------------------------------------------------------------
def test_random_search_draws_templates_and_magnitudes_from_its_seed() -> None:
    ctx = context([rule("truncation")], branches=2)
    first = RandomPlanner(7).propose(ctx).interventions
    again = RandomPlanner(7).propose(ctx).interventions
    assert [iv.changes for iv in first] == [iv.changes for iv in again]
    seen: dict[str, set[str]] = {}
    for seed in range(40):
        for iv in RandomPlanner(seed).propose(ctx).interventions:
            apply(iv, PARENT, Path(CONFIG_FILE))  # every draw is a valid child config
            seen.setdefault(iv.template, set()).add(json.dumps(iv.changes, sort_keys=True))
            assert iv.source == "random" and iv.evidence == [f"random draw (seed {seed})"]
    assert len(seen) >= 8  # the whole catalog, not the rules' templates: random search reads no rule
    lrs = [json.loads(c)["recipe.learning_rate"] for c in seen["lower_lr"]]
    step = CONFIG.recipe.learning_rate
    assert len(lrs) >= 3 and all(0.99 * step * 2**-SPREAD <= lr <= 1.01 * step * 2 ** (-1 / SPREAD) for lr in lrs)


# -- the ranking that learns ---------------------------------------------------------------------
def cases_store(path: Path, outcomes: dict[str, list[tuple[str, str | None]]]) -> Store:
    """A store whose case memory holds, per template, decided branches: (decision, vs_control)."""
    store = Store(path)
    n = 0
    for template, decided in outcomes.items():
        for decision, vs in decided:
            n += 1
            case = {"signature": "", "domain": "math", "parent": "v0", "kind": TEMPLATES[template].kind}
            case |= {"template": template, "factor": "f", "verdict": "improved", "control": "v1" if vs else None}
            store.record_case(f"v{n + 1}", case | {"vs_control": vs}, decision, "-")
    return store


def test_the_ranking_counts_wins_against_the_control_and_explores(tmp_path: Path) -> None:
    store = cases_store(
        tmp_path / "s.duckdb",
        {
            # promoted, but no better than its control: a loss; the only win is beating the control
            "longer_budget": [("promoted", "improved"), ("promoted", "improved"), ("pruned", "improved")],
            "efficiency_reward": [("promoted", "insufficient evidence"), ("rejected", "regressed")],
            "temperature_up": [("promoted", None)],  # compared with no control: its promotion counts
        },
    )
    assert bandit.evidence(store, "math") == {
        "longer_budget": (3, 0),
        "efficiency_reward": (0, 2),
        "temperature_up": (1, 0),
    }
    arms = {a.template: a for a in bandit.rank(store, "math", ["truncation"], [], "round 1")}
    budget, efficiency = arms["longer_budget"], arms["efficiency_reward"]
    assert budget.prior == efficiency.prior == (2, 1)  # both answer truncation
    assert budget.mean == pytest.approx(5 / 6) and efficiency.mean == pytest.approx(2 / 5)
    assert arms["raise_lr"].prior == (1, 2)  # answers no rule that fired
    led = {a.template: a for a in bandit.rank(store, "math", ["truncation", "format_gate"], [], "r", "truncation")}
    assert led["longer_budget"].prior == (3, 1) and led["format_weight"].prior == (2, 1)  # the bottleneck leads
    # Seeded by the round: the same round draws the same; over rounds, a template with no evidence
    # is sometimes drawn above the one that keeps winning (exploration), mostly not.
    assert bandit.rank(store, "math", ["truncation"], [], "round 1") == bandit.rank(
        store, "math", ["truncation"], [], "round 1"
    )
    firsts = [bandit.rank(store, "math", ["truncation"], [], f"round {i}")[0].template for i in range(200)]
    assert 0.5 < firsts.count("longer_budget") / 200 < 1
    store.close()


def test_the_offline_planner_tries_candidates_in_the_order_of_the_draws(tmp_path: Path) -> None:
    store = cases_store(tmp_path / "s.duckdb", {"group_filter": [("rejected", "regressed")] * 6})
    fired = [rule("insufficient_signal", "critical")]
    arms = bandit.rank(store, "math", ["insufficient_signal"], [], "round 3")
    ctx = context(fired, branches=2, ranking=[a.to_dict() for a in arms])
    chosen = [iv.template for iv in OfflinePlanner().propose(ctx).interventions]
    draws = {a.template: a.draw for a in arms}
    candidates = [t.name for t in TEMPLATES.values() if {"insufficient_signal", ""} & set(t.triggers)]
    applicable = [t for t in candidates if TEMPLATES[t].propose(CONFIG, []) is not None]
    # The bottleneck's templates first (insufficient_signal's), the general ones after; by draw within.
    tier = {t: 0 if "insufficient_signal" in TEMPLATES[t].triggers else 2 for t in applicable}
    assert chosen == sorted(applicable, key=lambda t: (tier[t], -draws[t]))[:2]
    lines = gate_report_lines({"rationale": "-", "proposals": [], "ranking": ctx.ranking})
    top = arms[0]
    assert any(line.strip().startswith(top.template) and f"{top.won}/{top.lost}" in line for line in lines)
    store.close()


# -- the control ---------------------------------------------------------------------------------
def test_the_control_changes_nothing_and_only_the_control_may() -> None:
    iv = control(50)
    assert iv.changes == {} and iv.factors == [] and iv.is_control and iv.factor == "control"
    with pytest.raises(ValueError, match="only the control"):
        Intervention(kind="budget", changes={}, hypothesis="h", template="raise_lr")


def honest(version: str, domain: Domain, task: Task, correct: bool) -> str:
    return task.answer if correct else "x"


@pytest.mark.parametrize(("factor", "card"), [(0.5, False), (0.75, True)])
def test_a_round_runs_a_control_and_credits_the_factor_with_its_gain_over_it(
    factor: float, card: bool, tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 is the control (the parent trained on: 0.3 -> 0.5), v2 the round's factor. Both beat v0;
    the factor earns a skill card only when it also beats the control."""
    quality = {"v0": 0.3, "v1": 0.5, "v2": factor}
    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner(quality.__getitem__, honest))
    ws = hack_workspace(tmp_path / "ws", "tolerance", sample_toml)
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "2"])
    assert result.exit_code == 0, result.output
    with Engine.open(ws.root) as engine:
        rows = engine.store.query(
            "SELECT c.id, c.template, c.decision, c.control, c.vs_control, c.vs_control_delta FROM cases c ORDER BY id"
        )
        v1, v2 = rows
        assert v1[1:4] == ("control", "promoted", None)  # the control is judged against its parent like any branch
        assert v2[2] == "promoted" and v2[3] == "v1"
        delta = engine.compare("v1", "v2").primary_delta
        assert delta is not None and v2[5] == pytest.approx(delta.diff)
        assert v2[4] == ("improved" if card else "insufficient evidence")
    cards = sorted((ws.root / "skills").glob("*.md")) if (ws.root / "skills").is_dir() else []
    assert len(cards) == int(card)
    if card:
        text = " ".join(cards[0].read_text().split())
        assert "control: v1" in text and "against the control v1" in text
    assert np.isfinite(v2[5])


def test_a_failed_comparison_with_the_control_writes_no_card_and_the_loop_goes_on(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison with the control only feeds memory: when it raises, the factor's decision
    against its parent stands, no card credits the factor, and the next round still runs."""
    quality = {"v0": 0.3, "v1": 0.5, "v2": 0.75}
    runner = ScriptedRunner(lambda v: quality.get(v, 0.3), honest)
    monkeypatch.setattr("engine.core.make_runner", lambda compute: runner)

    compare = Engine.compare

    def broken(self: Engine, parent: str, child: str) -> Any:
        if parent == "v1":  # the control: its comparisons with the round's other branches fail
            raise RuntimeError("the control's evaluation is unreadable")
        return compare(self, parent, child)

    monkeypatch.setattr(Engine, "compare", broken)
    ws = hack_workspace(tmp_path / "ws", "tolerance", sample_toml)
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "3"])
    assert result.exit_code == 0, result.output
    assert "could not be compared with the control v1" in result.output
    with Engine.open(ws.root) as engine:
        rows = engine.store.query("SELECT id, decision, control, vs_control FROM cases ORDER BY id")
    assert rows[:2] == [("v1", "promoted", None, None), ("v2", "promoted", None, None)]
    assert len(rows) == 3  # a third version was trained after the failure
    assert not (ws.root / "skills").is_dir() or not list((ws.root / "skills").glob("*.md"))
