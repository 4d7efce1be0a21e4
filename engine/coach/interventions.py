"""The intervention catalog: typed single-factor changes of a version's workspace.toml.

An intervention (Δ) changes one *factor* of the parent's configuration: one optimizer knob, the
reward composition, the group filter, the data mix, a budget, or the evaluation protocol. Each
carries a hypothesis, a falsifiable success criterion and a rollback. Applying one gives the
child's `workspace.toml` text, validated like any workspace file, which `Engine.create_version`
commits on a new version branch.

Templates (`CATALOG`) are what the offline planner proposes from; a model backend may propose
any change of the same shape, and `check()` holds both to the same rules.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.config import WorkspaceConfig, parse_config
from engine.domains import reward_component_names
from engine.grpo import DEAD_STD
from engine.harness.thresholds import DEAD_GROUPS
from engine.store import Store

Kind = Literal["reward", "filter", "optimizer", "data", "budget", "environment", "evaluation"]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]

#: Paths under these prefixes are one factor together (a reward *composition*, a filter *setting*).
FACTOR_GROUPS = ("recipe.rewards", "recipe.group_filter")

#: Layer of the harness an intervention kind mainly acts on (escalation switches layers).
KIND_LAYER = {
    "reward": "signal",
    "filter": "signal",
    "optimizer": "signal",
    "data": "score",
    "budget": "behavior",
    "environment": "behavior",
    "evaluation": "score",
}

DEFAULT_CRITERION = "val correctness (greedy or sampled) rises with its 95% paired-bootstrap interval above 0"


#: The template name of a round's control: the parent trained on with no change.
CONTROL = "control"


def control(steps: int) -> Intervention:
    """The round's control: the parent trained `steps` more steps with nothing changed. Its gain
    over the parent is what training longer buys; the round's other branches are credited with
    their gain over it, not over the parent."""
    return Intervention(
        kind="budget",
        changes={},
        hypothesis=f"If the parent trains {steps} more steps with no change, val correctness rises: training longer"
        " is an intervention too, and the round's other branches are credited with their gain over it",
        rollback="keep the parent",
        evidence=["control: every round continues its parent unchanged once"],
        template=CONTROL,
        source=CONTROL,
    )


class InterventionError(ValueError):
    """A proposed intervention that cannot be applied: says which field and why."""


class Intervention(BaseModel):
    """One proposed change of a version (what a planner or a model proposes)."""

    model_config = ConfigDict(extra="forbid")

    kind: Kind
    changes: dict[str, Any] = Field(
        description="Dotted workspace.toml paths -> new values, e.g. {'recipe.learning_rate': 4e-5}; empty only"
        " for the round's control."
    )
    hypothesis: str = Field(min_length=1, description="If X then Y, because Z.")
    success_criterion: str = DEFAULT_CRITERION
    rollback: str = "keep the parent; this branch stays as negative evidence"
    evidence: list[str] = Field(default_factory=list, description="Rules and findings the proposal rests on.")
    template: str = Field("", description="Catalog template it came from ('' when written by a model).")
    source: str = Field("planner", description="planner, skill:<id>, case, feedback or model.")

    @model_validator(mode="after")
    def _one_change_at_least(self) -> Intervention:
        if not self.changes and self.template != CONTROL:
            raise ValueError("changes: an intervention changes at least one path (only the control changes none)")
        return self

    @property
    def is_control(self) -> bool:
        return self.template == CONTROL

    @property
    def factors(self) -> list[str]:
        """The distinct factors the change touches (a reward composition counts as one)."""
        out: dict[str, None] = {}
        for path in self.changes:
            group = next((g for g in FACTOR_GROUPS if path == g or path.startswith(g + ".")), path)
            out[group] = None
        return list(out)

    @property
    def factor(self) -> str:
        return ", ".join(self.factors) or CONTROL

    def title(self, parent: WorkspaceConfig | None = None) -> str:
        if self.is_control:
            return f"{CONTROL}: the parent trained on, no change"
        before = _flatten(parent.model_dump(mode="json")) if parent is not None else {}
        parts = []
        for path, value in self.changes.items():
            old = before.get(path, "unset") if parent is not None else None
            parts.append(f"{path} {old!r} -> {value!r}" if parent is not None else f"{path} = {value!r}")
        return f"{self.kind}: " + ", ".join(parts)


def check(iv: Intervention) -> None:
    """Refuse multi-factor changes that cite no evidence (DESIGN: one factor per version)."""
    if len(iv.factors) > 1 and not iv.evidence:
        raise InterventionError(
            f"intervention changes {len(iv.factors)} factors ({iv.factor}) without evidence; "
            "propose one factor, or cite the findings that justify changing them together"
        )


def apply(iv: Intervention, parent_text: str, source: Path, root: Path | None = None) -> tuple[str, WorkspaceConfig]:
    """The child's workspace.toml text and its validated config. Raises InterventionError naming
    the path or field that is wrong."""
    check(iv)
    text = edit_toml(parent_text, iv.changes)
    try:
        config = parse_config(text, source, root)
    except Exception as exc:  # WorkspaceConfigError names the field; keep its message
        raise InterventionError(f"intervention {iv.title()} gives an invalid workspace.toml: {exc}") from None
    return text, config


def edit_toml(text: str, edits: Mapping[str, Any]) -> str:
    """TOML `text` with each dotted path of `edits` set to its value (None removes the key);
    tables on the way are created. Raises InterventionError when a path runs through a value."""
    data = tomllib.loads(text)
    for path, value in edits.items():
        *tables, last = path.split(".")
        node = data
        for key in tables:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise InterventionError(f"cannot set {path!r}: {key!r} is a value, not a table")
            node = child
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return tomli_w.dumps(data)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name != "recipe.rewards":
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_changes(old: WorkspaceConfig, new: WorkspaceConfig) -> dict[str, dict[str, Any]]:
    """Every dotted path whose value differs, as ``{path: {"from": a, "to": b}}``."""
    a = _flatten(old.model_dump(mode="json"))
    b = _flatten(new.model_dump(mode="json"))
    return {k: {"from": a.get(k), "to": b.get(k)} for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


# -- the catalog ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LengthFit:
    """The completion lengths a run's train rollouts needed: a log-normal fitted by maximum
    likelihood to the lengths (tokens) of the correct completions, with the truncated ones as
    right-censored at the budget (they needed more than it; how much, the fit says)."""

    budget: int  # the run's max_completion_length (the censoring point)
    correct: int
    truncated: int
    q95: int  # the length that 95% of finished-or-truncated completions would need

    def __str__(self) -> str:
        return (
            f"a log-normal fitted to the parent's {self.correct} correct completion lengths with its {self.truncated}"
            f" truncated ones censored at {self.budget} tokens: 95% need at most {self.q95}"
        )


@dataclass(frozen=True)
class Facts:
    """What the store says about the parent that a template may need beyond its config."""

    #: Train tasks the parent's latest GRPO run sampled in full groups and never solved.
    hopeless_tasks: tuple[str, ...] = ()
    #: Train tasks that run saw at all (a drop is only worth it when it is a real share of them).
    seen_tasks: int = 0
    #: (subset, share of that run's train samples that were correct), hardest first.
    subset_success: tuple[tuple[str, float], ...] = ()
    #: Per train task of that run: (correct samples, samples), over all its groups.
    task_success: tuple[tuple[int, int], ...] = ()
    #: The completion lengths that run needed, when it had correct and truncated completions.
    lengths: LengthFit | None = None


def run_facts(store: Store, run_id: str | None) -> Facts:
    """What a GRPO run's train rollouts say about its prompts: hopeless tasks (every sample, in
    every group the run drew for them, scored 0 on correctness), each task subset's success, each
    task's successes, and the completion lengths it needed."""
    if run_id is None:
        return Facts()
    row = store.query_one(
        """
        WITH t AS (
            SELECT task_id, subset, coalesce(reward_components['correctness'], reward) AS c
            FROM rollouts WHERE run_id = ? AND split = 'train'
        ), by_task AS (SELECT task_id, max(c) AS solved, sum(c = 1)::INT AS k, count(*)::INT AS n
                       FROM t GROUP BY task_id),
        by_subset AS (SELECT subset, avg(c) AS success FROM t GROUP BY subset)
        SELECT (SELECT list(task_id ORDER BY task_id) FILTER (WHERE solved = 0) FROM by_task),
               (SELECT count(*) FROM by_task),
               (SELECT list({'subset': subset, 'success': success} ORDER BY success, subset) FROM by_subset),
               (SELECT list([k, n] ORDER BY task_id) FROM by_task)
        """,
        [run_id],
    )
    if not row or not row[1]:
        return Facts()
    subsets = tuple((s["subset"], float(s["success"])) for s in row[2] or ())
    success = tuple((int(k), int(n)) for k, n in row[3] or ())
    return Facts(tuple(row[0] or ()), int(row[1]), subsets, success, _length_fit(store, run_id))


