"""The coach: the autonomous loop of rounds, as a state machine over each round's stage.

One round: diagnose the best promoted version -> design K branches (each a different single
factor) -> backtest where one applies -> run each branch -> judge it against its parent ->
decide (promote / reject / prune) -> remember (case, skill, harness evolution). The next round
branches from the best promoted version. Gates stop the loop for a person where the workspace
switches them on, and everywhere after consecutive failures.

Each stage is persisted (`rounds.Rounds`, `gates.Gates`), so a loop stopped at a pending gate,
or by a dead engine, resumes where it stopped. What a stage needs from elsewhere lives where it
belongs: backtests in `engine.harness.backtest`, harness evolution and re-validation in
`evolution`, skill cards in `skills`, cases and the retrieval trace in `memory`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.coach.backends.base import Backend
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.evolution import Investigation, evolve, find_anomaly, moved, probe, revalidate
from engine.coach.gates import Answer, Answerer, Gate, Gates, nobody
from engine.coach.interventions import Intervention, control
from engine.coach.memory import Memory, failure_signature
from engine.coach.planning import Planner
from engine.coach.rounds import Branch, Round, Rounds
from engine.coach.skills import SkillLibrary, card_from_promotion
from engine.config import CONFIG_FILE, WorkspaceConfig
from engine.core import Engine, ProgressFn, RunFailed, VersionPlan
from engine.harness.backtest import backtest_intervention
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import MODE_LAYERS, load_harness
from engine.harness.rules import direct_tests_passed
from engine.verdict import Verdict

_VERB = {"promoted": "Promote", "rejected": "Reject", "pruned": "Prune", "held": "Prune"}

#: Revise answers a design gate takes before the round gives up on proposing.
MAX_REVISIONS = 3
#: Rounds in a row that ran nothing (every branch dropped by its backtest) before a loop stops.
MAX_IDLE_ROUNDS = 3


class WaitingAtGate(Exception):
    def __init__(self, gate: Gate):
        self.gate = gate
        super().__init__(f"waiting at gate {gate.id} ({gate.kind}): {gate.question}")


class Aborted(Exception):
    pass


@dataclass
class CoachEvent:
    """What a display shows: one line of the coach's reasoning or a decision."""

    kind: str  # round, diagnosis, proposal, refused, fallback, backtest, verdict, decision, escalation, evolution
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopResult:
    trained: list[str] = field(default_factory=list)
    decisions: list[tuple[str, str, str]] = field(default_factory=list)
    waiting: Gate | None = None
    aborted: bool = False
    stopped: str | None = None  # why the loop ended early, in words


def make_backend(config: WorkspaceConfig, on_event: Callable[[CoachEvent], None] | None = None) -> Backend:
    """The configured backend; anthropic without a key falls back to offline, saying so."""
    if config.coach.backend == "anthropic":
        if os.environ.get("ANTHROPIC_API_KEY"):
            from engine.coach.backends.anthropic_backend import AnthropicBackend

            return AnthropicBackend(config.coach.model, config.coach.max_tokens)
        if on_event is not None:
            on_event(CoachEvent("fallback", "coach.backend is anthropic but ANTHROPIC_API_KEY is not set: offline"))
    return OfflinePlanner()


