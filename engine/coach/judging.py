"""Judging a trained branch (`BranchJudge`): its verdict against the parent, its diagnosis, the
investigation every gain (and every unexplained regression) gets before the decision, and the
decision they propose (`proposed_decision`). Judging fails closed: an error anywhere in it holds
the version for a person, never promotes it.
"""

from __future__ import annotations

from typing import Any

from engine.coach.context import CoachContext
from engine.coach.evolution import Investigation, evolve, find_anomaly, moved, probe_all
from engine.coach.planning import Planner
from engine.coach.rounds import Round
from engine.coach.schedule import EXPLOIT, Schedule, SegmentVerdict, margin
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import load_harness
from engine.harness.rules import direct_tests_passed
from engine.verdict import Verdict


class BranchJudge:
    def __init__(self, ctx: CoachContext, planner: Planner):
        self.ctx = ctx
        self.planner = planner

    def judge(
        self, rnd: Round, name: str, diagnosis: Diagnosis | None
    ) -> tuple[Verdict | SegmentVerdict | None, dict[str, Any], str, str]:
        """The verdict, the child's diagnosis, the investigation and the decision they propose,
        with the gate's report. Judging fails closed: an error anywhere in it holds the version for
        a person (`held`), never promotes it."""
        emit = self.ctx.emit
        try:
            verdict: Verdict | SegmentVerdict = self.ctx.engine.judge(name)
            if self._template(name) in EXPLOIT:
                verdict = self.segment(name, verdict)
            emit("verdict", f"{name}: {verdict.summary()}", version=name, label=verdict.label)
            child = self.ctx.child_diagnosis(name)
            investigation = self.investigate(rnd, name, verdict, diagnosis, child)
            if investigation is not None and investigation.adopted:
                child = self.ctx.child_diagnosis(name)  # again, with the evolved harness
            decision, reason = proposed_decision(verdict, child, investigation, self.ctx.layers is None)
            report: dict[str, Any] = {"verdict": verdict.summary(), "decision": decision, "reason": reason}
            if investigation is not None:
                report["investigation"] = investigation.to_dict()
            report["flips"] = self.ctx.engine.flips(name)
        except Exception as exc:  # noqa: BLE001 - an error while judging holds the version (fail closed)
            reason = f"judging {name} failed: {type(exc).__name__}: {exc}"
            emit("decision", f"{name} held: {reason}", version=name, decision="held")
            return None, {"decision": "held", "reason": reason}, "held", reason
        if decision == "held":
            emit("decision", f"{name} held: {reason}", version=name, decision="held")
        return verdict, report, decision, reason

    def segment(self, name: str, against_parent: Verdict) -> SegmentVerdict:
        """A continuation or combination's verdict: against its parent, against its lineage's start,
        and the margin its parent's established gain allows (`engine.coach.schedule`)."""
        engine = self.ctx.engine
        lineage = Schedule(self.ctx.store).lineage(name)
        if lineage is None:
            raise ValueError(f"{name} continues no lineage")
        parent = self.ctx.store.get_version(against_parent.parent)
        established = None
        if parent is not None and parent.state == "promoted":
            established = engine.compare(lineage.start, parent.name)
        return SegmentVerdict(against_parent, engine.compare(lineage.start, name), margin(established))

    def _template(self, name: str) -> str | None:
        row = self.ctx.store.query_one(
            "SELECT i.template FROM versions v JOIN interventions i ON i.id = v.intervention_id WHERE v.name = ?",
            [name],
        )
        return row[0] if row else None

    def investigate(
        self,
        rnd: Round,
        name: str,
        verdict: Verdict | SegmentVerdict,
        parent_diagnosis: Diagnosis | None,
        child: Diagnosis | None,
    ) -> Investigation | None:
        """Before the decision: every gain that would be promoted, and a regression that no rule or
        moved finding explains, is investigated. Nothing that moves with the score can explain a
        gain, so a gain is investigated whatever moved. The planner proposes analyzers from what
        moved; each probes the version's val answers against its parent's (beyond the parent's own
        spread at the false-alarm rate of `engine.harness.cutoffs`, it is a finding); each is
        validated on past versions and the best separating one adopted. The score-only ablation
        does not evolve its harness."""
        if self.ctx.layers is not None:
            return None
        anomaly = find_anomaly(verdict.label, child, parent_diagnosis)
        if anomaly is None and verdict.label == "improved":
            moves = moved(child, parent_diagnosis) if child is not None else []
            anomaly = {"verdict": "improved", "version": name, "unexplained": False, "moved": moves}
        if anomaly is None:
            return None
        engine, store, emit = self.ctx.engine, self.ctx.store, self.ctx.emit
        root = engine.workspace.root
        existing = {a.name for a in load_harness(root).analyzers}
        runs = engine.eval_run(name), engine.eval_run(rnd.parent)
        logged = store.query(
            "SELECT DISTINCT unnest(map_keys(reward_components)) FROM rollouts WHERE run_id = ? ORDER BY 1",
            [runs[0].id if runs[0] else ""],
        )
        anomaly |= {"components": [c for (c,) in logged], "existing": sorted(existing)}
        anomaly["flips"] = self.planner.flips(name)  # what the model backend reads before it judges
        why = "no rule explains it" if anomaly["unexplained"] else "every gain is"
        emit("evolution", f"{name} {verdict.label} and {why}: investigating before the decision")
        try:
            specs = self.planner.propose_analyzers(rnd, parent_diagnosis, anomaly)
            probes = probe_all(store, specs, runs[0].id, runs[1].id) if all(runs) and specs else {}
            for p in probes.values():
                emit("evolution", f"probe {p.summary()}", version=name, found=p.found)
            results = evolve(store, root, specs, rnd.id, existing, name, probes)
        except Exception as exc:  # noqa: BLE001 - nothing a proposal does stops the loop
            failed = Investigation(name, anomaly, [], [], f"{type(exc).__name__}: {exc}")
            emit("evolution", failed.summary(), version=name)
            return failed
        for r in results:
            emit("evolution", f"analyzer {r.spec.name} {'adopted' if r.adopted else 'refused'}: {r.reason}")
        investigation = Investigation(name, anomaly, list(probes.values()), [r.spec.name for r in results if r.adopted])
        emit("evolution", f"{name}: {investigation.summary()}", version=name)
        return investigation


