"""Built-in rules: each combines findings into a named, explained statement about the bottleneck
and names the kinds of intervention worth proposing. Priority orders them when several fire."""

from __future__ import annotations

from collections.abc import Sequence

from engine.harness.base import Context, Finding, Findings, RuleResult, rule
from engine.harness.thresholds import (
    DEAD_GROUPS,
    DEAD_TRAINING,
    DIVERSITY_DROP,
    ENTROPY_RATIO,
    FILTER_KEEP_RATIO,
    HACKING_NO_GAIN,
    HISTORY_SUCCESS_GAP,
    HISTORY_USE,
    LAZINESS_NO_GAIN,
    LEAK_GAIN_SHARE,
    LENGTH_GROWTH,
    LENGTH_REWARD_CORR,
    LENGTH_SHRINK,
    OUT_OF_TURNS,
    REWARD_MODE_SHARE,
    REWARD_RISE,
    SHORTCUT_NO_GAIN,
    TURNS_ECHO_TRAP,
    TURNS_GIVING_UP,
    TURNS_GROWTH,
    UPDATE_DRIFT,
)

#: Rules that, firing critical, stand against a promotion: the gain may come from the wrong thing
#: (a leak, a form the verifier mistakes for skill, a shaped reward) or the policy collapsed. The
#: other rules name bottlenecks (truncation, too little signal, ...): what to change next, not a
#: reason to distrust a measured gain. The coach's decision and the benchmark's check read this.
BLOCKING_RULES = frozenset(
    {
        "leak",
        "stopped_early",
        "form_shift",
        "reward_hacking",
        "exploration_collapse",
        "verifier_audit",
        "answer_agreement",
        "workspace_critical",
    }
)


def is_blocking(rule: str, severity: str) -> bool:
    return rule in BLOCKING_RULES and severity == "critical"


@rule(
    "leak",
    priority=1,
    candidate_kinds=("environment: remove the answer from history", "evaluation: clean protocol"),
)
def leak(f: Findings, ctx: Context) -> RuleResult | None:
    """The score may not be the skill: success concentrates in rollouts that read history, or the
    version's val gain is (mostly) not reproduced in the clean environment."""
    share, gap = f.value("behavior.history_use_rate"), f.value("behavior.history_success_gap")
    if HISTORY_USE.crossed(share) and HISTORY_SUCCESS_GAP.crossed(gap):
        return RuleResult(
            f"{share:.0%} of rollouts used history commands and they succeed {gap:+.2f} more often: "
            "the policy may be copying the fix from history",
            "critical",
            ("behavior.history_use_rate", "behavior.history_success_gap"),
        )
    grew, low = f.value("version.clean_gap_delta"), f.value("version.clean_gap_delta_low")
    gain = f.value("version.delta_to_parent", 0.0) or 0.0
    # The gap grew beyond noise (its interval above 0) and accounts for LEAK_GAIN_SHARE of the val gain.
    if grew is None or low is None or low <= 0 or grew < LEAK_GAIN_SHARE.value * gain:
        return None
    return RuleResult(
        f"val correctness moved {gain:+.3f} vs the parent, but the val - clean gap grew {grew:+.3f} "
        f"(95% interval above {low:+.3f}): the gain is read from the leaked history, not earned",
        "critical",
        ("version.clean_gap_delta", "version.clean_gap", "version.delta_to_parent"),
    )


@rule(
    "verifier_audit",
    priority=1,
    candidate_kinds=("reward: fix the verifier", "reward: exact-answer check"),
)
def verifier_audit(f: Findings, ctx: Context) -> RuleResult | None:
    """The version's val gain is the verifier's alone: re-checked against the tasks' reference
    answers, it is not a gain (`version.audit.gain`, critical; `engine.harness.analyzers.audit`)."""
    finding = f.get("version.audit.gain")
    if finding is None or finding.severity != "critical":
        return None
    return RuleResult(finding.explanation, "critical", ("version.audit.gain", "version.audit.refused_share"))


