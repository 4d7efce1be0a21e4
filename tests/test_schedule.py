"""The step budget's schedule (`engine.coach.schedule`): lengths from power, and the judging of a
lineage's segments, whose error rates are stated in the module and checked here by simulation
against an independent oracle (scipy's normal distribution), not against the code itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from engine import verdict as verdict_module
from engine.bench.arms import approve_everything
from engine.coach.interventions import CONTROL, config_changes
from engine.coach.loop import Coach
from engine.coach.schedule import (
    COMBINE,
    CONTINUE,
    EXPLOIT,
    POWER,
    POWER_FACTOR,
    Schedule,
    SegmentVerdict,
    held_to,
    margin,
    power_length,
    segment_label,
)
from engine.config import WorkspaceConfig
from engine.core import Engine, version_score, yardsticks
from engine.runs.spec import RunSpec
from engine.verdict import Delta, Verdict, paired_bootstrap
from engine.workspace import Workspace, init_workspace
from tests.conftest import commit_workspace_toml, tiny_toml
from tests.scripted_runs import Finished, ScriptedRunner

#: The stated one-sided error rate of each test a segment passes (the 95% interval's lower end).
ALPHA = 0.025


def test_power_factor_is_the_normal_quantiles() -> None:
    z = stats.norm.ppf
    assert POWER_FACTOR == pytest.approx((z(0.975) + z(POWER)) / z(0.975), abs=1e-6)


@pytest.mark.parametrize(("gain", "floor"), [(0.0012, 0.015), (0.0005, 0.04), (0.02, 0.03), (1e-5, 0.02)])
def test_power_length_is_the_shortest_with_80_percent_power(gain: float, floor: float) -> None:
    """At the length, an effect growing `gain` a step is seen beyond a floor of `floor` (the 95%
    half-width, so the estimate's sd is floor / 1.96) with at least 80% power; a step less, not."""
    sd = floor / stats.norm.ppf(0.975)

    def power(n: int) -> float:
        return float(stats.norm.sf(floor, loc=gain * n, scale=sd))

    n = power_length(gain, floor)
    assert n is not None
    assert power(n) >= POWER - 1e-9
    assert n == 1 or power(n - 1) < POWER


def test_no_length_clears_a_floor_when_nothing_grows() -> None:
    assert power_length(0.0, 0.02) is None
    assert power_length(-0.001, 0.02) is None


# -- judging segments ---------------------------------------------------------------------------------
TASKS, PASSES = 300, 4


def _scores(rng: np.random.Generator, difficulty: np.ndarray, effect: float) -> np.ndarray:
    """Per task, the mean over PASSES sampled passes of a version `effect` better than the base."""
    p = np.clip(difficulty + effect, 0.0, 1.0)
    return rng.binomial(PASSES, p) / PASSES


def _verdict(parent: str, child: str, a: np.ndarray, b: np.ndarray, seed: int) -> Verdict:
    low, high = paired_bootstrap(a, b, seed)
    return Verdict(parent, child, len(a), (Delta("sampled", float(a.mean()), float(b.mean()), low, high),))


def _decide(rng: np.random.Generator, start: float, head: float, child: float, head_promoted: bool, seed: int) -> str:
    difficulty = rng.uniform(0.1, 0.7, TASKS)
    s, h, c = (_scores(rng, difficulty, e) for e in (start, head, child))
    established = _verdict("S", "H", s, h, seed) if head_promoted else None
    segment = SegmentVerdict(
        _verdict("H", "C", h, c, seed + 1), _verdict("S", "C", s, c, seed + 2), margin(established)
    )
    return segment.label


@pytest.fixture
def quick_bootstrap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Fewer resamples: each simulated decision bootstraps three comparisons, hundreds of times.
    monkeypatch.setattr(verdict_module, "BOOTSTRAP_SAMPLES", 400)


def _rate(labels: list[str]) -> tuple[float, float]:
    """The share of promotions and its Monte Carlo standard error."""
    p = sum(label == "improved" for label in labels) / len(labels)
    return p, float(np.sqrt(max(p * (1 - p), ALPHA * (1 - ALPHA)) / len(labels)))


@pytest.mark.usefixtures("quick_bootstrap")
def test_a_lineage_no_better_than_its_start_is_promoted_at_most_at_the_stated_rate() -> None:
    """The head gained, the segment gave it all back: the lineage (start -> segment) has no true
    gain. Whatever the segment test says, the lineage test holds promotions to 2.5%."""
    rng = np.random.default_rng(7)
    labels = [_decide(rng, 0.0, 0.06, 0.0, head_promoted=False, seed=i) for i in range(300)]
    rate, se = _rate(labels)
    assert rate <= ALPHA + 3 * se


@pytest.mark.usefixtures("quick_bootstrap")
def test_a_segment_that_gives_back_half_the_established_gain_is_promoted_at_most_at_the_stated_rate() -> None:
    """The head established +0.16 over the start; the segment loses half of it (+0.08 left, which
    the lineage test alone would promote nearly always): the margin is half the *lower end* of the
    established gain, never more than half the true gain, so the non-inferiority test refuses it
    but for at most 2.5%."""
    rng = np.random.default_rng(8)
    lineage_alone = []
    labels = []
    for i in range(300):
        difficulty = rng.uniform(0.1, 0.7, TASKS)
        s, h, c = (_scores(rng, difficulty, e) for e in (0.0, 0.16, 0.08))
        established = _verdict("S", "H", s, h, 3 * i)
        segment = SegmentVerdict(_verdict("H", "C", h, c, 3 * i + 1), _verdict("S", "C", s, c, 3 * i + 2), None)
        lineage_alone.append(segment.lineage.label)
        labels.append(SegmentVerdict(segment.segment, segment.lineage, margin(established)).label)
    rate, se = _rate(labels)
    assert rate <= ALPHA + 3 * se
    assert lineage_alone.count("improved") / len(lineage_alone) > 0.5  # the case is not vacuous


@pytest.mark.usefixtures("quick_bootstrap")
def test_small_real_gains_are_kept_where_a_test_of_each_increment_throws_them_away() -> None:
    """Segments that each add a real gain too small for their own floor: judging every increment
    by itself (the verdict against the parent) prunes most of them; the segment rule keeps them,
    because the lineage beats its start and the segment gives nothing back. The rates come from
    the same simulated runs, and each is compared with its normal-approximation prediction."""
    rng = np.random.default_rng(9)
    new, old = [], []
    predicted_old = []
    for i in range(200):
        difficulty = rng.uniform(0.1, 0.7, TASKS)
        s, h, c = (_scores(rng, difficulty, e) for e in (0.0, 0.08, 0.095))
        established = _verdict("S", "H", s, h, 3 * i)
        seg = _verdict("H", "C", h, c, 3 * i + 1)
        segment = SegmentVerdict(seg, _verdict("S", "C", s, c, 3 * i + 2), margin(established))
        new.append(segment.label)
        old.append(seg.label)
        # The increment's own test: its true gain 0.015 against its estimate's sd (its floor / 1.96).
        main = seg.primary_delta
        assert main is not None
        predicted_old.append(float(stats.norm.sf(stats.norm.ppf(0.975) - 0.015 / (main.noise_floor / 1.96))))
    new_rate, new_se = _rate(new)
    old_rate, old_se = _rate(old)
    assert old_rate == pytest.approx(np.mean(predicted_old), abs=4 * old_se)
    assert new_rate - old_rate > 4 * np.hypot(new_se, old_se)


@pytest.mark.usefixtures("quick_bootstrap")
def test_a_segment_that_loses_its_own_floor_is_promoted_at_most_at_the_stated_rate() -> None:
    """The head established +0.08 over the start, so half its established gain is narrower than a
    segment's floor and the floor is the margin; the segment loses 0.04, more than its floor (a
    loss its verdict can see), with +0.04 left that the lineage test alone would mostly promote.
    The non-inferiority test refuses it but for at most 2.5%."""
    rng = np.random.default_rng(10)
    labels, lineage_alone, floor_binds, floors = [], [], [], []
    for i in range(300):
        difficulty = rng.uniform(0.1, 0.7, TASKS)
        s, h, c = (_scores(rng, difficulty, e) for e in (0.0, 0.08, 0.04))
        established = _verdict("S", "H", s, h, 3 * i)
        segment = SegmentVerdict(
            _verdict("H", "C", h, c, 3 * i + 1), _verdict("S", "C", s, c, 3 * i + 2), margin(established)
        )
        main = segment.primary_delta
        assert main is not None
        labels.append(segment.label)
        lineage_alone.append(segment.lineage.label)
        floors.append(main.noise_floor)
        floor_binds.append(held_to(segment.segment, segment.give_back) == main.noise_floor)
    rate, se = _rate(labels)
    assert 0.04 > float(np.mean(floors))  # the loss is beyond the segment's floor
    assert np.mean(floor_binds) > 0.8  # the floor, not the established gain, is the margin
    assert rate <= ALPHA + 3 * se
    assert lineage_alone.count("improved") / len(lineage_alone) > 0.5  # the case is not vacuous


@pytest.mark.usefixtures("quick_bootstrap")
def test_a_parent_that_barely_cleared_the_floor_does_not_make_its_segment_beat_it() -> None:
    """The head cleared the floor with little to spare (+0.06: half its established gain is about
    0.01); the segment adds a real +0.015. Held to half the established gain alone, the segment
    must beat its parent by its own floor less that, nearly the per-increment test, and most such
    segments are pruned; held to its floor, it is kept when its estimate is not below its
    parent's. Both come from the same simulated runs (those whose head was promoted), and each
    segment test's rate is compared with its normal-approximation prediction."""
    rng = np.random.default_rng(11)
    z = stats.norm.ppf(0.975)
    labels, narrow_labels, kept, narrow, predicted_kept, predicted_narrow = [], [], [], [], [], []
    seed = 0
    while len(labels) < 200:
        seed += 3
        difficulty = rng.uniform(0.1, 0.7, TASKS)
        s, h, c = (_scores(rng, difficulty, e) for e in (0.0, 0.06, 0.075))
        established = _verdict("S", "H", s, h, seed)
        if established.label != "improved":
            continue
        segment = SegmentVerdict(
            _verdict("H", "C", h, c, seed + 1), _verdict("S", "C", s, c, seed + 2), margin(established)
        )
        main, give_back, held = segment.primary_delta, segment.give_back, held_to(segment.segment, segment.give_back)
        assert main is not None and give_back is not None and held is not None
        labels.append(segment.label)
        kept.append(main.low > -held)
        narrow.append(main.low > -give_back)
        lineage_improved = segment.lineage.label == "improved"
        narrow_labels.append("improved" if lineage_improved and narrow[-1] else "insufficient evidence")
        # The segment's estimate has sd floor / z around its true +0.015; its lower end is the
        # estimate less the floor, so it clears -margin when the estimate exceeds floor - margin.
        sd = main.noise_floor / z
        predicted_kept.append(float(stats.norm.sf(main.noise_floor - held, loc=0.015, scale=sd)))
        predicted_narrow.append(float(stats.norm.sf(main.noise_floor - give_back, loc=0.015, scale=sd)))
    for outcomes, predicted in ((kept, predicted_kept), (narrow, predicted_narrow)):
        rate = float(np.mean(outcomes))
        assert rate == pytest.approx(np.mean(predicted), abs=4 * np.sqrt(max(rate * (1 - rate), 0.01) / len(outcomes)))
    rate, se = _rate(labels)
    narrow_rate, narrow_se = _rate(narrow_labels)
    assert rate - narrow_rate > 4 * np.hypot(se, narrow_se)
    assert rate > 0.5


def test_segment_label_reads_each_condition() -> None:
    def v(low: float, high: float) -> Verdict:
        return Verdict("a", "b", 100, (Delta("sampled", 0.5, 0.5 + (low + high) / 2, low, high),))

    gain, flat, loss = v(0.01, 0.05), v(-0.02, 0.02), v(-0.05, -0.01)
    assert segment_label(flat, gain, 0.03) == "improved"
    assert segment_label(v(-0.04, 0.0), gain, 0.03) == "insufficient evidence"  # may lose more than the margin
    # A margin narrower than the segment's floor (0.02 here) is widened to it: kept while the
    # estimate is above its parent's, not when it is below.
    assert held_to(flat, 0.01) == pytest.approx(0.02)
    assert held_to(flat, 0.03) == pytest.approx(0.03)
    assert held_to(flat, None) is None
    assert segment_label(v(-0.015, 0.025), gain, 0.01) == "improved"
    assert segment_label(v(-0.025, 0.015), gain, 0.01) == "insufficient evidence"
    assert segment_label(flat, gain, None) == "improved"  # a provisional head: the lineage decides
    assert segment_label(loss, gain, 0.1) == "regressed"  # worse than its parent beyond the floor
    assert segment_label(gain, flat, 0.03) == "insufficient evidence"  # the lineage does not beat its start
    assert margin(gain) == pytest.approx(0.005)
    assert margin(flat) is None


# -- the coach on a step budget (scripted runs: real artifacts, judged and decided for real) --------
class LineageRunner(ScriptedRunner):
    """A version answers correctly with probability 0.3, plus `bonus` for each factor its recipe
    changed from v0's (the steps and the seed are no factor), plus `per_step` for every GRPO step
    its lineage trained with such a factor (a change that pays keeps paying as it trains), minus
    `drop` once that lineage trained more than `peak` steps. With `steps_pay`, every step its
    lineage trained pays, a factor or not; `greedy_unchanged` is what greedy decoding adds to a
    version that changed no factor (the sampled passes decide; greedy is a guardrail)."""

    def __init__(
        self,
        bonus: float,
        per_step: float,
        peak: int = 10**9,
        drop: float = 0.0,
        steps_pay: bool = False,
        greedy_unchanged: float = 0.0,
    ) -> None:
        self.bonus, self.per_step, self.peak, self.drop = bonus, per_step, peak, drop
        self.steps_pay, self.greedy_unchanged = steps_pay, greedy_unchanged
        self.trained: dict[str, int] = {"v0": 0}
        self.p: dict[str, float] = {}
        self.g: dict[str, float] = {}
        self.base: WorkspaceConfig | None = None
        super().__init__(self.p.__getitem__, greedy=self.g.__getitem__)

    def start(self, run_dir: Path) -> Finished:
        spec = RunSpec.load(run_dir)
        if spec.kind == "warmup":
            self.base = spec.config
            self.p["v0"] = 0.3
            self.g["v0"] = 0.3 + self.greedy_unchanged
        elif spec.kind == "train":
            assert self.base is not None and spec.model_in is not None
            changed = {path.split(".")[1] for path in config_changes(self.base, spec.config)} - {"steps", "seed"}
            self.trained[spec.version] = self.trained[spec.model_in.name] + spec.config.recipe.steps
            steps = self.trained[spec.version] if changed or self.steps_pay else 0
            p = 0.3 + self.bonus * len(changed) + self.per_step * steps - (self.drop if steps > self.peak else 0.0)
            self.p[spec.version] = min(0.95, p)
            self.g[spec.version] = min(0.95, p + (0.0 if changed else self.greedy_unchanged))
        return super().start(run_dir)


def scripted(
    tmp_path: Path,
    sample_toml: str,
    monkeypatch: pytest.MonkeyPatch,
    runner: LineageRunner,
    val: int,
    passes: int = 4,
    steps: int = 8,
) -> Workspace:
    """A workspace whose runs `runner` scripts: `val` tasks, `passes` sampled passes, versions of `steps`."""
    monkeypatch.setattr("engine.core.make_runner", lambda compute: runner)
    ws = init_workspace(tmp_path / "ws")
    ws.config_path.write_text(tiny_toml(sample_toml, val_size=val, sampled_seeds=passes, grpo_steps=steps))
    commit_workspace_toml(ws, "scripted runs")
    return ws


def tree(engine: Engine) -> dict[str, tuple[str | None, str, str, int]]:
    """version -> (parent, template, state, steps trained)."""
    schedule = Schedule(engine.store)
    rows = engine.store.query(
        "SELECT v.name, v.parent, coalesce(i.template, ''), v.state FROM versions v"
        " LEFT JOIN interventions i ON i.id = v.intervention_id ORDER BY CAST(substr(v.name, 2) AS INTEGER)"
    )
    return {name: (parent, template, state, schedule.version_steps(name)) for name, parent, template, state in rows}


def lineage_of(versions: dict[str, tuple[str | None, str, str, int]], name: str) -> list[str]:
    out = []
    while name is not None and versions[name][0] is not None:
        out.append(name)
        name = versions[name][0]  # type: ignore[assignment]
    return out


def test_a_step_budget_screens_short_then_continues_the_winner(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factor that pays keeps paying as it trains (+0.0008 a step, a segment's gain well inside
    its floor). The screen's branches train at most half the budget between them; the winner is
    continued (each segment a `continue` child, promoted on its lineage), so the answer's lineage
    carries every step the screen's losers did not take; the budget is spent to the step."""
    runner = LineageRunner(bonus=0.15, per_step=0.0008)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=1000)
    budget = 48
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=budget)
        versions = tree(engine)
        best = engine.best_version()
    assert best is not None
    screen = [v for v, (parent, template, _, _) in versions.items() if parent == "v0"]
    screen_steps = sum(versions[v][3] for v in screen)
    assert screen_steps <= budget // 2
    assert sum(steps for *_, steps in versions.values()) == budget
    lineage = lineage_of(versions, best.name)
    continued = [v for v in lineage if versions[v][1] == CONTINUE]
    assert continued and all(versions[v][2] == "promoted" for v in continued)
    losers = [v for v in screen if v not in lineage]
    assert sum(versions[v][3] for v in lineage) == budget - sum(versions[v][3] for v in losers)
    # Each continuation's own verdict against its parent is inside the floor: the old rule would
    # have pruned it and stopped the lineage there.
    with Engine.open(ws.root) as engine:
        labels = {v: engine.store.get_version(v).verdict for v in continued}  # type: ignore[union-attr]
    assert "insufficient evidence" in labels.values(), labels


