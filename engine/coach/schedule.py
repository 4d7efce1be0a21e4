"""How the coach spends a step budget: screen short, continue the winner longer.

With a budget of GRPO steps (`Coach.run(..., steps=N)`, the benchmark's arms, `evotui run --steps`)
each round is one of two kinds:

- a **screen**: the round's factor branches, and the control beside them, from the head (the best
  promoted version), each trained `length` steps. The length comes from power where this
  workspace has judged versions (the steps after which the median judged version's gain per step
  clears their median noise floor with 80% power, never shorter than the shortest of them: a gain
  per step is known from there on), else the recipe's own `steps`; either way a screen spends at
  most half the steps left, so that its winner can be trained on with the other half (successive
  halving's equal split between its two stages): as many branches of that length as fit there,
  the control first (alone where one fits: a lone factor, judged against its parent only, would be
  credited with what its steps did), and one at least (cut to half the steps left if even one
  does not fit), since a shorter branch shows less whatever the number of branches.
- an **exploit** round: one branch, from a version a screen found: the head *continued* (its
  recipe unchanged, resuming its training state, so a lineage trained in segments is one long
  run), or first, when other factors beat the same control, the head with those factors
  *combined*; or first, when the winner's screen had room for the control alone, the head with the
  optimizer factor the planner ranks first for it (`explored`: with one-branch screens nothing
  else would ever test what the diagnosis names about how the lineage trains; a new learning rate
  resumes the head's training, `engine.runs.continuation`). A combination or that factor, when
  not promoted, is given up and the head continued alone. A segment doubles the lineage's steps
  (successive halving's survivor gets twice the budget) until a segment has measured what
  continued training gains per step; then it is sized from power like a screen. The last segment
  takes what is left when less than another would remain.

A screen's winner is its promoted branch (the head the next round branches from; of several,
the best by val, where a promoted control is no candidate when a promoted factor branch beside it
was not found worse than it: `engine.core.reading.yardsticks`). When a screen
promoted nothing, its best branch by point estimate (above its parent, and a factor above the
control too; inside the floor: neither regressed, nor mixed, a guardrail's harm, nor rejected) is
continued *provisionally*: its gain was inside the floor after a short screen, and the
continuation is judged on the lineage's whole gain. So is a continuation the lineage did not yet
promote (pruned) while it still adds to it by point estimate: a lineage stops when a segment adds
nothing, is regressed, mixed or rejected, or the budget ends, not when an increment is inside the
floor.

**Judging a segment** (`segment_label`): a lineage must not throw away real gains one increment
at a time, nor collect small losses one increment at a time. A continuation or combination is
promoted when
1. the lineage, from its start (the version the screen branched from) to the segment, is improved
   beyond the floor: a false promotion of a lineage no better than its start has probability at
   most 2.5% (the one-sided level of the 95% interval);
2. the segment is not regressed against its parent (its 95% interval is not wholly below 0); and
3. the segment is non-inferior to its parent at a margin of half the gain the lineage had
   established at its parent (the lower end of the parent's interval against the start), or of
   the segment's own floor (its interval's half-width) where that is wider: a segment that loses
   that margin or more is promoted with probability at most 2.5%, so at least half of an
   established gain is kept (the convention of non-inferiority trials, M2 = M1 / 2), and no
   segment is promoted that lost as much as its verdict can see. A margin narrower than the
   floor would ask a parent that barely cleared the floor for a segment that beats it beyond its
   own floor, a test of each increment by itself, which throws away the small real gains of
   continued training one at a time; at the floor the segment is kept when its estimate is not
   below its parent's. A provisional parent established nothing: the lineage test alone decides.
Over a lineage of K promoted segments, the chance that any of them is a false promotion is at most
K x 2.5% (Bonferroni); `tests/test_schedule.py` checks each rate by simulation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from statistics import median
from typing import Literal

from engine.coach.interventions import CONTROL, Intervention
from engine.coach.rounds import Rounds
from engine.store import Store, VersionRecord
from engine.verdict import Delta, Verdict

#: The template of a continuation (the parent trained on, resuming its training state) and of a
#: combination (the parent with the other factors that beat the same control).
CONTINUE = "continue"
COMBINE = "combine"
#: Templates of exploit branches: judged by `segment_label`, never credited with a skill card.
EXPLOIT = (CONTINUE, COMBINE)

#: Power of a length sized from power: 80%, at the verdicts' two-sided 5% level.
POWER = 0.8
#: (z_{1-alpha/2} + z_{power}) / z_{1-alpha/2}: an effect this many floors wide is seen with 80% power.
POWER_FACTOR = (1.959964 + 0.841621) / 1.959964
#: A screen spends at most this share of the steps left (successive halving's equal split between
#: the screen and its winner's continuation).
SCREEN_SHARE = 0.5
#: A segment may lose at most this share of the gain its lineage established (non-inferiority's M2 = M1/2).
MARGIN_SHARE = 0.5

Mode = Literal["screen", "exploit"]


@dataclass(frozen=True)
class Lineage:
    """A version's exploit lineage: `start` (what the screen branched from), `winner` (the screen
    branch it continues), the segments after it, and the steps they trained together."""

    start: str
    winner: str
    segments: tuple[str, ...]
    steps: int

    @property
    def head(self) -> str:
        return self.segments[-1] if self.segments else self.winner


@dataclass(frozen=True)
class Plan:
    """What a round does: screen or exploit, from which version, each branch's steps and how they
    were sized; for an exploit round, the factors to combine (empty: a plain continuation)."""

    mode: Mode
    parent: str
    steps: int
    how: str
    combine: tuple[Intervention, ...] = ()
    provisional: bool = False
    #: An exploit round whose winner's screen held the control alone: its one branch takes the
    #: optimizer factor the planner ranks first for the head (`explored`), which no screen had room to test.
    explore: bool = False
    #: A screen's branches, the control included when there is room for it (an exploit round has one).
    branches: int = 1
    lineage: Lineage | None = None


def steps_spent(store: Store) -> int:
    """GRPO steps every train run of this store trained (each run counts its steps from 1)."""
    row = store.query_one(
        """SELECT coalesce(sum(s), 0) FROM (
               SELECT max(m.step) AS s FROM metrics m JOIN runs r ON r.id = m.run_id
               WHERE r.kind = 'train' GROUP BY m.run_id)"""
    )
    return int(row[0]) if row else 0


def power_length(gain_per_step: float, floor: float) -> int | None:
    """Steps after which an effect growing `gain_per_step` a step clears a noise floor of
    `floor` (the 95% half-width) with 80% power; None when nothing grows."""
    if gain_per_step <= 0 or floor <= 0:
        return None
    return max(1, math.ceil(POWER_FACTOR * floor / gain_per_step))


class Schedule:
    """Reads the store for what a step budget's next round is (`plan`) and for the facts a
    segment is judged by (`lineage`). It decides nothing: the coach acts on its plan."""

    def __init__(self, store: Store, steps_of: dict[str, int] | None = None):
        self.store = store
        self._steps_of = steps_of or {}

    # -- the version tree ---------------------------------------------------------------------
    def _versions(self) -> dict[str, VersionRecord]:
        return {v.name: v for v in self.store.list_versions()}

    def _templates(self) -> dict[str, str]:
        rows = self.store.query(
            "SELECT v.name, coalesce(i.template, '') FROM versions v LEFT JOIN interventions i"
            " ON i.id = v.intervention_id"
        )
        return {name: template for name, template in rows}

    def _round_of(self) -> dict[str, int | None]:
        rows = self.store.query(
            "SELECT v.name, i.round FROM versions v LEFT JOIN interventions i ON i.id = v.intervention_id"
        )
        return {name: r for name, r in rows}

    def version_steps(self, name: str) -> int:
        """GRPO steps a version trained: its train run's last step (0 for v0 or an untrained one)."""
        if name not in self._steps_of:
            row = self.store.query_one(
                """SELECT coalesce(max(m.step), 0) FROM metrics m JOIN runs r ON r.id = m.run_id
                   WHERE r.kind = 'train' AND r.version = ? AND r.state = 'succeeded'""",
                [name],
            )
            self._steps_of[name] = int(row[0]) if row else 0
        return self._steps_of[name]

    def lineage(self, version: str) -> Lineage | None:
        """The exploit lineage `version` heads (or the screen winner it is), None for v0."""
        versions, templates = self._versions(), self._templates()
        segments: list[str] = []
        name = version
        while templates.get(name) in EXPLOIT:
            segments.append(name)
            parent = versions[name].parent
            assert parent is not None
            name = parent
        winner = versions.get(name)
        if winner is None or winner.parent is None:
            return None
        ordered = tuple(reversed(segments))
        return Lineage(winner.parent, winner.name, ordered, sum(map(self.version_steps, (winner.name, *ordered))))

    # -- the next round -----------------------------------------------------------------------
    def plan(self, best: str, steps_left: int, screen_branches: int, default_steps: int) -> Plan:
        """The next round: exploit a lineage that is going, or one a screen just found; else screen
        from `best` (the best promoted version) with `screen_branches` branches."""
        versions, templates = self._versions(), self._templates()
        children = [v for v in versions.values() if v.parent == best]
        stalled = any(
            templates.get(c.name) == CONTINUE and c.state in ("rejected", "pruned", "failed") for c in children
        )
        if best in versions and versions[best].parent is not None and not stalled:
            return self._exploit(best, steps_left, provisional=False)
        going = self._going(best)
        if going is not None:
            return self._exploit(going, steps_left, provisional=True)
        provisional = self._provisional_winner(best)
        if provisional is not None:
            return self._exploit(provisional, steps_left, provisional=True)
        return self._screen(best, steps_left, screen_branches, default_steps)

    def _going(self, best: str) -> str | None:
        """The continuation the latest round trained, when it continues a lineage through `best` and
        added to it by point estimate though the lineage did not clear the floor (pruned, its own
        verdict neither regressed nor mixed, its gain over its parent above 0): the survivor goes on
        until the budget ends or a segment adds nothing, and its lineage's whole gain decides."""
        versions, templates, rounds = self._versions(), self._templates(), self._round_of()
        latest = max((r for r in rounds.values() if r is not None), default=None)
        last = [v for v in versions.values() if latest is not None and rounds[v.name] == latest]
        if len(last) != 1 or templates.get(last[0].name) != CONTINUE:
            return None
        segment = last[0]
        if (
            segment.state != "pruned"
            or segment.verdict not in ("insufficient evidence", "improved")
            or not (segment.verdict_delta or 0.0) > 0.0
        ):
            return None
        lineage = self.lineage(segment.name)
        if lineage is None or best not in (lineage.start, lineage.winner, *lineage.segments):
            return None
        return segment.name

    def _provisional_winner(self, best: str) -> str | None:
        """The best branch of the latest screen from `best` when that screen promoted nothing and
        none of its branches was continued yet: above its parent and the control by point
        estimate, neither regressed nor rejected."""
        versions, templates, rounds = self._versions(), self._templates(), self._round_of()
        screened = [
            v for v in versions.values() if v.parent == best and templates.get(v.name) not in EXPLOIT and rounds[v.name]
        ]
        if not screened:
            return None
        latest = max(rounds[v.name] or 0 for v in screened)
        branches = [v for v in screened if rounds[v.name] == latest]
        if any(v.state in ("promoted", "created", "training", "trained") for v in branches):
            return None
        if any(
            v.parent == b.name and (templates.get(v.name) != COMBINE or v.state == "promoted")
            for v in versions.values()
            for b in branches
        ):
            return None  # one of them was continued already (one that lost a combination is continued alone)
        control = next((v for v in branches if templates.get(v.name) == CONTROL), None)
        # A factor must beat the control's gain too; the control, its parent only.
        bar = max(0.0, control.verdict_delta or 0.0) if control is not None else 0.0
        candidates = [
            v
            for v in branches
            if v.state == "pruned"
            and v.verdict == "insufficient evidence"  # mixed: a declared guardrail says it harms
            and v.verdict_delta is not None
            and v.verdict_delta > (0.0 if v is control else bar)
        ]
        return max(candidates, key=lambda v: (v.verdict_delta or 0.0, -int(v.name[1:]))).name if candidates else None

    def _screen(self, parent: str, steps_left: int, branches: int, default_steps: int) -> Plan:
        room = int(SCREEN_SHARE * steps_left)
        measured = self._measured_gain()
        length = power_length(*measured[:2]) if measured is not None else None
        if measured is not None and length is not None:
            gain, floor, shortest, n = measured
            how = (
                f"power: {length} steps for the median gain per step of this workspace's {n} judged versions"
                f" ({gain:+.5f}) to clear their median noise floor (±{floor:.3f}) with {POWER:.0%} power"
            )
            if length < shortest:
                how += f"; raised to {shortest}, the shortest of them: a gain per step is known from there on"
                length = shortest
        else:
            length = default_steps
            why = "no version judged yet" if measured is None else "the median version gained nothing"
            how = f"the recipe's {default_steps} steps: {why} in this workspace"
        # A screen spends at most half the steps left: as many branches of that length as fit (a
        # shorter branch shows less, whatever the number of branches), at least one, which takes
        # what fits when even one does not.
        fits = max(1, min(branches, room // max(1, length)))
        if fits < branches:
            how += f"; {fits} of {branches} branches fit in half the {steps_left} steps left"
        if fits == 1 and length > max(1, room):
            how += f"; cut to {max(1, room)} steps, half of what is left"
            length = max(1, room)
        return Plan("screen", parent, min(length, steps_left), how, branches=fits)

    def _measured_gain(self) -> tuple[float, float, int, int] | None:
        """(median gain per step, median floor, fewest steps, count) over the judged child versions
        (all of them: what a typical change gains, not what the best did); None before any."""
        gains, floors, steps_of = [], [], []
        for v in self._versions().values():
            if v.parent is None or v.verdict_delta is None or v.verdict_floor is None:
                continue
            steps = self.version_steps(v.name)
            if steps:
                gains.append(v.verdict_delta / steps)
                floors.append(v.verdict_floor)
                steps_of.append(steps)
        if not gains:
            return None
        return median(gains), median(floors), min(steps_of), len(gains)

    def _exploit(self, head: str, steps_left: int, provisional: bool) -> Plan:
        lineage = self.lineage(head)
        assert lineage is not None
        versions = self._versions()
        segments = [versions[s] for s in lineage.segments if self._templates().get(s) == CONTINUE]
        measured = [
            (s.verdict_delta / self.version_steps(s.name), s.verdict_floor)
            for s in segments
            if s.verdict_delta is not None and s.verdict_floor and self.version_steps(s.name)
        ]
        if measured:
            gain, floor = measured[-1]
            sized = power_length(gain, floor)
            if sized is None:
                length, how = steps_left, f"the steps left: the last segment gained {gain:+.5f} a step"
            else:
                length = sized
                how = (
                    f"power: the last segment gained {gain:+.5f} a step; {sized} steps clear its floor"
                    f" (±{floor:.3f}) with {POWER:.0%} power"
                )
        else:
            length, how = lineage.steps, f"the lineage's {lineage.steps} steps again (a survivor's budget doubles)"
        if steps_left - length < length:
            if length < steps_left:
                how += f"; the whole {steps_left} steps left, since less than another segment would remain"
            length = steps_left
        tried = any(v.parent == head and self._templates().get(v.name) == COMBINE for v in versions.values())
        tried = tried or any(b.intervention.template == COMBINE for b in Rounds(self.store).dropped(head))
        combine = () if lineage.segments or tried else self._combination(lineage)
        explore = not (lineage.segments or tried or combine) and self._screened_alone(lineage)
        if explore:
            how += "; its screen had room for the control alone: it takes the optimizer factor the planner ranks first"
        return Plan("exploit", head, max(1, length), how, combine, provisional, explore, lineage=lineage)

    def _screened_alone(self, lineage: Lineage) -> bool:
        """Whether the lineage's winner is a control its screen ran alone (no factor beside it)."""
        templates, rounds = self._templates(), self._round_of()
        if templates.get(lineage.winner) != CONTROL:
            return False
        screen = rounds.get(lineage.winner)
        return not any(
            v.parent == lineage.start and v.name != lineage.winner and rounds.get(v.name) == screen
            for v in self._versions().values()
        )

    def _combination(self, lineage: Lineage) -> tuple[Intervention, ...]:
        """The other factors of the winner's screen that each beat the same control and were
        promoted: they join the winner in one combined version (nothing when the winner did not
        beat the control itself, or no other factor did)."""
        rows = self.store.query(
            """SELECT c.id, c.vs_control, v.state, i.kind, i.change, i.hypothesis, i.template, i.round
               FROM cases c JOIN versions v ON v.name = c.id JOIN interventions i ON i.id = v.intervention_id
               WHERE c.parent = ? AND c.retracted IS NULL""",
            [lineage.start],
        )
        by_version = {r[0]: r for r in rows}
        winner = by_version.get(lineage.winner)
        if winner is None or winner[1] != "improved":
            return ()
        out = []
        for name, vs_control, state, kind, change, hypothesis, template, round_ in rows:
            if name == lineage.winner or round_ != winner[7] or vs_control != "improved" or state != "promoted":
                continue
            edits = json.loads(change) if isinstance(change, str) else change
            changes = {path: edit["to"] for path, edit in edits.items()}
            changes.pop("recipe.steps", None)
            if not changes:
                continue
            out.append(
                Intervention(
                    kind=kind,
                    changes=changes,
                    hypothesis=hypothesis or "-",
                    evidence=[f"vs_control:{name} improved"],
                    template=template or "",
                    source=f"combine:{name}",
                )
            )
        return tuple(out)


def continuation(steps: int, plan: Plan) -> Intervention:
    """The exploit round's branch: the head trained `steps` more steps with nothing changed,
    resuming its training state."""
    lineage = plan.lineage
    assert lineage is not None
    start = f"judged on the lineage from {lineage.start} ({lineage.steps} steps so far)"
    return Intervention(
        kind="budget",
        changes={"recipe.steps": steps},
        hypothesis=f"If {plan.parent} trains {steps} more steps with no change, resuming its training, val correctness"
        f" keeps what it gained and adds to it: its lineage is still gaining. Sized by {plan.how}; {start}",
        success_criterion="the lineage beats its start beyond the floor, and this segment keeps at least half the"
        " gain its parent had established (non-inferiority at that margin, or at its own floor where wider)",
        rollback=f"keep {plan.parent}; screen new factors from it",
        evidence=[f"lineage:{lineage.winner}" + (" (provisional)" if plan.provisional else "")],
        template=CONTINUE,
        source="schedule",
    )


def combination(plan: Plan) -> Intervention:
    """The first exploit round's branch when other factors beat the same control: the winner with
    them, one version, judged against the winner (the best single one)."""
    changes: dict[str, object] = {}
    evidence: list[str] = []
    for iv in plan.combine:
        changes |= iv.changes
        evidence += iv.evidence
    kinds = {iv.kind for iv in plan.combine}
    what = ", ".join(f"{k} = {v!r}" for k, v in changes.items())
    return Intervention(
        kind=plan.combine[0].kind if len(kinds) == 1 else "budget",  # type: ignore[arg-type]
        changes=dict(changes),
        hypothesis=f"If {plan.parent} also takes {what} (each beat the same control as {plan.parent} did), val"
        f" correctness rises beyond what {plan.parent} alone reaches: the factors act on different bottlenecks."
        f" Trained {plan.steps} steps, sized by {plan.how}",
        success_criterion=f"not worse than {plan.parent} (the best single factor) beyond half its established gain"
        " (or its own floor where wider), and the lineage beats its start beyond the floor",
        rollback=f"keep {plan.parent} and continue it alone",
        evidence=evidence,
        template=COMBINE,
        source="schedule",
    )


def explored(plan: Plan, factor: Intervention) -> Intervention:
    """The first exploit round's branch when the winner's screen held the control alone: the winner
    with `factor` (the optimizer factor the planner ranks first for it), one version, a segment of
    the lineage judged like a combination (against its parent and on the lineage), credited to no
    factor."""
    lineage = plan.lineage
    assert lineage is not None
    return factor.model_copy(
        update={
            "hypothesis": f"{factor.hypothesis} The screen that found {lineage.winner} had room for the control"
            f" alone, so {plan.parent} is continued with this factor: {plan.steps} steps, sized by {plan.how}",
            "success_criterion": f"not worse than {plan.parent} beyond half its established gain (or its own floor"
            " where wider), and the lineage beats its start beyond the floor",
            "rollback": f"keep {plan.parent} and continue it alone",
            "evidence": [*factor.evidence, f"lineage:{lineage.winner}{' (provisional)' if plan.provisional else ''}"],
            "template": COMBINE,
            "source": f"explore:{factor.template or factor.source}",
        }
    )


# -- judging a segment -------------------------------------------------------------------------------
def margin(established: Verdict | None) -> float | None:
    """What a segment may give back: half the lower end of the gain its parent established over the
    lineage's start; None when the parent established nothing (a provisional parent)."""
    if established is None or established.label != "improved":
        return None
    main = established.primary_delta
    return MARGIN_SHARE * max(0.0, main.low) if main is not None else None


def held_to(segment: Verdict, give_back: float | None) -> float | None:
    """The non-inferiority margin a segment is held to: what its parent's established gain lets it
    give back (`margin`), never narrower than the segment's own floor; None when its parent
    established nothing."""
    main = segment.primary_delta
    if give_back is None or main is None:
        return give_back
    return max(give_back, main.noise_floor)


def segment_label(segment: Verdict, lineage: Verdict, give_back: float | None) -> str:
    """The label a continuation or combination is decided by (see the module's doc): improved when
    the lineage beats its start and the segment is neither regressed nor worse than its parent by
    its margin (`held_to`) or more; regressed when the segment or the lineage is; else insufficient
    evidence (mixed when the lineage is)."""
    if segment.label == "regressed" or lineage.label == "regressed":
        return "regressed"
    if lineage.label != "improved":
        return lineage.label
    main, held = segment.primary_delta, held_to(segment, give_back)
    if held is not None and (main is None or main.low <= -held):
        return "insufficient evidence"
    return "improved"


@dataclass(frozen=True)
class SegmentVerdict:
    """A segment's verdict: against its parent (`segment`, what is stored on the version), against
    the lineage's start (`lineage`), and the margin it was held to. It reads like a `Verdict` (a
    label, the primary delta against the parent, a summary) for the decision, the case and the gate."""

    segment: Verdict
    lineage: Verdict
    give_back: float | None

    @property
    def label(self) -> str:
        return segment_label(self.segment, self.lineage, self.give_back)

    @property
    def primary_delta(self) -> Delta | None:
        return self.segment.primary_delta

    @property
    def parent(self) -> str:
        return self.segment.parent

    def summary(self) -> str:
        parent, give_back = self.segment.parent, self.give_back
        held = held_to(self.segment, give_back)
        if give_back is None or held is None:
            note = f"{parent} established nothing: the lineage decides"
        elif held == give_back:
            note = f"may give back at most {held:.3f} (half the gain {parent} established)"
        else:
            note = f"may give back at most {held:.3f} (its floor; half the gain {parent} established: {give_back:.3f})"
        seg = self.segment.summary().split(": ", 1)[-1]
        lin = self.lineage.summary().split(": ", 1)[-1]
        return f"{self.label}: segment against {parent}: {seg} ({note}); lineage against {self.lineage.parent}: {lin}"
