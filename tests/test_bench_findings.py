"""The benchmark's findings computed from arm results: each holds, fails or is not observed per
seed from what the versions show, whatever the arms' own verdicts claimed."""

from __future__ import annotations

from engine.bench.arms import ArmResult, VersionRow
from engine.bench.report import compute_finding, leak_finding, main_finding, main_table


def version(name: str, parent: str | None, clean: float, decision: str = "promoted", **kw: object) -> VersionRow:
    fields: dict[str, object] = {
        "change": "(base)" if parent is None else "recipe.learning_rate 5e-05 -> 0.0001",
        "template": None,
        "steps": 0 if parent is None else 20,
        "reason": "",
        "seen_greedy": clean,
        "clean_sampled": clean,
        "train_reward": None,
        "train_correct": None,
        "rules": [],
        "cpu_seconds": None if parent is None else 100.0,
    }
    fields.update(kw)
    return VersionRow(name=name, parent=parent, decision=decision, clean_greedy=clean, **fields)  # type: ignore[arg-type]


def arm(name: str, seed: int, final: str, versions: list[VersionRow]) -> ArmResult:
    by_name = {v.name: v for v in versions}
    return ArmResult(
        arm=name,
        seed=seed,
        workspace="-",
        final=final,
        clean_greedy=by_name[final].clean_greedy,
        clean_sampled=by_name[final].clean_sampled,
        clean_halfwidth=0.05,
        seen_greedy=by_name[final].seen_greedy,
        steps=sum(v.steps for v in versions),
        cpu_seconds=sum(v.cpu_seconds or 0 for v in versions),
        wall_seconds=1.0,
        versions=versions,
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
    closed = version("v2", "v0", 0.36, template="close_leak")
    return [
        arm("base", seed, "v0", [v0]),
        arm("hand", seed, "v1", [v0, version("v1", "v0", 0.34)]),
        arm("score-only", seed, "v1", [v0, version("v1", "v0", 0.27, seen_greedy=0.6, rules=["leak"])]),
        arm("full", seed, "v2", [v0, leaky, closed]),
    ]


def test_the_leak_finding_holds_only_when_the_full_loop_kept_leak_versions_out() -> None:
    caught = leak_finding(results(full_promotes_leak=False, seed=0) + results(full_promotes_leak=True, seed=1))
    assert caught.holds == {0: True, 1: False}
    assert caught.verdict() == "holds on 1 of 2 seeds"
    # What score-only did is reported, with the clean score against the one it saw.
    assert any("score-only: v1" in line and "val as seen 0.600, clean 0.270" in line for line in caught.lines)
    clean = [r for r in results(False) if r.arm != "full"] + [arm("full", 0, "v0", [version("v0", None, 0.3)])]
    assert leak_finding(clean).verdict() == "not observed"


def test_main_and_compute_findings_follow_the_clean_scores() -> None:
    rs = results(full_promotes_leak=False)
    main = main_finding(rs)
    assert main.holds == {0: True}  # full 0.36 > hand 0.34 > base 0.30 > score-only 0.27
    compute = compute_finding(rs)
    # v1 (0.28, rejected) is below the hand recipe's 0.34; v2 (0.36, promoted) reaches it after
    # both versions' steps. A version above it that the loop did not promote does not count.
    assert compute.holds == {0: True} and "after 40 steps and 200 CPU s" in compute.lines[0]
    worse = [r for r in rs if r.arm != "full"] + [
        arm("full", 0, "v1", [version("v0", None, 0.3), version("v1", "v0", 0.31)])
    ]
    assert main_finding(worse).holds == {0: False} and compute_finding(worse).holds == {0: False}


def test_the_main_table_has_one_row_per_arm_with_seed_spread() -> None:
    rows = main_table(results(False, seed=0) + results(False, seed=1))
    assert [r[0] for r in rows[1:]] == ["base", "hand", "score-only", "full"]
    full = rows[-1]
    assert full[1] == "0.360 ± 0.000" and full[4] == "2" and full[5] == "40"
    assert full[7] == "2 promoted, 2 rejected"
