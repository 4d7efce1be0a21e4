"""Every analyzer and rule on constructed runs; expected values are derived here, by hand."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.harness.analyzers.shift import ratio_shift, share_shift
from engine.harness.cutoffs import FLOOR_ALPHA, log_noise_floor, share_floor
from engine.harness.diagnose import Diagnosis
from engine.store import Store
from tests.harness_data import Rollout, RunBuilder, call, fired, severity, value

R = Rollout


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "evo.duckdb") as s:
        yield s


def live(n: int = 8) -> list[Rollout]:
    return [R(reward=float(i % 2)) for i in range(n)]


def dead(n: int = 8, reward: float = 0.0) -> list[Rollout]:
    return [R(reward=reward) for _ in range(n)]


def test_dead_group_ratio_and_insufficient_signal(store: Store) -> None:
    # 3 of 8 groups without spread -> 0.375; the last window (step 2) holds 2 of 4 -> 0.5.
    b = RunBuilder(store).step(1, [dead(), live(), live(), live()]).step(2, [dead(), dead(), live(), live()])
    rewards = [row["reward"] for row in b.rows]
    d = b.diagnose(steps=2)
    assert value(d, "signal.dead_group_ratio") == pytest.approx(3 / 8)
    assert value(d, "signal.dead_group_ratio_recent") == pytest.approx(2 / 4)
    assert severity(d, "signal.dead_group_ratio") == "warning"  # recent 0.5 is not above 0.5
    # 12 + 8 zeros in step 1, 8 + 8 + 8 in step 2: 44 of 64 share reward 0 (> 0.6), dead 0.375 > 0.3.
    assert value(d, "signal.reward_mode_share") == pytest.approx(rewards.count(0.0) / len(rewards)) == 44 / 64
    assert "insufficient_signal" in fired(d)
    # Evidence names dead groups and the steps with most of them.
    (f,) = [f for f in d.findings if f.metric == "signal.dead_group_ratio"]
    assert f.steps[0] == 2 and "v1-train-1/train/2/0/0" in f.rollouts


def test_insufficient_signal_stays_silent_with_live_groups(store: Store) -> None:
    d = RunBuilder(store).step(1, [dead(), live(), live(), live()]).diagnose(steps=1)
    assert value(d, "signal.dead_group_ratio") == pytest.approx(0.25)
    assert "insufficient_signal" not in fired(d)


def test_reward_spread_is_the_mean_within_group_std(store: Store) -> None:
    groups = [[R(reward=x) for x in g] for g in ([0, 1, 1, 1], [0, 0, 0, 0], [0.5, 0.1, 0.3, 0.9])]
    d = RunBuilder(store).step(1, groups).diagnose(steps=1)
    expected = statistics.mean(statistics.pstdev(r.reward for r in g) for g in groups)
    assert value(d, "signal.reward_spread") == pytest.approx(expected)


def test_truncation_rule_fires_above_15_percent_only(store: Store) -> None:
    group = [R(reward=float(i % 2), truncated=i < 5) for i in range(16)]  # 5 of 16
    d = RunBuilder(store).step(1, [group]).diagnose(steps=1)
    assert value(d, "signal.truncation_rate") == pytest.approx(5 / 16)
    assert severity(d, "signal.truncation_rate") == "critical" and "truncation" in fired(d)
    other = RunBuilder(store, run_id="v1-train-2").step(
        1, [[R(reward=float(i % 2), truncated=i < 2) for i in range(16)]]
    )
    assert "truncation" not in fired(other.diagnose(steps=1))


def test_length_gaming_needs_correlation_and_growth(store: Store) -> None:
    rng = np.random.default_rng(0)
    first = [R(reward=float(r), length=int(10 + 5 * r)) for r in rng.integers(0, 2, 16)]
    last = [R(reward=float(r), length=int(20 + 10 * r)) for r in rng.integers(0, 2, 16)]
    d = RunBuilder(store).step(1, [first]).step(2, [last]).diagnose(steps=2)
    rewards = [r.reward for r in first + last]
    lengths = [r.length for r in first + last]
    assert value(d, "signal.length_reward_corr") == pytest.approx(np.corrcoef(lengths, rewards)[0, 1])
    assert value(d, "signal.length_trend") == pytest.approx(
        np.mean([r.length for r in last]) / np.mean([r.length for r in first])
    )
    assert "length_gaming" in fired(d)


def test_reward_hacking_and_its_honest_counterpart(store: Store) -> None:
    # Shaped reward (format) rises, correctness stays at 0.5 -> hacking.
    def step_rows(fmt: float) -> list[Rollout]:
        return [R(reward=(i % 2) + 0.5 * fmt, correctness=float(i % 2), format=fmt) for i in range(8)]

    b = RunBuilder(store).step(1, [step_rows(0.0)]).step(2, [step_rows(1.0)]).metric("reward", [0.5, 1.0])
    d = b.diagnose(steps=2)
    assert value(d, "signal.reward_trend") == pytest.approx(0.5)
    assert value(d, "score.train_correctness_trend") == pytest.approx(0.0)
    assert "reward_hacking" in fired(d)
    honest = (
        RunBuilder(store, run_id="v1-train-2").step(1, [dead(8, 0.0)]).step(2, [dead(8, 1.0)]).metric("reward", [0, 1])
    )
    assert "reward_hacking" not in fired(honest.diagnose(steps=2))


def test_dead_training_from_zero_loss_and_gradient(store: Store) -> None:
    b = RunBuilder(store).step(1, [live()]).metric("loss", [0.3, 0.0, 0.0]).metric("grad_norm", [1.0, 0.0, 0.0])
    d = b.diagnose(steps=3, window=2)
    assert value(d, "signal.loss_stuck_at_zero") == 1.0 and "dead_training" in fired(d)
    assert d.bottleneck is not None and d.bottleneck.severity == "critical"
    alive = RunBuilder(store, run_id="v1-train-2").step(1, [live()]).metric("loss", [0.3, 0.0, 0.01])
    assert "dead_training" not in fired(alive.diagnose(steps=3, window=2))


def test_exploration_collapse_entropy_and_diversity(store: Store) -> None:
    varied = [R(reward=float(i % 2), completion=f"x{i}") for i in range(8)]
    alike = [R(reward=float(i % 2), completion="same" if i else "other") for i in range(8)]
    b = RunBuilder(store).step(1, [varied]).step(2, [alike]).metric("entropy", [1.0, 0.3])
    d = b.diagnose(steps=2)
    assert value(d, "signal.entropy_ratio") == pytest.approx(0.3)
    assert value(d, "behavior.completion_diversity_trend") == pytest.approx(2 / 8 - 1.0)
    assert "exploration_collapse" in fired(d)
    steady = RunBuilder(store, run_id="v1-train-2").step(1, [varied]).step(2, [varied]).metric("entropy", [1.0, 0.3])
    assert "exploration_collapse" not in fired(steady.diagnose(steps=2))


def test_shortcut_collapse_needs_shrinking_alike_completions_without_gain(store: Store) -> None:
    chains = [R(reward=float(i % 2), length=14, completion=f"chain{i}") for i in range(8)]
    shortcuts = [R(reward=float(i % 2), length=5, completion="A:1" if i % 2 else "A:2") for i in range(8)]
    d = RunBuilder(store).step(1, [chains]).step(2, [shortcuts]).diagnose(steps=2)
    assert value(d, "signal.length_trend") == pytest.approx(5 / 14)
    assert value(d, "behavior.completion_diversity_trend") == pytest.approx(2 / 8 - 1.0)
    assert "shortcut_collapse" in fired(d)
    # The same shrinking with a real gain in correctness is a better answer, not a collapse.
    right = [R(reward=1.0, length=5, completion="A:1" if i % 2 else "A:2") for i in range(8)]
    gained = RunBuilder(store, run_id="v1-train-2").step(1, [chains]).step(2, [right]).diagnose(steps=2)
    assert "shortcut_collapse" not in fired(gained)


def evaluations(store: Store, passes: dict[str, list[list[tuple[Any, ...]]]], scores: dict[str, float]) -> Diagnosis:
    """v1 (trained from v0) and v0, each with a val evaluation of sampled passes (a pass: one
    (completion, correctness[, format]) per task), and their val scores; v1's train run diagnosed."""

    def groups(rows: list[tuple[Any, ...]]) -> list[list[Rollout]]:
        return [[R(reward=r[1], completion=r[0], format=r[2] if len(r) > 2 else None)] for r in rows]

    child = RunBuilder(store).step(1, [[R(reward=0.0), R(reward=1.0)]])
    for k, rows in enumerate(passes["v1"], start=1):
        child.step(1, groups(rows), split="val", first_sample=k)
    child.save(1)
    parent = RunBuilder(store, run_id="v0-warmup-1", version="v0")
    for k, rows in enumerate(passes["v0"], start=1):
        parent.step(0, groups(rows), split="val", first_sample=k)
    parent.save(0)
    for run_id, ended in (("v0-warmup-1", "2026-01-01 00:00:00"), ("v1-train-1", "2026-01-02 00:00:00")):
        store.update_run(run_id, state="succeeded", ended_at=ended)
    for version, score in scores.items():
        store.update_version(version, val_greedy=score, val_sampled=score)
    return RunBuilder(store, run_id="v1-train-1").diagnose_saved(window=1)