def proposed_decision(
    verdict: Verdict | SegmentVerdict,
    diagnosis: Diagnosis | None,
    investigation: Investigation | None = None,
    investigated: bool = False,
) -> tuple[str, str]:
    """Promote only a gain that clears the noise floor (the paired bootstrap's 95% interval above 0)
    with no blocking rule standing against it; a higher score with one (a leak, a collapse, a form
    shift, a gain the verifier audit refuses: `BLOCKING_RULES`, critical) is rejected with that
    reason and kept as negative evidence, while a bottleneck rule (truncation, say) does not block
    a measured gain. So is one whose investigation found a shift no rule measured, where no direct
    test of the gain (the audit, the agreement of answers) ran and found it sound; beside one that
    did, what the probes found is reported (a probe blocks once adopted). A run the
    collapse guard stopped early is rejected whatever it scores. Regressions are rejected; mixed or
    insufficient evidence is pruned.

    Fail closed: with `investigated` (the full harness investigates every promotion), a gain is
    `held` for a person when it has no diagnosis or investigation, when the investigation or one of
    its probes failed, or when a workspace harness file, analyzer or rule is broken (a rule that
    blocks may not have run)."""
    stopped = diagnosis.fired_rule("stopped_early") if diagnosis else None
    if stopped is not None:
        return "rejected", f"stopped early: {stopped.explanation}"
    if verdict.label == "improved":
        if diagnosis and diagnosis.blocking:
            r = diagnosis.blocking[0]
            return "rejected", f"scores higher but rule {r.rule} is critical: {r.explanation}"
        if investigated:
            held = _held(diagnosis, investigation)
            if held is not None:
                return "held", f"scores higher, but {held}: {verdict.summary()}"
        if investigation is not None and investigation.found:
            tested = direct_tests_passed(diagnosis.findings) if diagnosis else []
            if not tested:
                return "rejected", f"scores higher, but {investigation.summary()}"
            # A probe is a proposal, not a validated analyzer: beside a direct test that found the
            # gain sound it is reported, and it blocks only once adopted (workspace_critical).
            return "promoted", (
                f"{verdict.summary()}; the gain survives the direct tests ({', '.join(tested)}); "
                f"reported: {investigation.summary()}"
            )
        if investigation is not None:
            return "promoted", f"{verdict.summary()}; {investigation.summary()}"
        return "promoted", verdict.summary()
    if verdict.label == "regressed":
        return "rejected", verdict.summary()
    return "pruned", verdict.summary()


def _held(diagnosis: Diagnosis | None, investigation: Investigation | None) -> str | None:
    """Why a gain cannot be judged to the end (see `proposed_decision`), or None."""
    if diagnosis is None:
        return "it has no diagnosis to check it against"
    broken = [f.explanation for f in diagnosis.findings if f.metric.startswith("harness.broken.")]
    if broken:
        return "the workspace harness is broken, so a rule that blocks may not have run: " + "; ".join(broken)
    if investigation is None:
        return "it was not investigated"
    if investigation.error:
        return investigation.summary()
    failed = [p.summary() for p in investigation.probes if p.error]
    if failed:
        return "a probe of the investigation failed: " + "; ".join(failed)
    return None
