"""Where each arm spent its steps: the share of its GRPO steps in its answer's lineage, and its
answer's test score against the steps it had spent, on arm results built by hand (the expected
numbers are counted here by hand, not by the code under test)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from engine.bench import report
from engine.bench.arms import ArmResult, BenchRun, BenchSettings, VersionRow
from engine.bench.report import (
    StepsCurve,
    lineage,
    lineage_cell,
    lineage_lines,
    lineage_steps,
    main_table,
    plot_steps_png,
    render,
    steps_curves,
    write_report,
)

V0_TEST = 0.30


def row(name: str, parent: str | None, steps: int, decision: str, test: float | None = None) -> VersionRow:
    return VersionRow(
        name=name,
        parent=parent,
        change="(base)" if parent is None else "recipe.learning_rate 5e-05 -> 0.0001",
        template=None,
        steps=steps,
        decision=decision,
        reason="",
        seen_greedy=None,
        clean_greedy=None,
        clean_sampled=None,
        train_reward=None,
        train_correct=None,
        rules=[],
        test_sampled=test,
    )


def result(arm: str, seed: int, final: str, versions: list[VersionRow], test: float | None) -> ArmResult:
    return ArmResult(
        arm=arm,
        seed=seed,
        workspace="-",
        final=final,
        clean_greedy=None,
        clean_sampled=None,
        clean_halfwidth=None,
        seen_greedy=None,
        steps=sum(v.steps for v in versions),
        cpu_seconds=1.0,
        wall_seconds=1.0,
        versions=versions,
        test_greedy=test,
        test_sampled=test,
        test_halfwidth=0.02,
    )


def base(seed: int = 0) -> ArmResult:
    return result("base", seed, "v0", [row("v0", None, 0, "promoted", V0_TEST)], V0_TEST)


def hand(seed: int = 0) -> ArmResult:
    return result("hand", seed, "v1", [row("v0", None, 0, "promoted"), row("v1", "v0", 400, "promoted", 0.45)], 0.45)


def full(seed: int = 0) -> ArmResult:
    """A screen of three from v0 (v2 wins; v3 promoted too, but the answer does not descend from
    it), v2 continued (v4), a rejected and a promoted segment on v4 (v5, v6: the answer), and a
    last rejected segment after the answer (v7). In creation order; 430 steps in all."""
    return result(
        "full",
        seed,
        "v6",
        [
            row("v0", None, 0, "promoted"),
            row("v1", "v0", 50, "rejected"),  # the control: cumulative 50
            row("v2", "v0", 50, "promoted", 0.40),  # 100
            row("v3", "v0", 50, "promoted", 0.42),  # 150, outside the lineage
            row("v4", "v2", 100, "promoted", 0.45),  # 250
            row("v5", "v4", 50, "rejected"),  # 300
            row("v6", "v4", 100, "promoted", 0.47),  # 400, the answer
            row("v7", "v6", 30, "rejected"),  # 430
        ],
        0.47,
    )


def score_only(seed: int = 0) -> ArmResult:
    """Promoted nothing: its answer is v0, tested in its own store (the report's test of the answer)."""
    versions = [row("v0", None, 0, "promoted", 0.31), row("v1", "v0", 50, "rejected"), row("v2", "v0", 50, "pruned")]
    return result("score-only", seed, "v0", versions, 0.31)


def orphan(seed: int = 0) -> ArmResult:
    """The answer v3's parent v2 is not among the rows (a store that lost it): no steps are
    invented for it; v3's own 50 count."""
    versions = [row("v0", None, 0, "promoted"), row("v1", "v0", 50, "rejected"), row("v3", "v2", 50, "promoted", 0.38)]
    return result("random", seed, "v3", versions, 0.38)


def test_the_lineage_counts_the_answer_and_its_ancestors_not_their_siblings() -> None:
    assert [v.name for v in lineage(full())] == ["v0", "v2", "v4", "v6"]
    assert lineage_steps(full()) == (50 + 100 + 100, 430)
    # The hand recipe: one version, every step in it.
    assert lineage_steps(hand()) == (400, 400)
    # An answer that is v0 carries none of the 100 steps spent.
    assert [v.name for v in lineage(score_only())] == ["v0"] and lineage_steps(score_only()) == (0, 100)
    # A parent missing from the rows: the chain stops at v3.
    assert [v.name for v in lineage(orphan())] == ["v3"] and lineage_steps(orphan()) == (50, 100)
    # The base arm trained nothing; an answer missing from the rows has no lineage.
    assert lineage_steps(base()) == (0, 0)
    lost = full()
    lost.final = "v9"
    assert lineage(lost) == [] and lineage_steps(lost) == (0, 430)
    assert lineage_lines([lost]) == ["seed 0, full: its answer v9 is not among its versions; 430 steps spent"]


def test_the_lineage_column_and_section_show_the_share_per_arm_and_seed() -> None:
    assert lineage_cell([full(0)]) == "250/430 (58%)"
    # Over seeds: the mean steps in the lineage against the mean spent; 175 / 415 = 42%.
    other = result("full", 1, "v1", [row("v0", None, 0, "promoted"), row("v1", "v0", 100, "promoted", 0.4)], 0.4)
    other.versions.append(row("v2", "v0", 300, "rejected"))
    other.steps = 400
    assert lineage_cell([full(0), other]) == "175/415 (42%)"
    assert lineage_cell([base()]) == "-" and lineage_cell([hand()]) == "400/400 (100%)"

    rows = main_table([base(), hand(), score_only(), orphan(), full()])
    col = rows[0].index("lineage steps")
    assert rows[0][col - 1] == "GRPO steps"
    assert {r[0]: r[col] for r in rows[1:]} == {
        "base": "-",
        "hand": "400/400 (100%)",
        "score-only": "0/100 (0%)",
        "random": "50/100 (50%)",
        "full": "250/430 (58%)",
    }

    lines = lineage_lines([base(), hand(), score_only(), orphan(), full()])
    assert (
        "seed 0, full: v0 -> v2 (50) -> v4 (100) -> v6 (100), 250 of 430 steps (58%); 180 in 4 other version(s)"
        in lines
    )
    assert "seed 0, hand: v0 -> v1 (400), 400 of 400 steps (100%); 0 in 0 other version(s)" in lines
    assert "seed 0, score-only: v0, 0 of 100 steps (0%); 100 in 2 other version(s)" in lines
    assert any(x.startswith("seed 0, random: v3 (50), 50 of 100 steps (50%)") and "v3's parent v2" in x for x in lines)
    assert "seed 0, base: v0, no GRPO step spent" in lines


def test_steps_curves_put_the_lineage_at_the_arms_cumulative_steps_siblings_included() -> None:
    curves = {c.arm: c for c in steps_curves([base(), hand(), score_only(), orphan(), full()])}
    # v2 after the control's 50 steps and its own; v4 after v3 (a sibling, promoted but not an
    # ancestor of the answer: not plotted) and its own 100; v6 after the rejected v5.
    assert curves["full"] == StepsCurve("full", 0, [(0, V0_TEST), (100, 0.40), (250, 0.45), (400, 0.47)], 430)
    assert curves["hand"] == StepsCurve("hand", 0, [(0, V0_TEST), (400, 0.45)], 400)
    # An answer that is v0: its own test of v0, then nothing more for its 100 steps.
    assert curves["score-only"] == StepsCurve("score-only", 0, [(0, 0.31)], 100)
    assert curves["random"] == StepsCurve("random", 0, [(0, V0_TEST), (100, 0.38)], 100)
    assert curves["base"] == StepsCurve("base", 0, [(0, V0_TEST)], 0)
    for c in curves.values():
        assert all(a[0] < b[0] for a, b in zip(c.points, c.points[1:], strict=False))
    # The last point is the answer's test score, which the main table reports.
    arms = {r.arm: r for r in [base(), hand(), score_only(), orphan(), full()]}
    assert all(c.points[-1][1] == arms[a].test_sampled for a, c in curves.items())


def test_steps_curves_without_a_base_arm_or_an_untested_answer_leave_the_points_out() -> None:
    untested = hand()
    untested.test_sampled = None
    untested.versions[1].test_sampled = None
    # No base arm in the seed and no own test of v0: the arm has no v0 point.
    assert steps_curves([untested]) == [StepsCurve("hand", 0, [], 400)]
    assert steps_curves([base(), untested])[1] == StepsCurve("hand", 0, [(0, V0_TEST)], 400)


def test_the_report_draws_test_score_against_steps_and_references_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = [arm(seed) for seed in (0, 1) for arm in (base, hand, score_only, orphan, full)]
    path = plot_steps_png(results, tmp_path / "steps.png")
    image = matplotlib.image.imread(path)
    assert path.stat().st_size > 1000 and image.shape[1] > image.shape[0]  # two panels side by side
    # The whole report, with the findings (which read the arms' stores) left out.
    monkeypatch.setattr(report, "findings", lambda run, domain: [])
    run = BenchRun(
        "bench-test", tmp_path, BenchSettings(budget_steps=400, version_steps=50, seeds=(0, 1)), results, [], 60.0
    )
    md, found, plots = write_report(run, "sample")
    text = md.read_text(encoding="utf-8")
    assert found == [] and set(plots) == {"base", "hand", "score-only", "random", "full"}
    assert (tmp_path / "steps.png").stat().st_size > 1000
    assert "![test score against steps spent](steps.png)" in text
    assert "## Where the steps went" in text and "| lineage steps |" in text
    assert "- seed 1, full: v0 -> v2 (50) -> v4 (100) -> v6 (100), 250 of 430 steps (58%)" in text
    assert json.loads((tmp_path / "results.json").read_text())["bench_id"] == "bench-test"
    # Without the figure the section still lists the lineages.
    assert "steps.png" not in render(run, "sample", [], plots={})