def _length_fit(store: Store, run_id: str) -> LengthFit | None:
    """The fit, censoring only the truncated completions that reached the run's token budget:
    one cut short by anything else (an agentic episode out of turns) says nothing about tokens."""
    rows = store.query(
        """SELECT o.completion_length, o.truncated, try_cast(r.config->'recipe'->>'max_completion_length' AS INTEGER)
           FROM rollouts o LEFT JOIN runs r ON r.id = o.run_id WHERE o.run_id = ? AND o.split = 'train'
           AND (o.truncated OR coalesce(o.reward_components['correctness'], o.reward) = 1)""",
        [run_id],
    )
    finished = [float(n) for n, cut, _ in rows if not cut]
    truncated = [float(n) for n, cut, _ in rows if cut]
    if len(finished) < 10 or not truncated:  # too few correct ones to fit, or nothing was cut
        return None
    budget = next((int(b) for *_, b in rows if b is not None), int(max(truncated)))
    cut = [n for n in truncated if n >= budget]
    from scipy import stats

    data = stats.CensoredData(uncensored=finished, right=cut)
    shape, _, scale = stats.lognorm.fit(data, floc=0)
    q95 = float(stats.lognorm.ppf(0.95, shape, 0, scale))
    if not math.isfinite(q95):
        return None
    return LengthFit(budget, len(finished), len(cut), math.ceil(q95))


