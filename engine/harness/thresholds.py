"""Every line the built-in harness draws, in one table.

An analyzer grades a finding against an entry (`Threshold.grade`, `Threshold.severity`) and a rule
fires on the same entry (`Threshold.crossed`), so the severity a finding shows and the firing of
the rule that reads it cannot drift apart: there is one number, here. Each entry says what it
rests on (`basis`, `principle`) and who reads it (`readers`: ``analyzer:NAME``, ``rule:NAME`` or a
module); `tests/test_thresholds.py` holds the readers to it and greps the harness for stray
literals. `evotui report --thresholds` prints the table.

A few values are written where their meaning lives and only quoted here (`defined_in`): the
dead-group std and the keep ratio in `engine.grpo` (training and the group filter read them too),
the noise floors and the test level in `engine.harness.cutoffs`, the separation test of analyzers
in `engine.harness.backtest`, and the failure counts of the coach in the workspace's ``[coach]``
section (the analyzer reads the workspace's value).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from engine.config import CoachConfig
from engine.grpo import DEAD_STD, MIN_KEEP_RATIO
from engine.harness import backtest, cutoffs
from engine.harness.base import Severity

Op = Literal[">", ">=", "<", "<="]

#: What an entry rests on:
#: - playbook: the default of the public EvoTrainer playbook (DESIGN.md, "Diagnostics to ship");
#: - stated test: a test at a stated level (the verdict's paired bootstrap, a permutation test);
#: - noise floor: a multiple of the parent's own spread, from a stated false-alarm rate;
#: - definition: what the word means (a dead group, an accepted answer, a zero loss);
#: - floor on data: how much data a finding needs before it is computed or graded;
#: - product default: this product's choice where the playbook names the symptom but no number;
#: - workspace setting: a ``workspace.toml`` field; the value shown is its default.
Basis = Literal[
    "playbook", "stated test", "noise floor", "definition", "floor on data", "product default", "workspace setting"
]

_COMPARE: dict[Op, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


class Grade(TypedDict):
    """A finding's severity and the line it was graded against: ``Finding(..., **T.grade(x))``."""

    severity: Severity
    threshold: float


@dataclass(frozen=True)
class Threshold:
    """One line: a value crosses it when ``value <op> self.value`` (strictly, or not, as `op` says).
    An entry without `op` is a parameter of a test (its level, its false-alarm rate), not a line that
    a value is compared with."""

    name: str
    value: float
    op: Op | None
    basis: Basis
    principle: str
    readers: tuple[str, ...]
    #: The finding whose value is compared (None: a line inside a computation, e.g. what "dead" means).
    metric: str | None = None
    #: A further line, same direction: beyond it the finding is critical.
    critical: float | None = None
    #: The severity of a finding graded beyond `value` (critical at once for a line with one level);
    #: None: a condition of a rule, not a grade of a finding.
    level: Severity | None = None
    #: Where the value is written, when that is not this module (the entry quotes it).
    defined_in: str = __name__

    def crossed(self, value: float | None, critical: bool = False) -> bool:
        """Whether `value` lies beyond the line (the critical one with `critical`); None never does."""
        if self.op is None:
            raise TypeError(f"threshold {self.name!r} is a parameter of a test, not a line to cross")
        line = self.critical if critical else self.value
        return value is not None and line is not None and _COMPARE[self.op](value, line)

    def severity(self, value: float | None) -> Severity:
        if self.level is None:
            raise TypeError(f"threshold {self.name!r} is a condition of a rule, not a grade of a finding")
        if self.critical is not None and self.crossed(value, critical=True):
            return "critical"
        return self.level if self.crossed(value) else "info"

    def grade(self, value: float | None) -> Grade:
        """The severity of `value` with the line it was graded against, for a `Finding`."""
        return {"severity": self.severity(value), "threshold": self.value}

    @property
    def line(self) -> str:
        """The line in words, e.g. ``> 0.3 warning, > 0.5 critical``."""
        if self.op is None:
            return f"= {self.value:g}"
        text = f"{self.op} {self.value:g}" + (f" {self.level}" if self.level else "")
        if self.critical is not None:
            text += f", {self.op} {self.critical:g} critical"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "metric": self.metric,
            "op": self.op,
            "value": self.value,
            "critical": self.critical,
            "level": self.level,
            "basis": self.basis,
            "principle": self.principle,
            "readers": list(self.readers),
            "defined_in": self.defined_in,
        }


