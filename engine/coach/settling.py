"""Settling a branch (`Settler`): its decision (tagged and stored), the case memory files for it,
measured against the parent's no-change control, and the skill card a promotion earns only when
its factor beat that control. Settling returns the round, stored, with the branch marked done.
"""

from __future__ import annotations

from engine.coach.context import CoachContext
from engine.coach.interventions import Intervention
from engine.coach.memory import failure_signature
from engine.coach.rounds import Round
from engine.coach.schedule import EXPLOIT, SegmentVerdict
from engine.coach.skills import SkillLibrary, card_from_promotion
from engine.harness.diagnose import Diagnosis
from engine.verdict import Verdict


class Settler:
    def __init__(self, ctx: CoachContext, skills: SkillLibrary):
        self.ctx = ctx
        self.skills = skills

    def settle(
        self,
        rnd: Round,
        index: int,
        diagnosis: Diagnosis | None,
        verdict: Verdict | SegmentVerdict | None,
        decision: str,
        reason: str,
    ) -> Round:
        """Record the end of branch `index`: the decision (tag and store), its case, a skill card
        for a promotion."""
        b = rnd.branches[index]
        name, iv = b.version, b.intervention
        assert name is not None
        engine = self.ctx.engine
        domain = engine.version_config(name).domain.name
        exploit = iv.template in EXPLOIT  # a segment of a lineage: judged on it, credited to no factor
        against = self._against_control(rnd.parent, name, iv) if verdict is not None and not exploit else None
        if (
            decision == "promoted" and isinstance(verdict, Verdict) and not exploit
        ):  # first: the decision below is the unit
            self._card(rnd, name, iv, diagnosis, verdict, against, domain)
        case = {"signature": failure_signature(diagnosis), "domain": domain, "parent": rnd.parent, "kind": iv.kind}
        case |= {"template": iv.template, "factor": iv.factor, "verdict": verdict.label if verdict else None}
        if against is not None:
            case |= {"control": against.parent, "vs_control": against.label, "vs_control_delta": _primary(against)}
        if decision == "failed":  # the run failed: no tag to add, the case alone
            self.ctx.store.record_case(name, case, decision, reason)
        else:
            engine.decide(name, decision, reason, case=case)
        self.ctx.emit("decision", f"{name} {decision}: {reason}", version=name, decision=decision)
        return self.ctx.rounds.update_branch(rnd, index, done=True)

    def _against_control(self, parent: str, name: str, iv: Intervention) -> Verdict | None:
        """The branch against its parent's control on val (None for the control itself, or when the
        parent has no trained control)."""
        control_name = self.ctx.control(parent)
        if iv.is_control or control_name is None:
            return None
        try:
            return self.ctx.engine.compare(control_name, name)
        except Exception as exc:  # noqa: BLE001 - memory only: the decision against the parent stands
            # Fails closed for memory: no comparison, so no card credits the factor; the loop goes on.
            why = f"{type(exc).__name__}: {exc}"
            self.ctx.emit("error", f"{name} could not be compared with the control {control_name}: {why}", version=name)
            return None

    def _card(
        self,
        rnd: Round,
        name: str,
        iv: Intervention,
        diagnosis: Diagnosis | None,
        verdict: Verdict,
        against: Verdict | None,
        domain: str,
    ) -> None:
        """A skill card for a promotion whose factor beat the round's control beyond the floor (with
        the control off, against the parent, and the card says so). The control earns none: its
        gain over itself is nothing, and what it shows (training longer pays) is in its case."""
        if iv.is_control:
            return
        if self.ctx.config.coach.control and (against is None or against.label != "improved"):
            why = f"against the control {against.summary()}" if against else "no comparison with a trained control"
            message = f"no skill card from {name}: its factor did not beat the control ({why})"
            self.ctx.emit("skill", message, version=name)
            return
        rules = diagnosis.rule_names if diagnosis else []
        card = card_from_promotion(name, rnd.parent, iv, rules, verdict, domain, against)
        path = self.skills.write(card)
        self.ctx.emit("skill", f"skill card {path.name} written from {name}", version=name)


def _primary(verdict: Verdict) -> float | None:
    main = verdict.primary_delta
    return main.diff if main else None
