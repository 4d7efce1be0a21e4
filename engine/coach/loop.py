"""The coach: the autonomous loop of rounds, as a state machine over each round's stage.

One round: diagnose the best promoted version -> design K branches (each a different single
factor) -> backtest where one applies -> run each branch -> judge it against its parent ->
decide (promote / reject / prune) -> remember (case, skill, harness evolution). The next round
branches from the best promoted version. Gates stop the loop for a person where the workspace
switches them on, and everywhere after consecutive failures.

Each stage is persisted (`rounds.Rounds`, `gates.Gates`), so a loop stopped at a pending gate,
or by a dead engine, resumes where it stopped. A round is a value: every stage returns the round
as stored after it, and the loop carries on from that. `Coach` holds the stages and their order;
each stage's work lives in the part that does it: `design.Designer` (proposals, backtests),
`running.BranchRunner` (create, train, gate), `judging.BranchJudge` (verdict, investigation, decision),
`settling.Settler` (decision, case and skill card against the control), `gatekeeper.Gatekeeper`
(stops for a person). What they share is `context.CoachContext`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from engine.coach.backends.base import Backend
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.context import CoachContext, CoachEvent, LoopResult
from engine.coach.design import Designer
from engine.coach.evolution import revalidate
from engine.coach.gatekeeper import Aborted, Gatekeeper, WaitingAtGate
from engine.coach.gates import Answerer, nobody
from engine.coach.judging import BranchJudge, proposed_decision
from engine.coach.memory import Memory
from engine.coach.planning import Planner
from engine.coach.rounds import Round, Rounds
from engine.coach.running import BranchRunner
from engine.coach.schedule import Plan, Schedule, steps_spent
from engine.coach.settling import Settler
from engine.coach.skills import SkillLibrary
from engine.config import WorkspaceConfig
from engine.core import BASE, Engine, ProgressFn
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import MODE_LAYERS, Layers

#: What callers import from the loop (the parts' names, kept where callers have always found them).
__all__ = ["Aborted", "Coach", "CoachEvent", "LoopResult", "WaitingAtGate", "make_backend", "proposed_decision"]

#: Rounds in a row that ran nothing (every branch dropped by its backtest) before a loop stops.
MAX_IDLE_ROUNDS = 3


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
        self.on_event = on_event
        self.rounds = Rounds(engine.store)
        self.memory = Memory(engine.store)
        self.harness_mode = harness or engine.config.coach.harness
        # One config and one set of layers for every part, read once: a coach's settings cannot
        # drift between the parts (`config` and `layers` below only read them).
        layers = MODE_LAYERS[self.harness_mode]
        self.ctx = ctx = CoachContext(engine, engine.config, layers, self._emit, self.rounds, self.memory)
        self.backend = backend or make_backend(ctx.config, self._emit)
        self.planner = Planner(engine, self.backend, self._emit)
        self.skills = SkillLibrary(engine.workspace.root)
        self.gatekeeper = Gatekeeper(ctx, answer)
        self.designer = Designer(ctx, self.planner, self.gatekeeper)
        self.branch_judge = BranchJudge(ctx, self.planner)
        self.settler = Settler(ctx, self.skills)
        self.branch_runner = BranchRunner(ctx, self.gatekeeper, self.branch_judge, self.settler)

    @property
    def config(self) -> WorkspaceConfig:
        return self.ctx.config

    @property
    def layers(self) -> Layers:
        """The harness layers every diagnosis of this coach uses (passed to the engine per call)."""
        return self.ctx.layers

    def _emit(self, kind: str | CoachEvent, message: str = "", **data: Any) -> None:
        event = kind if isinstance(kind, CoachEvent) else CoachEvent(kind, message, data)
        self.engine.store.add_event(f"coach_{event.kind}", {"message": event.message, **event.data})
        if self.on_event is not None:
            self.on_event(event)

    # -- the loop -------------------------------------------------------------------------------
    def run(self, versions: int, progress: ProgressFn | None = None, steps: int | None = None) -> LoopResult:
        """Run rounds until `versions` versions were trained (or a gate waits, or it is aborted);
        with `steps`, also until this call's versions trained that many GRPO steps, spent as
        `engine.coach.schedule` plans: screen short, continue the winner longer."""
        result = LoopResult()
        self.engine.ensure_base(progress, self.layers)
        spent = steps_spent(self.engine.store)
        idle = 0
        while len(result.trained) < versions:
            left = None if steps is None else steps - (steps_spent(self.engine.store) - spent)
            if left is not None and left <= 0:
                break
            if idle >= MAX_IDLE_ROUNDS:
                result.stopped = f"{idle} rounds in a row had every branch dropped by its backtest"
                break
            children = sum(1 for v in self.engine.store.list_versions() if v.parent is not None)
            if children >= self.config.budget.max_versions:
                result.stopped = f"budget.max_versions ({self.config.budget.max_versions}) reached"
                break
            rnd = self.rounds.current() or self.open_round(left)
            before = len(result.trained) + len(result.decisions)
            try:
                if not self._play(rnd, versions - len(result.trained), result, progress, left):
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

    def open_round(self, steps_left: int | None = None) -> Round:
        """A new round from the best promoted version, escalated after `escalate_after` failures;
        with a step budget, from the version the schedule continues when it exploits one."""
        best = self.engine.best_version()
        assert best is not None  # v0 is promoted by ensure_base
        plan = self.plan(best.name, steps_left)
        parent = plan.parent if plan is not None else best.name
        failures = self.memory.consecutive_failures()
        escalated = failures >= self.config.coach.escalate_after and (plan is None or plan.mode == "screen")
        rnd = self.rounds.open(parent, self.backend.name, self.harness_mode, escalated)
        how = f" ({plan.mode}, {plan.steps} steps a branch: {plan.how})" if plan is not None else ""
        self._emit("round", f"round {rnd.id}: branching from {parent}{how}", round=rnd.id, parent=parent)
        if escalated:
            self._escalate(rnd, failures)
        return rnd

    def plan(self, best: str, steps_left: int | None) -> Plan | None:
        """What the schedule makes of the steps left (None without a step budget: every version
        trains its recipe's steps, and rounds branch from the best promoted version)."""
        if steps_left is None:
            return None
        branches = self.config.coach.branches + self.designer.needs_control(best, 2)
        default = self.engine.version_config(BASE).recipe.steps  # the workspace's own version length
        return Schedule(self.engine.store).plan(best, steps_left, branches, default)

    def _play(
        self, rnd: Round, remaining: int, result: LoopResult, progress: ProgressFn | None, steps_left: int | None
    ) -> bool:
        """Move the round through its stages from where it stands; False when it had nothing to run."""
        diagnosis = self.ctx.parent_diagnosis(rnd.parent)
        if rnd.stage == "diagnosis":
            self._emit("diagnosis", _headline(rnd.parent, diagnosis), round=rnd.id)
            report = diagnosis.to_dict() if diagnosis else None
            self.gatekeeper.ask(rnd, "after_diagnosis", f"round{rnd.id}", f"Diagnosis of {rnd.parent}: go on?", report)
            rnd = self.rounds.advance(rnd, "design", diagnosis=diagnosis.id if diagnosis else None)
        if rnd.stage == "design":
            best = self.engine.best_version()
            assert best is not None
            plan = self.plan(best.name, steps_left)
            rnd = self.designer.design(rnd, diagnosis, remaining, plan if plan and plan.parent == rnd.parent else None)
            if rnd.stage == "design":  # nothing approved to run
                self.rounds.end(rnd)
                return False
        if rnd.stage == "backtest":
            rnd = self.designer.backtest(rnd, diagnosis)
        if rnd.stage == "run":
            rnd = self.branch_runner.run(rnd, diagnosis, result, progress)
            self.rounds.end(rnd)
        return True

    def _escalate(self, rnd: Round, failures: int) -> None:
        """After `escalate_after` failures: re-validate the harness on past outcomes (retiring
        adopted analyzers that no longer separate them), then let the planner switch layers and
        prefer removing over adding; the round branches from the last good version (the best
        promoted one)."""
        check = revalidate(self.engine.store, self.engine.workspace.root, rnd.id)
        retired = f"; retired {', '.join(f for f, _ in check.retired)}" if check.retired else ""
        self._emit(
            "escalation",
            f"{failures} consecutive failures: re-validated the harness ({len(check.separating)} of "
            f"{len(check.validations)} metrics separate past outcomes{retired}); switching layers, preferring "
            "removal, consulting skills and literature; branching from the last good version",
            round=rnd.id,
            retired=[f for f, _ in check.retired],
        )


def _headline(version: str, diagnosis: Diagnosis | None) -> str:
    source = f" (from {diagnosis.run_id})" if diagnosis else ""
    b = diagnosis.bottleneck if diagnosis else None
    if b is None:
        return f"{version}{source}: no rule fired"
    return f"{version}{source}: bottleneck {b.rule} ({b.severity}): {b.explanation}"
