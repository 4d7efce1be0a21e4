"""Running a round's branches (`BranchRunner`): each branch becomes a version, trains (all at once
on a runner that runs in parallel), is judged, stops at the after-completion gate and is settled,
one at a time and in order. Every step stores the round and carries on from the value stored.
"""

from __future__ import annotations

from engine.coach.context import CoachContext, LoopResult
from engine.coach.gatekeeper import Gatekeeper
from engine.coach.judging import BranchJudge
from engine.coach.rounds import Branch, Round
from engine.coach.settling import Settler
from engine.config import CONFIG_FILE
from engine.core import ProgressFn, RunFailed, VersionPlan
from engine.harness.diagnose import Diagnosis

_VERB = {"promoted": "Promote", "rejected": "Reject", "pruned": "Prune", "held": "Prune"}


class BranchRunner:
    def __init__(self, ctx: CoachContext, gatekeeper: Gatekeeper, judge: BranchJudge, settler: Settler):
        self.ctx = ctx
        self.gatekeeper = gatekeeper
        self.judge = judge
        self.settler = settler

    def run(self, rnd: Round, diagnosis: Diagnosis | None, result: LoopResult, progress: ProgressFn | None) -> Round:
        """Every branch of the round not dropped or done, created, trained, judged and settled; the
        round as stored after its last branch."""
        engine = self.ctx.engine
        if engine.runner.parallel:
            rnd = self._train_together(rnd, result, progress)
        for i in range(len(rnd.branches)):
            b = rnd.branches[i]
            if b.dropped or b.done:
                continue
            if b.version is None:
                rnd = self.ctx.rounds.update_branch(rnd, i, version=self._create(rnd, b))
            name = rnd.branches[i].version
            assert name is not None
            if self._state(name) in ("created", "training"):
                try:
                    engine.train(name, progress, self.ctx.layers)
                except RunFailed as exc:
                    rnd = self.settler.settle(rnd, i, diagnosis, None, "failed", f"run failed: {exc.run.id}")
                    continue
                self._trained(name, result)
            state = self._state(name)
            if state == "failed":  # its run failed while no engine watched (settled on open)
                rnd = self.settler.settle(rnd, i, diagnosis, None, "failed", "run failed")
                continue
            if state == "trained":
                verdict, report, decision, reason = self.judge.judge(rnd, name, diagnosis)
                held = decision == "held"
                question = f"{_VERB[decision]} {name}? ({reason})"
                answer = self.gatekeeper.ask(rnd, "after_completion", name, question, report, force=held)
                if answer.verb == "revise":
                    self.ctx.emit("decision", f"{name}: left undecided, feedback for the next round: {answer.feedback}")
                else:
                    if held:  # a person saw why and approved: the version does not live on
                        decision, reason = "pruned", f"held for a person, who pruned it: {reason}"
                    rnd = self.settler.settle(rnd, i, diagnosis, verdict, decision, reason)
                    result.decisions.append((name, decision, reason))
                    continue
            rnd = self.ctx.rounds.update_branch(rnd, i, done=True)
        return rnd

    def _train_together(self, rnd: Round, result: LoopResult, progress: ProgressFn | None) -> Round:
        """A runner that runs runs in parallel (a Ray cluster) trains the round's branches at once;
        judging and deciding them stays one at a time, in order (`run`)."""
        for i, b in enumerate(rnd.branches):
            if b.version is None and not (b.dropped or b.done):
                rnd = self.ctx.rounds.update_branch(rnd, i, version=self._create(rnd, b))
        untrained = [
            b.version
            for b in rnd.branches
            if b.version is not None and not (b.dropped or b.done) and self._state(b.version) in ("created", "training")
        ]
        if len(untrained) < 2:
            return rnd  # one branch: trained in turn
        for name, outcome in self.ctx.engine.train_many(untrained, progress, self.ctx.layers).items():
            if not isinstance(outcome, RunFailed):
                self._trained(name, result)
        return rnd

    def _trained(self, name: str, result: LoopResult) -> None:
        result.trained.append(name)
        if (child := self.ctx.child_diagnosis(name)) is not None:
            self.ctx.emit("diagnosis", f"diagnosis of {child.run_id}", version=name, lines=child.headline())

    def _state(self, version: str) -> str:
        record = self.ctx.store.get_version(version)
        assert record is not None
        return record.state

    def _create(self, rnd: Round, b: Branch) -> str:
        iv = b.intervention
        name = self.ctx.engine.next_version_name()
        self.ctx.engine.create_version(
            VersionPlan(
                parent=rnd.parent,
                name=name,
                files={CONFIG_FILE: b.text},
                kind=iv.kind,
                factor=iv.factor,
                change=b.change,
                hypothesis=iv.hypothesis,
                success_criterion=iv.success_criterion,
                rollback=iv.rollback,
                round=rnd.id,
                template=iv.template,
                source=iv.source,
                evidence=tuple(iv.evidence),
            )
        )
        return name