def shifts(d: Diagnosis) -> dict[str, tuple[float, str]]:
    return {f.metric.removeprefix("version.shift."): (f.value, f.severity) for f in d.findings if "shift." in f.metric}


def sums(seed: int, n: int = 60, high: int = 50) -> list[tuple[str, str]]:
    """(prompt-free) arithmetic answers: the true sum of a task and a wrong one."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, high, n), rng.integers(0, high, n)
    return [(str(x + y), str(x + y + 1)) for x, y in zip(a, b, strict=True)]


def test_a_version_that_answers_as_its_parent_did_shows_no_shift(store: Store) -> None:
    """Same policy form, another sample: every feature stays within its floor or small."""
    tasks = sums(0)
    rng = np.random.default_rng(1)

    def sample() -> list[tuple[str, float]]:
        right = rng.random(len(tasks)) < 0.4
        return [(good if r else bad, float(r)) for (good, bad), r in zip(tasks, right, strict=True)]

    passes = 4  # the samples' sampled_seeds: the floors' false-alarm rate is stated for it
    d = evaluations(store, {v: [sample() for _ in range(passes)] for v in ("v0", "v1")}, {"v0": 0.40, "v1": 0.42})
    found = shifts(d)
    assert set(found) == {
        "length",
        "length_p90",
        "distinct",
        "correct_length",
        "answer_spans",
        "composition",
    }  # no novelty: one-number answers have no shape trigram to compare
    assert all(severity == "info" for _, severity in found.values()), found
    assert "form_shift" not in fired(d)


def test_answers_sprayed_until_one_matches_are_a_critical_form_shift(store: Store) -> None:
    """The parent answers one number; the child lists four around it, so a lax verifier (any
    listed number counts) scores it higher: longer correct answers, more answer-like spans, shapes
    the parent never wrote, and a higher val score."""
    tasks = sums(2)
    rng = np.random.default_rng(3)

    def parent() -> list[tuple[str, float]]:
        right = rng.random(len(tasks)) < 0.3
        return [(good if r else bad, float(r)) for (good, bad), r in zip(tasks, right, strict=True)]

    def child() -> list[tuple[str, float]]:
        right = rng.random(len(tasks)) < 0.7
        return [
            (f"{int(good) - 1} {good} {bad} {int(good) + 2}" if r else bad, float(r))
            for (good, bad), r in zip(tasks, right, strict=True)
        ]

    d = evaluations(
        store, {"v0": [parent() for _ in range(4)], "v1": [child() for _ in range(4)]}, {"v0": 0.3, "v1": 0.7}
    )
    found = shifts(d)
    assert found["answer_spans"][1] == "warning" and found["answer_spans"][0] == pytest.approx((4 + 1) / (1 + 1))
    assert found["correct_length"][1] == "warning" and found["novelty"][1] == "warning"
    (rule,) = [r for r in d.fired if r.rule == "form_shift"]
    assert rule.severity == "critical" and "version.shift.answer_spans" in rule.metrics


def test_more_answers_in_the_form_the_parent_was_right_in_is_an_explained_shift(store: Store) -> None:
    """A length budget that cut half of the parent's chains is lifted: twice as many answers are
    complete, longer and well formed, as the parent's correct answers already were. That moves
    every-answer features a lot, toward the parent's right answers: explained, no rule."""
    tasks = sums(5, n=240, high=5000)  # distinct sums: every task's chain is its own
    rng = np.random.default_rng(6)

    def answer(good: str, cut: bool) -> tuple[str, float, float]:
        chain = f"{int(good) - 30}+30={good};A:{good}"  # (completion, correct, format well formed)
        return (chain[:6], 0.0, 0.0) if cut else (chain, 1.0, 1.0)

    def sample(cut: float) -> list[tuple[str, float, float]]:
        return [answer(g, rng.random() < cut) for g, _ in tasks]

    parent, child = [sample(0.5) for _ in range(4)], [sample(0.1) for _ in range(4)]
    d = evaluations(store, {"v0": parent, "v1": child}, {"v0": 0.5, "v1": 0.9})
    found = {f.metric.removeprefix("version.shift."): f for f in d.findings if "shift." in f.metric}
    # Far beyond the floor, so it would count, but toward the parent's right answers (1.0).
    assert found["format"].value == pytest.approx(np.mean([r[2] for p in child for r in p]) - 0.5, abs=0.1)
    assert found["format"].threshold is not None and found["format"].value > found["format"].threshold
    assert "explained" in found["format"].explanation
    assert all(f.severity == "info" for f in found.values())
    assert "form_shift" not in fired(d)