def test_a_segment_that_loses_is_rejected_and_the_next_round_screens_from_the_head(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 16 steps the lineage collapses (-0.2): its segment is rejected, the head stays, and
    the steps left go to a screen from the head, not to another continuation of it."""
    runner = LineageRunner(bonus=0.15, per_step=0.0, peak=16, drop=0.2)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=1000)
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=64)
        versions = tree(engine)
    failed = [v for v, (_, template, state, _) in versions.items() if template == CONTINUE and state != "promoted"]
    assert failed, versions
    head = versions[failed[0]][0]
    after = [v for v, (parent, template, _, _) in versions.items() if parent == head and v > failed[0]]
    assert after and all(versions[v][1] != CONTINUE for v in after), versions


def test_two_factors_that_beat_the_control_are_combined_and_judged_against_the_best_one(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = LineageRunner(bonus=0.12, per_step=0.0)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=1000)
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=48)
        versions = tree(engine)
        combined = [v for v, (_, template, _, _) in versions.items() if template == COMBINE]
        assert len(combined) == 1, versions
        name = combined[0]
        parent = versions[name][0]
        assert parent is not None
        winners = engine.store.query("SELECT id FROM cases WHERE vs_control = 'improved' ORDER BY id")
        assert parent in {w for (w,) in winners} and len(winners) >= 2
        # It carries the other winners' changes on top of its parent's, and was judged against its parent.
        change = engine.store.query_one(
            "SELECT i.change FROM versions v JOIN interventions i ON i.id = v.intervention_id WHERE v.name = ?",
            [name],
        )
        assert change is not None
        record = engine.store.get_version(name)
        assert record is not None and record.state == "promoted", record
        assert f"segment against {parent}" in (record.decision_reason or "")


def test_a_screen_that_promotes_nothing_continues_its_best_branch_provisionally(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factor worth +0.004 a step is inside the floor of 200 val tasks after a short screen;
    continued, its lineage clears the floor against the screen's parent and is promoted, though
    the screen branch it continues was pruned."""
    runner = LineageRunner(bonus=0.0, per_step=0.004)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=200)
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=64)
        versions = tree(engine)
        best = engine.best_version()
    assert best is not None and versions[best.name][1] == CONTINUE, versions
    lineage = lineage_of(versions, best.name)
    winner = lineage[-1]
    assert versions[winner][0] == "v0" and versions[winner][2] == "pruned", versions
    assert "lineage against v0" in (best.decision_reason or "")