@dataclass(frozen=True)
class Sized:
    """A template's change with how its magnitude was chosen, in words."""

    changes: dict[str, Any]
    how: str


#: What the offline planner says of a magnitude that nothing in the parent's data sizes.
FIXED = "a fixed step of the catalog: nothing in the parent's data sizes it"
#: Groups whose predicted dead share a larger group size aims below (the insufficient_signal rule's line).
TARGET_DEAD = DEAD_GROUPS.value
#: The largest group size a proposal sizes up to.
MAX_GENERATIONS = 32


def _easier_mix(config: WorkspaceConfig, facts: Facts, size: float | None = None) -> dict[str, Any] | None:
    """Leave the hardest train subset out (val stays as it is), while another one remains."""
    left = [(s, x) for s, x in facts.subset_success if s not in config.data.exclude_subsets]
    if len(left) < 2:
        return None
    hardest = left[0][0]
    return {"data.exclude_subsets": sorted({*config.data.exclude_subsets, hardest})}


def _step(size: float | None) -> float:
    """The multiple of the catalog's step: 1 unless a random draw gives another."""
    return 1.0 if size is None else size


def dead_share(success: tuple[tuple[int, int], ...], generations: int) -> float:
    """The share of groups of `generations` samples predicted dead (all right or all wrong), from
    each task's successes with a Jeffreys estimate ((k + 1/2) / (n + 1)) of its success rate."""
    if not success:
        return 0.0
    k, n = np.array(success, dtype=float).T
    p = (k + 0.5) / (n + 1)
    return float(np.mean(p**generations + (1 - p) ** generations))


