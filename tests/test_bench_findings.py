"""The benchmark's findings computed from arm results: each holds, fails or is not observed per
seed from what the versions show (on test), whatever the arms' own verdicts claimed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.bench.arms import ArmResult, VersionRow
from engine.bench.report import (
    COMPUTE_SHARE,
    compute_finding,
    efficiency_finding,
    hand_finding,
    leak_finding,
    main_finding,
    main_table,
    paired,
    plot_png,
    plot_terminal,
    reach_finding,
    rl_pays_finding,
)

TASKS = 400


def solved(rate: float, seed: int) -> dict[str, float]:
    """Per test task, 1 when solved: `rate` of TASKS, drawn with a seed; a better arm solves a
    superset of a worse one's tasks when drawn with the same seed (paired, as real arms are)."""
    u = np.random.default_rng(seed).random(TASKS)
    return {f"test-{i:05d}": float(u[i] < rate) for i in range(TASKS)}


def version(name: str, parent: str | None, score: float, decision: str = "promoted", **kw: object) -> VersionRow:
    fields: dict[str, object] = {
        "change": "(base)" if parent is None else "recipe.learning_rate 5e-05 -> 0.0001",
        "template": None,
        "steps": 0 if parent is None else 20,
        "reason": "",
        "seen_greedy": score,
        "clean_greedy": score,
        "clean_sampled": score,
        "train_reward": None,
        "train_correct": None,
        "rules": [],
        "cpu_seconds": None if parent is None else 100.0,
        "test_sampled": score if decision == "promoted" else None,
        "test_per_task": solved(score, 0) if decision == "promoted" else {},
    }
    fields.update(kw)
    return VersionRow(name=name, parent=parent, decision=decision, **fields)  # type: ignore[arg-type]


def arm(name: str, seed: int, final: str, versions: list[VersionRow], steps: int | None = None) -> ArmResult:
    by_name = {v.name: v for v in versions}
    score = by_name[final].clean_greedy or 0.0
    return ArmResult(
        arm=name,
        seed=seed,
        workspace="-",
        final=final,
        clean_greedy=score,
        clean_sampled=score,
        clean_halfwidth=0.05,
        seen_greedy=by_name[final].seen_greedy,
        steps=sum(v.steps for v in versions) if steps is None else steps,
        cpu_seconds=sum(v.cpu_seconds or 0 for v in versions),
        wall_seconds=1.0,
        versions=versions,
        test_greedy=score,
        test_sampled=score,
        test_halfwidth=0.04,
        test_per_task=solved(score, seed),
    )


def results(full_promotes_leak: bool, seed: int = 0) -> list[ArmResult]:
    v0 = version("v0", None, 0.30)
    leaky = version(
        "v1",
        "v0",
        0.28,
        "promoted" if full_promotes_leak else "rejected",
        seen_greedy=0.55,
        rules=["leak"],
        reason="rule leak is critical",
    )
    closed = version("v2", "v0", 0.50, template="close_leak")
    return [
        arm("base", seed, "v0", [v0]),
        arm("hand", seed, "v1", [v0, version("v1", "v0", 0.40)], steps=60),
        arm("score-only", seed, "v1", [v0, version("v1", "v0", 0.27, seen_greedy=0.6, rules=["leak"])]),
        arm("random", seed, "v1", [v0, version("v1", "v0", 0.35)]),
        arm("full", seed, "v2", [v0, leaky, closed]),
    ]


def copying(r: ArmResult, share: float, seed: int) -> ArmResult:
    """The arm's final version played leaky: `share` of the test tasks it fails clean it solves by
    copying the fix (drawn with a seed)."""
    u = np.random.default_rng(seed).random(TASKS)
    clean = r.test_per_task.items()
    r.test_leaky_per_task = {t: 1.0 if x == 0 and u[i] < share else x for i, (t, x) in enumerate(clean)}
    return r


def leaky(full_copies: bool, seed: int) -> list[ArmResult]:
    """v0 copies on 5% of the tasks it fails; score-only's final version on 40%; the full loop's
    on 40% or as v0 does (drawn with another seed: the same rate, other tasks)."""
    shares = {"base": 0.05, "hand": 0.05, "score-only": 0.4, "random": 0.05, "full": 0.4 if full_copies else 0.05}
    return [copying(r, shares[r.arm], 100 + i) for i, r in enumerate(results(full_promotes_leak=False, seed=seed))]