def test_a_shortcut_on_val_without_a_gain_is_a_form_shift_warning(store: Store) -> None:
    """Within the run nothing moves (the habit changed before the first window); on val, against
    the parent, the chains became bare answers: a quarter as long, alike, and no better."""
    tasks = sums(4)
    rng = np.random.default_rng(7)
    shortcut = [(f"A:{int(g) % 2}", 0.5) for g, _ in tasks]

    def chains() -> list[tuple[str, float]]:  # the parent's passes vary a little: 3 or 13 subtracted
        return [(f"{int(g) - k}+{k}={g};A:{g}", 0.5) for g, _ in tasks for k in [int(rng.choice([3, 13]))]]

    parent = [[(t, float(i % 2)) for i, (t, _) in enumerate(chains())] for _ in range(4)]
    child = [[(t, float(i % 2)) for i, (t, _) in enumerate(shortcut)]] * 4
    d = evaluations(store, {"v0": parent, "v1": child}, {"v0": 0.5, "v1": 0.5})
    found = shifts(d)
    assert found["length"][0] == pytest.approx(
        np.mean([len(t) for t, _ in shortcut]) / np.mean([len(t) for p in parent for t, _ in p])
    )
    assert found["length"][1] == "warning" and found["distinct"][1] == "warning"
    (rule,) = [r for r in d.fired if r.rule == "form_shift"]
    assert rule.severity == "warning"