_PLAYBOOK = "EvoTrainer playbook default"

# -- signal layer ------------------------------------------------------------------------------------
DEAD_GROUP_STD = Threshold(
    "dead_group_std",
    DEAD_STD,
    "<",
    "definition",
    "A GRPO group whose reward std (population) is below this gives every sample the same advantage: "
    "it teaches nothing. The group filter's default std_threshold too (engine.config), and the backtests', "
    "so a backtest predicts what a run keeps.",
    ("analyzer:dead_groups", "engine.config", "engine.harness.backtest"),
    defined_in="engine.grpo.DEAD_STD",
)
DEAD_GROUPS = Threshold(
    "dead_groups",
    0.3,
    ">",
    "playbook",
    f"{_PLAYBOOK}: dead-group ratio warning > 30%, critical > 50% (graded on the last window; the "
    "insufficient_signal rule reads the whole run's ratio against the same lines).",
    ("analyzer:dead_groups", "rule:insufficient_signal", "engine.coach.interventions"),
    metric="signal.dead_group_ratio",
    critical=0.5,
    level="warning",
)
CORRECTNESS_DEAD_GROUPS = Threshold(
    "correctness_dead_groups",
    DEAD_GROUPS.value,
    ">",
    "playbook",
    f"{_PLAYBOOK}: the dead-group lines (warning > 30%, critical > 50%) read on the binary correctness "
    "component alone, over the whole run: a group whose samples are all right or all wrong gives correctness no "
    "advantage, whatever spread format or penalty components add to its total. The sparse_correctness rule reads "
    "the finding's severity.",
    ("analyzer:dead_groups",),
    metric="signal.correctness_dead_group_ratio",
    critical=DEAD_GROUPS.critical,
    level="warning",
)
DEAD_TRAINING = Threshold(
    "dead_training",
    0.95,
    ">=",
    "product default",
    "Almost every recent group dead is the same statement as a loss stuck at zero: nothing is learned.",
    ("rule:dead_training",),
    metric="signal.dead_group_ratio_recent",
    level="critical",
)
LOSS_AT_ZERO = Threshold(
    "loss_at_zero",
    1e-8,
    "<",
    "definition",
    "A |loss| and |grad_norm| below this over the last window are zero (round-off): dead training.",
    ("analyzer:optimizer",),
    metric="signal.loss_stuck_at_zero",
    level="critical",
)
REWARD_SPREAD = Threshold(
    "reward_spread",
    0.05,
    "<",
    "playbook",
    f"{_PLAYBOOK}: mean within-group reward std warning < 0.05.",
    ("analyzer:reward_spread",),
    metric="signal.reward_spread",
    level="warning",
)
REWARD_MODE_SHARE = Threshold(
    "reward_mode_share",
    0.6,
    ">",
    "product default",
    "One discrete total reward on more than this share of train rollouts leaves GRPO few advantages (the "
    "playbook's 'one discrete value dominates', no number given). The insufficient_signal rule's line, "
    "which decides; the analyzer's own 0.8 is gone.",
    ("analyzer:reward_components", "rule:insufficient_signal"),
    metric="signal.reward_mode_share",
    level="warning",
)
JUDGE_FALLBACKS = Threshold(
    "judge_fallbacks",
    0.1,
    ">",
    "product default",
    "Above this share of episodes scored by the offline rubric instead of Claude, the judge reward mixes "
    "two judges' scales: the run did not train on the judge it configured.",
    ("analyzer:judge_fallbacks",),
    metric="signal.judge_fallback_ratio",
    level="warning",
)
TRUNCATION = Threshold(
    "truncation",
    0.15,
    ">",
    "playbook",
    f"{_PLAYBOOK}: truncation rate warning > 15-20% (the lower end); critical > 30% is a product default. "
    "Graded on the last window; the truncation rule reads the finding's severity.",
    ("analyzer:truncation", "rule:truncation"),
    metric="signal.truncation_rate",
    critical=0.30,
    level="warning",
)
OUT_OF_TURNS = Threshold(
    "out_of_turns",
    0.5,
    ">",
    "definition",
    "Truncation is out of turns when most truncated episodes (more than half) took the run's domain.max_turns "
    "actions, rather than running out of tokens or ending without a submit. The out_of_turns rule reads it with "
    "the truncation finding's severity.",
    ("rule:out_of_turns",),
    metric="signal.out_of_turns_share",
)
LENGTH_REWARD_CORR = Threshold(
    "length_reward_corr",
    0.3,
    ">",
    "playbook",
    f"{_PLAYBOOK}: corr(length, reward) > 0.3 = length gaming.",
    ("analyzer:length_dynamics", "rule:length_gaming"),
    metric="signal.length_reward_corr",
    level="warning",
)
LENGTH_GROWTH = Threshold(
    "length_growth",
    1.1,
    ">",
    "product default",
    "Length gaming also needs the completions to grow: last window's mean length over the first's.",
    ("rule:length_gaming",),
    metric="signal.length_trend",
)
LENGTH_SHRINK = Threshold(
    "length_shrink",
    0.6,
    "<",
    "product default",
    "A shortcut replacing the reasoning: completions shrink below this share of their first window's length.",
    ("rule:shortcut_collapse",),
    metric="signal.length_trend",
)
ENTROPY_RATIO = Threshold(
    "entropy_ratio",
    0.5,
    "<",
    "product default",
    "Entropy collapse (the playbook names it, no number): last window's entropy below half of the first "
    "window's is a warning, below a fifth critical. exploration_collapse fires on the warning line.",
    ("analyzer:optimizer", "rule:exploration_collapse"),
    metric="signal.entropy_ratio",
    critical=0.2,
    level="warning",
)
KL_SPIKE = Threshold(
    "kl_spike",
    5.0,
    ">",
    "product default",
    "A KL spike (the playbook names it, no number): the run's peak KL over its median.",
    ("analyzer:optimizer",),
    metric="signal.kl_spike",
    level="warning",
)
CLIP_RATIO = Threshold(
    "clip_ratio",
    0.2,
    ">",
    "product default",
    "Mean share of tokens clipped by the PPO ratio (TRL's clip_ratio/region_mean): the updates are too large.",
    ("analyzer:optimizer",),
    metric="signal.clip_ratio",
    level="warning",
)
UPDATE_DRIFT = Threshold(
    "update_drift",
    1.0,
    "<",
    "stated test",
    "How far a per-step metric moved over a run against its own step-to-step noise: the t statistic of its "
    "least-squares slope on the step, in units of the two-sided critical value at the verdict's level "
    "(cutoffs.LEVEL, Student's t with steps - 2 degrees of freedom). Below 1 the drift is inside its noise. "
    "small_updates fires when entropy's and the reward's (signal.reward_drift) both are, while groups have reward "
    "spread: the policy barely moved.",
    ("rule:small_updates",),
    metric="signal.entropy_drift",
)
FILTER_KEEP_RATIO = Threshold(
    "filter_keep_ratio",
    MIN_KEEP_RATIO,
    "<",
    "playbook",
    f"{_PLAYBOOK}: filter keep ratio < 30% = over-filtering. A filter backtest predicting less is contradicted.",
    ("analyzer:optimizer", "rule:over_filtering", "engine.harness.backtest"),
    metric="signal.filter_keep_ratio",
    defined_in="engine.grpo.MIN_KEEP_RATIO",
    level="warning",
)
REWARD_RISE = Threshold(
    "reward_rise",
    0.05,
    ">=",
    "product default",
    "Reward hacking needs the shaped total reward to rise at least this much (last window minus first).",
    ("rule:reward_hacking",),
    metric="signal.reward_trend",
)

