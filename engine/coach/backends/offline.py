"""The offline reasoning backend: a deterministic planner over the intervention catalog.

It reasons only from what the harness and memory say (the rules that fired, the verdicts of past
versions, matching cases and skills, a person's feedback), never from knowledge of the tasks:

1. validated skills whose trigger matches, catalog templates that answer the rules that fired,
   and general templates (for "nothing is wrong but nothing improves") are the candidates;
2. they are tried feedback first, then by tier (the bottleneck's templates, then those of the
   other rules that fired and of skill cards, then the general ones), and within a tier in the
   order of the round's Thompson draws (`engine.coach.bandit`: what each template gained against
   its control in this workspace, with the diagnosis and skill cards as its prior);
minus what was tried from this parent, what case memory says failed under the same signature,
and what feedback rules out. Escalation reorders: removing before adding, and layers the last
failures did not touch before those they did.
"""

from __future__ import annotations

import re
from typing import Any

from engine.coach.backends.base import AnalyzerSpec, ModelCall, PlanningContext, Proposals, analyzer_name
from engine.coach.interventions import CATALOG, KIND_LAYER, TEMPLATES, Intervention, Template

_NEGATION = re.compile(r"\b(no|not|don't|dont|avoid|stop|without|never)\b")


#: Words a person (or a literature note) uses for what a template changes.
_TERMS = {
    "raise_lr": {"learning rate", "lr"},
    "lower_lr": {"learning rate", "lr"},
    "temperature_up": {"temperature"},
    "clip_higher": {"clip-higher", "clip higher", "epsilon_high"},
    "kl_anchor": {"kl", "beta"},
    "group_filter": {"filter", "filtering"},
    "relax_filter": {"filter", "filtering"},
    "continuous_correctness": {"continuous", "closeness", "partial credit"},
    "more_generations": {"group size", "generations"},
    "longer_budget": {"completion length", "truncation"},
    "longer_training": {"steps", "longer training"},
    "easier_mix": {"difficulty", "easier"},
    "more_eval_seeds": {"seeds", "noise floor"},
    "drop_shaping": {"shaping", "shaped"},
    "format_weight": {"format"},
    "dr_grpo": {"dr. grpo", "dr_grpo", "length normalization"},
    "efficiency_reward": {"efficiency", "fewer turns"},
    "close_leak": {"leak", "history"},
    "more_turns": {"more turns", "max_turns", "turn budget"},
}


def _terms(t: Template) -> set[str]:
    return {t.name.replace("_", " "), t.kind} | _TERMS.get(t.name, set())


def feedback_preferences(feedback: list[str]) -> tuple[set[str], set[str]]:
    """(preferred, excluded) template names from free-text feedback, newest feedback winning."""
    preferred: set[str] = set()
    excluded: set[str] = set()
    for text in feedback:
        for sentence in re.split(r"[.;\n]+", text.lower()):
            negated = bool(_NEGATION.search(sentence))
            for t in CATALOG:
                if any(re.search(rf"\b{re.escape(term)}\b", sentence) for term in _terms(t)):
                    (excluded if negated else preferred).add(t.name)
                    (preferred if negated else excluded).discard(t.name)
    return preferred, excluded


def signals(ctx: PlanningContext) -> list[str]:
    """Rules that fired on the parent (bottleneck first), plus what the ledger says about the
    parent's last child: 'insufficient_evidence' or 'regressed'."""
    out = list(ctx.diagnosis.rule_names) if ctx.diagnosis else []
    children = [h for h in ctx.history if h.get("parent") == ctx.parent and h.get("verdict")]
    if children:
        last = children[-1]["verdict"]
        if last in ("insufficient evidence", "mixed"):
            out.append("insufficient_evidence")
        elif last == "regressed":
            out.append("regressed")
    return out


