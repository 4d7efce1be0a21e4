"""More turns for agentic runs out of turns: the `out_of_turns` rule (truncation where the
truncated episodes took the run's `domain.max_turns`), `more_turns` sized like the completion
budget (a log-normal of the correct episodes' turns with those out of turns censored at the limit;
the figure recomputed here with scipy), and the evaluation keeping the parent's turns."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pyarrow as pa
import pytest
from scipy import stats

from engine.coach.backends.base import PlanningContext
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.backends.random_search import RandomPlanner
from engine.coach.interventions import FIXED, TEMPLATES, Facts, TurnFit, apply, run_facts
from engine.config import CONFIG_FILE, SweDomainConfig, parse_config
from engine.domains import make_domain
from engine.harness.thresholds import OUT_OF_TURNS
from engine.runs.artifacts import ROLLOUT_SCHEMA
from engine.store import Store
from tests.harness_data import Rollout, RunBuilder, fired, value

LIMIT = 10
SWE_TEXT = (
    '[workspace]\nname = "t"\n[domain]\nname = "swe"\ntrain_size = 12\nval_size = 4\ntest_size = 2\n'
    f"max_turns = {LIMIT}\n[recipe.rewards]\ncorrectness = 1.0\n"
)
SWE = parse_config(SWE_TEXT, Path(CONFIG_FILE))


class TurnRun(RunBuilder):
    """A run whose stored config carries the domain's turn limit (as a real run's spec does)."""

    def save(self, steps: int) -> None:
        self.store.add_version("v0", None, "versions/v0", "a", state="promoted")
        self.store.add_version(self.version, "v0", f"versions/{self.version}", "b", state="trained")
        self.store.add_run(self.run_id, self.version, "train", "/nowhere", SWE.model_dump(mode="json"), steps)
        self.store.insert_rollouts("SELECT * FROM batch", batch=pa.Table.from_pylist(self.rows, schema=ROLLOUT_SCHEMA))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "evo.duckdb") as s:
        yield s


def episodes(n: int, shape: float, scale: float, seed: int, cut_by_tokens: int = 0) -> list[Rollout]:
    """Episodes that would succeed after a log-normal number of turns: within the limit they
    submit and pass (correct), beyond it they run out of turns (truncated at the limit). Plus
    `cut_by_tokens` truncated after fewer turns (the token budget), and as many wrong submissions."""
    draws = stats.lognorm.rvs(shape, scale=scale, size=n, random_state=seed)
    out = []
    for x in draws:
        turns = max(1, math.ceil(x))
        if turns <= LIMIT:
            out.append(Rollout(reward=1.0, turns=turns))
        else:
            out.append(Rollout(reward=0.0, truncated=True, turns=LIMIT))
    rng = random.Random(seed)
    out += [Rollout(reward=0.0, truncated=True, turns=rng.randint(2, LIMIT - 1)) for _ in range(cut_by_tokens)]
    out += [Rollout(reward=0.0, turns=rng.randint(2, LIMIT)) for _ in range(cut_by_tokens)]
    return out


def groups(rollouts: list[Rollout]) -> list[list[Rollout]]:
    return [rollouts[i : i + 8] for i in range(0, len(rollouts), 8)]


def expected_q95(rollouts: list[Rollout]) -> int:
    """The same censored fit, from the rows: correct episodes' turns, out-of-turns ones at the limit."""
    correct = [float(r.turns or 0) for r in rollouts if r.reward == 1 and not r.truncated]
    out = [float(LIMIT) for r in rollouts if r.truncated and (r.turns or 0) >= LIMIT]
    shape, _, scale = stats.lognorm.fit(stats.CensoredData(uncensored=correct, right=out), floc=0)
    return math.ceil(stats.lognorm.ppf(0.95, shape, 0, scale))


