"""The Claude reasoning backend of the coach: proposals and analyzers through the Messages API.

Every answer comes back through a *forced* tool call, so the output is JSON with a schema rather
than prose to be parsed. A reply that misses the tool or fails validation (a pydantic error, or
`check()` refusing a multi-factor change without evidence) is re-asked exactly once, with the
validation message as an error tool result; a second bad reply is a `BackendError`, and the coach
falls back to the offline planner. Transient API failures are retried by the SDK itself
(`max_retries`); what is left after that is a `BackendError` too.

The API key lives only inside the SDK client: it is never copied into `ModelCall`s, error
messages, logs or the backend's repr.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
from anthropic.types import Message
from pydantic import ValidationError

from engine.coach.backends.base import (
    AnalyzerSpec,
    BackendError,
    ModelCall,
    PlanningContext,
    Proposals,
    analyzer_name,
)
from engine.coach.evolution import UnsafeSQLError, check_sql
from engine.coach.interventions import CATALOG, KIND_LAYER, KINDS, Intervention, InterventionError, check

log = logging.getLogger(__name__)

T = TypeVar("T")

PROPOSE_TOOL = "propose_interventions"
ANALYZER_TOOL = "propose_analyzers"

#: Longest validation message sent back to the model / put into an error (keeps prompts and logs small).
_FEEDBACK_CHARS = 2000
_ERROR_CHARS = 300

_PROPOSE_SYSTEM = """\
You are the coach of a GRPO (group relative policy optimization) post-training run of a small language \
model policy. You do not train anything yourself: you read what the evaluation harness measured about the \
parent version and propose the next versions to train, each as an intervention on the parent's workspace.toml.

Rules:
- Propose {branches} interventions. Each is single-factor: it changes ONE factor of the recipe (one optimizer \
knob, the reward composition `recipe.rewards` as a whole, the group filter `recipe.group_filter` as a whole, \
one data or budget or evaluation setting). Different interventions change different factors.
- Reason only from what the context gives you: the diagnosis (findings and fired rules), the version history, \
matching cases, skill cards, literature excerpts, the person's feedback and `flips`: the val tasks the \
parent's own change turned (wrong to right and right to wrong, both versions' answers, a few examples). Read \
the flips for what kind of answer changed (an accepted answer that looks wrong is a verifier being learned); \
do not propose from the particular tasks or their answers, and never guess other tasks.
- Change several factors together only when cited evidence (findings, rules, cases, skills, literature) says \
they must move together; then list that evidence in `evidence`. A multi-factor change without evidence is \
refused.
- `ranking` is what each catalog template won and lost against its control in this workspace, with this \
round's Thompson draw: weigh it, and say in the hypothesis how you sized each change from the data \
(`facts`, the diagnosis' findings); a fixed multiplier only where nothing better is known, and say so.
- Do not repeat anything listed in `tried` (templates or factors already tried from this parent).
- Follow the person's `feedback`, newest last; it overrides the catalog hints.
- When `escalated` is true, earlier rounds kept failing: switch to a different harness layer than the last \
attempts (see `kind_layer`) and prefer removing or weakening something over adding more.
- `changes` maps dotted workspace.toml paths to new values, e.g. {{"recipe.learning_rate": 1e-05}}; a value of \
null removes the key. Only use paths that exist in `parent_config`.
- `hypothesis` reads "If X then Y, because Z". `success_criterion` must be falsifiable from the next run's \
evaluation. `rollback` says what happens if it fails. `evidence` names the findings, rules, cases, skills or \
literature the proposal rests on.
- The catalog templates are hints of well-understood interventions, not a menu you must pick from.

Answer only by calling the tool `{tool}`."""

_ANALYZER_SYSTEM = """\
You extend the evaluation harness of a GRPO post-training workbench. A version's score moved and no rule of \
the harness explains it: `anomaly` says which way, and which findings moved most from the parent's diagnosis. \
`anomaly.flips` shows the val tasks whose outcome flipped, with both versions' answers: read them first. \
Propose analyzers that would measure what changed, each as ONE SQL query that DuckDB runs over the view \
`completions` and that gives ONE number. Before the version is decided, each is measured on the accepted \
answers of the version's sampled val passes, on the tasks both it and its parent solved, against its \
parent's; a change beyond the seed-to-seed spread holds the version back. Later, the harness computes it \
on each run's train rollouts.