# -- score layer: correctness that does not follow ---------------------------------------------------
HACKING_NO_GAIN = Threshold(
    "hacking_no_gain",
    0.01,
    "<=",
    "product default",
    "Reward hacking: binary train correctness flat or falling while the shaped reward rises.",
    ("rule:reward_hacking",),
    metric="score.train_correctness_trend",
)
LAZINESS_NO_GAIN = Threshold(
    "laziness_no_gain",
    0.02,
    "<=",
    "product default",
    "Laziness: fewer tests or giving up, with train correctness gaining no more than this.",
    ("rule:laziness",),
    metric="score.train_correctness_trend",
)
SHORTCUT_NO_GAIN = Threshold(
    "shortcut_no_gain",
    0.1,
    "<=",
    "product default",
    "Shortcut collapse: completions shrink and become alike without a train correctness gain above this.",
    ("rule:shortcut_collapse",),
    metric="score.train_correctness_trend",
)
SUBSET_MIN_TASKS = Threshold(
    "subset_min_tasks",
    10,
    ">=",
    "floor on data",
    "A val subset never solved is a warning only over at least this many greedy tasks.",
    ("analyzer:subsets",),
    metric="score.subset.*",
    level="warning",
)

# -- behavior layer ----------------------------------------------------------------------------------
DIVERSITY_DROP = Threshold(
    "diversity_drop",
    -0.1,
    "<",
    "product default",
    "Group samples becoming alike: distinct completions per group fell by more than 0.1 (last window minus first).",
    ("rule:exploration_collapse", "rule:shortcut_collapse"),
    metric="behavior.completion_diversity_trend",
)
EDIT_FAILURES = Threshold(
    "edit_failures",
    0.15,
    ">",
    "playbook",
    f"{_PLAYBOOK}: poor edit quality = edit failures > 15%. The rule reads the finding's severity.",
    ("analyzer:tool_use", "rule:poor_edit_quality"),
    metric="behavior.edit_failure_rate",
    level="warning",
)
SELF_TEST = Threshold(
    "self_test",
    0.5,
    "<",
    "playbook",
    f"{_PLAYBOOK}: self-test rate warning < 50%. The laziness rule reads the finding's severity.",
    ("analyzer:habits", "rule:laziness"),
    metric="behavior.self_test_rate",
    level="warning",
)
TURNS_GIVING_UP = Threshold(
    "turns_giving_up",
    5.0,
    "<",
    "playbook",
    f"{_PLAYBOOK}: mean turns < 5 is critical (giving up).",
    ("analyzer:turns", "rule:laziness"),
    metric="behavior.turns_mean",
    level="critical",
)
TURNS_ECHO_TRAP = Threshold(
    "turns_echo_trap",
    50.0,
    ">",
    "playbook",
    f"{_PLAYBOOK}: mean turns > 50 is critical (an echo trap).",
    ("analyzer:turns", "rule:echo_trap"),
    metric="behavior.turns_mean",
    level="critical",
)
TURNS_GROWTH = Threshold(
    "turns_growth",
    1.5,
    ">",
    "product default",
    "An echo trap in the making: last window's mean turns over the first's (the playbook's 'turns rising').",
    ("rule:echo_trap",),
    metric="behavior.turns_trend",
)
SOLUTION_DIVERSITY = Threshold(
    "solution_diversity",
    0.15,
    "<",
    "playbook",
    f"{_PLAYBOOK}: solution diversity (1 - mean pairwise Jaccard of edited-file sets in a group) "
    "warning < 15%. exploration_collapse reads the finding's severity.",
    ("analyzer:solution_diversity", "rule:exploration_collapse"),
    metric="behavior.solution_diversity",
    level="warning",
)
FORMAT_VIOLATIONS = Threshold(
    "format_violations",
    0.2,
    ">",
    "product default",
    "Share of completions failing the domain's format check (the playbook's format gate, no number). "
    "The format_gate rule reads the finding's severity.",
    ("analyzer:format", "rule:format_gate"),
    metric="behavior.format_violation_rate",
    level="warning",
)
HISTORY_USE = Threshold(
    "history_use",
    0.05,
    ">=",
    "product default",
    "A leak read from behavior needs at least this share of rollouts using history commands...",
    ("rule:leak",),
    metric="behavior.history_use_rate",
)
HISTORY_SUCCESS_GAP = Threshold(
    "history_success_gap",
    0.3,
    ">=",
    "product default",
    "... and their success at least this much above the rollouts that did not (the playbook's 'success "
    "concentrates in rollouts that used them').",
    ("rule:leak",),
    metric="behavior.history_success_gap",
)

