"""The coach: the autonomous loop of rounds.

One round: diagnose the best promoted version -> propose K branches (each a different single
factor) -> backtest where one applies -> run each branch -> judge it against its parent ->
decide (promote / reject / prune) -> remember (case, skill, harness evolution). The next round
branches from the best promoted version. Gates stop the loop for a person where the workspace
switches them on, and everywhere after consecutive failures.

Every stage is persisted in the store (`rounds`, `gates`), so a loop stopped at a pending gate,
or by a dead engine, resumes where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from engine.coach.backends.base import Backend, BackendError, PlanningContext, Proposals
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.evolution import evolve, find_anomaly
from engine.coach.gates import Answer, Answerer, Gate, Gates, nobody
from engine.coach.interventions import Facts, Intervention, InterventionError, apply, config_changes
from engine.coach.literature import Literature
from engine.coach.memory import Memory, failure_signature
from engine.coach.skills import SkillCard, SkillLibrary, slugify
from engine.config import CONFIG_FILE, WorkspaceConfig
from engine.core import Engine, Plan, ProgressFn, RunFailed
from engine.harness.backtest import filter_backtest, reward_backtest, store_backtest
from engine.harness.diagnose import Diagnosis
from engine.verdict import Verdict

_VERB = {"promoted": "Promote", "rejected": "Reject", "pruned": "Prune"}

#: Revise answers a design gate takes before the round gives up on proposing.
MAX_REVISIONS = 3


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
        self.memory = Memory(self.store)
        self.answer = answer
        self.on_event = on_event
        self.backend = backend or make_backend(self.config, self._emit)
        self.offline = OfflinePlanner()
        self.harness_mode = harness or self.config.coach.harness
        engine.harness_layers = ("score",) if self.harness_mode == "score-only" else None
        root = engine.workspace.root
        self.skills = SkillLibrary(root)
        self.literature = Literature(root)
        self._diagnoses: dict[str, Diagnosis] = {}
        #: What the last planning context looked up (recorded with the proposals made from it).
        self._retrievals: tuple[Any, ...] = (None, "", [], [], [], "none", [])
        previous = engine.on_diagnosis

        def capture(d: Diagnosis) -> None:
            self._diagnoses[d.run_id] = d
            if previous is not None:
                previous(d)

        engine.on_diagnosis = capture

    def _emit(self, kind: str | CoachEvent, message: str = "", **data: Any) -> None:
        event = kind if isinstance(kind, CoachEvent) else CoachEvent(kind, message, data)
        self.store.add_event(f"coach_{event.kind}", {"message": event.message, **event.data})
        if self.on_event is not None:
            self.on_event(event)

    # -- the loop -------------------------------------------------------------------------------
    def run(self, versions: int, progress: ProgressFn | None = None) -> LoopResult:
        """Run rounds until `versions` versions were trained (or a gate waits, or it is aborted)."""
        result = LoopResult()
        self.engine.ensure_base(progress)
        while len(result.trained) < versions:
            children = sum(1 for v in self.store.list_versions() if v.parent is not None)
            if children >= self.config.budget.max_versions:
                result.stopped = f"budget.max_versions ({self.config.budget.max_versions}) reached"
                break
            round_id = self._open_round()
            try:
                if not self._play(round_id, versions - len(result.trained), result, progress):
                    result.stopped = "no applicable intervention is left to propose"
                    break
            except WaitingAtGate as waiting:
                result.waiting = waiting.gate
                self._emit("waiting", str(waiting), gate=waiting.gate.id)
                break
            except Aborted as exc:
                result.aborted = True
                result.stopped = str(exc)
                break
        return result

    def _open_round(self) -> int:
        row = self.store.query_one("SELECT id FROM rounds WHERE state = 'open' ORDER BY id DESC LIMIT 1")
        if row:
            return int(row[0])
        best = self.engine.best_version()
        assert best is not None  # v0 is promoted by ensure_base
        row = self.store.query_one("SELECT coalesce(max(id), 0) + 1 FROM rounds")
        round_id = int(row[0]) if row else 1
        failures = self.memory.consecutive_failures()
        escalated = failures >= self.config.coach.escalate_after
        self.store.con.execute(
            "INSERT INTO rounds (id, parent, state, stage, backend, harness, escalated, proposals)"
            " VALUES (?, ?, 'open', 'diagnosis', ?, ?, ?, '[]')",
            [round_id, best.name, self.backend.name, self.harness_mode, escalated],
        )
        self._emit("round", f"round {round_id}: branching from {best.name}", round=round_id, parent=best.name)
        if escalated:
            self._escalate(round_id, failures)
        return round_id

    def _round(self, round_id: int) -> dict[str, Any]:
        cur = self.store.con.execute("SELECT * FROM rounds WHERE id = ?", [round_id])
        row = cur.fetchone()
        assert row is not None
        out = dict(zip([d[0] for d in cur.description], row, strict=True))
        out["proposals"] = json.loads(out["proposals"] or "[]")
        return out

    def _set_round(self, round_id: int, **values: Any) -> None:
        if "proposals" in values:
            values["proposals"] = json.dumps(values["proposals"], default=str)
        sets = ", ".join(f"{k} = ?" for k in values)
        self.store.con.execute(f"UPDATE rounds SET {sets} WHERE id = ?", [*values.values(), round_id])

    def _play(self, round_id: int, remaining: int, result: LoopResult, progress: ProgressFn | None) -> bool:
        rnd = self._round(round_id)
        parent = rnd["parent"]
        diagnosis = self._parent_diagnosis(parent)
        if rnd["stage"] == "diagnosis":
            self._emit("diagnosis", self._headline(parent, diagnosis), round=round_id)
            self._gate(round_id, "after_diagnosis", f"round{round_id}", f"Diagnosis of {parent}: go on?", diagnosis)
            self._set_round(round_id, stage="design", diagnosis=(diagnosis or {}).get("id"))
            rnd["stage"] = "design"
        if rnd["stage"] == "design":
            if not self._design(round_id, parent, diagnosis, remaining):
                self._set_round(round_id, state="done", stage="done", ended_at=_now())
                return False
            rnd = self._round(round_id)
        if rnd["stage"] == "backtest":
            self._backtest(round_id, parent)
            rnd = self._round(round_id)
        if rnd["stage"] == "run":
            self._run_branches(round_id, parent, diagnosis, result, progress)
            self._set_round(round_id, state="done", stage="done", ended_at=_now())
        return True

    # -- gates ------------------------------------------------------------------------------------
    def _gate(self, round_id: int, kind: str, subject: str, question: str, report: Any) -> Answer:
        forced = self.memory.consecutive_failures() >= self.config.coach.gates_after_failures
        if not getattr(self.config.gates, kind) and not forced:
            return Answer("approve", by="not gated")
        gate = self.gates.find(round_id, kind, subject)
        if gate is None:
            gate = self.gates.open(round_id, kind, subject, question, {"report": report}, forced)
        if gate.answer is not None:
            answer = gate.answer
        else:
            now = self.answer(gate)
            if now is None:
                raise WaitingAtGate(gate)
            answer = self.gates.answer(gate.id, now).answer or now
        if answer.verb == "abort":
            self._abort(round_id, f"aborted at gate {gate.id} ({kind})")
        return answer

    def _abort(self, round_id: int, reason: str) -> None:
        """Stop, and roll back what the round had not run: versions created but not trained are pruned."""
        for v in self.store.list_versions():
            if v.state == "created" and self._round_of(v.name) == round_id:
                self.engine.decide(v.name, "pruned", reason)
        self._set_round(round_id, state="aborted", ended_at=_now())
        self._emit("decision", reason, round=round_id)
        raise Aborted(reason)

    def _round_of(self, version: str) -> int | None:
        row = self.store.query_one(
            "SELECT i.round FROM versions v JOIN interventions i ON i.id = v.intervention_id WHERE v.name = ?",
            [version],
        )
        return row[0] if row else None

    # -- design -------------------------------------------------------------------------------------
    def _design(self, round_id: int, parent: str, diagnosis: dict[str, Any] | None, remaining: int) -> bool:
        for revision in range(MAX_REVISIONS + 1):
            subject = f"round{round_id}-design{revision}"
            rnd = self._round(round_id)
            if self.gates.find(round_id, "after_design", subject) is not None and rnd["proposals"]:
                # Resuming at this design's gate: the proposals it shows, not new ones.
                planned, rationale = rnd["proposals"], rnd["rationale"] or ""
            else:
                ctx = self._context(round_id, parent, diagnosis, min(self.config.coach.branches, remaining))
                proposals = self._propose(round_id, ctx)
                planned, rationale = self._applicable(round_id, parent, proposals), proposals.rationale
                if not planned:
                    self._emit("refused", f"round {round_id}: nothing applicable to propose from {parent}")
                    return False
                self._set_round(round_id, proposals=planned, rationale=rationale)
                for p in planned:
                    self._emit("proposal", p["title"], round=round_id, hypothesis=p["intervention"]["hypothesis"])
            report = {"rationale": rationale, "proposals": planned}
            answer = self._gate(round_id, "after_design", subject, f"Run {len(planned)} branch(es)?", report)
            if answer.verb == "approve":
                self._set_round(round_id, stage="backtest")
                return True
            self._emit("proposal", f"revised: {answer.feedback}", round=round_id)
        self._emit("refused", f"round {round_id}: still revised after {MAX_REVISIONS} proposals")
        return False

    def _context(self, round_id: int, parent: str, diagnosis: dict[str, Any] | None, branches: int) -> PlanningContext:
        config = self.engine.version_config(parent)
        domain = config.domain.name
        rnd = self._round(round_id) if round_id is not None else {"escalated": False, "proposals": []}
        rules = [r["rule"] for r in (diagnosis or {}).get("rules", [])]
        signature = failure_signature(diagnosis)
        cases = self.memory.cases(signature, domain)
        # Cards validated in this domain first; without one, cards validated in other domains,
        # whose template the planner re-applies to this domain's config (the adaptation).
        skills = self.skills.match(rules, domain) or self.skills.match(rules, domain, cross_domain=True)
        bottleneck = (diagnosis or {}).get("rules", [{}])[0] if rules else {}
        query = (
            " ".join(
                [bottleneck.get("rule", "").replace("_", " "), bottleneck.get("explanation", "")]
                + list((diagnosis or {}).get("candidate_kinds", []))
            ).strip()
            or "GRPO training stalls without a diagnosed failure: learning rate, temperature, steps"
        )
        hits = [h.to_dict() for h in self.literature.search(query, k=3)]
        history = self.memory.ledger()
        tried = sorted(
            {h["template"] for h in history if h["parent"] == parent and h.get("template")}
            | {p["intervention"].get("template", "") for p in rnd["proposals"] if p.get("version")} - {""}
        )
        self._retrievals = (round_id, query, hits, rules, skills, signature, cases)
        return PlanningContext(
            parent=parent,
            parent_config=config,
            domain=domain,
            diagnosis=diagnosis,
            history=[{k: v for k, v in h.items() if k not in ("hypothesis",)} for h in history],
            cases=cases,
            skills=[s.to_dict() for s in skills],
            literature=hits,
            feedback=self.gates.feedback(),
            tried=tried,
            escalated=bool(rnd["escalated"]),
            branches=branches,
            facts=self._facts((diagnosis or {}).get("run_id")),
        )

    def _facts(self, run_id: str | None) -> Facts:
        """Hopeless prompts of the run a round reasons from: train tasks whose every sample (in
        every group the run drew for them) scored 0 on correctness."""
        if run_id is None:
            return Facts()
        row = self.store.query_one(
            """
            SELECT list(task_id ORDER BY task_id) FILTER (WHERE solved = 0), count(*) FROM (
                SELECT task_id, max(coalesce(reward_components['correctness'], reward)) AS solved
                FROM rollouts WHERE run_id = ? AND split = 'train' GROUP BY task_id
            )
            """,
            [run_id],
        )
        if not row or not row[1]:
            return Facts()
        return Facts(tuple(row[0] or ()), int(row[1]))

    def _propose(self, round_id: int, ctx: PlanningContext) -> Proposals:
        try:
            proposals = self.backend.propose(ctx)
        except BackendError as exc:
            self._emit("fallback", f"{self.backend.name} backend failed ({exc}); the offline planner proposes")
            proposals = self.offline.propose(ctx)
        finally:
            self.memory.record_calls(round_id, self.backend.calls)
            self.backend.calls.clear()
        self._record_retrievals(proposals)
        return proposals

    def _record_retrievals(self, proposals: Proposals) -> None:
        """The retrieval trace: what was looked up for this proposal, what came back, what was used."""
        round_id, query, hits, rules, skills, signature, cases = self._retrievals
        cited = {e.split(":", 1)[1] for iv in proposals.interventions for e in iv.evidence if ":" in e}
        templates = {iv.template for iv in proposals.interventions}
        self.memory.record_retrieval(round_id, "literature", query, hits, [h["doc"] for h in hits if h["doc"] in cited])
        self.memory.record_retrieval(
            round_id,
            "skills",
            " ".join(rules) or "general",
            [s.to_dict() for s in skills],
            [s.id for s in skills if s.id in cited],
        )
        # A case is used when it kept a failed intervention out of this round's proposals.
        avoided = [
            c["version"]
            for c in cases
            if c.get("template") and c["decision"] != "promoted" and c["template"] not in templates
        ]
        self.memory.record_retrieval(round_id, "cases", signature, cases, avoided)

    def _applicable(self, round_id: int, parent: str, proposals: Proposals) -> list[dict[str, Any]]:
        parent_text = self.engine.tree.read(parent, CONFIG_FILE)
        parent_config = self.engine.version_config(parent)
        planned = []
        factors: set[str] = set()
        for iv in proposals.interventions:
            try:
                text, config = apply(iv, parent_text, Path(f"{parent}+{iv.template or 'model'}:{CONFIG_FILE}"))
            except InterventionError as exc:
                self._emit("refused", str(exc), round=round_id)
                continue
            change = config_changes(parent_config, config)
            if not change or factors & set(iv.factors):
                self._emit("refused", f"{iv.title()}: no change, or a factor another branch already changes")
                continue
            factors |= set(iv.factors)
            planned.append(
                {"intervention": iv.model_dump(), "text": text, "change": change, "title": iv.title(parent_config)}
            )
        return planned

    # -- backtests ----------------------------------------------------------------------------------
    def _backtest_run(self, round_id: int, parent: str) -> str | None:
        """The GRPO run a round's backtests re-score: the one its diagnosis reasons from (after
        failed branches, the latest child's run from this parent), else the parent's own."""
        row = self.store.query_one(
            """SELECT d.run_id FROM rounds r JOIN diagnoses d ON d.id = r.diagnosis JOIN runs x ON x.id = d.run_id
               WHERE r.id = ? AND x.kind = 'train' AND x.state = 'succeeded'""",
            [round_id],
        )
        if row:
            return str(row[0])
        train = self.engine.train_run(parent)
        return train.id if train is not None else None

    def _backtest(self, round_id: int, parent: str) -> None:
        rnd = self._round(round_id)
        run_id = self._backtest_run(round_id, parent)
        ran = []
        kept = []
        for p in rnd["proposals"]:
            iv = Intervention.model_validate(p["intervention"])
            if run_id is not None and iv.kind in ("reward", "filter"):
                p["backtest"] = self._one_backtest(run_id, iv)
                ran.append(p)
                if p["backtest"].get("contradicts"):
                    self._emit("refused", f"{p['title']}: dropped, {p['backtest']['summary']}", round=round_id)
                    p["dropped"] = p["backtest"]["summary"]
                    continue
            kept.append(p)
        self._set_round(round_id, proposals=rnd["proposals"])
        for p in ran:
            self._emit("backtest", f"{p['title']}: {p['backtest']['summary']}", round=round_id)
        if ran:
            report = [{"title": p["title"], "backtest": p["backtest"]} for p in ran]
            self._gate(round_id, "after_backtest", f"round{round_id}", "Backtests done: run the branches?", report)
        self._set_round(round_id, stage="run")

    def _one_backtest(self, run_id: str, iv: Intervention) -> dict[str, Any]:
        if iv.kind == "reward":
            weights = iv.changes.get("recipe.rewards")
            if not isinstance(weights, dict):
                return {"summary": "no reward composition to backtest"}
            bt = reward_backtest(self.store, run_id, weights)
            bt_id = store_backtest(self.store, "reward", run_id, {"weights": weights}, bt)
            contradicts = bt.dead_before > 0 and bt.dead_after >= bt.dead_before and bt.revived == 0
            return {
                "id": bt_id,
                "summary": f"dead groups {bt.dead_before:.2f} -> {bt.dead_after:.2f}, {bt.revived:.0%} revived,"
                f" rank corr with correctness {bt.rank_corr_with_correctness or 0:.2f}",
                "contradicts": contradicts,
            }
        settings = iv.changes.get("recipe.group_filter", {})
        if not isinstance(settings, dict) or not settings.get("enabled", True):
            return {"summary": "filter off: nothing to backtest"}
        ema = settings.get("ema") or None
        keep = settings.get("keep_ratio", 1.0)
        fb = filter_backtest(self.store, run_id, settings.get("std_threshold", 1e-3), keep if keep < 1 else None, ema)
        bt_id = store_backtest(self.store, "filter", run_id, settings, fb)
        return {
            "id": bt_id,
            "summary": f"keeps {fb.kept:.0%} of groups; dead among kept {fb.dead_before:.2f} -> {fb.dead_after:.2f}",
            "contradicts": fb.kept < 0.3,
        }

    # -- running, judging, deciding -------------------------------------------------------------------
    def _run_branches(
        self,
        round_id: int,
        parent: str,
        diagnosis: dict[str, Any] | None,
        result: LoopResult,
        progress: ProgressFn | None,
    ) -> None:
        rnd = self._round(round_id)
        for p in rnd["proposals"]:
            if p.get("dropped") or p.get("done"):
                continue
            iv = Intervention.model_validate(p["intervention"])
            name = p.get("version")
            if name is None:
                name = self._create(round_id, parent, iv, p)
                p["version"] = name
                self._set_round(round_id, proposals=rnd["proposals"])
            record = self.store.get_version(name)
            assert record is not None
            if record.state in ("created", "training"):
                try:
                    self.engine.train(name, progress)
                except RunFailed as exc:
                    self._settle(round_id, name, parent, iv, diagnosis, None, "failed", f"run failed: {exc.run.id}")
                    p["done"] = True
                    self._set_round(round_id, proposals=rnd["proposals"])
                    continue
                result.trained.append(name)
            record = self.store.get_version(name)
            assert record is not None
            if record.state == "failed":  # its run failed while no engine watched (settled on open)
                self._settle(round_id, name, parent, iv, diagnosis, None, "failed", "run failed")
            elif record.state == "trained":
                verdict = self.engine.judge(name)
                self._emit("verdict", f"{name}: {verdict.summary()}", version=name, label=verdict.label)
                decision, reason = self._proposed_decision(name, verdict)
                report = {"verdict": verdict.summary(), "decision": decision, "reason": reason}
                answer = self._gate(round_id, "after_completion", name, f"{_VERB[decision]} {name}? ({reason})", report)
                if answer.verb == "revise":
                    self._emit("decision", f"{name}: left undecided, feedback for the next round: {answer.feedback}")
                else:
                    self._settle(round_id, name, parent, iv, diagnosis, verdict, decision, reason)
                    result.decisions.append((name, decision, reason))
            p["done"] = True
            self._set_round(round_id, proposals=rnd["proposals"])

    def _create(self, round_id: int, parent: str, iv: Intervention, p: dict[str, Any]) -> str:
        name = self.engine.next_version_name()
        plan = Plan(
            parent=parent,
            name=name,
            files={CONFIG_FILE: p["text"]},
            kind=iv.kind,
            factor=iv.factor,
            change=p["change"],
            hypothesis=iv.hypothesis,
            success_criterion=iv.success_criterion,
            rollback=iv.rollback,
            round=round_id,
            template=iv.template,
            source=iv.source,
            evidence=tuple(iv.evidence),
        )
        self.engine.create_version(plan)
        return name

    def _proposed_decision(self, version: str, verdict: Verdict) -> tuple[str, str]:
        return proposed_decision(verdict, self._child_diagnosis(version))

    def _settle(
        self,
        round_id: int | None,
        name: str,
        parent: str,
        iv: Intervention,
        diagnosis: dict[str, Any] | None,
        verdict: Verdict | None,
        decision: str,
        reason: str,
    ) -> None:
        if decision != "failed":
            self.engine.decide(name, decision, reason)
        self._emit("decision", f"{name} {decision}: {reason}", version=name, decision=decision)
        domain = self.engine.version_config(name).domain.name
        self.memory.record_case(
            name,
            failure_signature(diagnosis),
            domain,
            parent,
            iv.kind,
            iv.template,
            iv.factor,
            verdict.label if verdict else None,
            decision,
            reason,
        )
        if decision == "promoted" and verdict is not None:
            self._write_skill(name, parent, iv, diagnosis, verdict, domain)
        if verdict is not None:
            self._maybe_evolve(round_id, name, parent, verdict, diagnosis)

    def _write_skill(
        self,
        name: str,
        parent: str,
        iv: Intervention,
        diagnosis: dict[str, Any] | None,
        verdict: Verdict,
        domain: str,
    ) -> None:
        trigger = sorted({r["rule"] for r in (diagnosis or {}).get("rules", [])})
        deltas = {d.decoding: d.diff for d in verdict.deltas}
        card = SkillCard(
            id=slugify(f"{'-'.join(trigger) or 'general'}-{iv.template or iv.factor}"),
            title=f"{iv.title()} when {', '.join(trigger) or 'no rule fires'}",
            trigger=trigger,
            intervention={"kind": iv.kind, "template": iv.template, "changes": iv.changes},
            expected_outcome="val correctness "
            + ", ".join(f"{k} {v:+.3f}" for k, v in deltas.items())
            + " (one validation)",
            validation=[
                {
                    "version": name,
                    "parent": parent,
                    "verdict": verdict.label,
                    "delta_greedy": deltas.get("greedy"),
                    "delta_sampled": deltas.get("sampled"),
                    "domain": domain,
                    "date": date.today().isoformat(),
                }
            ],
            domains=[domain],
            body=f"Hypothesis: {iv.hypothesis}\n\nEvidence: {', '.join(iv.evidence) or 'none recorded'}\n",
        )
        path = self.skills.write(card)
        self._emit("skill", f"skill card {path.name} written from {name}", version=name)

    def _maybe_evolve(
        self, round_id: int | None, name: str, parent: str, verdict: Verdict, parent_diagnosis: dict[str, Any] | None
    ) -> None:
        child = self._child_diagnosis(name)
        anomaly = find_anomaly(verdict.label, child, parent_diagnosis)
        if anomaly is None:
            return
        config = self.engine.version_config(name)
        run = self.engine.train_run(name)
        anomaly["components"] = sorted(config.recipe.rewards)
        anomaly["metric_keys"] = (
            sorted(k for (k,) in self.store.query("SELECT DISTINCT key FROM metrics WHERE run_id = ?", [run.id]))
            if run
            else []
        )
        self._emit("evolution", f"{name} {verdict.label} and no rule explains it: proposing analyzers")
        ctx = self._context(round_id, parent, parent_diagnosis, 1)
        try:
            specs = self.backend.propose_analyzer(anomaly, ctx)
        except BackendError as exc:
            self._emit("fallback", f"analyzer proposal failed ({exc}); offline templates")
            specs = self.offline.propose_analyzer(anomaly, ctx)
        finally:
            self.memory.record_calls(round_id, self.backend.calls)
            self.backend.calls.clear()
        from engine.harness.loader import load_harness

        existing = {a.name for a in load_harness(self.engine.workspace.root).analyzers}
        for r in evolve(self.store, self.engine.workspace.root, specs, round_id, existing):
            verb = "adopted" if r.adopted else "refused"
            self._emit("evolution", f"analyzer {r.spec.name} {verb}: {r.reason}", adopted=r.adopted)

    # -- escalation ------------------------------------------------------------------------------
    def _escalate(self, round_id: int, failures: int) -> None:
        """After `escalate_after` failures: re-validate the harness on past outcomes, then let the
        planner switch layers and prefer removing over adding; the round branches from the last
        good version (the best promoted one)."""
        rows = self.store.query(
            """
            WITH latest AS (
                SELECT d.id, d.version FROM diagnoses d JOIN versions v ON v.name = d.version
                WHERE v.verdict IN ('improved', 'regressed')
                QUALIFY row_number() OVER (PARTITION BY d.version ORDER BY d.created_at DESC) = 1
            ),
            vals AS (
                SELECT f.metric, v.verdict, f.value FROM findings f
                JOIN latest l ON l.id = f.diagnosis_id JOIN versions v ON v.name = l.version
                WHERE f.value IS NOT NULL
            )
            SELECT a.metric, avg(CASE WHEN a.value > b.value THEN 1.0 WHEN a.value = b.value THEN 0.5 ELSE 0 END)
            FROM vals a JOIN vals b ON a.metric = b.metric AND a.verdict = 'improved' AND b.verdict = 'regressed'
            GROUP BY a.metric ORDER BY abs(avg(CASE WHEN a.value > b.value THEN 1.0
                                                    WHEN a.value = b.value THEN 0.5 ELSE 0 END) - 0.5) DESC
            """
        )
        separating = [(m, auc) for m, auc in rows if abs(auc - 0.5) >= 0.25]
        store_backtest(
            self.store, "harness_revalidation", None, {"round": round_id}, {"metrics": rows, "separating": separating}
        )
        self._emit(
            "escalation",
            f"{failures} consecutive failures: re-validated the harness ({len(separating)} of {len(rows)} metrics "
            "separate past outcomes); switching layers, preferring removal, consulting skills and literature; "
            "branching from the last good version",
            round=round_id,
        )

    # -- diagnoses ----------------------------------------------------------------------------------
    def _parent_diagnosis(self, parent: str) -> dict[str, Any] | None:
        """What a round reasons from: the latest GRPO run that started from `parent` or trained it
        (what training does to this policy: after failed branches, the last child's run), else
        the parent's own latest run (v0's warm-up)."""
        row = self.store.query_one(
            """SELECT r.id FROM runs r JOIN versions v ON v.name = r.version
               WHERE r.kind = 'train' AND r.state = 'succeeded' AND (v.name = ? OR v.parent = ?)
               ORDER BY r.ended_at DESC LIMIT 1""",
            [parent, parent],
        )
        try:
            run = self.store.get_run(row[0]) if row else self.engine.latest_run(parent)
        except ValueError:
            return None
        assert run is not None
        if run.id in self._diagnoses and self.harness_mode != "score-only":
            return self._diagnoses[run.id].to_dict()
        return self.engine.diagnose_version(run.version, run).to_dict()

    def _child_diagnosis(self, version: str) -> dict[str, Any]:
        run = self.engine.train_run(version)
        if run is None:
            return {}
        if run.id in self._diagnoses:
            return self._diagnoses[run.id].to_dict()
        return self.engine.diagnose_version(version).to_dict()

    def _headline(self, version: str, diagnosis: dict[str, Any] | None) -> str:
        source = f" (from {diagnosis['run_id']})" if diagnosis and diagnosis.get("run_id") else ""
        if not diagnosis or not diagnosis.get("rules"):
            return f"{version}{source}: no rule fired"
        b = diagnosis["rules"][0]
        return f"{version}{source}: bottleneck {b['rule']} ({b['severity']}): {b['explanation']}"


def proposed_decision(verdict: Verdict, diagnosis: dict[str, Any]) -> tuple[str, str]:
    """Promote only a gain that clears the noise floor (the paired bootstrap's 95% interval above 0)
    with no critical rule standing against it; a higher score with a critical rule (a leak, a
    collapse) is rejected with that reason and kept as negative evidence. A run the collapse guard
    stopped early is rejected whatever it scores. Regressions are rejected; mixed or insufficient
    evidence is pruned."""
    stopped = [r for r in diagnosis.get("rules", []) if r["rule"] == "stopped_early"]
    if stopped:
        return "rejected", f"stopped early: {stopped[0]['explanation']}"
    if verdict.label == "improved":
        critical = [r for r in diagnosis.get("rules", []) if r["severity"] == "critical"]
        if critical:
            r = critical[0]
            return "rejected", f"scores higher but rule {r['rule']} is critical: {r['explanation']}"
        return "promoted", verdict.summary()
    if verdict.label == "regressed":
        return "rejected", verdict.summary()
    return "pruned", verdict.summary()


def _now() -> datetime:
    return datetime.now()