The view (one run's rollouts; the engine decides which):
- completions(text VARCHAR -- what the policy wrote: the completion, or a multi-turn episode's actions, \
correct BOOLEAN -- judged correct, task_id VARCHAR, subset VARCHAR, prompt VARCHAR, completion VARCHAR, \
reward DOUBLE, reward_components MAP(VARCHAR, DOUBLE), truncated BOOLEAN, completion_length INTEGER, \
num_turns INTEGER, tool_calls STRUCT(turn INTEGER, tool VARCHAR, args VARCHAR, ok BOOLEAN, files VARCHAR[])[], \
step INTEGER, group_id INTEGER, sample_idx INTEGER)

Rules:
- The query reads `completions` and nothing else, is a single read-only SELECT (or WITH ... SELECT), and \
returns exactly one row with one numeric column.
- `kind` is "mean" for a quantity compared between versions as a ratio (a length, a count per completion), \
"share" for a value in [0, 1] compared as a difference (a rate, a share).
- `name` is snake_case (lowercase letters, digits, underscores; 3-41 characters, starting with a letter).
- `layer` is where the number belongs: score (what evaluation says), signal (what the optimizer gets), \
behavior (what the policy does), version (across versions).
- `explanation` says in one line what the number means; `threshold` and `higher_is` say when it is bad.
- Reason from the anomaly and the context only, never from knowledge of specific tasks or their answers.

Answer only by calling the tool `{tool}`."""


class _MalformedOutput(ValueError):
    """The model's tool input is well-typed JSON but breaks a rule the schema cannot express."""


class AnthropicBackend:
    """Claude as the coach's reasoning backend (implements the `Backend` protocol)."""

    name = "anthropic"

    def __init__(
        self,
        model: str,
        max_tokens: int = 4096,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        timeout: float = 60.0,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise BackendError("ANTHROPIC_API_KEY is not set (export it, or use coach.backend = 'offline')")
        self.model = model
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.timeout = timeout
        self.calls: list[ModelCall] = []
        # The key goes into the SDK client and nowhere else (redaction reads it back from there).
        self._client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=max_retries, timeout=timeout)

    def __repr__(self) -> str:
        # Spelled out so that no attribute (the client holds the key) ever ends up in a log line.
        return f"AnthropicBackend(model={self.model!r}, max_tokens={self.max_tokens}, max_retries={self.max_retries})"

    # -- the protocol --------------------------------------------------------------------------------
    def propose(self, ctx: PlanningContext) -> Proposals:
        """Ask for `ctx.branches` single-factor interventions on the parent, with a rationale."""
        system = _PROPOSE_SYSTEM.format(branches=ctx.branches, tool=PROPOSE_TOOL)
        user = _compact_json({"context": context_payload(ctx), "catalog": catalog_hints(), "kind_layer": KIND_LAYER})
        tool = propose_tool(ctx.branches)

        def parse(data: dict[str, Any]) -> Proposals:
            return _parse_proposals(data, ctx)

        return self._call_tool(purpose="propose", system=system, user_text=user, tool=tool, parse=parse)

    def propose_analyzer(self, anomaly: dict[str, Any], ctx: PlanningContext) -> list[AnalyzerSpec]:
        """Ask for analyzers (SQL over the store) that would measure an anomaly the harness missed."""
        system = _ANALYZER_SYSTEM.format(tool=ANALYZER_TOOL)
        payload = {
            "anomaly": anomaly,
            "parent": ctx.parent,
            "domain": ctx.domain,
            "diagnosis": ctx.diagnosis.to_dict() if ctx.diagnosis else None,
            "feedback": ctx.feedback,
        }
        return self._call_tool(
            purpose="propose_analyzer",
            system=system,
            user_text=_compact_json(payload),
            tool=analyzer_tool(),
            parse=lambda data: _parse_analyzers(data, frozenset(anomaly.get("existing", ()))),
        )

    # -- one forced tool call, validated, re-asked once --------------------------------------------------
    def _call_tool(
        self,
        *,
        purpose: str,
        system: str,
        user_text: str,
        tool: dict[str, Any],
        parse: Callable[[dict[str, Any]], T],
    ) -> T:
        """Call with `tool` forced and parse its input; a malformed reply gets one corrective turn.

        One re-ask fixes most slips (a missing field, a multi-factor change without evidence) for the
        price of one call; more would spend tokens on a model that does not follow the schema.
        """
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": user_text}]}]
        problem = ""
        for attempt in range(2):
            response = self._create(purpose if attempt == 0 else f"{purpose}:retry", system, messages, tool)
            block = next((b for b in response.content if b.type == "tool_use" and b.name == tool["name"]), None)
            try:
                if block is None:
                    raise _MalformedOutput(
                        f"the reply did not call the tool {tool['name']} (stop_reason {response.stop_reason})"
                    )
                if not isinstance(block.input, dict):
                    raise _MalformedOutput(f"the tool input is {type(block.input).__name__}, not an object")
                result = parse(block.input)
            except (ValidationError, InterventionError, _MalformedOutput) as exc:
                problem = _describe(exc)
                if response.stop_reason == "max_tokens":
                    problem += f" (the reply hit max_tokens = {self.max_tokens})"
                self.calls[-1].ok = False
                self.calls[-1].error = _short(f"malformed output: {problem}", _ERROR_CHARS)
                log.info("%s: malformed output on attempt %d: %s", purpose, attempt + 1, _short(problem, 200))
                if attempt == 0:
                    messages = _corrective_turn(messages, response, problem, tool["name"])
                continue
            return result
        raise BackendError(_short(f"malformed output from {self.model} ({purpose}), also after a re-ask: {problem}"))

    def _create(self, purpose: str, system: str, messages: list[dict[str, Any]], tool: dict[str, Any]) -> Message:
        """One `messages.create` (the SDK retries 408/409/429/5xx and connection errors inside it);
        records a `ModelCall` whatever happens and turns API errors into `BackendError`s."""
        call = ModelCall(backend=self.name, model=self.model, purpose=purpose)
        start = time.monotonic()
        try:
            response = self._client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=system,
                messages=messages,  # type: ignore[arg-type]
                tools=[tool],  # type: ignore[list-item]
                tool_choice={"type": "tool", "name": tool["name"]},
            )
        except anthropic.APITimeoutError:
            error = f"request timed out after {self.timeout:g}s ({self.max_retries} retries)"
        except anthropic.APIStatusError as exc:
            error = f"HTTP {exc.status_code} {_api_error_text(exc)}"
        except anthropic.APIConnectionError as exc:
            error = f"connection error: {exc} ({self.max_retries} retries)"
        except anthropic.APIError as exc:  # e.g. a response body the SDK could not read
            error = f"{type(exc).__name__}: {exc}"
        else:
            call.seconds = time.monotonic() - start
            usage = response.usage
            call.input_tokens = int(getattr(usage, "input_tokens", 0) or 0)
            call.output_tokens = int(getattr(usage, "output_tokens", 0) or 0)
            self.calls.append(call)
            return response
        call.seconds = time.monotonic() - start
        call.ok = False
        call.error = _short(self._redact(error), _ERROR_CHARS)
        self.calls.append(call)
        log.warning("anthropic %s failed: %s", purpose, call.error)
        # `from None`: the SDK exception holds the request, and the request holds the key header.
        raise BackendError(f"anthropic API call ({purpose}) failed: {call.error}") from None

    def _redact(self, text: str) -> str:
        """Belt and braces: an error text never carries the key, even if a server echoed it."""
        key = self._client.api_key
        return text.replace(key, "[redacted]") if key else text


# -- prompts and tool schemas ----------------------------------------------------------------------------
def context_payload(ctx: PlanningContext) -> dict[str, Any]:
    """What the model reasons from: the planning context minus the policy section (paths, sizes)."""
    config = ctx.parent_config.model_dump(mode="json")
    config.pop("policy", None)
    return {
        "parent": ctx.parent,
        "domain": ctx.domain,
        "parent_config": config,
        "diagnosis": ctx.diagnosis.to_dict() if ctx.diagnosis else None,
        "history": ctx.history,
        "cases": ctx.cases,
        "skills": ctx.skills,
        "literature": ctx.literature,
        "feedback": ctx.feedback,
        "tried": {"templates": ctx.tried_templates, "factors": ctx.tried_factors},
        "escalated": ctx.escalated,
        "branches": ctx.branches,
        "facts": {
            "hopeless_tasks": len(ctx.facts.hopeless_tasks),
            "seen_tasks": ctx.facts.seen_tasks,
            "lengths": str(ctx.facts.lengths) if ctx.facts.lengths else None,
        },
        "flips": ctx.flips,
        "ranking": ctx.ranking,
    }


def catalog_hints() -> list[dict[str, Any]]:
    """The offline planner's templates as hints: which rule each answers and why it should help."""
    return [
        {"name": t.name, "kind": t.kind, "triggers": list(t.triggers), "removes": t.removes, "because": t.because}
        for t in CATALOG
    ]


def propose_tool(branches: int) -> dict[str, Any]:
    """The `propose_interventions` tool: the Intervention fields a model may write (not template/source)."""
    intervention = {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": list(KINDS)},
            "changes": {
                "type": "object",
                "description": "Dotted workspace.toml paths -> new values, e.g. {'recipe.learning_rate': 4e-5}.",
            },
            "hypothesis": {"type": "string", "description": "If X then Y, because Z."},
            "success_criterion": {"type": "string", "description": "Falsifiable from the next run's evaluation."},
            "rollback": {"type": "string"},
            "evidence": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Findings, rules, cases, skills or literature the proposal rests on.",
            },
        },
        "required": ["kind", "changes", "hypothesis", "success_criterion", "rollback", "evidence"],
        "additionalProperties": False,
    }
    return {
        "name": PROPOSE_TOOL,
        "description": f"Propose {branches} single-factor interventions on the parent, each a different factor.",
        "input_schema": {
            "type": "object",
            "properties": {
                "rationale": {"type": "string", "description": "Why these, from the evidence in the context."},
                "interventions": {"type": "array", "items": intervention, "minItems": 1, "maxItems": branches},
            },
            "required": ["rationale", "interventions"],
        },
    }