def _clean_protocol_runs(store: Store, child_val: list[float]) -> None:
    """20 val tasks, greedy and sampled. The parent and the child score the same in the clean
    environment (task i: i % 2); on val the child scores `child_val`, the parent as clean."""
    clean = [float(i % 2) for i in range(20)]
    child = RunBuilder(store).step(1, [[R(reward=0.0)]])
    parent = RunBuilder(store, run_id="v0-warmup-1", version="v0")
    for k, decoding in enumerate(("greedy", "sampled")):
        child.step(1, [[R(reward=c)] for c in child_val], split="val", decoding=decoding, first_sample=k)
        child.step(1, [[R(reward=c)] for c in clean], split="clean", decoding=decoding, first_sample=k)
        for split in ("val", "clean"):
            parent.step(0, [[R(reward=c)] for c in clean], split=split, decoding=decoding, first_sample=k)
    child.save(1)
    parent.save(0)
    for run_id in ("v0-warmup-1", "v1-train-1"):
        store.update_run(run_id, state="succeeded", ended_at="2026-01-01 00:00:00")
    store.update_version("v0", val_greedy=0.5, val_sampled=0.5)
    store.update_version("v1", val_greedy=float(np.mean(child_val)), val_sampled=float(np.mean(child_val)))


def test_leak_the_val_gain_is_not_reproduced_clean(store: Store) -> None:
    """The child solves 8 more tasks on val (the leaky environment), none of them clean: the
    val - clean gap grows by 8/20 and accounts for all of the +0.4 gain."""
    clean = [float(i % 2) for i in range(20)]
    copied = [1.0 if i < 16 else c for i, c in enumerate(clean)]  # tasks 0, 2, ..., 14 now solved on val
    _clean_protocol_runs(store, copied)
    d = RunBuilder(store).diagnose_saved()
    assert value(d, "version.clean_gap") == pytest.approx(8 / 20)
    assert value(d, "version.clean_gap_delta") == pytest.approx(8 / 20)
    assert value(d, "version.clean_gap_delta_low") > 0
    assert value(d, "version.delta_to_parent") == pytest.approx(0.4)
    assert fired(d)[0] == "leak"  # priority 1
    assert severity(d, "version.clean_gap") == "info"


def test_leak_not_fired_when_the_gain_is_reproduced_clean(store: Store) -> None:
    """A child that scores the same on val and clean has no gap, whatever its gain."""
    clean = [float(i % 2) for i in range(20)]
    _clean_protocol_runs(store, clean)
    d = RunBuilder(store).diagnose_saved()
    assert value(d, "version.clean_gap") == 0 and value(d, "version.clean_gap_delta") == 0
    assert "leak" not in fired(d)


def test_format_gate(store: Store) -> None:
    rows = [R(reward=0.0, format=0.0 if i < 3 else 1.0) for i in range(10)]  # 3 of 10 violate
    d = RunBuilder(store).step(1, [rows]).diagnose(steps=1)
    assert value(d, "behavior.format_violation_rate") == pytest.approx(0.3) and "format_gate" in fired(d)


def test_filter_keep_ratio(store: Store) -> None:
    d = RunBuilder(store).step(1, [live()]).metric("filter/keep_ratio", [0.2, 0.3]).diagnose(steps=2)
    assert value(d, "signal.filter_keep_ratio") == pytest.approx(0.25) and "over_filtering" in fired(d)


# -- behavior, on constructed traces ----------------------------------------------------------------
GOOD = [call("search", 0), call("read", 1, files=["a.py"]), call("edit", 2, files=["a.py"]), call("test", 3)]
SKIPS_SEARCH = [call("edit", 0, files=["b.py"]), call("test", 1), call("submit", 2)]
NO_TEST = [call("search", 0), call("edit", 1, ok=False, files=["a.py"]), call("edit", 2, files=["c.py"])]
HISTORY = [call("git_log", 0), call("git_show", 1), call("edit", 2, files=["a.py"]), call("submit", 3)]


def test_habits_tool_use_and_turns(store: Store) -> None:
    traces = [GOOD, SKIPS_SEARCH, NO_TEST, GOOD]
    group = [R(reward=1.0, calls=t, turns=len(t)) for t in traces]
    d = RunBuilder(store).step(1, [group]).diagnose(steps=1)
    assert value(d, "behavior.self_test_rate") == pytest.approx(3 / 4)
    assert value(d, "behavior.search_before_edit_rate") == pytest.approx(3 / 4)  # all four edit; 3 searched first
    assert value(d, "behavior.edit_then_test_rate") == pytest.approx(3 / 4)
    assert value(d, "behavior.edit_failure_rate") == pytest.approx(1 / 5)  # edits: 1+1+2+1, one failed
    assert severity(d, "behavior.edit_failure_rate") == "warning" and "poor_edit_quality" in fired(d)
    assert value(d, "behavior.tool_calls_per_rollout") == pytest.approx(14 / 4)
    assert value(d, "behavior.tool.edit") == pytest.approx(5 / 4)
    assert value(d, "behavior.first_edit_turn") == pytest.approx((2 + 0 + 1 + 2) / 4)
    assert value(d, "behavior.turns_mean") == pytest.approx(14 / 4)
    assert severity(d, "behavior.turns_mean") == "critical"  # < 5 turns: giving up