def test_the_leak_finding_reads_what_copying_adds_to_each_final_version_on_test() -> None:
    """Holds: score-only's final version copies beyond v0 and the full loop's does not. Fails: the
    full loop's copies. Not observed: no final version copies beyond v0, or no leaky test ran."""
    found = leak_finding(leaky(full_copies=False, seed=0) + leaky(full_copies=True, seed=1))
    assert found.holds == {0: True, 1: False}
    assert found.verdict() == "holds on 1 of 2 seeds, fails on 1"
    line = next(x for x in found.lines if x.startswith("seed 0, score-only: final v1 leaky - clean"))
    assert "it learned the leak" in line
    assert not any(x.startswith("seed 0, full:") and "learned" in x for x in found.lines)
    # The val-side evidence is listed beside it: score-only's v1 fired the rule on what it saw.
    assert any("score-only: v1" in x and "val as seen 0.600, clean 0.270" in x for x in found.lines)
    nobody = [copying(r, 0.05, 100 + i) for i, r in enumerate(results(full_promotes_leak=False))]
    assert leak_finding(nobody).verdict() == "not observed"
    assert leak_finding(results(full_promotes_leak=True)).verdict() == "not observed"  # no leaky test


def test_the_main_finding_needs_the_full_loop_beyond_score_only_and_random_search_on_test() -> None:
    rs = results(full_promotes_leak=False)
    main = main_finding(rs)  # full 0.50 against score-only 0.27 and random 0.35 on the same 400 tasks
    assert main.holds == {0: True}
    assert "vs score-only v1 0.270" in main.lines[0] and "vs random v1 0.350" in main.lines[0]
    tied = [r for r in rs if r.arm != "full"] + [
        arm("full", 0, "v1", [version("v0", None, 0.3), version("v1", "v0", 0.27)])
    ]
    assert main_finding(tied).holds == {0: False}  # equal on test: the interval holds 0
    # Beyond score-only but level with random search: the coach's proposals added nothing.
    level = [r for r in rs if r.arm != "random"] + [
        arm("random", 0, "v1", [version("v0", None, 0.3), version("v1", "v0", 0.5)])
    ]
    assert main_finding(level).holds == {0: False}
    assert rl_pays_finding(rs).holds == {0: True}  # hand 0.40 against v0 0.30
    assert hand_finding(rs).holds == {0: True} and hand_finding(tied).holds == {0: False}
    # Below the hand recipe by less than the noise: the interval holds 0, and the finding holds.
    hand = next(r for r in rs if r.arm == "hand").test_per_task
    right, wrong = [t for t, x in hand.items() if x == 1], [t for t, x in hand.items() if x == 0]
    near = arm("full", 0, "v1", [version("v0", None, 0.3), version("v1", "v0", 0.38)])
    # 20 of the hand recipe's solved tasks lost, 14 others won: 6 fewer of 400, within the noise.
    near.test_per_task = hand | dict.fromkeys(right[:20], 0.0) | dict.fromkeys(wrong[:14], 1.0)
    d = paired(near.test_per_task, hand)
    assert d is not None and d[0] == -6 / TASKS and d[1] < 0 < d[2]
    assert hand_finding([r for r in rs if r.arm != "full"] + [near]).holds == {0: True}


def test_the_reach_finding_asks_the_main_results_question_of_the_hand_recipe() -> None:
    """The positive control of the main result: the same test, the hand recipe in the full loop's
    place. It can fail where the main result holds (the test split does not tell the hand recipe
    from a baseline), and it is not observed without a hand arm."""
    rs = results(full_promotes_leak=False)
    reach = reach_finding(rs)  # hand 0.40 against score-only 0.27 and random 0.35 on the same tasks
    assert reach.holds == {0: True}
    (line,) = reach.lines
    assert line.startswith("seed 0: hand v1 0.400; vs score-only v1 0.270") and "vs random v1 0.350" in line
    by_arm = {r.arm: r.test_per_task for r in rs}
    gain = paired(by_arm["hand"], by_arm["base"])
    assert gain is not None and f"; vs base: {gain[0]:+.3f} (95% {gain[1]:+.3f}" in line
    assert "vs hand" not in line and "vs full" not in line
    # Random search level with the hand recipe: the reference fails the test the full loop passes.
    level = [r for r in rs if r.arm != "random"] + [
        arm("random", 0, "v1", [version("v0", None, 0.3), version("v1", "v0", 0.4)])
    ]
    assert reach_finding(level).holds == {0: False} and main_finding(level).holds == {0: True}
    assert reach_finding([r for r in rs if r.arm != "hand"]).verdict() == "not observed"