class Coach:
    def __init__(
        self,
        engine: Engine,
        backend: Backend | None = None,
        answer: Answerer = nobody,
        on_event: Callable[[CoachEvent], None] | None = None,
        harness: str | None = None,
    ):
        self.engine = engine
        self.store = engine.store
        self.config = engine.config
        self.gates = Gates(self.store)
        self.rounds = Rounds(self.store)
        self.memory = Memory(self.store)
        self.answer = answer
        self.on_event = on_event
        self.backend = backend or make_backend(self.config, self._emit)
        self.planner = Planner(engine, self.backend, self._emit)
        self.harness_mode = harness or self.config.coach.harness
        #: The harness layers every diagnosis of this coach uses (passed to the engine per call).
        self.layers = MODE_LAYERS[self.harness_mode]
        self.skills = SkillLibrary(engine.workspace.root)

    def _emit(self, kind: str | CoachEvent, message: str = "", **data: Any) -> None:
        event = kind if isinstance(kind, CoachEvent) else CoachEvent(kind, message, data)
        self.store.add_event(f"coach_{event.kind}", {"message": event.message, **event.data})
        if self.on_event is not None:
            self.on_event(event)

    # -- the loop -------------------------------------------------------------------------------
    def run(self, versions: int, progress: ProgressFn | None = None) -> LoopResult:
        """Run rounds until `versions` versions were trained (or a gate waits, or it is aborted)."""
        result = LoopResult()
        self.engine.ensure_base(progress, self.layers)
        idle = 0
        while len(result.trained) < versions:
            if idle >= MAX_IDLE_ROUNDS:
                result.stopped = f"{idle} rounds in a row had every branch dropped by its backtest"
                break
            children = sum(1 for v in self.store.list_versions() if v.parent is not None)
            if children >= self.config.budget.max_versions:
                result.stopped = f"budget.max_versions ({self.config.budget.max_versions}) reached"
                break
            rnd = self.rounds.current() or self._open_round()
            before = len(result.trained) + len(result.decisions)
            try:
                if not self._play(rnd, versions - len(result.trained), result, progress):
                    result.stopped = "no applicable intervention is left to propose"
                    break
                idle = idle + 1 if len(result.trained) + len(result.decisions) == before else 0
            except WaitingAtGate as waiting:
                result.waiting = waiting.gate
                self._emit("waiting", str(waiting), gate=waiting.gate.id)
                break
            except Aborted as exc:
                result.aborted = True
                result.stopped = str(exc)
                break
        return result

    def _open_round(self) -> Round:
        best = self.engine.best_version()
        assert best is not None  # v0 is promoted by ensure_base
        failures = self.memory.consecutive_failures()
        escalated = failures >= self.config.coach.escalate_after
        rnd = self.rounds.open(best.name, self.backend.name, self.harness_mode, escalated)
        self._emit("round", f"round {rnd.id}: branching from {best.name}", round=rnd.id, parent=best.name)
        if escalated:
            self._escalate(rnd, failures)
        return rnd

    def _play(self, rnd: Round, remaining: int, result: LoopResult, progress: ProgressFn | None) -> bool:
        """Move the round through its stages from where it stands; False when it had nothing to run."""
        diagnosis = self._parent_diagnosis(rnd.parent)
        if rnd.stage == "diagnosis":
            self._emit("diagnosis", self._headline(rnd.parent, diagnosis), round=rnd.id)
            report = diagnosis.to_dict() if diagnosis else None
            self._gate(rnd, "after_diagnosis", f"round{rnd.id}", f"Diagnosis of {rnd.parent}: go on?", report)
            self.rounds.advance(rnd, "design", diagnosis=diagnosis.id if diagnosis else None)
        if rnd.stage == "design" and not self._design(rnd, diagnosis, remaining):
            self.rounds.end(rnd)
            return False
        if rnd.stage == "backtest":
            self._backtest(rnd, diagnosis)
        if rnd.stage == "run":
            self._run_branches(rnd, diagnosis, result, progress)
            self.rounds.end(rnd)
        return True

    # -- gates ------------------------------------------------------------------------------------
    def _gate(self, rnd: Round, kind: str, subject: str, question: str, report: Any, force: bool = False) -> Answer:
        """Stop for a person at a gate the workspace turned on; `force` (a held version) or a run
        of consecutive failures opens it whatever the settings, and `--auto-approve` does not
        answer it."""
        forced = force or self.memory.consecutive_failures() >= self.config.coach.gates_after_failures
        if not getattr(self.config.gates, kind) and not forced:
            return Answer("approve", by="not gated")
        gate = self.gates.find(rnd.id, kind, subject)
        if gate is None:
            gate = self.gates.open(rnd.id, kind, subject, question, {"report": report}, forced)
        if gate.answer is not None:
            answer = gate.answer
        else:
            now = self.answer(gate)
            if now is None:
                raise WaitingAtGate(gate)
            answer = self.gates.answer(gate.id, now).answer or now
        if answer.verb == "abort":
            self._abort(rnd, f"aborted at gate {gate.id} ({kind})")
        return answer

    def _abort(self, rnd: Round, reason: str) -> None:
        """Stop, and roll back what the round had not run: versions created but not trained are pruned."""
        for v in self.store.list_versions():
            if v.state == "created" and self.rounds.of_version(v.name) == rnd.id:
                self.engine.decide(v.name, "pruned", reason)
        self.rounds.end(rnd, "aborted")
        self._emit("decision", reason, round=rnd.id)
        raise Aborted(reason)

    # -- design -------------------------------------------------------------------------------------
    def _design(self, rnd: Round, diagnosis: Diagnosis | None, remaining: int) -> bool:
        ranking: list[dict[str, Any]] = []
        for revision in range(MAX_REVISIONS + 1):
            subject = f"round{rnd.id}-design{revision}"
            # Resuming at this design's gate: the proposals it shows, not new ones.
            if self.gates.find(rnd.id, "after_design", subject) is None or not rnd.branches:
                # The control comes on top of the round's factors when there is room for both.
                with_control = self._needs_control(rnd.parent, remaining)
                branches = min(self.config.coach.branches, remaining - with_control)
                proposals = self.planner.propose(rnd, diagnosis, branches)
                ranking = proposals.ranking
                if with_control:
                    steps = self.engine.version_config(rnd.parent).recipe.steps
                    proposals.interventions.insert(0, control(steps))
                    proposals.rationale += "; with the control (the parent trained on, no change)"
                rnd.branches, rnd.rationale = self.planner.branches(rnd, proposals), proposals.rationale
                if not rnd.branches:
                    self._emit("refused", f"round {rnd.id}: nothing applicable to propose from {rnd.parent}")
                    return False
                self.rounds.save_branches(rnd)
                for b in rnd.branches:
                    self._emit("proposal", b.title, round=rnd.id, hypothesis=b.intervention.hypothesis)
            report = {"rationale": rnd.rationale, "proposals": [b.model_dump(mode="json") for b in rnd.branches]}
            if ranking:
                report["ranking"] = ranking
            answer = self._gate(rnd, "after_design", subject, f"Run {len(rnd.branches)} branch(es)?", report)
            if answer.verb == "approve":
                self.rounds.advance(rnd, "backtest")
                return True
            self._emit("proposal", f"revised: {answer.feedback}", round=rnd.id)
        self._emit("refused", f"round {rnd.id}: still revised after {MAX_REVISIONS} proposals")
        return False

    def _needs_control(self, parent: str, remaining: int) -> bool:
        """A round with room for two versions runs the control beside its factors, unless this
        parent already has one."""
        return self.config.coach.control and remaining >= 2 and self._control(parent) is None

    def _control(self, parent: str) -> str | None:
        """The parent's evaluated control (one a round aborted before it trained does not count)."""
        return next((c for c in self.memory.controls(parent) if self.engine.eval_run(c) is not None), None)

    # -- backtests ----------------------------------------------------------------------------------
    def _backtest(self, rnd: Round, diagnosis: Diagnosis | None) -> None:
        """Price reward and filter branches on the train rollouts the round reasons from (after
        failed branches, the latest child's GRPO run from this parent; for v0, its baseline groups),
        else the parent's own GRPO run; a branch the backtest contradicts is dropped."""
        run = self.store.get_run(diagnosis.run_id) if diagnosis else None
        trained = run and self.store.query_one(
            "SELECT count(*) FROM rollouts WHERE run_id = ? AND split = 'train'", [run.id]
        )
        if not trained or not trained[0]:
            run = self.engine.train_run(rnd.parent)
        ran = []
        for b in rnd.branches:
            iv = b.intervention
            if iv.is_control:  # it changes nothing: nothing to price
                continue
            outcome = backtest_intervention(self.store, run.id, iv.kind, iv.changes) if run else None
            if outcome is None:
                continue
            b.backtest = asdict(outcome)
            ran.append(b)
            if outcome.contradicts:
                b.dropped = outcome.summary
                self._emit("refused", f"{b.title}: dropped, {outcome.summary}", round=rnd.id)
        self.rounds.save_branches(rnd)
        for b in ran:
            self._emit("backtest", f"{b.title}: {b.backtest['summary']}", round=rnd.id)  # type: ignore[index]
        if ran:
            report = [{"title": b.title, "backtest": b.backtest} for b in ran]
            self._gate(rnd, "after_backtest", f"round{rnd.id}", "Backtests done: run the branches?", report)
        self.rounds.advance(rnd, "run")

    # -- running, judging, deciding -------------------------------------------------------------------
    def _run_branches(
        self, rnd: Round, diagnosis: Diagnosis | None, result: LoopResult, progress: ProgressFn | None
    ) -> None:
        if self.engine.runner.parallel:
            self._train_together(rnd, result, progress)
        for b in rnd.branches:
            if b.dropped or b.done:
                continue
            if b.version is None:
                b.version = self._create(rnd, b)
                self.rounds.save_branches(rnd)
            record = self.store.get_version(b.version)
            assert record is not None
            if record.state in ("created", "training"):
                try:
                    self.engine.train(b.version, progress, self.layers)
                except RunFailed as exc:
                    self._settle(rnd, b, diagnosis, None, "failed", f"run failed: {exc.run.id}")
                    continue
                self._trained(b.version, result)
            record = self.store.get_version(b.version)
            assert record is not None
            if record.state == "failed":  # its run failed while no engine watched (settled on open)
                self._settle(rnd, b, diagnosis, None, "failed", "run failed")
                continue
            if record.state == "trained":
                verdict, report, decision, reason = self._judge(rnd, b.version, diagnosis)
                held = decision == "held"
                question = f"{_VERB[decision]} {b.version}? ({reason})"
                answer = self._gate(rnd, "after_completion", b.version, question, report, force=held)
                if answer.verb == "revise":
                    self._emit(
                        "decision", f"{b.version}: left undecided, feedback for the next round: {answer.feedback}"
                    )
                else:
                    if held:  # a person saw why and approved: the version does not live on
                        decision, reason = "pruned", f"held for a person, who pruned it: {reason}"
                    self._settle(rnd, b, diagnosis, verdict, decision, reason)
                    result.decisions.append((b.version, decision, reason))
                    continue
            b.done = True
            self.rounds.save_branches(rnd)

    def _judge(
        self, rnd: Round, name: str, diagnosis: Diagnosis | None
    ) -> tuple[Verdict | None, dict[str, Any], str, str]:
        """The verdict, the child's diagnosis, the investigation and the decision they propose,
        with the gate's report. Judging fails closed: an error anywhere in it holds the version for
        a person (`held`), never promotes it."""
        try:
            verdict = self.engine.judge(name)
            self._emit("verdict", f"{name}: {verdict.summary()}", version=name, label=verdict.label)
            child = self._child_diagnosis(name)
            investigation = self._investigate(rnd, name, verdict, diagnosis, child)
            if investigation is not None and investigation.adopted:
                child = self._child_diagnosis(name)  # again, with the evolved harness
            decision, reason = proposed_decision(verdict, child, investigation, self.layers is None)
            report: dict[str, Any] = {"verdict": verdict.summary(), "decision": decision, "reason": reason}
            if investigation is not None:
                report["investigation"] = investigation.to_dict()
            report["flips"] = self.engine.flips(name)
        except Exception as exc:  # noqa: BLE001 - an error while judging holds the version (fail closed)
            reason = f"judging {name} failed: {type(exc).__name__}: {exc}"
            self._emit("decision", f"{name} held: {reason}", version=name, decision="held")
            return None, {"decision": "held", "reason": reason}, "held", reason
        if decision == "held":
            self._emit("decision", f"{name} held: {reason}", version=name, decision="held")
        return verdict, report, decision, reason

    def _train_together(self, rnd: Round, result: LoopResult, progress: ProgressFn | None) -> None:
        """A runner that runs runs in parallel (a Ray cluster) trains the round's branches at once;
        judging and deciding them stays one at a time, in order (`_run_branches`)."""
        for b in rnd.branches:
            if b.version is None and not (b.dropped or b.done):
                b.version = self._create(rnd, b)
        self.rounds.save_branches(rnd)
        untrained = [
            b.version
            for b in rnd.branches
            if b.version is not None and not (b.dropped or b.done) and self._state(b.version) in ("created", "training")
        ]
        if len(untrained) < 2:
            return  # one branch: trained in turn
        for name, outcome in self.engine.train_many(untrained, progress, self.layers).items():
            if not isinstance(outcome, RunFailed):
                self._trained(name, result)

    def _trained(self, name: str, result: LoopResult) -> None:
        result.trained.append(name)
        if (child := self._child_diagnosis(name)) is not None:
            self._emit("diagnosis", f"diagnosis of {child.run_id}", version=name, lines=child.headline())

    def _state(self, version: str) -> str:
        record = self.store.get_version(version)
        assert record is not None
        return record.state

    def _create(self, rnd: Round, b: Branch) -> str:
        iv = b.intervention
        name = self.engine.next_version_name()
        self.engine.create_version(
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

    def _settle(
        self,
        rnd: Round,
        b: Branch,
        diagnosis: Diagnosis | None,
        verdict: Verdict | None,
        decision: str,
        reason: str,
    ) -> None:
        """Record a branch's end: the decision (tag and store), its case, a skill card for a
        promotion."""
        name, iv = b.version, b.intervention
        assert name is not None
        domain = self.engine.version_config(name).domain.name
        against = self._against_control(rnd.parent, name, iv) if verdict is not None else None
        if decision == "promoted" and verdict is not None:  # written first: the decision below is the unit
            self._card(rnd, name, iv, diagnosis, verdict, against, domain)
        case = {"signature": failure_signature(diagnosis), "domain": domain, "parent": rnd.parent, "kind": iv.kind}
        case |= {"template": iv.template, "factor": iv.factor, "verdict": verdict.label if verdict else None}
        if against is not None:
            case |= {"control": against.parent, "vs_control": against.label, "vs_control_delta": _primary(against)}
        if decision == "failed":  # the run failed: no tag to add, the case alone
            self.store.record_case(name, case, decision, reason)
        else:
            self.engine.decide(name, decision, reason, case=case)
        self._emit("decision", f"{name} {decision}: {reason}", version=name, decision=decision)
        b.done = True
        self.rounds.save_branches(rnd)

    def _against_control(self, parent: str, name: str, iv: Intervention) -> Verdict | None:
        """The branch against its parent's control on val (None for the control itself, or when the
        parent has no trained control)."""
        control_name = self._control(parent)
        if iv.is_control or control_name is None:
            return None
        try:
            return self.engine.compare(control_name, name)
        except Exception as exc:  # noqa: BLE001 - memory only: the decision against the parent stands
            # Fails closed for memory: no comparison, so no card credits the factor; the loop goes on.
            why = f"{type(exc).__name__}: {exc}"
            self._emit("error", f"{name} could not be compared with the control {control_name}: {why}", version=name)
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
        if self.config.coach.control and (against is None or against.label != "improved"):
            why = f"against the control {against.summary()}" if against else "no comparison with a trained control"
            self._emit("skill", f"no skill card from {name}: its factor did not beat the control ({why})", version=name)
            return
        rules = diagnosis.rule_names if diagnosis else []
        card = card_from_promotion(name, rnd.parent, iv, rules, verdict, domain, against)
        path = self.skills.write(card)
        self._emit("skill", f"skill card {path.name} written from {name}", version=name)

    def _investigate(
        self, rnd: Round, name: str, verdict: Verdict, parent_diagnosis: Diagnosis | None, child: Diagnosis | None
    ) -> Investigation | None:
        """Before the decision: every gain that would be promoted, and a regression that no rule or
        moved finding explains, is investigated. Nothing that moves with the score can explain a
        gain, so a gain is investigated whatever moved. The planner proposes analyzers from what
        moved; each probes the version's val answers against its parent's (beyond the parent's own
        spread at the false-alarm rate of `engine.harness.cutoffs`, it is a finding); each is
        validated on past versions and the best separating one adopted. The score-only ablation
        does not evolve its harness."""
        if self.layers is not None:
            return None
        anomaly = find_anomaly(verdict.label, child, parent_diagnosis)
        if anomaly is None and verdict.label == "improved":
            moves = moved(child, parent_diagnosis) if child is not None else []
            anomaly = {"verdict": "improved", "version": name, "unexplained": False, "moved": moves}
        if anomaly is None:
            return None
        root = self.engine.workspace.root
        existing = {a.name for a in load_harness(root).analyzers}
        runs = self.engine.eval_run(name), self.engine.eval_run(rnd.parent)
        logged = self.store.query(
            "SELECT DISTINCT unnest(map_keys(reward_components)) FROM rollouts WHERE run_id = ? ORDER BY 1",
            [runs[0].id if runs[0] else ""],
        )
        anomaly |= {"components": [c for (c,) in logged], "existing": sorted(existing)}
        anomaly["flips"] = self.planner.flips(name)  # what the model backend reads before it judges
        why = "no rule explains it" if anomaly["unexplained"] else "every gain is"
        self._emit("evolution", f"{name} {verdict.label} and {why}: investigating before the decision")
        try:
            specs = self.planner.propose_analyzers(rnd, parent_diagnosis, anomaly)
            probes = {s.name: probe(self.store, s, runs[0].id, runs[1].id) for s in specs} if all(runs) else {}
            for p in probes.values():
                self._emit("evolution", f"probe {p.summary()}", version=name, found=p.found)
            results = evolve(self.store, root, specs, rnd.id, existing, name, probes)
        except Exception as exc:  # noqa: BLE001 - nothing a proposal does stops the loop
            failed = Investigation(name, anomaly, [], [], f"{type(exc).__name__}: {exc}")
            self._emit("evolution", failed.summary(), version=name)
            return failed
        for r in results:
            self._emit("evolution", f"analyzer {r.spec.name} {'adopted' if r.adopted else 'refused'}: {r.reason}")
        investigation = Investigation(name, anomaly, list(probes.values()), [r.spec.name for r in results if r.adopted])
        self._emit("evolution", f"{name}: {investigation.summary()}", version=name)
        return investigation

    # -- escalation ------------------------------------------------------------------------------
    def _escalate(self, rnd: Round, failures: int) -> None:
        """After `escalate_after` failures: re-validate the harness on past outcomes (retiring
        adopted analyzers that no longer separate them), then let the planner switch layers and
        prefer removing over adding; the round branches from the last good version (the best
        promoted one)."""
        check = revalidate(self.store, self.engine.workspace.root, rnd.id)
        retired = f"; retired {', '.join(f for f, _ in check.retired)}" if check.retired else ""
        self._emit(
            "escalation",
            f"{failures} consecutive failures: re-validated the harness ({len(check.separating)} of "
            f"{len(check.validations)} metrics separate past outcomes{retired}); switching layers, preferring "
            "removal, consulting skills and literature; branching from the last good version",
            round=rnd.id,
            retired=[f for f, _ in check.retired],
        )

    # -- diagnoses ----------------------------------------------------------------------------------
    def _parent_diagnosis(self, parent: str) -> Diagnosis | None:
        """What a round reasons from: the latest GRPO run that started from `parent` or trained it
        (what training does to this policy: after failed branches, the last child's run), else
        the parent's own latest run (v0's warm-up); diagnosed with this coach's layers."""
        run = self.engine.latest_train_run_from(parent)
        if run is None:
            try:
                run = self.engine.latest_run(parent)
            except ValueError:
                return None
        return self.engine.diagnosis(run, self.layers)

    def _child_diagnosis(self, version: str) -> Diagnosis | None:
        run = self.engine.train_run(version)
        return self.engine.diagnosis(run, self.layers) if run else None

    def _headline(self, version: str, diagnosis: Diagnosis | None) -> str:
        source = f" (from {diagnosis.run_id})" if diagnosis else ""
        b = diagnosis.bottleneck if diagnosis else None
        if b is None:
            return f"{version}{source}: no rule fired"
        return f"{version}{source}: bottleneck {b.rule} ({b.severity}): {b.explanation}"


def proposed_decision(
    verdict: Verdict,
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


def _primary(verdict: Verdict) -> float | None:
    main = verdict.primary_delta
    return main.diff if main else None


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