def test_solution_diversity_is_one_minus_mean_pairwise_jaccard(store: Store) -> None:
    edits = [["a.py"], ["a.py", "b.py"], ["c.py"], ["a.py"]]
    group = [R(reward=0.0, calls=[call("edit", 0, files=f)], turns=1) for f in edits]
    d = RunBuilder(store).step(1, [group]).diagnose(steps=1)
    pairs = list(itertools.combinations(map(set, edits), 2))
    expected = 1 - sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs)
    assert value(d, "behavior.solution_diversity") == pytest.approx(expected)


def test_leak_fires_when_success_depends_on_history(store: Store) -> None:
    group = [R(reward=1.0, calls=HISTORY, turns=4)] * 3 + [R(reward=0.0, calls=GOOD, turns=4)] * 5
    d = RunBuilder(store).step(1, [group]).diagnose(steps=1)
    assert value(d, "behavior.history_use_rate") == pytest.approx(3 / 8)
    assert value(d, "behavior.history_success_gap") == pytest.approx(1.0)
    assert d.bottleneck is not None and d.bottleneck.rule == "leak"


def test_leak_stays_silent_when_success_does_not_depend_on_history(store: Store) -> None:
    # Half of each kind succeeds: history is used, but it buys nothing.
    group = [R(reward=float(i % 2), calls=HISTORY, turns=4) for i in range(4)]
    group += [R(reward=float(i % 2), calls=GOOD, turns=4) for i in range(4)]
    d = RunBuilder(store).step(1, [group]).diagnose(steps=1)
    assert value(d, "behavior.history_use_rate") == pytest.approx(0.5)
    assert value(d, "behavior.history_success_gap") == pytest.approx(0.0)
    assert "leak" not in fired(d)


def test_echo_trap_and_laziness(store: Store) -> None:
    short = [R(reward=0.0, calls=[call("submit", 0)], turns=1) for _ in range(4)]
    long = [R(reward=0.0, calls=[call("read", t) for t in range(6)], turns=6) for _ in range(4)]
    d = RunBuilder(store).step(1, [short]).step(2, [long]).diagnose(steps=2)
    assert value(d, "behavior.turns_trend") == pytest.approx(6.0)
    assert "echo_trap" in fired(d)
    assert value(d, "behavior.self_test_rate") == 0.0 and "laziness" in fired(d)


def test_no_traces_no_behavior_trace_findings(store: Store) -> None:
    d = RunBuilder(store).step(1, [live()]).diagnose(steps=1)
    assert not [f for f in d.findings if f.metric.startswith("behavior.tool")]


# -- version layer ----------------------------------------------------------------------------------
def test_consecutive_failures_along_the_lineage(store: Store) -> None:
    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    for name, parent in (("v1", "v0"), ("v2", "v1"), ("v3", "v2")):
        store.add_version(name, parent, f"versions/{name}", "x", state="rejected")
        store.update_version(name, verdict="regressed")
    d = RunBuilder(store, run_id="v3-train-1", version="v3").step(1, [live()]).diagnose(steps=1)
    assert value(d, "version.consecutive_failures") == 3.0
    assert severity(d, "version.consecutive_failures") == "critical"


# -- the workspace harness ----------------------------------------------------------------------------
def test_workspace_analyzers_and_rules_are_loaded_with_provenance(store: Store, tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "short.py").write_text(
        "from engine.harness import Finding, RuleResult, analyzer, rule\n"
        "\n"
        "@analyzer('short_answers', 'behavior')\n"
        "def short_answers(ctx):\n"
        '    (share,) = ctx.q1("SELECT avg((completion_length < 5)::INT) FROM rollouts WHERE run_id = $run")\n'
        "    return Finding('behavior.short_share', share, 'warning' if share > 0.5 else 'info')\n"
        "\n"
        "@rule('too_short', priority=0)\n"
        "def too_short(f, ctx):\n"
        "    if f.at_least('behavior.short_share', 'warning'):\n"
        "        return RuleResult('most answers are short', 'critical', ('behavior.short_share',))\n"
    )
    group = [R(reward=float(i % 2), length=3 if i < 6 else 9) for i in range(8)]
    d = RunBuilder(store).step(1, [group]).diagnose(steps=1, workspace=tmp_path)
    (f,) = [f for f in d.findings if f.metric == "behavior.short_share"]
    assert f.value == pytest.approx(6 / 8) and f.provenance == "workspace" and f.analyzer == "short_answers"
    assert d.bottleneck is not None and d.bottleneck.rule == "too_short" and d.bottleneck.provenance == "workspace"
    assert "+ workspace" in d.harness_revision


def test_a_broken_workspace_analyzer_is_a_finding_not_a_crash(store: Store, tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "oops.py").write_text(
        "from engine.harness import analyzer\n\n@analyzer('oops', 'signal')\ndef oops(ctx):\n    return 1 / 0\n"
    )
    (tmp_path / "harness" / "typo.py").write_text("def broken(:\n")
    d = RunBuilder(store).step(1, [live()]).diagnose(steps=1, workspace=tmp_path)
    broken = {f.metric: f for f in d.findings if f.metric.startswith("harness.broken")}
    oops = broken["harness.broken.oops"].explanation
    assert f"{(tmp_path / 'harness' / 'oops.py').resolve()}:5" in oops and "ZeroDivisionError" in oops
    typo = broken["harness.broken.typo"].explanation
    assert f"{(tmp_path / 'harness' / 'typo.py').resolve()}:1" in typo and "SyntaxError" in typo
    assert value(d, "signal.dead_group_ratio") == 0.0  # the built-ins still ran


