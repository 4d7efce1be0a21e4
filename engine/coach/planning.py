"""Planning: what the coach asks its reasoning backend, and what it does with the answer.

The `Planner` gathers a `PlanningContext` for a round (the diagnosis it reasons from, the version
ledger, cases filed under the same signature, matching skill cards, literature hits for the
bottleneck, a person's feedback, what this parent already tried), asks the backend for proposals
or analyzers, falls back to the offline planner when the backend fails, and records the model
calls and the retrieval trace. `branches` turns proposals into the round's branches: the ones
that apply to the parent's config, each a different factor.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.coach import bandit
from engine.coach.backends.base import AnalyzerSpec, Backend, BackendError, PlanningContext, Proposals
from engine.coach.backends.offline import OfflinePlanner, signals
from engine.coach.gates import Gates
from engine.coach.interventions import CATALOG, InterventionError, apply, config_changes, edit_toml, run_facts
from engine.coach.literature import Literature
from engine.coach.memory import Lookups, Memory, failure_signature
from engine.coach.rounds import Branch, Round, Rounds
from engine.coach.schedule import CONTINUE
from engine.coach.skills import SkillLibrary
from engine.config import CONFIG_FILE, parse_config
from engine.core import Engine
from engine.harness.diagnose import Diagnosis
from engine.versions import VersionTreeError

#: Says one line of the planner's reasoning: (kind, message, data).
Emit = Callable[..., None]

#: The literature query when no rule fired.
#: Flipped tasks shown each way to a model backend (the counts are whole).
FLIP_EXAMPLES = 5
#: The path of a version's length, which a step budget's schedule sets on every branch, and the
#: catalog's templates that change it (not offered when the schedule owns it).
STEPS = "recipe.steps"
STEPS_TEMPLATES = ("longer_training",)
GENERAL_QUERY = "GRPO training stalls without a diagnosed failure: learning rate, temperature, steps"


class Planner:
    def __init__(self, engine: Engine, backend: Backend, emit: Emit):
        self.engine = engine
        self.backend = backend
        self.offline = OfflinePlanner()
        self.emit = emit
        self.memory = Memory(engine.store)
        self.gates = Gates(engine.store)
        self.skills = SkillLibrary(engine.workspace.root)
        self.literature = Literature(engine.workspace.root)
        self.rounds = Rounds(engine.store)

    def context(self, rnd: Round, diagnosis: Diagnosis | None, branches: int) -> tuple[PlanningContext, Lookups]:
        parent = rnd.parent
        config = self.engine.version_config(parent)
        domain = config.domain.name
        rules = diagnosis.rule_names if diagnosis else []
        signature = failure_signature(diagnosis)
        cases = self.memory.cases(signature, domain)
        # Cards validated in this domain first; without one, cards validated in other domains,
        # whose template the planner re-applies to this domain's config (the adaptation).
        skills = self.skills.match(rules, domain) or self.skills.match(rules, domain, cross_domain=True)
        words = []
        if diagnosis is not None:
            if (bottleneck := diagnosis.bottleneck) is not None:
                words += [bottleneck.rule.replace("_", " "), bottleneck.explanation]
            words += diagnosis.candidate_kinds
        query = " ".join(words).strip() or GENERAL_QUERY
        hits = [h.to_dict() for h in self.literature.search(query, k=3)]
        history = self.memory.ledger()
        tried = [h for h in history if h["parent"] == parent]  # this round's created branches included
        # ... and what a backtest dropped before it ran.
        tried += [
            {"template": b.intervention.template, "factor": ", ".join(b.intervention.factors)}
            for b in self.rounds.dropped(parent)
        ]
        lookups = Lookups(query, hits, rules, [s.to_dict() for s in skills], signature, cases)
        ctx = PlanningContext(
            parent=parent,
            parent_config=config,
            domain=domain,
            diagnosis=diagnosis,
            history=[{k: v for k, v in h.items() if k != "hypothesis"} for h in history],
            cases=cases,
            skills=lookups.skills,
            literature=hits,
            feedback=self.gates.feedback(),
            tried_templates=sorted({t["template"] for t in tried if t.get("template")}),
            tried_factors=sorted({f for t in tried for f in (t.get("factor") or "").split(", ") if f}),
            escalated=rnd.escalated,
            branches=branches,
            facts=run_facts(self.engine.store, diagnosis.run_id if diagnosis else None),
            flips=self.flips(parent),
        )
        bottleneck = diagnosis.bottleneck.rule if diagnosis and diagnosis.bottleneck else None
        seed = f"round {rnd.id} from {parent}"
        arms = bandit.rank(self.engine.store, domain, signals(ctx), ctx.skills, seed, bottleneck)
        ctx.ranking = [a.to_dict() for a in arms]
        return ctx, lookups

    def flips(self, version: str) -> dict[str, Any] | None:
        """The version's flips against its parent, or None (the base, or runs not there to compare)."""
        record = self.engine.store.get_version(version)
        if record is None or record.parent is None:
            return None
        try:
            return self.engine.flips(version, examples=FLIP_EXAMPLES)
        except (ValueError, VersionTreeError):
            return None

    def propose(
        self,
        rnd: Round,
        diagnosis: Diagnosis | None,
        branches: int,
        scheduled: bool = False,
        kinds: tuple[str, ...] | None = None,
    ) -> Proposals:
        """The backend's proposals for the round; `scheduled`: a step budget's schedule sizes every
        version's steps, so the templates that would change them are not offered; `kinds`: only
        the catalog's templates of these kinds are offered."""
        ctx, lookups = self.context(rnd, diagnosis, branches)
        if scheduled:
            ctx.tried_templates = sorted({*ctx.tried_templates, *STEPS_TEMPLATES})
        if kinds is not None:
            ctx.tried_templates = sorted({*ctx.tried_templates, *(t.name for t in CATALOG if t.kind not in kinds)})
        try:
            proposals = self.backend.propose(ctx)
        except BackendError as exc:
            self.emit("fallback", f"{self.backend.name} backend failed ({exc}); the offline planner proposes")
            proposals = self.offline.propose(ctx)
        finally:
            self._record_calls(rnd.id)
        self.memory.record_lookups(rnd.id, lookups, proposals.interventions)
        proposals.ranking = ctx.ranking
        return proposals

    def propose_analyzers(self, rnd: Round, diagnosis: Diagnosis | None, anomaly: dict[str, Any]) -> list[AnalyzerSpec]:
        ctx, _ = self.context(rnd, diagnosis, 1)
        try:
            return self.backend.propose_analyzer(anomaly, ctx)
        except BackendError as exc:
            self.emit("fallback", f"analyzer proposal failed ({exc}); offline templates")
            return self.offline.propose_analyzer(anomaly, ctx)
        finally:
            self._record_calls(rnd.id)

    def branches(self, rnd: Round, proposals: Proposals, steps: int | None = None) -> list[Branch]:
        """The proposals that apply to the parent's config, each a different factor; with `steps`
        (the schedule's version length), each trains that many steps, and a proposal that changes
        the steps itself is refused (the schedule owns them)."""
        parent_text = self.engine.config_text(rnd.parent)
        parent_config = self.engine.version_config(rnd.parent)
        dropped = {json.dumps(b.change, sort_keys=True): b.dropped for b in self.rounds.dropped(rnd.parent)}
        out: list[Branch] = []
        factors: set[str] = set()
        for iv in proposals.interventions:
            if steps is not None and iv.template != CONTINUE and STEPS in iv.changes:
                self.emit("refused", f"{iv.title()}: the schedule sizes every version's steps", round=rnd.id)
                continue
            try:
                source = Path(f"{rnd.parent}+{iv.template or 'model'}:{CONFIG_FILE}")
                text, config = apply(iv, parent_text, source, self.engine.workspace.root)
                if iv.is_control and steps is None:
                    text = parent_text  # nothing changes, the comments included
                if steps is not None and config.recipe.steps != steps:
                    text = edit_toml(text, {STEPS: steps})
                    config = parse_config(text, source, self.engine.workspace.root)
            except InterventionError as exc:
                self.emit("refused", str(exc), round=rnd.id)
                continue
            change = config_changes(parent_config, config)
            if iv.is_control or iv.template == CONTINUE:  # the parent's recipe, trained on
                out.append(Branch(intervention=iv, text=text, change=change, title=iv.title(parent_config)))
                continue
            if not change or (steps is not None and set(change) == {STEPS}) or factors & set(iv.factors):
                self.emit("refused", f"{iv.title()}: no change, or a factor another branch already changes")
                continue
            if (why := dropped.get(json.dumps(change, sort_keys=True))) is not None:
                self.emit("refused", f"{iv.title()}: a backtest already dropped this change from {rnd.parent} ({why})")
                continue
            factors |= set(iv.factors)
            out.append(Branch(intervention=iv, text=text, change=change, title=iv.title(parent_config)))
        return out

    def _record_calls(self, round_id: int) -> None:
        self.memory.record_calls(round_id, self.backend.calls)
        self.backend.calls.clear()