def test_compute_counts_every_step_until_a_promoted_version_reached_the_hand_recipe() -> None:
    rs = results(full_promotes_leak=False)
    # v1 (rejected, no test score) does not count; v2 (0.50 >= hand 0.40) does, after both versions'
    # 40 steps: 40 / 60 of the hand recipe's steps, within COMPUTE_SHARE.
    compute = compute_finding(rs)
    assert 40 / 60 <= COMPUTE_SHARE and compute.holds == {0: True}
    assert "after 40 steps (0.67x the hand recipe's 60)" in compute.lines[0]
    slow = [r for r in rs if r.arm != "hand"] + [
        arm("hand", 0, "v1", [version("v0", None, 0.3), version("v1", "v0", 0.4)], steps=50)
    ]
    assert compute_finding(slow).holds == {0: False}  # reached, but on 0.8x the steps: fails


def test_the_main_table_has_one_row_per_arm_with_seed_spread() -> None:
    rows = main_table(results(False, seed=0) + results(False, seed=1))
    assert rows[0][1] == "test greedy"
    assert [r[0] for r in rows[1:]] == ["base", "hand", "score-only", "random", "full"]
    full = rows[-1]
    assert full[1] == "0.500 ± 0.000" and full[2] == "0.500 ± 0.040" and full[4] == "2" and full[5] == "40"
    # The answer v2 carries its own 20 steps; the rejected sibling v1 spent the other 20.
    assert rows[0][6] == "lineage steps" and full[6] == "20/40 (50%)"
    assert rows[1][6] == "-"  # the base arm trained nothing
    assert full[8] == "2 promoted, 2 rejected"


def test_plots_keep_a_reward_above_one_in_range(tmp_path: Path) -> None:
    """A weighted sum of components can pass 1 (correctness + 0.5 x pass_fraction: the code
    sample's hand recipe trained to 1.22): both plots widen their range to it (plotext raised
    on a point above its range, after a whole benchmark had run)."""
    versions = [version("v0", None, 0.99), version("v1", "v0", 0.99, train_reward=1.22)]
    results = [arm("hand", seed, "v1", versions) for seed in (0, 1, 2)]
    text = plot_terminal(results, "hand")
    assert "hand: reward and clean score over versions" in text
    path = plot_png(results, "hand", tmp_path / "hand.png")
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[0] > 0


def test_the_efficiency_finding_reads_collapse_then_the_decision() -> None:
    """Holds when the full loop kept a collapsed efficiency branch out; fails when it promoted
    one; not observed when its branch did not collapse (no collapse is no test of the rule)."""

    def with_efficiency(decision: str, seed: int) -> list[ArmResult]:
        rs = results(full_promotes_leak=False, seed=seed)
        full = next(r for r in rs if r.arm == "full")
        full.versions.append(version("v3", "v0", 0.3, decision, template="efficiency_reward"))
        return rs

    collapse = {0: (0.05, 0.6, 0.9, 0.2), 1: (0.05, 0.6, 0.9, 0.2), 2: (0.05, 0.06, 0.9, 0.9)}
    runs = with_efficiency("rejected", 0) + with_efficiency("promoted", 1) + with_efficiency("pruned", 2)
    found = efficiency_finding(runs, shares=lambda r, v: collapse[r.seed])
    assert found.holds == {0: True, 1: False, 2: None}
    assert "seed 2: not observed: no branch of the full loop collapsed" in found.lines
    assert efficiency_finding(results(False)).holds == {0: None}  # nobody proposed it