# -- backtests ------------------------------------------------------------------------------------------
def test_reward_backtest_revives_the_groups_a_continuous_component_separates(store: Store) -> None:
    from engine.config import GroupFilterConfig
    from engine.grpo import MIN_KEEP_RATIO
    from engine.harness.backtest import backtest_intervention, filter_backtest, reward_backtest

    def group(correct: list[float], close: list[float]) -> list[Rollout]:
        return [R(reward=c, correctness=c, format=x) for c, x in zip(correct, close, strict=True)]

    # Four dead groups (all wrong); a second stored component (here "format") varies in exactly
    # two of them, so adding it brings two of the four dead groups back. One group is live.
    groups = [
        group([0, 0, 0, 0], [0.1, 0.5, 0.1, 0.1]),
        group([0, 0, 0, 0], [0.2, 0.2, 0.2, 0.2]),
        group([0, 0, 0, 0], [0.0, 0.9, 0.3, 0.0]),
        group([0, 0, 0, 0], [0.4, 0.4, 0.4, 0.4]),
        group([1, 0, 1, 0], [1.0, 0.3, 1.0, 0.2]),
    ]
    b = RunBuilder(store).step(1, groups)
    b.save(steps=1)
    result = reward_backtest(store, b.run_id, {"correctness": 1.0, "format": 0.5})
    assert (result.groups, result.dead_before, result.dead_after) == (5, 4 / 5, 2 / 5)
    assert result.revived == pytest.approx(2 / 4)
    news = [r["reward"] + 0.5 * dict(r["reward_components"])["format"] for r in b.rows]
    olds = [r["reward"] for r in b.rows]
    assert result.mean_shift == pytest.approx(np.mean(news) - np.mean(olds))
    from scipy.stats import spearmanr

    assert result.rank_corr_with_correctness == pytest.approx(spearmanr(news, olds).statistic)
    # The filter: with a 0.05 std threshold the four dead groups go, the live one stays.
    kept = filter_backtest(store, b.run_id, GroupFilterConfig(enabled=True, std_threshold=0.05))
    assert (kept.kept, kept.dead_after, kept.dead_before) == (1 / 5, 0.0, 4 / 5)
    # As a proposed intervention: keeping a fifth of the groups is below MIN_KEEP_RATIO, so the
    # backtest contradicts it; the reward change revives groups, so that one stands.
    settings = {"enabled": True, "std_threshold": 0.05}
    proposed = backtest_intervention(store, b.run_id, "filter", {"recipe.group_filter": settings})
    assert proposed is not None and proposed.contradicts == (kept.kept < MIN_KEEP_RATIO) is True
    rewards = {"recipe.rewards": {"correctness": 1.0, "format": 0.5}}
    assert not backtest_intervention(store, b.run_id, "reward", rewards).contradicts  # type: ignore[union-attr]
    assert backtest_intervention(store, b.run_id, "optimizer", {"recipe.learning_rate": 1e-4}) is None
    assert store.query("SELECT kind FROM backtests ORDER BY id") == [("filter",), ("reward",)]


def test_reward_backtest_rescores_missing_components_with_the_domain(store: Store) -> None:
    from engine.config import MathDomainConfig
    from engine.domains import make_domain
    from engine.harness.backtest import reward_backtest

    domain = make_domain(MathDomainConfig(train_size=10, val_size=5))
    task = domain.tasks("train")[0]
    answers = [int(task.answer) + k for k in (0, 1, 5, 20)]  # closeness 1.0, 0.9, 0.5, 0.0
    b = RunBuilder(store)
    b.step(1, [[R(reward=float(k == 0)) for k in (0, 1, 5, 20)]])
    for row, a in zip(b.rows, answers, strict=True):
        row["task_id"], row["completion"] = task.task_id, f"A:{a}"
    b.save(steps=1)
    result = reward_backtest(store, b.run_id, {"closeness": 1.0}, domain)
    assert result.rescored_components == ("closeness",)
    assert result.mean_shift == pytest.approx((1.0 + 0.9 + 0.5 + 0.0) / 4 - 1 / 4)
    with pytest.raises(ValueError, match="no domain was given"):
        reward_backtest(store, b.run_id, {"closeness": 1.0})