def test_a_factor_its_control_did_not_beat_leads_the_lineage_though_the_control_ranks_higher(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step pays (+0.02 sampled), the factor adds nothing on top, and greedy decoding of an
    unchanged recipe is 0.1 better: the screen promotes the control and the factor, tied on the
    primary, and the control ranks higher on greedy and sampled together. The control measured
    the factor (it did not beat it), so it is a yardstick: the lineage goes on from the factor,
    which trained the control's steps too, and the answer is in the factor's lineage."""
    runner = LineageRunner(bonus=0.0, per_step=0.02, steps_pay=True, greedy_unchanged=0.1)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=400)
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=32)
        versions = tree(engine)
        best = engine.best_version()
        screen = {v: template for v, (parent, template, *_) in versions.items() if parent == "v0"}
        control = next(v for v, template in screen.items() if template == CONTROL)
        factor = next(v for v, template in screen.items() if template not in (CONTROL, *EXPLOIT))
        records = {v.name: v for v in engine.store.list_versions()}
        vs_control = engine.store.query_one("SELECT vs_control FROM cases WHERE id = ?", [factor])
        assert yardsticks(engine.store) == {control}
    assert versions[control][2] == versions[factor][2] == "promoted", versions
    assert vs_control is not None and vs_control[0] != "regressed"
    # What the rule changes: ranked on greedy and sampled alone, the control would lead.
    score = {v: version_score(records[v].val_greedy, records[v].val_sampled) for v in (control, factor)}
    assert score[control] > score[factor], score  # type: ignore[operator]
    continued = [v for v, (_, template, *_) in versions.items() if template == CONTINUE]
    assert continued and versions[continued[0]][0] == factor, versions
    assert best is not None and factor in lineage_of(versions, best.name), versions


def test_a_control_that_beat_its_factor_stays_a_candidate(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The factor costs 0.1 against the steps alone: promoted against v0, beaten by the control,
    which the lineage goes on from."""
    runner = LineageRunner(bonus=-0.1, per_step=0.02, steps_pay=True)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=400)
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=32)
        versions = tree(engine)
        beaten = engine.store.query("SELECT id FROM cases WHERE vs_control = 'regressed'")
        assert yardsticks(engine.store) == set()
    assert beaten and versions[beaten[0][0]][2] == "promoted", versions
    continued = [v for v, (_, template, *_) in versions.items() if template == CONTINUE]
    assert continued and versions[versions[continued[0]][0]][1] == CONTROL, versions