def _more_generations(config: WorkspaceConfig, facts: Facts, size: float | None) -> Sized | dict[str, Any] | None:
    now = config.recipe.num_generations
    if now >= MAX_GENERATIONS:
        return None
    if size is None and facts.task_success:
        before = dead_share(facts.task_success, now)
        target = next(
            (g for g in range(now + 1, MAX_GENERATIONS + 1) if dead_share(facts.task_success, g) <= TARGET_DEAD), None
        )
        if target is not None:
            after = dead_share(facts.task_success, target)
            how = (
                f"the smallest group size whose predicted dead share, from the parent's per-task success on"
                f" {len(facts.task_success)} train tasks, is at most {TARGET_DEAD:.0%} ({before:.0%} at {now} ->"
                f" {after:.0%} at {target})"
            )
            return Sized({"recipe.num_generations": target}, how)
        best = dead_share(facts.task_success, MAX_GENERATIONS)
        how = f"{MAX_GENERATIONS}, the most proposed: no group size reaches {TARGET_DEAD:.0%} dead (at best {best:.0%})"
        return Sized({"recipe.num_generations": MAX_GENERATIONS}, how)
    return {"recipe.num_generations": min(MAX_GENERATIONS, max(now + 1, round(now * 2 ** _step(size))))}


def _longer_budget(config: WorkspaceConfig, facts: Facts, size: float | None) -> Sized | dict[str, Any] | None:
    now = config.recipe.max_completion_length
    fit = facts.lengths
    if size is None and fit is not None and fit.budget == now:
        if fit.q95 <= now:
            return None  # the fit says the budget already covers them: a longer one would not help
        return Sized({"recipe.max_completion_length": min(fit.q95, 8 * now)}, str(fit))
    return {"recipe.max_completion_length": max(now + 1, int(now * (1 + 0.5 * _step(size))))}


Make = Callable[[WorkspaceConfig, Facts, "float | None"], "Sized | dict[str, Any] | None"]


@dataclass(frozen=True)
class Template:
    """A catalog entry: when it applies (the rules it answers) and how it changes a config."""

    name: str
    kind: Kind
    #: Rules whose firing makes this template a candidate ("" = general: when no rule fired).
    triggers: tuple[str, ...]
    #: Removes or weakens something (escalation prefers these).
    removes: bool
    #: (config, facts, size) -> the change. `size` is None when the planner sizes the change (from
    #: the facts where a template knows how, else the catalog's step), or a multiple of that step.
    make: Make
    because: str
    #: Whether the change has a magnitude (a switch, a removal or a data drop has none).
    magnitude: bool = False

    def propose(
        self,
        config: WorkspaceConfig,
        evidence: list[str],
        source: str = "planner",
        facts: Facts | None = None,
        size: float | None = None,
    ) -> Intervention | None:
        made = self.make(config, facts or Facts(), size)
        if not made:
            return None
        changes, how = (made.changes, made.how) if isinstance(made, Sized) else (made, self._how(size))
        draft = Intervention(
            kind=self.kind, changes=changes, hypothesis="-", evidence=evidence, template=self.name, source=source
        )
        what = draft.title(config).split(": ", 1)[1]
        sized = f" Sized by {how}." if how else ""
        return draft.model_copy(
            update={"hypothesis": f"If {what}, val correctness rises, because {self.because}.{sized}"}
        )

    def _how(self, size: float | None) -> str:
        if not self.magnitude:
            return ""
        return FIXED if size is None else f"a random draw: {size:.2f} times the catalog's step"


def _rewards(config: WorkspaceConfig, **weights: float) -> dict[str, Any] | None:
    """The reward weights with `weights` changed; None when nothing changes or the domain lacks a
    component named (a custom domain's are checked when it loads)."""
    offered = reward_component_names(config.domain.name)
    if offered is not None and not set(weights) <= set(offered):
        return None
    new = {**config.recipe.rewards, **weights}
    new = {k: v for k, v in new.items() if v}
    return {"recipe.rewards": new} if new != config.recipe.rewards and new else None