def test_analyzer_validation_measures_separation(store: Store) -> None:
    from engine.harness.backtest import validate_analyzer

    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    values = {"v1": ("improved", 0.1), "v2": ("improved", 0.2), "v3": ("regressed", 0.6), "v4": ("regressed", 0.15)}
    for name, (verdict, _) in values.items():
        store.add_version(name, "v0", f"versions/{name}", "x", state="trained")
        store.update_version(name, verdict=verdict)
    result = validate_analyzer(store, "signal.dead_group_ratio", lambda v: values[v][1] if v in values else None)
    # Pairs (improved, regressed): (0.1,0.6) (0.1,0.15) (0.2,0.6) (0.2,0.15): improved higher in 1 of 4.
    assert result.auc == pytest.approx(1 / 4)
    # Of the 6 ways to call two of the four values "improved", those as far from 0.5 as 1/4:
    pooled = [0.1, 0.2, 0.6, 0.15]
    aucs = [
        np.mean([(a > b) + 0.5 * (a == b) for a in (pooled[i], pooled[j]) for b in np.delete(pooled, [i, j])])
        for i, j in itertools.combinations(range(4), 2)
    ]
    assert result.p_value == pytest.approx(np.mean([abs(a - 0.5) >= 0.25 for a in aucs]))
    assert not result.separates  # two versions a side cannot show a separation (p >= 1/3)


@pytest.mark.parametrize("seed", range(5))
def test_separation_p_value_is_the_exact_mann_whitney_test(seed: int) -> None:
    from scipy.stats import mannwhitneyu

    from engine.harness.backtest import separation

    rng = np.random.default_rng(seed)
    improved, regressed = rng.normal(0.5, 1, 5), rng.normal(0, 1, 6)
    auc, p = separation(improved, regressed)
    exact = mannwhitneyu(improved, regressed, alternative="two-sided", method="exact")
    assert auc == pytest.approx(exact.statistic / (5 * 6))
    assert p == pytest.approx(exact.pvalue)


def test_solution_diversity_without_bit_masks_past_64_files(store: Store) -> None:
    # 8 rollouts x 9 files = 72 distinct files: too many for a 64-bit mask, so the sets are compared.
    edits = [[f"f{i}_{k}.py" for k in range(9)] for i in range(8)]
    edits[1] = edits[0][:3] + edits[1][3:]  # one pair shares 3 of 15 files
    group = [R(reward=0.0, calls=[call("edit", 0, files=f)], turns=1) for f in edits]
    d = RunBuilder(store).step(1, [group]).diagnose(steps=1)
    pairs = list(itertools.combinations(map(set, edits), 2))
    expected = 1 - sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs)
    assert value(d, "behavior.solution_diversity") == pytest.approx(expected)


def test_reward_flow_between_two_steps_is_a_per_task_transition_matrix(store: Store) -> None:
    from engine.harness.health import reward_flow

    b = RunBuilder(store)
    before = [1.0, 1.0, 0.0, 0.0, 1.0]
    after = [1.0, 0.0, 1.0, 0.0, 1.0]
    for step, solved in ((10, before), (20, after)):
        b.step(step, [[R(reward=x)] for x in solved], split="val")
    for row in b.rows:
        row["decoding"] = "greedy"
    b.save(steps=20)
    flow = reward_flow(store, b.run_id, b.run_id, 10, 20)
    pairs = list(zip(before, after, strict=True))
    expected = {
        f"{'solved' if x else 'unsolved'}->{'solved' if y else 'unsolved'}": pairs.count((x, y)) for x, y in set(pairs)
    }
    assert flow["matrix"] == expected and flow["regressed_tasks"] == ["t1"]


def test_one_new_shape_among_formulaic_answers_is_not_a_form_shift(store: Store) -> None:
    """Formulaic answers: every pass of the parent uses the same two shape trigrams, so its
    pass-to-pass spread of novelty is 0. The child writes one answer in a new shape among
    hundreds: sampling noise, below the share's binomial floor, so nothing counts (with a floor
    of 0 it did, and a real gain beside it was rejected as a critical form shift)."""
    tasks = sums(7, n=200)
    rng = np.random.default_rng(8)

    def sample(odd: bool) -> list[tuple[str, float]]:
        right = rng.random(len(tasks)) < 0.5
        rows = [(f"x={good};" if r else bad, float(r)) for (good, bad), r in zip(tasks, right, strict=True)]
        if odd:
            i = int(np.flatnonzero(right)[0])
            rows[i] = (f"x={tasks[i][0]}!", 1.0)
        return rows

    passes = {"v0": [sample(False) for _ in range(4)], "v1": [sample(k == 0) for k in range(4)]}
    d = evaluations(store, passes, {"v0": 0.5, "v1": 0.6})
    novelty = next(f for f in d.findings if f.metric == "version.shift.novelty")
    assert 0 < novelty.value < novelty.threshold  # type: ignore[operator]
    assert novelty.severity == "info" and "form_shift" not in fired(d)


def test_a_share_floor_is_never_below_its_sampling_noise() -> None:
    """Two passes a side of the same policy, a share near 1 read over 200 answers a pass: the
    passes often agree exactly, a pass-to-pass range of 0 makes the range-only floor 0, and noise
    counts as a shift far more often than the stated rate. With the answers counted, the floor
    keeps to that rate, and a real move (0.995 -> 0.9, four passes) counts as often as before."""
    rng = np.random.default_rng(0)
    n, draws = 200, 4000

    def passes(p: float, k: int) -> np.ndarray:
        return rng.binomial(n, p, (draws, k)) / n

    def alarms(child: np.ndarray, parent: np.ndarray, counted: bool) -> float:
        rows = (n * child.shape[1], n * parent.shape[1]) if counted else None
        shifts = [share_shift("s", list(c), list(p), rows) for c, p in zip(child, parent, strict=True)]
        return float(np.mean([s is not None and s.counts for s in shifts]))

    same, parent = passes(0.995, 2), passes(0.995, 2)
    assert alarms(same, parent, counted=False) > 4 * FLOOR_ALPHA
    assert alarms(same, parent, counted=True) <= FLOOR_ALPHA
    moved, parent = passes(0.9, 4), passes(0.995, 4)
    power = alarms(moved, parent, counted=True)
    assert power > 0.9 and power == pytest.approx(alarms(moved, parent, counted=False), abs=0.01)
    # The least floor is the binomial one, whatever the ranges say.
    shift = share_shift("s", [1.0, 1.0], [0.99, 0.99], (400, 400))
    assert shift is not None and shift.floor == pytest.approx(share_floor(0.995, 400, 400)) and not shift.counts