def test_a_screen_with_room_for_one_branch_runs_the_control_and_its_lineage_goes_on_to_the_budgets_end(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions of 10 steps and a budget of 30: half the budget fits one branch, the control (a
    lone factor would be judged against v0 alone). Every step pays +0.001 and no factor adds
    anything: 10 steps are inside the floor of 1000 val tasks, so the control is pruned and
    continued provisionally (its first segment with the factor the planner ranks first, which no
    screen had room to test), and each continuation goes on while it adds by point estimate, until
    the budget ends. The answer's lineage carries every step and is v0's answer only when its
    whole gain is inside the floor."""
    runner = LineageRunner(bonus=0.0, per_step=0.001, steps_pay=True)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=1000, steps=10)
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=30)
        versions = tree(engine)
        best = engine.best_version()
        records = {v.name: v for v in engine.store.list_versions()}
        rows = engine.store.query(
            "SELECT v.name, i.change, i.kind FROM versions v JOIN interventions i ON i.id = v.intervention_id"
        )
        changes = {name: json.loads(change) if isinstance(change, str) else change for name, change, _ in rows}
        kinds = {name: kind for name, _, kind in rows}
    screen = [v for v, (parent, *_) in versions.items() if parent == "v0"]
    assert [versions[v][1] for v in screen] == [CONTROL], versions
    assert sum(steps for *_, steps in versions.values()) == 30
    last = max(versions, key=lambda v: int(v[1:]))
    chain = lineage_of(versions, last)
    assert set(chain) == set(versions) - {"v0"}, versions  # one lineage: nothing else was trained
    first, *later = reversed(chain[:-1])  # the segments after the control, in order
    assert versions[first][1] == COMBINE and all(versions[v][1] == CONTINUE for v in later), versions
    # The first segment changed how the lineage trains (an optimizer factor) besides its steps.
    assert kinds[first] == "optimizer" and set(changes[first]) - {"recipe.steps"}, (kinds[first], changes[first])
    assert "segment against v1" in (records[first].decision_reason or ""), records[first].decision_reason
    # The control and at least one continuation were inside the floor by themselves, yet continued.
    pruned = [v for v in chain[1:] if versions[v][2] == "pruned"]
    assert pruned and all((records[v].verdict_delta or 0.0) > 0 for v in pruned), versions
    assert best is not None and (best.name == "v0" or best.name in chain), versions
    # The last segment was decided on the lineage's whole gain against v0, not on its own increment.
    assert "lineage against v0" in (records[last].decision_reason or ""), records[last].decision_reason


def test_a_lineage_stops_when_a_segment_adds_nothing(
    tmp_path: Path, sample_toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control's first 10 steps gain +0.005 (inside the floor: continued provisionally, with
    the factor the planner ranks first); past 10 steps its lineage gives back 0.015, inside the
    floor too. That segment added nothing by point estimate: it is not continued; its winner is
    continued alone (a combination's rollback), which adds nothing either."""
    runner = LineageRunner(bonus=0.0, per_step=0.0005, steps_pay=True, peak=10, drop=0.015)
    ws = scripted(tmp_path, sample_toml, monkeypatch, runner, val=1000, passes=8, steps=10)
    with Engine(ws) as engine:
        Coach(engine, answer=approve_everything).run(20, steps=30)
        versions = tree(engine)
        records = {v.name: v for v in engine.store.list_versions()}
    assert versions["v1"][:3] == ("v0", CONTROL, "pruned"), versions
    assert versions["v2"][:3] == ("v1", COMBINE, "pruned"), versions
    assert records["v2"].verdict == "insufficient evidence" and (records["v2"].verdict_delta or 0.0) <= 0
    assert not any(parent == "v2" for parent, *_ in versions.values()), versions
    assert versions["v3"][:3] == ("v1", CONTINUE, "pruned"), versions
    assert (records["v3"].verdict_delta or 0.0) <= 0, records["v3"]
