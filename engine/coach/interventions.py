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
from engine.harness.analyzers.signal import RUN_MAX_TURNS, Drift, metric_drift
from engine.harness.thresholds import DEAD_GROUPS, UPDATE_DRIFT
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
class TurnFit:
    """The turns a multi-turn run's train episodes needed, sized as `LengthFit` sizes tokens: a
    log-normal fitted to the turns of the correct episodes, with the episodes that ran out of
    turns (truncated at the run's `domain.max_turns`) right-censored there. Episodes cut short by
    the token budget are not censored: they say nothing about turns."""

    max_turns: int  # the run's domain.max_turns (the censoring point)
    correct: int
    out_of_turns: int
    truncated: int  # every truncated episode: out of turns, out of tokens, or ended unsubmitted
    q95: int | None  # the turns 95% of them would need; None: too few correct episodes to fit

    def __str__(self) -> str:
        return (
            f"a log-normal fitted to the parent's {self.correct} correct episodes' turns with its {self.out_of_turns}"
            f" episodes out of turns ({self.out_of_turns} of {self.truncated} truncated) censored at {self.max_turns}:"
            f" 95% need at most {self.q95}"
        )


@dataclass(frozen=True)
class PartialCredit:
    """What a continuous counterpart of binary correctness (`CONTINUOUS`, logged at any weight)
    adds to a run's train groups: how many groups binary correctness left without spread
    (`DEAD_STD`), in how many of those the component varies, and the mean within-group spreads
    that size its weight."""

    component: str
    groups: int
    dead: int  # groups whose correctness has no spread
    revived: int  # ... of which the component has one
    live_spread: float | None  # mean correctness std over the groups correctness splits
    revived_spread: float | None  # mean component std over the revived groups


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
    #: The turns that run's episodes needed, when some ran out of turns (multi-turn domains).
    turns: TurnFit | None = None
    #: Per continuous counterpart of correctness the run logged: the spread it adds.
    partial_credit: tuple[PartialCredit, ...] = ()
    #: How far the policy's entropy drifted over that run against its noise (TRL's `entropy`).
    entropy_drift: Drift | None = None


def run_facts(store: Store, run_id: str | None) -> Facts:
    """What a GRPO run's train rollouts say about its prompts: hopeless tasks (every sample, in
    every group the run drew for them, scored 0 on correctness), each task subset's success, each
    task's successes, the completion lengths and turns it needed, the spread partial credit adds
    to its groups, and how far its policy's entropy drifted."""
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
    return Facts(
        tuple(row[0] or ()),
        int(row[1]),
        subsets,
        success,
        _length_fit(store, run_id),
        _turn_fit(store, run_id),
        _partial_credit(store, run_id),
        metric_drift(store, run_id, "entropy"),
    )


#: Correct samples a log-normal fit of what they needed takes at least.
MIN_FIT = 10


def _q95(needed: list[float], censored: list[float]) -> int | None:
    """The 95% quantile of a log-normal fitted by maximum likelihood to `needed`, with `censored`
    right-censored (they needed more than their value; how much, the fit says): scipy's
    `CensoredData`."""
    from scipy import stats

    data = stats.CensoredData(uncensored=needed, right=censored)
    shape, _, scale = stats.lognorm.fit(data, floc=0)
    q95 = float(stats.lognorm.ppf(0.95, shape, 0, scale))
    return math.ceil(q95) if math.isfinite(q95) else None


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
    if len(finished) < MIN_FIT or not truncated:  # too few correct ones to fit, or nothing was cut
        return None
    budget = next((int(b) for *_, b in rows if b is not None), int(max(truncated)))
    cut = [n for n in truncated if n >= budget]
    q95 = _q95(finished, cut)
    return None if q95 is None else LengthFit(budget, len(finished), len(cut), q95)


def _turn_fit(store: Store, run_id: str) -> TurnFit | None:
    """The turns fit of a multi-turn run (None: a run without a turn limit in its config, or one
    whose episodes never ran out of turns). An episode out of turns is a truncated one that took
    the run's `domain.max_turns` actions."""
    row = store.query_one(
        f"""
        WITH o AS (
            SELECT o.num_turns, o.truncated, coalesce(o.reward_components['correctness'], o.reward) AS c,
                   {RUN_MAX_TURNS} AS max_turns
            FROM rollouts o LEFT JOIN runs r ON r.id = o.run_id
            WHERE o.run_id = ? AND o.split = 'train' AND o.num_turns IS NOT NULL
        )
        SELECT {{'max_turns': any_value(max_turns),
                 'correct': list(num_turns) FILTER (WHERE c = 1 AND NOT truncated),
                 'out': count(*) FILTER (WHERE truncated AND num_turns >= max_turns),
                 'truncated': count(*) FILTER (WHERE truncated)}}
        FROM o
        """,
        [run_id],
    )
    fit = row[0] if row else None
    if not fit or fit["max_turns"] is None or not fit["out"]:
        return None
    limit, correct = int(fit["max_turns"]), [float(n) for n in fit["correct"] or ()]
    q95 = _q95(correct, [float(limit)] * int(fit["out"])) if len(correct) >= MIN_FIT else None
    return TurnFit(limit, len(correct), int(fit["out"]), int(fit["truncated"]), q95)