# -- the trigger ---------------------------------------------------------------------------------
def test_out_of_turns_fires_when_the_truncated_episodes_ran_out_of_turns(store: Store) -> None:
    rollouts = episodes(160, 0.4, 9.0, seed=1)
    d = TurnRun(store).step(1, groups(rollouts)).diagnose(steps=1)
    truncated = [r for r in rollouts if r.truncated]
    share = sum((r.turns or 0) >= LIMIT for r in truncated) / len(truncated)
    assert OUT_OF_TURNS.crossed(share) and len(truncated) / len(rollouts) > 0.3
    assert value(d, "signal.out_of_turns_share") == pytest.approx(share)
    assert {"truncation", "out_of_turns"} <= set(fired(d))
    assert fired(d).index("out_of_turns") < fired(d).index("truncation")  # the specific reading leads


def test_out_of_turns_is_silent_when_the_episodes_ran_out_of_tokens(store: Store) -> None:
    rng = random.Random(2)
    rollouts = [Rollout(reward=0.0, truncated=True, turns=rng.randint(3, LIMIT - 1)) for _ in range(80)]
    rollouts += [Rollout(reward=1.0, turns=rng.randint(3, LIMIT)) for _ in range(80)]
    d = TurnRun(store).step(1, groups(rollouts)).diagnose(steps=1)
    assert value(d, "signal.out_of_turns_share") == 0 and "truncation" in fired(d)
    assert "out_of_turns" not in fired(d)
    assert run_facts(store, "v1-train-1").turns is None  # nothing ran out of turns: nothing to size
    assert TEMPLATES["more_turns"].propose(SWE, ["rule:truncation"], facts=run_facts(store, "v1-train-1")) is None


# -- the size ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape", "scale"), [(0.4, 8.0), (0.3, 9.0)])
def test_the_turns_are_sized_from_the_turns_the_episodes_needed(store: Store, shape: float, scale: float) -> None:
    rollouts = episodes(800, shape, scale, seed=3, cut_by_tokens=40)
    TurnRun(store).step(1, groups(rollouts)).save(steps=1)
    facts = run_facts(store, "v1-train-1")
    fit = facts.turns
    assert fit is not None and fit.max_turns == LIMIT
    assert fit.out_of_turns == sum(r.truncated and (r.turns or 0) >= LIMIT for r in rollouts)
    assert fit.truncated == sum(r.truncated for r in rollouts)  # the token cuts are counted, not censored
    assert fit.q95 == expected_q95(rollouts)
    truth = stats.lognorm.ppf(0.95, shape, scale=scale)
    assert abs(fit.q95 - truth) <= 0.15 * truth + 1  # what was cut off is recovered (turns are whole)
    iv = TEMPLATES["more_turns"].propose(SWE, ["rule:out_of_turns"], facts=facts)
    assert iv is not None
    assert iv.changes == {"domain.max_turns": fit.q95, "domain.eval_max_turns": LIMIT}
    assert "log-normal" in iv.hypothesis and "out of turns" in iv.hypothesis and FIXED not in iv.hypothesis
    text, child = apply(iv, SWE_TEXT, Path(CONFIG_FILE))  # two paths, one cited reason: a valid child
    assert child.domain.max_turns == fit.q95  # type: ignore[union-attr]


def test_the_turns_stop_at_what_the_domain_allows_and_are_not_raised_when_they_cover(store: Store) -> None:
    top = SweDomainConfig.model_fields["max_turns"].metadata[-1].le
    rollouts = episodes(400, 1.2, 12.0, seed=4)  # a fit far beyond the domain's limit
    TurnRun(store).step(1, groups(rollouts)).save(steps=1)
    facts = run_facts(store, "v1-train-1")
    assert facts.turns is not None and facts.turns.q95 is not None and facts.turns.q95 > top
    iv = TEMPLATES["more_turns"].propose(SWE, [], facts=facts)
    assert iv is not None and iv.changes["domain.max_turns"] == top and f"at most {top}" in iv.hypothesis
    # A fit that says the limit already covers 95%: more turns are not proposed.
    covered = Facts(turns=TurnFit(LIMIT, 100, 1, 1, LIMIT - 1))
    assert TEMPLATES["more_turns"].propose(SWE, [], facts=covered) is None
    # Out of turns, but too few correct episodes to fit: the catalog's step, saying so.
    few = Facts(turns=TurnFit(LIMIT, 3, 20, 25, None))
    stepped = TEMPLATES["more_turns"].propose(SWE, [], facts=few)
    assert (
        stepped is not None and stepped.changes["domain.max_turns"] == int(LIMIT * 1.5) and FIXED in stepped.hypothesis
    )