class OfflinePlanner:
    name = "offline"

    def __init__(self) -> None:
        self.calls: list[ModelCall] = []

    def candidates(self, ctx: PlanningContext) -> list[tuple[Template, str, list[str]]]:
        """(template, source, evidence) in the order the planner would try them."""
        fired = signals(ctx)
        rules = {r.rule: r for r in (ctx.diagnosis.fired if ctx.diagnosis else ())}
        preferred, excluded = feedback_preferences(ctx.feedback)
        failed_here = {
            c["template"] for c in ctx.cases if c.get("exact") and c.get("decision") in ("rejected", "pruned", "failed")
        }
        ordered: list[tuple[Template, str, list[str]]] = []

        def evidence_for(t: Template) -> list[str]:
            out = []
            for name in fired:
                if name in t.triggers:
                    out.append(f"rule:{name}")
                    out += [f"finding:{m}" for m in (rules[name].metrics if name in rules else ())]
            return out

        for card in ctx.skills:
            template = TEMPLATES.get(card.get("intervention", {}).get("template", ""))
            if template is not None:
                ordered.append((template, f"skill:{card['id']}", [f"skill:{card['id']}", *evidence_for(template)]))
        for name in fired:
            ordered += [(t, "planner", evidence_for(t)) for t in CATALOG if name in t.triggers]
        ordered += [(t, "planner", ["no rule fired: general improvement"]) for t in CATALOG if "" in t.triggers]

        seen: set[str] = set()
        kept = []
        for t, source, evidence in ordered:
            if t.name in seen or t.name in excluded or t.name in ctx.tried_templates:
                continue
            if t.name in failed_here and not ctx.escalated:
                continue
            seen.add(t.name)
            kept.append((t, "feedback" if t.name in preferred else source, evidence))
        # Feedback that names a template brings it in even if no rule asked for it.
        for name in sorted(preferred - seen - excluded - set(ctx.tried_templates)):
            kept.append((TEMPLATES[name], "feedback", ["feedback"]))
        rank = {t.name: i for i, (t, _, _) in enumerate(kept)}

        bottleneck = next(iter(rules), None)  # the first rule that fired (pseudo-signals are not rules)
        # The diagnosis says where to look (the bottleneck's templates, then the other rules' and
        # the skills', then the general ones); within each tier, what paid in this workspace, with
        # exploration (`engine.coach.bandit`). Without a ranking, the order above.
        draws = {a["template"]: a["draw"] for a in ctx.ranking}

        def tier(t: Template, source: str) -> int:
            if bottleneck is not None and bottleneck in t.triggers:
                return 0
            return 1 if source.startswith("skill:") or set(fired) & set(t.triggers) else 2

        def key(item: tuple[Template, str, list[str]]) -> tuple[int, ...]:
            t, source, _ = item
            failed_layers = {KIND_LAYER.get(h.get("kind") or "", "") for h in ctx.history[-3:]}
            # Escalated: still answer the bottleneck first, but within that prefer a layer the last
            # failures did not touch, and removing over adding.
            escalation = (
                (bottleneck not in t.triggers, KIND_LAYER[t.kind] in failed_layers, not t.removes)
                if ctx.escalated
                else (0, 0, 0)
            )
            order = (tier(t, source), -draws[t.name]) if t.name in draws else (0, 0.0)
            return (source != "feedback", *escalation, *order, rank[t.name])

        return sorted(kept, key=key)

    def propose(self, ctx: PlanningContext) -> Proposals:
        chosen: list[Intervention] = []
        factors: set[str] = set()
        notes = []
        for template, source, evidence in self.candidates(ctx):
            iv = template.propose(ctx.parent_config, evidence, source, ctx.facts)
            if iv is None:  # does not apply to this recipe (e.g. already at the value)
                continue
            if factors & set(iv.factors):
                continue  # one factor per branch, each branch a different factor
            literature = [h["doc"] for h in ctx.literature if _mentions(h, template)]
            iv.evidence += [f"literature:{doc}" for doc in dict.fromkeys(literature)]
            chosen.append(iv)
            factors |= set(iv.factors)
            notes.append(f"{template.name} ({source})")
            if len(chosen) == ctx.branches:
                break
        fired = signals(ctx)
        why = f"signals: {', '.join(fired) or 'none'}" + ("; escalated" if ctx.escalated else "")
        return Proposals(chosen, f"{why}; chosen: {', '.join(notes) or 'nothing applicable'}", self.name)

    def propose_analyzer(self, anomaly: dict[str, Any], ctx: PlanningContext) -> list[AnalyzerSpec]:
        """Analyzers for what moved: each finding that moved from the parent's diagnosis to the
        version's (largest change first) brings the probes of its family; the general ones fill
        the rest, up to `MAX_PROBES`. Names are valid by construction and unique."""
        # Not correctness: the verdict already measured it, and it moved by definition.
        components = [c for c in anomaly.get("components", []) if isinstance(c, str) and c != "correctness"]
        families: list[str] = []
        for moved in anomaly.get("moved", []):
            metric = str(moved.get("metric", ""))
            families += [f for words, fs in _FAMILIES for f in fs if any(w in metric for w in words)]
            if metric.startswith("signal.component.") and metric.split(".")[2] in components:
                families.append(f"component:{metric.split('.')[2]}")
        families += ["length", "answer_spans", "distinct"] + [f"component:{c}" for c in components]
        taken = set(anomaly.get("existing", []))
        specs: list[AnalyzerSpec] = []
        for family in dict.fromkeys(families):
            spec = _probe_spec(family, taken)
            if spec is None:
                continue
            taken.add(spec.name)
            specs.append(spec)
            if len(specs) == MAX_PROBES:
                break
        return specs