def _partial_credit(store: Store, run_id: str) -> tuple[PartialCredit, ...]:
    """Per continuous counterpart of correctness the run's train rollouts carry: its groups dead on
    binary correctness, those the component revives, and the two mean spreads (one SQL pass)."""
    row = store.query_one(
        f"""
        WITH e AS (
            SELECT step, group_id, coalesce(reward_components['correctness'], reward) AS c,
                   unnest(map_entries(reward_components)) AS kv
            FROM rollouts WHERE run_id = ? AND split = 'train'
        ), g AS (
            SELECT kv.key AS component, stddev_pop(c) AS c_std, stddev_pop(kv.value) AS x_std
            FROM e WHERE list_contains(?, kv.key) GROUP BY kv.key, step, group_id
        ), per AS (
            SELECT component, count(*) AS groups,
                   count(*) FILTER (WHERE c_std < {DEAD_STD}) AS dead,
                   count(*) FILTER (WHERE c_std < {DEAD_STD} AND x_std >= {DEAD_STD}) AS revived,
                   avg(c_std) FILTER (WHERE c_std >= {DEAD_STD}) AS live_spread,
                   avg(x_std) FILTER (WHERE c_std < {DEAD_STD} AND x_std >= {DEAD_STD}) AS revived_spread
            FROM g GROUP BY component
        )
        SELECT list({{'component': component, 'groups': groups, 'dead': dead, 'revived': revived,
                     'live_spread': live_spread, 'revived_spread': revived_spread}} ORDER BY component)
        FROM per
        """,
        [run_id, list(CONTINUOUS)],
    )
    return tuple(
        PartialCredit(
            str(x["component"]),
            int(x["groups"]),
            int(x["dead"]),
            int(x["revived"]),
            x["live_spread"],
            x["revived_spread"],
        )
        for x in (row[0] if row and row[0] else ())
    )


@dataclass(frozen=True)
class Sized:
    """A template's change with how its magnitude was chosen, in words."""

    changes: dict[str, Any]
    #: How the magnitude was chosen ("": the template's default, the catalog's step or a random draw).
    how: str = ""
    #: Why paths of another factor change with it, cited as evidence (a change of several factors
    #: must cite its reason: `check`).
    together: str = ""


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
        if isinstance(made, Sized):
            changes, how = made.changes, made.how or self._how(size)
            evidence = [*evidence, f"together: {made.together}"] if made.together else evidence
        else:
            changes, how = made, self._how(size)
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


def _continuous(config: WorkspaceConfig, facts: Facts, size: float | None) -> Sized | dict[str, Any] | None:
    """Partial credit beside binary correctness, weighted so that a group it revives carries the
    reward spread of a group correctness already splits (see `_partial_credit_weight`)."""
    offered = reward_component_names(config.domain.name) or ()
    name = next((n for n in CONTINUOUS if n in offered), None)
    if not name or name in config.recipe.rewards:
        return None
    seen = next((x for x in facts.partial_credit if x.component == name), None)
    if size is None and seen is not None and seen.dead:
        if not seen.revived:
            return None  # it varies in none of the groups correctness leaves dead: it would revive nothing
        weight, how = _partial_credit_weight(seen, config.recipe.rewards.get("correctness", 0.0))
        changes = _rewards(config, **{name: weight})
        return Sized(changes, how) if changes else None
    return _rewards(config, **{name: _scaled(0.5, _step(size))})


def _partial_credit_weight(seen: PartialCredit, correctness: float) -> tuple[float, str]:
    """The weight w at which the component's mean spread in the groups it revives, times w, equals
    binary correctness's own mean spread (at its weight) in the groups it splits: a revived group
    then carries the reward spread of a live one. Never above correctness's weight: partial credit
    stands beside the binary reward, not above it. (With `scale_rewards = "group"` a revived group's
    advantages do not depend on w; w then sets how much partial credit reorders the groups
    correctness already splits.)"""
    where = (
        f"{seen.component} varies in {seen.revived} of the {seen.dead} groups (of {seen.groups}) that binary"
        " correctness left dead in the parent's run"
    )
    if not seen.live_spread or not seen.revived_spread or correctness <= 0:
        return _scaled(0.5, 1.0), f"{FIXED} ({where}, and no group that correctness splits gives a spread to match)"
    matched = correctness * seen.live_spread / seen.revived_spread
    weight = _scaled(min(correctness, matched), 1.0, 2)
    how = (
        f"the spread it adds: {where}, with a mean spread {seen.revived_spread:.3f} there against correctness's"
        f" {seen.live_spread:.3f} in the groups it splits; weighted {weight:g}, a revived group carries the spread of"
        " a live one"
    )
    if matched > correctness:
        how += f" (matching needs {matched:.2g}: capped at correctness's weight {correctness:g})"
    return weight, how


def _scaled(value: float, factor: float, digits: int = 3) -> float:
    return float(f"{value * factor:.{digits}g}")