@rule(
    "answer_agreement",
    priority=1,
    candidate_kinds=("reward: fix the verifier", "reward: exact-answer check"),
)
def answer_agreement(f: Findings, ctx: Context) -> RuleResult | None:
    """The version's val gain rests on accepted answers that disagree with each other or with the
    answers its parent had accepted on the same tasks (`version.agreement.*`, critical;
    `engine.harness.analyzers.agreement`)."""
    critical = [x for x in (f.get("version.agreement.self"), f.get("version.agreement.parent")) if x is not None]
    critical = [x for x in critical if x.severity == "critical"]
    if not critical:
        return None
    return RuleResult("; ".join(x.explanation for x in critical), "critical", tuple(x.metric for x in critical))


#: The findings that test a gain directly (a second reading of the same answers); where one of
#: them ran and passed, a symptom alone (a form shift, a probe of the investigation) no longer
#: blocks: it is reported beside them.
DIRECT_TESTS = ("version.audit.gain", "version.agreement.self", "version.agreement.parent")


def direct_tests_passed(findings: Sequence[Finding]) -> list[str]:
    """The direct tests of the gain that ran on these findings and found it sound."""
    by_metric = {f.metric: f for f in findings}
    return [m for m in DIRECT_TESTS if (x := by_metric.get(m)) is not None and x.severity == "info"]


@rule(
    "stopped_early",
    priority=1,
    candidate_kinds=("reward: remove or cap the shaped component", "optimizer: lower learning_rate"),
)
def stopped_early(f: Findings, ctx: Context) -> RuleResult | None:
    """The collapse guard ended the run: the policy was collapsing into one-step episodes."""
    stop = f.get("behavior.stopped_early")
    if stop is None:
        return None
    return RuleResult(stop.explanation, "critical", ("behavior.stopped_early",))


@rule(
    "dead_training",
    priority=2,
    candidate_kinds=("optimizer: learning_rate", "reward: continuous correctness"),
)
def dead_training(f: Findings, ctx: Context) -> RuleResult | None:
    """Nothing is learned: loss and gradient stuck at zero, or (almost) every group dead."""
    stuck = f.value("signal.loss_stuck_at_zero", 0.0) == 1.0
    dead = f.value("signal.dead_group_ratio_recent", 0.0) or 0.0
    if not stuck and not DEAD_TRAINING.crossed(dead):
        return None
    why = "loss and gradient are zero" if stuck else f"{dead:.0%} of recent groups have no reward spread"
    return RuleResult(f"dead training: {why}", "critical", ("signal.loss_stuck_at_zero", "signal.dead_group_ratio"))


@rule(
    "insufficient_signal",
    priority=3,
    candidate_kinds=(
        "reward: continuous correctness",
        "reward: add a judge or auxiliary signal",
        "data: drop hopeless prompts",
    ),
)
def insufficient_signal(f: Findings, ctx: Context) -> RuleResult | None:
    """Many dead groups and one reward value dominating: GRPO has few advantages to learn from."""
    dead, mode = f.value("signal.dead_group_ratio"), f.value("signal.reward_mode_share")
    severity = DEAD_GROUPS.severity(dead)
    if severity == "info" or not REWARD_MODE_SHARE.crossed(mode):
        return None
    return RuleResult(
        f"{dead:.0%} of groups are dead and {mode:.0%} of rollouts share one reward value: "
        "make the reward continuous or add a signal",
        severity,
        ("signal.dead_group_ratio", "signal.reward_mode_share"),
    )