#: The continuous counterpart of binary correctness, by domain.
CONTINUOUS = ("closeness", "pass_fraction")


def _continuous(config: WorkspaceConfig, size: float | None) -> dict[str, Any] | None:
    offered = reward_component_names(config.domain.name) or ()
    name = next((n for n in CONTINUOUS if n in offered), None)
    if not name or name in config.recipe.rewards:
        return None
    return _rewards(config, **{name: _scaled(0.5, _step(size))})


def _scaled(value: float, factor: float, digits: int = 3) -> float:
    return float(f"{value * factor:.{digits}g}")


def _filter(config: WorkspaceConfig, **fields: Any) -> dict[str, Any] | None:
    current = config.recipe.group_filter.model_dump()
    new = {**current, **fields}
    return {"recipe.group_filter": new} if new != current else None


def _more_seeds(c: WorkspaceConfig, size: float | None) -> dict[str, Any] | None:
    now = c.eval.sampled_seeds
    return {"eval.sampled_seeds": min(16, max(now + 1, round(now * 2 ** _step(size))))} if now < 8 else None


def _longer_training(c: WorkspaceConfig, size: float | None) -> dict[str, Any] | None:
    steps = max(c.recipe.steps + 1, int(c.recipe.steps * 2 ** _step(size)))
    return {"recipe.steps": steps} if steps <= c.budget.max_train_steps else None