def analyzer_tool() -> dict[str, Any]:
    """The `propose_analyzers` tool: items follow AnalyzerSpec's own JSON schema, minus `source`."""
    spec = AnalyzerSpec.model_json_schema()
    spec["properties"].pop("source", None)
    spec.pop("title", None)
    return {
        "name": ANALYZER_TOOL,
        "description": "Propose analyzers, each one SQL query over `completions` giving one number.",
        "input_schema": {
            "type": "object",
            "properties": {
                "rationale": {"type": "string"},
                "analyzers": {"type": "array", "items": spec, "minItems": 1},
            },
            "required": ["analyzers"],
        },
    }


# -- parsing --------------------------------------------------------------------------------------------
def _parse_proposals(data: dict[str, Any], ctx: PlanningContext) -> Proposals:
    """Interventions from the tool input, held to the planner's rules (`check()`, distinct factors,
    nothing already tried); any breach is malformed output, so the model is re-asked."""
    rationale = data.get("rationale")
    items = data.get("interventions")
    if not isinstance(rationale, str) or not rationale.strip():
        raise _MalformedOutput("'rationale' must be a non-empty string")
    if not isinstance(items, list) or not items:
        raise _MalformedOutput("'interventions' must be a non-empty array")
    tried = set(ctx.tried_factors)
    out: list[Intervention] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items[: ctx.branches]):
        if not isinstance(item, dict):
            raise _MalformedOutput(f"interventions[{i}] must be an object")
        fields = {k: v for k, v in item.items() if k not in ("source", "template")}
        try:
            iv = Intervention.model_validate({**fields, "source": "model"})
            check(iv)
        except InterventionError as exc:
            raise InterventionError(f"interventions[{i}]: {exc}") from None
        except ValidationError as exc:
            raise _MalformedOutput(f"interventions[{i}]: {_describe(exc)}") from None
        if iv.factor in seen:
            raise _MalformedOutput(
                f"interventions[{i}] changes the same factor ({iv.factor}) as interventions[{seen[iv.factor]}]; "
                "each intervention must change a different factor"
            )
        repeated = sorted(tried.intersection(iv.factors))
        if repeated:
            raise _MalformedOutput(f"interventions[{i}] changes {', '.join(repeated)}, already tried from this parent")
        seen[iv.factor] = i
        out.append(iv)
    return Proposals(interventions=out, rationale=rationale.strip(), backend=AnthropicBackend.name)