@rule(
    "sparse_correctness",
    priority=8,
    candidate_kinds=("reward: continuous correctness (partial credit)", "optimizer: num_generations"),
)
def sparse_correctness(f: Findings, ctx: Context) -> RuleResult | None:
    """Binary correctness leaves many groups without spread (all right or all wrong), whatever the
    other components add to the total reward: the dead-group lines read on correctness alone
    (`signal.correctness_dead_group_ratio`; the finding's severity). insufficient_signal reads the
    total reward, which a format or penalty component keeps alive while correctness teaches nothing.
    Its priority comes after truncation, out_of_turns and format_gate: an answer cut short or
    unreadable scores 0 on correctness, so those failures make correctness sparse, not the other
    way round, and at the same severity the cause leads."""
    finding = f.get("signal.correctness_dead_group_ratio")
    if finding is None or finding.severity == "info":
        return None
    return RuleResult(
        f"{finding.value:.0%} of groups have no spread in binary correctness: partial credit would give them one",
        finding.severity,
        ("signal.correctness_dead_group_ratio", "signal.dead_group_ratio"),
    )


@rule("reward_hacking", priority=4, candidate_kinds=("reward: remove or cap the shaped component",))
def reward_hacking(f: Findings, ctx: Context) -> RuleResult | None:
    """The shaped total reward rises while binary correctness is flat or falling."""
    reward, correct = f.value("signal.reward_trend"), f.value("score.train_correctness_trend")
    if not (REWARD_RISE.crossed(reward) and HACKING_NO_GAIN.crossed(correct)):
        return None
    return RuleResult(
        f"total reward {reward:+.3f} while correctness {correct:+.3f}: the policy is paid for something else",
        "critical",
        ("signal.reward_trend", "score.train_correctness_trend"),
    )


@rule("exploration_collapse", priority=5, candidate_kinds=("optimizer: temperature", "optimizer: epsilon_high"))
def exploration_collapse(f: Findings, ctx: Context) -> RuleResult | None:
    """Entropy collapses while samples of a group become alike (or solution diversity is low)."""
    entropy = f.value("signal.entropy_ratio")
    diversity_drop = f.value("behavior.completion_diversity_trend", 0.0) or 0.0
    low_solutions = f.at_least("behavior.solution_diversity", "warning")
    if not ENTROPY_RATIO.crossed(entropy) or not (DIVERSITY_DROP.crossed(diversity_drop) or low_solutions):
        return None
    return RuleResult(
        f"entropy fell to {entropy:.0%} of its start and group samples became alike",
        "critical",
        ("signal.entropy_ratio", "behavior.completion_diversity_trend", "behavior.solution_diversity"),
    )


@rule(
    "shortcut_collapse",
    priority=5,
    candidate_kinds=("optimizer: KL anchor to the parent", "optimizer: lower learning rate"),
)
def shortcut_collapse(f: Findings, ctx: Context) -> RuleResult | None:
    """Completions shrink and become alike without a matching gain: the policy is dropping its
    reasoning for a shortcut (answering at once), which GRPO rewards whenever the shortcut is
    sometimes right. Entropy need not fall, so exploration_collapse does not see it."""
    gain = f.value("score.train_correctness_trend", 0.0) or 0.0
    length, diversity = f.value("signal.length_trend"), f.value("behavior.completion_diversity_trend")
    if LENGTH_SHRINK.crossed(length) and DIVERSITY_DROP.crossed(diversity) and SHORTCUT_NO_GAIN.crossed(gain):
        return RuleResult(
            f"completions shrank to {length:.0%} of their length and group diversity fell {-diversity:.2f} "
            f"while train correctness moved {gain:+.2f}: a shortcut is replacing the reasoning",
            "warning",
            ("signal.length_trend", "behavior.completion_diversity_trend", "score.train_correctness_trend"),
        )
    return None