def _filter(config: WorkspaceConfig, **fields: Any) -> dict[str, Any] | None:
    current = config.recipe.group_filter.model_dump()
    new = {**current, **fields}
    return {"recipe.group_filter": new} if new != current else None


def _more_seeds(c: WorkspaceConfig, size: float | None) -> dict[str, Any] | None:
    now = c.eval.sampled_seeds
    return {"eval.sampled_seeds": min(16, max(now + 1, round(now * 2 ** _step(size))))} if now < 8 else None


#: The learning rate a proposal raises from (only below it: TINY_POLICY_NOTES, 1e-4 broke the math
#: sample's policy) and the most it proposes.
RAISE_LR_BELOW = 1e-4
MAX_LR = 1e-2


def _raise_lr(config: WorkspaceConfig, facts: Facts, size: float | None) -> Sized | dict[str, Any] | None:
    """A larger learning rate, sized from how far the parent's entropy drifted over its run against
    its step-to-step noise (`Facts.entropy_drift`): under Adam a step's size follows the learning
    rate, so the drift's t statistic grows with it; the raise is the one that brings the expected t
    of a run as long to its critical value. A measured |t| under 1 (one standard error of the
    estimate) is not told from no drift at all and counts as 1: the raise is then the critical
    value itself (about x2 for 20 steps or more). Where the entropy moved beyond its noise, the
    policy does not move too little, and no raise is proposed."""
    now = config.recipe.learning_rate
    if now >= RAISE_LR_BELOW:
        return None
    drift = facts.entropy_drift
    if size is None and drift is not None:
        if not UPDATE_DRIFT.crossed(drift.units):
            return None
        factor = 1 / max(drift.units, 1 / drift.critical)
        how = (
            f"the update size: {drift} (a drift inside its noise); the step follows the learning rate under Adam, so"
            f" x{factor:.2f} brings the expected drift of a run as long to the critical value"
        )
        if abs(drift.t) < 1:
            how += " (a |t| under one standard error is not told from no drift: it counts as 1)"
        return Sized({"recipe.learning_rate": min(MAX_LR, _scaled(now, factor))}, how)
    return {"recipe.learning_rate": min(MAX_LR, _scaled(now, 2 ** _step(size)))}


def _turn_limit(config: WorkspaceConfig) -> tuple[int, int] | None:
    """(max_turns now, the most the domain's section allows) of a domain whose config has a turn
    limit (SWE); None otherwise (a custom agentic domain sets its turns in its own code)."""
    field = type(config.domain).model_fields.get("max_turns")
    now = getattr(config.domain, "max_turns", None)
    if field is None or not isinstance(now, int):
        return None
    top = next((m.le for m in field.metadata if getattr(m, "le", None) is not None), now)
    return now, int(top)


def _more_turns(config: WorkspaceConfig, facts: Facts, size: float | None) -> Sized | None:
    """More turns per training episode, sized like the completion budget (`TurnFit`); the
    evaluation keeps the parent's turns (`domain.eval_max_turns`, set when unset), so the verdict
    compares policies, not turn budgets."""
    limit = _turn_limit(config)
    if limit is None:
        return None
    now, top = limit
    if now >= top:
        return None
    pinned = getattr(config.domain, "eval_max_turns", None) is None
    pin = {"domain.eval_max_turns": now} if pinned else {}
    together = (
        f"domain.eval_max_turns keeps the {now} turns the parent was evaluated with: the verdict compares"
        " policies, not turn budgets"
        if pinned
        else ""
    )

    def turns(n: int, how: str = "") -> Sized:
        return Sized({"domain.max_turns": n, **pin}, how, together)

    stepped = min(top, max(now + 1, int(now * (1 + 0.5 * _step(size)))))
    if size is not None:
        return turns(stepped)
    fit = facts.turns
    if fit is None:
        return None  # no episode of the parent's run ran out of turns: more turns answer nothing
    if fit.q95 is None or fit.max_turns != now:
        why = (
            f"{fit.correct} correct episodes are too few to fit"
            if fit.q95 is None
            else f"that run had {fit.max_turns} turns, this recipe {now}"
        )
        out = f"{fit.out_of_turns} of {fit.truncated} truncated episodes ran out of turns"
        return turns(stepped, f"{FIXED} ({out}; {why})")
    if fit.q95 <= now:
        return None  # the fit says the turns already cover them
    return turns(min(fit.q95, top), str(fit) + (f" (the domain allows at most {top})" if fit.q95 > top else ""))


def _longer_training(c: WorkspaceConfig, size: float | None) -> dict[str, Any] | None:
    steps = max(c.recipe.steps + 1, int(c.recipe.steps * 2 ** _step(size)))
    return {"recipe.steps": steps} if steps <= c.budget.max_train_steps else None


CATALOG: list[Template] = [
    Template(
        "continuous_correctness",
        "reward",
        ("insufficient_signal", "dead_training", "sparse_correctness"),
        False,
        _continuous,
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
        "more_turns",
        "budget",
        ("out_of_turns",),
        False,
        _more_turns,
        "episodes that run out of turns end unsubmitted; more turns let them finish, while the evaluation keeps"
        " the parent's turns",
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
        ("small_updates", "", "dead_training"),
        False,
        _raise_lr,
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