def _piled_lengths(rng: np.random.Generator, passes: int, scale: float = 1.0, n: int = 400) -> np.ndarray:
    """Episode lengths as a multi-turn domain writes them: spread below a cap, a fifth of them piled
    on a few lengths at it, so a pass's 90th percentile often lands on the same few values."""
    spread = np.clip(rng.normal(120, 60, (passes, n)), 10, 199).round()
    piled = rng.choice([200, 201, 202, 203, 204], size=(passes, n), p=[0.4, 0.25, 0.15, 0.1, 0.1])
    return np.where(rng.random((passes, n)) < 0.2, piled, spread) * scale


def test_a_ratio_floor_is_never_below_its_sampling_noise() -> None:
    """Two passes a side of the same policy, lengths piled at a cap: the passes' 90th percentiles
    often agree, the range-only floor is then near 0, and noise counts as a shift several times
    more often than the stated rate. With each side's sampling noise (here a bootstrap over its
    answers, an oracle independent of the analyzer's order-statistic estimate) the floor keeps to
    that rate, and a real 5% move still counts nearly always."""
    rng = np.random.default_rng(0)

    def log_p90_se(lengths: np.ndarray) -> float:
        resampled = lengths[rng.integers(0, len(lengths), (100, len(lengths)))]
        return float(np.std(np.log(np.quantile(resampled, 0.9, axis=1))))

    def alarms(scale: float, draws: int, noisy: bool) -> float:
        counted = 0
        for _ in range(draws):
            child, parent = _piled_lengths(rng, 2, scale), _piled_lengths(rng, 2)
            noise = (log_p90_se(child.ravel()), log_p90_se(parent.ravel())) if noisy else None
            shift = ratio_shift("length_p90", list(np.quantile(child, 0.9, axis=1)),
                                list(np.quantile(parent, 0.9, axis=1)), noise=noise)  # fmt: skip
            counted += shift is not None and shift.beyond_floor
        return counted / draws

    draws = 1000
    assert alarms(1.0, draws, noisy=False) > 2 * FLOOR_ALPHA
    assert alarms(1.0, draws, noisy=True) <= FLOOR_ALPHA + 3 * np.sqrt(FLOOR_ALPHA / draws)
    assert alarms(1.05, 200, noisy=True) > 0.9
    # The least floor is the noise's, whatever the ranges say.
    shift = ratio_shift("length", [100.0, 100.0], [101.0, 101.0], noise=(0.01, 0.01))
    assert shift is not None and shift.floor == pytest.approx(log_noise_floor(0.01, 0.01)) and not shift.beyond_floor


def test_a_90th_percentile_inside_its_sampling_noise_is_no_form_shift(store: Store, tmp_path: Path) -> None:
    """Through the analyzer: a child and a parent of the same policy whose passes' 90th
    percentiles differ while each side's agree (the range-only floor counts the move, as it did on
    an SWE seed's control continued 20 steps: 202.05 -> 203.00, floor 1.00x); the floor from the
    answers themselves does not. Lengths 10% longer are still a shift."""
    rng = np.random.default_rng(3)
    for _ in range(200):  # the first draw whose move the range-only floor would count
        child, parent = _piled_lengths(rng, 2), _piled_lengths(rng, 2)
        ranged = ratio_shift("p90", list(np.quantile(child, 0.9, axis=1)), list(np.quantile(parent, 0.9, axis=1)))
        if ranged is not None and ranged.beyond_floor:
            break
    else:
        pytest.fail("no draw the range-only floor counts")

    def rows(lengths: np.ndarray) -> list[list[tuple[str, float]]]:
        return [[("x" * int(n), float(i % 2)) for i, n in enumerate(one)] for one in lengths]

    d = evaluations(store, {"v0": rows(parent), "v1": rows(child)}, {"v0": 0.5, "v1": 0.6})
    p90 = next(f for f in d.findings if f.metric == "version.shift.length_p90")
    assert p90.value == pytest.approx(ranged.value)  # the same move the range-only floor counted
    assert p90.threshold is not None and abs(np.log(p90.value)) < np.log(p90.threshold), p90.explanation
    assert p90.severity == "info"
    with Store(tmp_path / "longer.duckdb") as other:
        longer = evaluations(other, {"v0": rows(parent), "v1": rows(child * 1.1)}, {"v0": 0.5, "v1": 0.6})
    assert shifts(longer)["length_p90"][1] == "warning", shifts(longer)
