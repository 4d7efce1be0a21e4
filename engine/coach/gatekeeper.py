"""Where the loop stops for a person (`Gatekeeper`): a gate the workspace turned on, or any gate
after consecutive failures, waits for an answer; an abort rolls back what the round had not run.
The gates themselves are stored by `gates.Gates`.
"""

from __future__ import annotations

from typing import Any

from engine.coach.context import CoachContext
from engine.coach.gates import Answer, Answerer, Gate, Gates
from engine.coach.rounds import Round


class WaitingAtGate(Exception):
    def __init__(self, gate: Gate):
        self.gate = gate
        super().__init__(f"waiting at gate {gate.id} ({gate.kind}): {gate.question}")


class Aborted(Exception):
    pass


class Gatekeeper:
    def __init__(self, ctx: CoachContext, answer: Answerer):
        self.ctx = ctx
        self.gates = Gates(ctx.store)
        self.answer = answer

    def ask(self, rnd: Round, kind: str, subject: str, question: str, report: Any, force: bool = False) -> Answer:
        """Stop for a person at a gate the workspace turned on; `force` (a held version) or a run
        of consecutive failures opens it whatever the settings, and `--auto-approve` does not
        answer it."""
        config = self.ctx.config
        forced = force or self.ctx.memory.consecutive_failures() >= config.coach.gates_after_failures
        if not getattr(config.gates, kind) and not forced:
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
            self.abort(rnd, f"aborted at gate {gate.id} ({kind})")
        return answer

    def abort(self, rnd: Round, reason: str) -> None:
        """Stop, and roll back what the round had not run: versions created but not trained are pruned."""
        for v in self.ctx.store.list_versions():
            if v.state == "created" and self.ctx.rounds.of_version(v.name) == rnd.id:
                self.ctx.engine.decide(v.name, "pruned", reason)
        self.ctx.rounds.end(rnd, "aborted")
        self.ctx.emit("decision", reason, round=rnd.id)
        raise Aborted(reason)