@rule(
    "form_shift",
    priority=2,
    candidate_kinds=("optimizer: KL anchor to the parent", "optimizer: lower learning rate"),
)
def form_shift(f: Findings, ctx: Context) -> RuleResult | None:
    """The form of the val answers moved from the parent's beyond the parent's own seed-to-seed
    spread (`version.shift.*`, cut-offs in `engine.harness.cutoffs`). With a higher val score it is
    critical where nothing tests the gain directly (no audit, no agreement: code, SWE, open text):
    a gain that comes with a new form of answer is a verifier being learned until shown otherwise.
    Where the audit or the agreement of answers ran and found the gain sound, the shift is a
    warning, reported beside them: form moves with the score itself (a chain no longer cut by the
    budget is longer), so it cannot convict a gain that a second reading confirms. Without a gain
    it is a warning (a shortcut replacing the reasoning is one such shift: shorter, alike)."""
    shifted = [x for x in f.all if x.metric.startswith("version.shift.") and x.severity != "info"]
    if not shifted:
        return None
    delta = f.value("version.delta_to_parent", 0.0) or 0.0
    what = "; ".join(x.explanation for x in shifted)
    metrics = tuple(x.metric for x in shifted)
    tested = direct_tests_passed(f.all)
    if delta > 0 and tested:
        return RuleResult(
            f"val correctness rose {delta:+.3f} while the form of the answers shifted: {what}. "
            f"The gain survives the direct tests ({', '.join(tested)}), so the shift is reported, not blocking",
            "warning",
            (*metrics, *tested),
        )
    if delta > 0:
        return RuleResult(
            f"val correctness rose {delta:+.3f} while the form of the answers shifted: {what}. "
            "A gain that comes with a new form of answer is suspect until shown to be skill",
            "critical",
            (*metrics, "version.delta_to_parent"),
        )
    return RuleResult(f"the form of the answers shifted for {delta:+.3f} val correctness: {what}", "warning", metrics)


@rule("workspace_critical", priority=1, candidate_kinds=("evaluation: clean protocol",))
def workspace_critical(f: Findings, ctx: Context) -> RuleResult | None:
    """A critical finding of an analyzer from the workspace's own harness (one a person wrote, or
    one harness evolution adopted because it separated past versions): it blocks like a built-in
    critical rule, so an adopted analyzer is one that can stop a version."""
    critical = [x for x in f.all if x.provenance == "workspace" and x.severity == "critical"]
    if not critical:
        return None
    return RuleResult("; ".join(x.explanation for x in critical), "critical", tuple(x.metric for x in critical))


@rule("out_of_turns", priority=6, candidate_kinds=("budget: domain.max_turns",))
def out_of_turns(f: Findings, ctx: Context) -> RuleResult | None:
    """Truncation (the truncation finding's severity) where most truncated episodes ran out of their
    turns, not of tokens (`signal.out_of_turns_share`): the turn limit, not the completion budget,
    cuts them. Registered before `truncation`, so that at the same priority and severity the more
    specific reading of the same finding leads."""
    finding, share = f.get("signal.truncation_rate"), f.value("signal.out_of_turns_share")
    if finding is None or finding.severity == "info" or not OUT_OF_TURNS.crossed(share):
        return None
    return RuleResult(
        f"{finding.value:.0%} of episodes are truncated and {share:.0%} of those ran out of turns",
        finding.severity,
        ("signal.truncation_rate", "signal.out_of_turns_share"),
    )


@rule("truncation", priority=6, candidate_kinds=("budget: max_completion_length", "reward: length-aware format"))
def truncation(f: Findings, ctx: Context) -> RuleResult | None:
    """Completions hit the length budget often enough to cost reward."""
    finding = f.get("signal.truncation_rate")
    if finding is None or finding.severity == "info":
        return None
    return RuleResult(
        f"{finding.value:.0%} of completions are truncated", finding.severity, ("signal.truncation_rate",)
    )


@rule("format_gate", priority=7, candidate_kinds=("reward: format weight", "reward: format gate"))
def format_gate(f: Findings, ctx: Context) -> RuleResult | None:
    """Many completions fail the format check, so correct answers go unrewarded."""
    finding = f.get("behavior.format_violation_rate")
    if finding is None or finding.severity == "info":
        return None
    return RuleResult(
        f"{finding.value:.0%} of completions fail the format check",
        "warning",
        ("behavior.format_violation_rate",),
    )