def _parse_analyzers(data: dict[str, Any], taken: set[str] | frozenset[str] = frozenset()) -> list[AnalyzerSpec]:
    """AnalyzerSpecs from the tool input. Names are made valid and unique (`analyzer_name`); a query
    that is not one read-only SELECT over `completions` is malformed."""
    items = data.get("analyzers")
    if not isinstance(items, list) or not items:
        raise _MalformedOutput("'analyzers' must be a non-empty array")
    out: list[AnalyzerSpec] = []
    names = set(taken)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _MalformedOutput(f"analyzers[{i}] must be an object")
        fields = {k: v for k, v in item.items() if k != "source"}
        fields["name"] = analyzer_name(str(fields.get("name") or f"model_analyzer_{i}"), taken=names)
        try:
            spec = AnalyzerSpec.model_validate({**fields, "source": "model"})
            check_sql(spec.sql)
        except ValidationError as exc:
            raise _MalformedOutput(f"analyzers[{i}]: {_describe(exc)}") from None
        except UnsafeSQLError as exc:
            raise _MalformedOutput(f"analyzers[{i}].sql: {exc}") from None
        names.add(spec.name)
        out.append(spec)
    return out


def _corrective_turn(
    messages: list[dict[str, Any]], response: Message, problem: str, tool_name: str
) -> list[dict[str, Any]]:
    """The conversation plus the bad reply and the correction.

    After a tool call the correction is an error `tool_result` for each `tool_use` id (the API requires
    every tool_use to be answered by a tool_result). A reply without any tool call cannot be answered
    with a tool_result (there is no id to refer to), so it gets a plain text correction instead.
    """
    echo: list[dict[str, Any]] = []
    for b in response.content:
        if b.type == "text" and b.text:
            echo.append({"type": "text", "text": b.text})
        elif b.type == "tool_use":
            echo.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
    text = f"Call the tool {tool_name} again with corrected input. The problem: {_short(problem, _FEEDBACK_CHARS)}"
    tool_uses = [b for b in echo if b["type"] == "tool_use"]
    if tool_uses:
        reply: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": b["id"], "is_error": True, "content": text} for b in tool_uses
        ]
    else:
        reply = [{"type": "text", "text": f"You answered without calling the tool. {text}"}]
    if not echo:  # an empty assistant turn is refused by the API; extend the last user turn instead
        last = messages[-1]
        return [*messages[:-1], {"role": "user", "content": [*last["content"], *reply]}]
    return [*messages, {"role": "assistant", "content": echo}, {"role": "user", "content": reply}]


# -- small helpers ---------------------------------------------------------------------------------------
def _describe(exc: Exception) -> str:
    """A validation error in a few lines the model can act on (field, message, what it sent)."""
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors(include_url=False):
            loc = ".".join(str(x) for x in err.get("loc", ())) or "(input)"
            got = _short(repr(err.get("input")), 80)
            parts.append(f"{loc}: {err['msg']} (got {got})")
        return "; ".join(parts)
    return str(exc)


def _api_error_text(exc: anthropic.APIStatusError) -> str:
    """`error.type: error.message` from the error body (short), falling back to the SDK's message."""
    kind = getattr(exc, "type", None)
    message = getattr(exc, "api_message", None)
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            kind = kind or err.get("type")
            message = message or err.get("message")
    text = f"{kind}: {message}" if kind and message else str(message or kind or exc.message)
    request_id = getattr(exc, "request_id", None)
    return _short(text, 200) + (f" (request {request_id})" if request_id else "")


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)


def _short(text: str, limit: int = _ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
