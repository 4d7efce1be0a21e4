"""Designing a round (`Designer`): the branches it proposes (each a different single factor, with
the no-change control beside them when there is room), the after-design gate and its revisions, and
the backtests that price reward and filter branches before anything trains. Each step returns the
round as stored after it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from engine.coach.backends.base import Proposals
from engine.coach.context import CoachContext
from engine.coach.gatekeeper import Gatekeeper
from engine.coach.interventions import control
from engine.coach.planning import Planner
from engine.coach.rounds import Round
from engine.coach.schedule import Plan, combination, continuation, explored
from engine.harness.backtest import backtest_intervention
from engine.harness.diagnose import Diagnosis

#: Revise answers a design gate takes before the round gives up on proposing.
MAX_REVISIONS = 3
#: The kinds of factor a segment may take where its screen had room for the control alone: how the
#: lineage trains (step size, sampling, clipping, the KL anchor, group size, the loss), not what it
#: trains on or is judged by. A change of the reward, data, environment or evaluation changes what
#: the lineage is; without a control beside it nothing tells its effect from the steps', and the
#: verifier's audit rejects the behavior it shifts (dev seed 4 of the SWE sample: more turns moved
#: the efficiency component 0.85 -> 0.94, a shift no rule measured).
EXPLORED = ("optimizer",)


class Designer:
    def __init__(self, ctx: CoachContext, planner: Planner, gatekeeper: Gatekeeper):
        self.ctx = ctx
        self.planner = planner
        self.gatekeeper = gatekeeper

    def design(self, rnd: Round, diagnosis: Diagnosis | None, remaining: int, plan: Plan | None = None) -> Round:
        """The round with its branches approved and moved on to `backtest`; still at `design` when
        nothing applicable was left to propose or every proposal was revised. With a `plan` (a step
        budget), an exploit round's one branch continues (or first combines) the head, and a
        screen's branches train the plan's steps."""
        ranking: list[dict[str, Any]] = []
        for revision in range(MAX_REVISIONS + 1):
            subject = f"round{rnd.id}-design{revision}"
            # Resuming at this design's gate: the proposals it shows, not new ones.
            if self.gatekeeper.gates.find(rnd.id, "after_design", subject) is None or not rnd.branches:
                if plan is not None and plan.mode == "exploit":
                    proposals = self._exploit(rnd, diagnosis, plan)
                else:
                    # The control comes on top of the round's factors when there is room for both.
                    # A screen of a step budget has room for `plan.branches`, the control first.
                    room = min(remaining, plan.branches) if plan is not None else remaining
                    with_control = self.needs_control(rnd.parent, room, screen=plan is not None)
                    branches = min(self.ctx.config.coach.branches, room - with_control)
                    if branches > 0:
                        proposals = self.planner.propose(rnd, diagnosis, branches, scheduled=plan is not None)
                        ranking = proposals.ranking
                    else:
                        proposals = Proposals([], f"a screen with room for one branch, from {rnd.parent}", "schedule")
                    if with_control:
                        steps = plan.steps if plan else self.ctx.engine.version_config(rnd.parent).recipe.steps
                        proposals.interventions.insert(0, control(steps))
                        proposals.rationale += "; with the control (the parent trained on, no change)"
                    if plan is not None:
                        proposals.rationale += f"; a screen of {plan.steps} steps a branch, sized by {plan.how}"
                proposed = self.planner.branches(rnd, proposals, plan.steps if plan else None)
                if not proposed:
                    self.ctx.emit("refused", f"round {rnd.id}: nothing applicable to propose from {rnd.parent}")
                    return rnd
                rnd = self.ctx.rounds.propose(rnd, proposed, proposals.rationale)
                for b in rnd.branches:
                    self.ctx.emit("proposal", b.title, round=rnd.id, hypothesis=b.intervention.hypothesis)
            report = {"rationale": rnd.rationale, "proposals": [b.model_dump(mode="json") for b in rnd.branches]}
            if ranking:
                report["ranking"] = ranking
            answer = self.gatekeeper.ask(rnd, "after_design", subject, f"Run {len(rnd.branches)} branch(es)?", report)
            if answer.verb == "approve":
                return self.ctx.rounds.advance(rnd, "backtest")
            self.ctx.emit("proposal", f"revised: {answer.feedback}", round=rnd.id)
        self.ctx.emit("refused", f"round {rnd.id}: still revised after {MAX_REVISIONS} proposals")
        return rnd

    def _exploit(self, rnd: Round, diagnosis: Diagnosis | None, plan: Plan) -> Proposals:
        """An exploit round's one proposal: the winner combined with the other factors that beat
        the same control (once); where its screen held the control alone, the winner with the
        optimizer factor the planner ranks first for it from its diagnosis (once; `EXPLORED`); else
        the head continued."""
        factor = with_factor = None
        if plan.explore:
            ranked = self.planner.propose(rnd, diagnosis, 1, scheduled=True, kinds=EXPLORED)
            factor = next((iv for iv in ranked.interventions if iv.kind in EXPLORED and iv.changes), None)
            with_factor = explored(plan, factor) if factor is not None else None
        if plan.combine:
            iv = combination(plan)
            why = f"exploit {plan.parent}: combined with the factors that beat the same control"
        elif with_factor is not None and self.planner.branches(rnd, Proposals([with_factor], "", ""), plan.steps):
            assert factor is not None
            iv = with_factor
            why = (
                f"exploit {plan.parent}: its screen had room for the control alone; continued {plan.steps} steps with"
                f" the factor the planner ranks first ({factor.template or factor.source}), sized by {plan.how}"
            )
        else:
            iv = continuation(plan.steps, plan)
            kind = "a provisional winner (inside the floor after its screen)" if plan.provisional else "the winner"
            why = f"exploit {plan.parent}, {kind}: continued {plan.steps} steps, sized by {plan.how}"
        return Proposals([iv], why, "schedule")

    def needs_control(self, parent: str, remaining: int, screen: bool = False) -> bool:
        """A round with room for two versions runs the control beside its factors, unless this
        parent already has one. A step budget's `screen` runs it even when it has room for one
        branch: a lone factor is judged against its parent alone, so what its steps did would be
        credited to (or blamed on) the factor, while the control measures what a step of the
        parent's recipe gains, the yardstick later factors are credited against and the gain per
        step later versions are sized from."""
        least = 1 if screen else 2
        return self.ctx.config.coach.control and remaining >= least and self.ctx.control(parent) is None

    def backtest(self, rnd: Round, diagnosis: Diagnosis | None) -> Round:
        """Price reward and filter branches on the train rollouts the round reasons from (after
        failed branches, the latest child's GRPO run from this parent; for v0, its baseline groups),
        else the parent's own GRPO run; a branch the backtest contradicts is dropped. The round
        moves on to `run`."""
        store = self.ctx.store
        run = store.get_run(diagnosis.run_id) if diagnosis else None
        trained = run and store.query_one(
            "SELECT count(*) FROM rollouts WHERE run_id = ? AND split = 'train'", [run.id]
        )
        if not trained or not trained[0]:
            run = self.ctx.engine.train_run(rnd.parent)
        ran = []
        for i, b in enumerate(rnd.branches):
            iv = b.intervention
            if iv.is_control:  # it changes nothing: nothing to price
                continue
            outcome = backtest_intervention(store, run.id, iv.kind, iv.changes) if run else None
            if outcome is None:
                continue
            ran.append(i)
            dropped = outcome.summary if outcome.contradicts else b.dropped
            rnd = self.ctx.rounds.update_branch(rnd, i, backtest=asdict(outcome), dropped=dropped)
            if outcome.contradicts:
                self.ctx.emit("refused", f"{b.title}: dropped, {outcome.summary}", round=rnd.id)
        priced = [rnd.branches[i] for i in ran]
        for b in priced:
            self.ctx.emit("backtest", f"{b.title}: {b.backtest['summary']}", round=rnd.id)  # type: ignore[index]
        if priced:
            report = [{"title": b.title, "backtest": b.backtest} for b in priced]
            self.gatekeeper.ask(rnd, "after_backtest", f"round{rnd.id}", "Backtests done: run the branches?", report)
        return self.ctx.rounds.advance(rnd, "run")