# -- version layer -----------------------------------------------------------------------------------
LEAK_GAIN_SHARE = Threshold(
    "leak_gain_share",
    0.5,
    ">=",
    "product default",
    "A leak read from the clean protocol: the val - clean gap grew beyond noise (its paired interval above "
    "0, at paired_test_level) by at least this share of the val gain.",
    ("rule:leak",),
    metric="version.clean_gap_delta",
)
ACCEPTED = Threshold(
    "accepted",
    0.5,
    ">=",
    "definition",
    "An answer the verifier accepts: its correctness reward at least this (binary rewards are 0 or 1; a "
    "pass fraction counts from a half).",
    ("analyzer:verifier_audit", "analyzer:answer_agreement"),
)
PAIRED_TEST_LEVEL = Threshold(
    "paired_test_level",
    cutoffs.LEVEL,
    None,
    "stated test",
    "The verdict's paired bootstrap over val tasks (engine.verdict.paired_bootstrap), 95%: a gain counts "
    "when its interval lies above 0. The audit and the agreement findings and the clean-protocol leak test "
    "read a gain with it, so a version is blocked only for a gain the verdict itself would call one.",
    ("analyzer:verifier_audit", "analyzer:answer_agreement", "analyzer:clean_protocol", "rule:leak"),
    defined_in="engine.harness.cutoffs.LEVEL",
)
FORM_SHIFT_FALSE_ALARM = Threshold(
    "form_shift_false_alarm",
    cutoffs.FLOOR_ALPHA,
    None,
    "noise floor",
    "A form feature's shift counts beyond the parent's own spread: floor_multiplier x the larger "
    "pass-to-pass range, the multiple pure noise exceeds with this probability (5% per version over the "
    "eight features, Bonferroni); a share's floor is never below its binomial noise at the same rate.",
    ("analyzer:form_vs_parent", "rule:form_shift"),
    metric="version.shift.*",
    defined_in="engine.harness.cutoffs.FLOOR_ALPHA",
)
FORM_MIN_CORRECT = Threshold(
    "form_min_correct",
    cutoffs.MIN_CORRECT,
    ">=",
    "floor on data",
    "Correct completions each version needs before the features read from correct answers alone are "
    "computed (fewer, and one odd answer moves a mean).",
    ("analyzer:form_vs_parent",),
    metric="version.shift.*",
    defined_in="engine.harness.cutoffs.MIN_CORRECT",
)
GATES_AFTER_FAILURES = Threshold(
    "gates_after_failures",
    CoachConfig.model_fields["gates_after_failures"].default,
    ">=",
    "workspace setting",
    "[coach] gates_after_failures: consecutive failures after which every gate is forced; the finding warns "
    "from the workspace's value.",
    ("analyzer:lineage", "engine.coach"),
    metric="version.consecutive_failures",
    defined_in="engine.config.CoachConfig.gates_after_failures",
    level="warning",
)
ESCALATE_AFTER = Threshold(
    "escalate_after",
    CoachConfig.model_fields["escalate_after"].default,
    ">=",
    "workspace setting",
    "[coach] escalate_after: consecutive failures after which the coach escalates; the finding is critical "
    "from the workspace's value.",
    ("analyzer:lineage", "engine.coach"),
    metric="version.consecutive_failures",
    level="critical",
    defined_in="engine.config.CoachConfig.escalate_after",
)
ANALYZER_SEPARATION = Threshold(
    "analyzer_separation",
    backtest.MIN_SEPARATION,
    ">=",
    "product default",
    "Harness evolution adopts an analyzer when |AUC - 0.5| between the versions judged improved and "
    "regressed is at least this...",
    ("engine.harness.backtest", "engine.coach.evolution"),
    defined_in="engine.harness.backtest.MIN_SEPARATION",
)
SEPARATION_ALPHA = Threshold(
    "separation_alpha",
    backtest.SEPARATION_ALPHA,
    "<=",
    "stated test",
    "... and the AUC's two-sided permutation p-value is at most this (divided by the specs tried together, "
    "Bonferroni)...",
    ("engine.harness.backtest", "engine.coach.evolution"),
    defined_in="engine.harness.backtest.SEPARATION_ALPHA",
)
SEPARATION_MIN_PER_SIDE = Threshold(
    "separation_min_per_side",
    backtest.MIN_PER_SIDE,
    ">=",
    "floor on data",
    "... over at least this many judged versions a side (fewer: a permutation test has too few arrangements).",
    ("engine.harness.backtest",),
    defined_in="engine.harness.backtest.MIN_PER_SIDE",
)

#: The table, in the order the layers are read.
THRESHOLDS: tuple[Threshold, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Threshold))
BY_NAME: dict[str, Threshold] = {t.name: t for t in THRESHOLDS}
