"""What the engine daemon does for its clients: answers requests, and runs the coach in a thread.

Requests run on a small thread pool, each thread with its own cursor of the engine's database
(one DuckDB connection per thread); the coach runs in one thread with the engine's own
connection. Whatever happens in the coach (a run's progress, a gate, a decision) is published as
an event to every subscribed client.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pydantic import BaseModel

from engine import __version__
from engine.api import queries
from engine.api.protocol import (
    PROTOCOL_VERSION,
    AnswerParams,
    BacktestParams,
    DiffParams,
    FlagParams,
    MetricsParams,
    PageParams,
    ProtocolError,
    ReportParams,
    RolloutParams,
    StartParams,
    VersionParams,
)
from engine.coach.gates import Answer, Gate, GateError, Gates
from engine.coach.loop import Coach, CoachEvent
from engine.coach.memory import Memory
from engine.coach.skills import SkillLibrary
from engine.config import GroupFilterConfig
from engine.core import Engine, Judge, RunUpdate, best_version, yardsticks
from engine.domains import make_domain
from engine.harness.backtest import filter_backtest, reward_backtest, store_backtest, validate_analyzer
from engine.harness.health import build_report
from engine.store import Store
from engine.versions import VersionTree, VersionTreeError

#: Flipped tasks a `flips` reply shows each way (the counts are whole).
FLIP_EXAMPLES = 200

Publish = Callable[[str, dict[str, Any]], None]


class CoachJob:
    """The coach loop in a thread. Its gates wait for an answer from a client (or for a stop)."""

    def __init__(self, engine: Engine, publish: Publish):
        self.engine = engine
        self.publish = publish
        self.thread: threading.Thread | None = None
        self.params: StartParams | None = None
        self.waiting: Gate | None = None
        self._offered: Answer | None = None
        self._cond = threading.Condition()
        self._stop = False
        self.last_result: dict[str, Any] | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, params: StartParams) -> None:
        if self.running:
            raise ProtocolError("conflict", "the coach is already running; stop it first or wait for it")
        self.params = params
        self._stop = False
        self.engine.stop_requested.clear()
        self.thread = threading.Thread(target=self._run, name="coach", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop at the next gate or between runs (a run in progress finishes first)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def offer(self, gate_id: str, answer: Answer) -> bool:
        """Hand an answer to the coach if it waits at this gate (it records it itself)."""
        with self._cond:
            if self.waiting is None or self.waiting.id != gate_id:
                return False
            self._offered = answer
            self._cond.notify_all()
            return True

    def _answer(self, gate: Gate) -> Answer | None:
        assert self.params is not None
        if self.params.auto_approve and not gate.forced:
            return Answer("approve", by="auto")
        self.publish("gate", {"gate": gate.id, "kind": gate.kind, "subject": gate.subject, "question": gate.question})
        with self._cond:
            self.waiting, self._offered = gate, None
            while self._offered is None and not self._stop:
                self._cond.wait()
            answer, self.waiting = self._offered, None
        return answer

    def _run(self) -> None:
        assert self.params is not None
        self.publish("coach_state", {"running": True, "versions": self.params.versions})
        result: dict[str, Any] = {}
        try:
            coach = Coach(self.engine, answer=self._answer, on_event=self._event, harness=self.params.harness)
            outcome = coach.run(self.params.versions, progress=self._progress, steps=self.params.steps)
            result = {
                "trained": outcome.trained,
                "decisions": outcome.decisions,
                "waiting": outcome.waiting.id if outcome.waiting else None,
                "aborted": outcome.aborted,
                "stopped": outcome.stopped,
            }
        except KeyboardInterrupt:
            result = {"stopped": "interrupted: the engine is stopping"}
        except Exception as exc:  # noqa: BLE001 - the engine stays up; the client sees why
            result = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.last_result = result
            self.publish("coach_state", {"running": False, **result})

    def _event(self, event: CoachEvent) -> None:
        self.publish("coach", {"kind": event.kind, "message": event.message, **event.data})

    def _progress(self, update: RunUpdate) -> None:
        self.publish("run", asdict(update))


class Service:
    def __init__(self, engine: Engine, publish: Publish):
        self.engine = engine
        self.root = engine.workspace.root
        self.job = CoachJob(engine, publish)
        self._local = threading.local()
        self._cursors: list[Store] = []
        self._lock = threading.Lock()

    @property
    def store(self) -> Store:
        """This thread's cursor of the engine's database."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self.engine.store.cursor()
            self._local.store = store
            with self._lock:
                self._cursors.append(store)
        return store

    def close(self) -> None:
        for c in self._cursors:
            c.close()

    def handle(self, method: str, params: BaseModel) -> Any:
        handler = getattr(self, f"do_{method}")
        return handler(params)

    # -- methods (names match protocol.METHODS) ---------------------------------------------------
    def do_hello(self, _: BaseModel) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "engine": __version__,
            "pid": os.getpid(),
            "workspace": str(self.root),
            "name": self.engine.config.workspace.name,
        }

    def do_subscribe(self, _: BaseModel) -> dict[str, Any]:
        return {"subscribed": True}  # the server adds the connection to its subscribers

    def do_status(self, _: BaseModel) -> dict[str, Any]:
        return {
            "coach_running": self.job.running,
            "waiting": self.job.waiting.id if self.job.waiting else None,
            "last_result": self.job.last_result,
            "pending_gates": [g["id"] for g in queries.gates(self.store)],
            "best": best.name if (best := best_version(self.store.list_versions(), yardsticks(self.store))) else None,
            "runs": queries.runs(self.store)[-5:],
        }

    def do_list_versions(self, _: BaseModel) -> list[dict[str, Any]]:
        return queries.versions(self.store)

    def do_version(self, p: VersionParams) -> dict[str, Any]:
        out = queries.version(self.store, p.version)
        if out["parent"]:
            try:
                out["diff_files"] = VersionTree(self.root).changed_files(out["parent"], p.version)
            except VersionTreeError:  # a store without its version branches (restored, or built by hand)
                out["diff_files"] = []
        return out

    def do_diagnosis(self, p: VersionParams) -> dict[str, Any] | None:
        return queries.diagnosis(self.store, p.version)

    def _view(self) -> Judge:
        """A judge of this thread's own: its cursor, its own version tree, no runner."""
        return self.engine.view(self.store)

    def do_diagnose(self, p: VersionParams) -> dict[str, Any]:
        """The harness again over a version's latest run (the workspace's harness as it is now).
        A promoted version in which a blocking rule now fires is flagged: the memory it wrote is
        retracted (`Memory.flag`), and the reply says so."""
        try:
            diagnosis = self._view().diagnose_version(p.version)
        except ValueError as exc:
            raise ProtocolError("not_found", str(exc)) from None
        reply = diagnosis.to_dict()
        record = self.store.get_version(p.version)
        if diagnosis.blocking and record is not None and record.state == "promoted" and not record.flagged:
            rule = diagnosis.blocking[0]
            reason = f"diagnosed again after its promotion: rule {rule.rule} is critical: {rule.explanation}"
            reply["flagged"] = Memory(self.store).flag(p.version, reason, SkillLibrary(self.root))
        return reply

    def do_flag(self, p: FlagParams) -> dict[str, Any]:
        """Flag a version after its decision: its case and skill card entries are retracted."""
        try:
            return Memory(self.store).flag(p.version, p.reason, SkillLibrary(self.root))
        except ValueError as exc:
            raise ProtocolError("not_found" if "no version" in str(exc) else "bad_request", str(exc)) from None

    def do_report(self, p: ReportParams) -> dict[str, Any]:
        view = self._view()
        try:
            primary = view.reader.version_config(p.version).eval.primary
            return build_report(self.store, p.version, view.diagnose_version(p.version), p.against, primary)
        except (ValueError, VersionTreeError) as exc:
            raise ProtocolError("not_found", str(exc)) from None

    def do_backtest(self, p: BacktestParams) -> dict[str, Any]:
        view = self._view()
        try:
            if p.kind == "analyzer":
                if not p.metric:
                    raise ProtocolError("bad_request", "an analyzer backtest needs `metric`")
                metric = p.metric

                def value_of(version: str) -> float | None:
                    try:
                        found = [f for f in view.diagnose_version(version).findings if f.metric == metric]
                    except ValueError:
                        return None
                    return found[0].value if found else None

                validation = validate_analyzer(self.store, metric, value_of)
                backtest_id = store_backtest(self.store, "analyzer", None, {"metric": metric}, validation)
                return {
                    "id": backtest_id,
                    **asdict(validation),
                    "separates": validation.separates,
                    "summary": validation.summary(),
                }
            if not p.version:
                raise ProtocolError("bad_request", f"a {p.kind} backtest needs `version`")
            run = view.reader.latest_run(p.version)
            result: Any
            if p.kind == "reward":
                domain = make_domain(view.reader.version_config(p.version).domain, self.engine.workspace.root)
                result = reward_backtest(self.store, run.id, p.weights, domain)
                params: dict[str, Any] = {"weights": p.weights}
            else:
                # Unset fields take the group filter's own defaults (one definition, in the config).
                given = {"std_threshold": p.std_threshold, "keep_ratio": p.keep_ratio, "ema": p.ema}
                settings = GroupFilterConfig(enabled=True, **{k: v for k, v in given.items() if v is not None})
                result = filter_backtest(self.store, run.id, settings)
                params = settings.model_dump()
            return {"id": store_backtest(self.store, p.kind, run.id, params, result), **asdict(result)}
        except ValueError as exc:  # no such version or run, or a reward component the domain lacks
            raise ProtocolError("bad_request", str(exc)) from None

    def do_list_runs(self, _: BaseModel) -> list[dict[str, Any]]:
        return queries.runs(self.store)

    def do_metrics(self, p: MetricsParams) -> dict[str, Any]:
        return queries.metrics(self.store, p.run_id, p.keys, p.after_step)

    def do_page_rollouts(self, p: PageParams) -> dict[str, Any]:
        page = queries.page_rollouts(self.store, p.filter, p.offset, p.limit)
        page["total"] = queries.count_rollouts(self.store, p.filter) if p.offset == 0 else None
        return page

    def do_rollout(self, p: RolloutParams) -> dict[str, Any]:
        return queries.rollout(self.store, p.rollout_id)

    def do_gates(self, _: BaseModel) -> list[dict[str, Any]]:
        return queries.gates(self.store, pending_only=False)

    def do_answer_gate(self, p: AnswerParams) -> dict[str, Any]:
        try:
            answer = Answer(p.verb, p.feedback, by="client")
            if self.job.offer(p.gate, answer):
                return {"gate": p.gate, "state": "answered", "taken_by": "coach"}
            gate = Gates(self.store).answer(p.gate, answer)
        except GateError as exc:
            kind = "not_found" if "no gate" in str(exc) else "conflict" if "already" in str(exc) else "bad_request"
            raise ProtocolError(kind, str(exc)) from None
        return {"gate": gate.id, "state": gate.state, "taken_by": "store"}

    def do_start(self, p: StartParams) -> dict[str, Any]:
        self.job.start(p)
        return {"started": True, "versions": p.versions}

    def do_stop(self, _: BaseModel) -> dict[str, Any]:
        self.job.stop()
        return {"stopping": self.job.running}

    def do_memory(self, _: BaseModel) -> dict[str, Any]:
        return queries.memory(self.store, self.root)

    def do_flips(self, p: VersionParams) -> dict[str, Any]:
        """The val tasks whose outcome flipped between the version and its parent."""
        try:
            return {"version": p.version, **self._view().flips(p.version, examples=FLIP_EXAMPLES)}
        except (ValueError, VersionTreeError) as exc:
            raise ProtocolError("not_found", str(exc)) from None

    def do_diff(self, p: DiffParams) -> dict[str, Any]:
        tree = VersionTree(self.root)  # its own repository object: the coach thread uses the engine's
        for v in (p.a, p.b):
            if not tree.exists(v):
                raise ProtocolError("not_found", f"no version {v!r} in the version tree")
        return {"a": p.a, "b": p.b, "diff": tree.diff(p.a, p.b)}