#: Probes an anomaly brings, by words in the metrics that moved.
_FAMILIES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("length", "truncat"), ("length", "correct_length", "lines")),
    (("answer", "span"), ("answer_spans",)),
    (("distinct", "diversity", "novelty", "composition"), ("distinct", "digit_share", "letter_share")),
    (("turn", "tool", "edit", "search", "test"), ("turns",)),
    (("format",), ("component:format",)),
]

#: At most this many probes per anomaly.
MAX_PROBES = 10

#: family -> (layer, kind, SQL over `completions`, what the number means)
_PROBES: dict[str, tuple[str, str, str, str]] = {
    "length": ("behavior", "mean", "SELECT avg(length(text)) FROM completions", "mean characters the policy wrote"),
    "correct_length": (
        "behavior",
        "mean",
        "SELECT avg(length(text)) FROM completions WHERE correct",
        "mean characters of the completions judged correct",
    ),
    "lines": (
        "behavior",
        "mean",
        "SELECT avg(len(string_split(text, chr(10)))) FROM completions",
        "mean lines per completion",
    ),
    "answer_spans": (
        "behavior",
        "mean",
        "SELECT avg(len(regexp_extract_all(text, '[-+]?[0-9]+'))) FROM completions WHERE correct",
        "numbers per correct completion (answer-like spans)",
    ),
    "distinct": (
        "behavior",
        "share",
        "SELECT count(DISTINCT text) / count(*) FROM completions",
        "share of distinct completions",
    ),
    "digit_share": (
        "behavior",
        "share",
        "SELECT sum(length(regexp_replace(text, '[^0-9]', '', 'g'))) / sum(length(text)) FROM completions",
        "share of digits in what the policy wrote",
    ),
    "letter_share": (
        "behavior",
        "share",
        "SELECT sum(length(regexp_replace(text, '[^A-Za-z]', '', 'g'))) / sum(length(text)) FROM completions",
        "share of letters in what the policy wrote",
    ),
    "turns": ("behavior", "mean", "SELECT avg(num_turns) FROM completions", "mean turns per episode"),
}


def _probe_spec(family: str, taken: set[str]) -> AnalyzerSpec | None:
    if family.startswith("component:"):
        component = family.split(":", 1)[1]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", component):
            return None
        return AnalyzerSpec(
            name=analyzer_name("component", component, "mean", taken=taken),
            layer="signal",
            sql=f"SELECT avg(reward_components['{component}']) FROM completions",
            explanation=f"mean of the {component} reward component",
            template="component_mean",
        )
    if family not in _PROBES:
        return None
    layer, kind, sql, explanation = _PROBES[family]
    return AnalyzerSpec(
        name=analyzer_name(family, taken=taken),
        layer=layer,  # type: ignore[arg-type]
        sql=sql,
        explanation=explanation,
        kind=kind,  # type: ignore[arg-type]
        template=family,
    )


def _mentions(hit: dict[str, Any], template: Template) -> bool:
    text = f"{hit.get('title', '')} {hit.get('excerpt', '')}".lower()
    return any(term in text for term in _TERMS.get(template.name, ()))