CATALOG: list[Template] = [
    Template(
        "continuous_correctness",
        "reward",
        ("insufficient_signal", "dead_training"),
        False,
        lambda c, _, s: _continuous(c, s),
        "a continuous correctness component gives groups with equal binary rewards a spread to learn from",
        magnitude=True,
    ),
    Template(
        "group_filter",
        "filter",
        ("insufficient_signal", "dead_training"),
        False,
        lambda c, _, s: _filter(c, enabled=True, std_threshold=DEAD_STD) if not c.recipe.group_filter.enabled else None,
        "dropping groups without reward spread stops them from diluting the loss of the groups that have one",
    ),
    Template(
        "relax_filter",
        "filter",
        ("over_filtering",),
        True,
        lambda c, _, s: _filter(c, enabled=False) if c.recipe.group_filter.enabled else None,
        "the filter keeps too few groups for a stable gradient",
    ),
    Template(
        "more_generations",
        "optimizer",
        ("insufficient_signal",),
        False,
        _more_generations,
        "larger groups are less often all-right or all-wrong, so fewer groups are dead",
        magnitude=True,
    ),
    Template(
        "drop_shaping",
        "reward",
        ("reward_hacking", "length_gaming"),
        True,
        lambda c, _, s: _rewards(c, **{k: 0.0 for k in c.recipe.rewards if k != "correctness"}),
        "the shaped components are rewarded without raising correctness; correctness alone cannot be gamed",
    ),
    Template(
        "format_weight",
        "reward",
        ("format_gate",),
        False,
        lambda c, _, s: _rewards(c, format=_scaled(max(0.2, 2 * c.recipe.rewards.get("format", 0.0)), _step(s))),
        "a stronger format reward teaches the answer format that correctness is read from",
        magnitude=True,
    ),
    Template(
        "longer_budget",
        "budget",
        ("truncation",),
        False,
        _longer_budget,
        "truncated completions lose their final answer; a longer budget lets them finish",
        magnitude=True,
    ),
    Template(
        "efficiency_reward",
        "reward",
        ("echo_trap", "truncation"),
        False,
        lambda c, _, s: (
            _rewards(c, efficiency=_scaled(0.5, _step(s))) if "efficiency" not in c.recipe.rewards else None
        ),
        "a bonus for fewer turns (1 - 0.3 * turns / max_turns) ends loops of repeated actions and leaves the"
        " turn and token budget to the fix",
        magnitude=True,
    ),
    Template(
        "close_leak",
        "environment",
        ("leak",),
        True,
        lambda c, _, s: (
            {"domain.leak_fix_in_history": False} if getattr(c.domain, "leak_fix_in_history", False) else None
        ),
        "the fix sits in the repository's history, so success measures copying it; with a clean history the"
        " score measures the skill again",
    ),
    Template(
        "dr_grpo",
        "optimizer",
        ("length_gaming",),
        True,
        lambda c, _, s: {"recipe.loss_type": "dr_grpo"} if c.recipe.loss_type != "dr_grpo" else None,
        "Dr. GRPO removes the per-sequence length normalization that favors long wrong answers",
    ),
    Template(
        "clip_higher",
        "optimizer",
        ("exploration_collapse",),
        False,
        lambda c, _, s: (
            {"recipe.epsilon_high": round(min(0.9, (c.recipe.epsilon_high or c.recipe.epsilon) + 0.07 * _step(s)), 3)}
            if (c.recipe.epsilon_high or 0) < 0.4 and c.recipe.num_iterations > 1
            else None
        ),
        "a higher upper clip lets rare good tokens grow and keeps entropy from collapsing (DAPO clip-higher); offered"
        " only with num_iterations > 1: with one pass per generation batch the policy ratio is 1 and no clip binds",
        magnitude=True,
    ),
    Template(
        "lower_lr",
        "optimizer",
        ("form_shift", "shortcut_collapse", "exploration_collapse", "reward_hacking", "regressed"),
        True,
        lambda c, _, s: {"recipe.learning_rate": _scaled(c.recipe.learning_rate, 2 ** -_step(s))},
        "smaller steps keep the policy near the parent's behavior while the reward still moves it",
        magnitude=True,
    ),
    Template(
        "raise_lr",
        "optimizer",
        ("", "dead_training"),
        False,
        lambda c, _, s: (
            {"recipe.learning_rate": min(1e-2, _scaled(c.recipe.learning_rate, 2 ** _step(s)))}
            if c.recipe.learning_rate < 1e-4
            else None
        ),
        "the reward spread is there but the policy moves too little in the run's steps",
        magnitude=True,
    ),
    Template(
        "temperature_up",
        "optimizer",
        ("exploration_collapse", ""),
        False,
        lambda c, _, s: (
            {"recipe.temperature": round(min(2.0, c.recipe.temperature + 0.2 * _step(s)), 2)}
            if c.recipe.temperature < 1.4
            else None
        ),
        "more diverse samples give more groups a mix of right and wrong answers",
        magnitude=True,
    ),
    Template(
        "kl_anchor",
        "optimizer",
        ("form_shift", "shortcut_collapse", "reward_hacking"),
        False,
        lambda c, _, s: {"recipe.beta": _scaled(0.04, _step(s))} if c.recipe.beta == 0 else None,
        "a KL anchor to the parent limits drift toward what the shaped reward pays for",
        magnitude=True,
    ),
    Template(
        "longer_training",
        "budget",
        ("",),
        False,
        lambda c, _, s: _longer_training(c, s),
        "the reward was still rising when the run ended",
        magnitude=True,
    ),
    Template(
        "easier_mix",
        "data",
        ("insufficient_signal", "dead_training"),
        True,
        _easier_mix,
        "easier prompts are solved sometimes rather than never, so their groups carry a signal",
    ),
    Template(
        "drop_hopeless",
        "data",
        ("insufficient_signal", "dead_training"),
        True,
        lambda c, f, s: (
            {"data.exclude_tasks": sorted({*c.data.exclude_tasks, *f.hopeless_tasks})}
            if f.seen_tasks and len(f.hopeless_tasks) >= 0.1 * f.seen_tasks
            else None
        ),
        "prompts no sample ever solves give all-zero groups: dropping them spends the steps on prompts with a signal",
    ),
    Template(
        "more_eval_seeds",
        "evaluation",
        ("insufficient_evidence",),
        False,
        lambda c, _, s: _more_seeds(c, s),
        "more sampled passes over val narrow the noise floor, so a real gain can clear it",
        magnitude=True,
    ),
]

TEMPLATES = {t.name: t for t in CATALOG}