@rule("length_gaming", priority=8, candidate_kinds=("reward: length penalty", "optimizer: loss_type"))
def length_gaming(f: Findings, ctx: Context) -> RuleResult | None:
    """Reward correlates with length and length grows: the policy may be paid for being long."""
    corr, growth = f.value("signal.length_reward_corr"), f.value("signal.length_trend")
    if not (LENGTH_REWARD_CORR.crossed(corr) and LENGTH_GROWTH.crossed(growth)):
        return None
    return RuleResult(
        f"corr(length, reward) {corr:.2f} and length x{growth:.2f}",
        "warning",
        ("signal.length_reward_corr", "signal.length_trend"),
    )


@rule("over_filtering", priority=9, candidate_kinds=("filter: lower the std threshold",))
def over_filtering(f: Findings, ctx: Context) -> RuleResult | None:
    keep = f.value("signal.filter_keep_ratio")
    if not FILTER_KEEP_RATIO.crossed(keep):
        return None
    return RuleResult(f"the group filter keeps only {keep:.0%} of groups", "warning", ("signal.filter_keep_ratio",))


@rule("echo_trap", priority=10, candidate_kinds=("budget: max turns", "environment: observation format"))
def echo_trap(f: Findings, ctx: Context) -> RuleResult | None:
    """Episodes get longer and longer (or beyond the echo-trap line): the policy repeats itself."""
    mean, trend = f.value("behavior.turns_mean"), f.value("behavior.turns_trend")
    if mean is None or not (TURNS_ECHO_TRAP.crossed(mean) or TURNS_GROWTH.crossed(trend)):
        return None
    return RuleResult(
        f"{mean:.1f} turns per episode, x{trend or 1:.2f} over the run", "warning", ("behavior.turns_mean",)
    )


@rule(
    "laziness",
    priority=11,
    candidate_kinds=("reward: edit-then-test component", "reward: search-before-edit"),
)
def laziness(f: Findings, ctx: Context) -> RuleResult | None:
    """Fewer tool calls and self-tests, and no gain in correctness."""
    self_test = f.at_least("behavior.self_test_rate", "warning")
    turns = f.value("behavior.turns_mean")
    giving_up = f.at_least("behavior.turns_mean", "critical") and TURNS_GIVING_UP.crossed(turns)
    gain = f.value("score.train_correctness_trend", 0.0) or 0.0
    if not (self_test or giving_up) or not LAZINESS_NO_GAIN.crossed(gain):
        return None
    return RuleResult(
        "the policy tests little or gives up early and correctness does not improve",
        "warning",
        ("behavior.self_test_rate", "behavior.turns_mean", "score.train_correctness_trend"),
    )


@rule("poor_edit_quality", priority=12, candidate_kinds=("environment: edit tool feedback", "data: easier bugs"))
def poor_edit_quality(f: Findings, ctx: Context) -> RuleResult | None:
    finding = f.get("behavior.edit_failure_rate")
    if finding is None or finding.severity == "info":
        return None
    return RuleResult(f"{finding.value:.0%} of edits fail", "warning", ("behavior.edit_failure_rate",))


@rule("small_updates", priority=13, candidate_kinds=("optimizer: raise learning_rate",))
def small_updates(f: Findings, ctx: Context) -> RuleResult | None:
    """The policy barely moved: over the run its entropy and its reward drifted no more than their
    step-to-step noise (`signal.entropy_drift`, `signal.reward_drift`: the slope's t statistic in
    units of its critical value), while its groups had reward spread to learn from."""
    entropy, reward = f.value("signal.entropy_drift"), f.value("signal.reward_drift")
    spread = f.get("signal.reward_spread")
    if not (UPDATE_DRIFT.crossed(entropy) and UPDATE_DRIFT.crossed(reward)) or spread is None:
        return None
    if spread.severity != "info":  # no spread: nothing to learn from, a larger step would not help
        return None
    return RuleResult(
        f"entropy and reward drifted {entropy:.2f} and {reward:.2f} critical values over the run (inside their"
        f" noise) though groups had a reward spread of {spread.value:.3f}: the steps may be too small",
        "warning",
        ("signal.entropy_drift", "signal.reward_drift", "signal.reward_spread"),
    )