def test_only_a_domain_with_a_turn_limit_gets_more_turns() -> None:
    math_config = parse_config('[workspace]\nname = "t"\n', Path(CONFIG_FILE))
    assert TEMPLATES["more_turns"].propose(math_config, [], size=1.0) is None


# -- the evaluation keeps the parent's turns ---------------------------------------------------------
def turns_played(domain, task) -> int:  # noqa: ANN001
    env = domain.environment(task)
    n = 0
    while not env.done:
        env.step("search nothing")
        n += 1
    return n


def test_a_child_with_more_turns_is_evaluated_with_its_parents() -> None:
    iv = TEMPLATES["more_turns"].propose(SWE, [], facts=Facts(), size=1.0)
    assert iv is not None and iv.changes == {"domain.max_turns": int(LIMIT * 1.5), "domain.eval_max_turns": LIMIT}
    assert [e for e in iv.evidence if e.startswith("together: domain.eval_max_turns")]  # cites why two paths
    _, child = apply(iv, SWE_TEXT, Path(CONFIG_FILE))
    parent_domain, child_domain = make_domain(SWE.domain), make_domain(child.domain)
    for split in ("val", "test"):
        task = child_domain.tasks(split)[0]
        assert turns_played(child_domain, task) == turns_played(parent_domain, task) == LIMIT
    train = child_domain.tasks("train")[0]
    assert turns_played(child_domain, train) == int(LIMIT * 1.5) > turns_played(parent_domain, train)
    assert child_domain.max_turns == int(LIMIT * 1.5)  # episodes play as long as the longest allows
    # A grandchild raises the training turns again; the evaluation's stay pinned.
    again = TEMPLATES["more_turns"].propose(child, [], facts=Facts(), size=1.0)
    assert again is not None and set(again.changes) == {"domain.max_turns"}


def test_unset_the_evaluation_plays_the_training_turns() -> None:
    domain = make_domain(SWE.domain)
    assert turns_played(domain, domain.tasks("val")[0]) == turns_played(domain, domain.tasks("train")[0]) == LIMIT


# -- the planners --------------------------------------------------------------------------------
def test_the_planner_answers_out_of_turns_with_more_turns(store: Store) -> None:
    rollouts = episodes(800, 0.4, 8.0, seed=3)
    d = TurnRun(store).step(1, groups(rollouts)).diagnose(steps=1)
    facts = run_facts(store, "v1-train-1")
    ctx = PlanningContext(parent="v0", parent_config=SWE, domain="swe", diagnosis=d, facts=facts)
    (iv,) = [iv for iv in OfflinePlanner().propose(ctx).interventions if iv.template == "more_turns"]
    assert "rule:out_of_turns" in iv.evidence and iv.changes["domain.max_turns"] == expected_q95(rollouts)
    # Random search draws it too, at a random multiple of the catalog's step, always a valid child.
    drawn = [
        iv for seed in range(30) for iv in RandomPlanner(seed).propose(ctx).interventions if iv.template == "more_turns"
    ]
    assert drawn and all(LIMIT < iv.changes["domain.max_turns"] <= 40 for iv in drawn)
    for iv in drawn:
        apply(iv, SWE_TEXT, Path(CONFIG_FILE))
