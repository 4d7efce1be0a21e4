"""The Claude backend against a local server that speaks the Messages API (the real SDK over a socket)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from engine.coach.backends.anthropic_backend import ANALYZER_TOOL, PROPOSE_TOOL, AnthropicBackend
from engine.coach.backends.base import AnalyzerSpec, BackendError, PlanningContext
from engine.coach.interventions import CATALOG, Intervention
from engine.config import parse_config
from engine.harness.base import Finding, RuleResult
from engine.harness.diagnose import Diagnosis
from tests.fake_messages_api import (
    FakeMessagesAPI,
    RecordedRequest,
    Reply,
    error_reply,
    rate_limited,
    sent_key,
    server_error,
    text_reply,
    tool_use_reply,
    use_test_key,
)

KEY = "sk-test-secret-123"
MODEL = "claude-test-model"

LOWER_LR: dict[str, Any] = {
    "kind": "optimizer",
    "changes": {"recipe.learning_rate": 1e-5},
    "hypothesis": "If the learning rate halves, val correctness rises, because entropy stops collapsing.",
    "success_criterion": "val correctness rises with its 95% interval above 0",
    "rollback": "keep the parent",
    "evidence": ["rule exploration_collapse fired"],
}
CLOSENESS: dict[str, Any] = {
    "kind": "reward",
    "changes": {"recipe.rewards": {"correctness": 1.0, "format": 0.1, "closeness": 0.5}},
    "hypothesis": "If a closeness component is added, dead groups get a spread, because rewards become continuous.",
    "success_criterion": "share of dead groups falls and val correctness rises",
    "rollback": "keep the parent",
    "evidence": ["finding signal.dead_groups high"],
}
TWO_FACTORS: dict[str, Any] = {
    **LOWER_LR,
    "changes": {"recipe.learning_rate": 1e-5, "recipe.temperature": 1.2},
    "evidence": [],
}
SPEC: dict[str, Any] = {
    "name": "short_completion_share",
    "layer": "behavior",
    "sql": "SELECT avg((completion_length < 5)::INT) FROM completions",
    "explanation": "Share of completions shorter than 5 tokens.",
    "kind": "share",
    "threshold": 0.2,
    "higher_is": "worse",
}


@pytest.fixture(autouse=True)
def fake_key(monkeypatch: pytest.MonkeyPatch) -> None:
    use_test_key(monkeypatch, KEY)


@pytest.fixture
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as server:
        yield server
        assert not server.refusals, f"the fake refused requests the real API would refuse: {server.refusals}"


def make_ctx(**overrides: Any) -> PlanningContext:
    values: dict[str, Any] = {
        "parent": "v1",
        "parent_config": parse_config('[workspace]\nname = "t"\n', Path("t.toml")),
        "domain": "math",
        "diagnosis": Diagnosis(
            "v1-train-1-diagnosis",
            "v1",
            "v1-train-1",
            "test",
            [Finding("signal.entropy_trend", -0.4, "warning")],
            [RuleResult("entropy fell", "warning", ("signal.entropy_trend",), rule="exploration_collapse")],
        ),
        "history": [{"name": "v1", "parent": "v0", "kind": "optimizer", "verdict": "better"}],
        "feedback": ["prefer optimizer changes"],
        "tried_templates": ["kl_anchor"],
        "tried_factors": ["recipe.beta"],
        "branches": 2,
    }
    values.update(overrides)
    return PlanningContext(**values)


def make_backend(api: FakeMessagesAPI, max_retries: int = 0, **kwargs: Any) -> AnthropicBackend:
    return AnthropicBackend(MODEL, base_url=api.url, max_retries=max_retries, timeout=5.0, **kwargs)


def proposals(*items: dict[str, Any], rationale: str = "entropy collapsed; two independent levers") -> dict[str, Any]:
    return {"rationale": rationale, "interventions": list(items)}


def usage(reply: Reply) -> tuple[int, int]:
    """The tokens a scripted reply reports (so expectations follow the script, not pasted numbers)."""
    u = reply[1]["usage"]
    return u["input_tokens"], u["output_tokens"]


def tool_use_id(reply: Reply) -> str:
    return next(b["id"] for b in reply[1]["content"] if b["type"] == "tool_use")


def last_user_blocks(request: RecordedRequest) -> list[dict[str, Any]]:
    message = request.body["messages"][-1]
    assert message["role"] == "user"
    return message["content"]


def test_the_model_reads_the_parents_flips(api: FakeMessagesAPI) -> None:
    flips = {"decoding": "sampled", "tasks": 40, "to_right": 6, "to_wrong": 1, "examples": [{"prompt": "q"}]}
    api.enqueue(tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR, CLOSENESS)))
    make_backend(api).propose(make_ctx(flips=flips))
    (request,) = api.requests
    assert json.loads(last_user_blocks(request)[0]["text"])["context"]["flips"] == flips
    assert "`flips`" in request.body["system"]


# -- 1 -----------------------------------------------------------------------------------------------------
def test_proposals_are_parsed_and_the_request_forces_the_tool(api: FakeMessagesAPI) -> None:
    reply = tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR, CLOSENESS), input_tokens=1234, output_tokens=567)
    api.enqueue(reply)
    backend = make_backend(api)

    result = backend.propose(make_ctx())

    assert result.backend == "anthropic"
    assert result.rationale == "entropy collapsed; two independent levers"
    assert all(isinstance(iv, Intervention) for iv in result.interventions)
    assert [iv.changes for iv in result.interventions] == [LOWER_LR["changes"], CLOSENESS["changes"]]
    assert [iv.source for iv in result.interventions] == ["model", "model"]
    assert [iv.template for iv in result.interventions] == ["", ""]
    assert [iv.evidence for iv in result.interventions] == [LOWER_LR["evidence"], CLOSENESS["evidence"]]

    [call] = backend.calls
    assert (call.input_tokens, call.output_tokens) == usage(reply)
    assert call.ok and call.error is None and call.purpose == "propose" and call.model == MODEL
    assert call.seconds > 0

    [request] = api.requests
    body = request.body
    assert request.path == "/v1/messages"
    assert sent_key(request.headers) == KEY
    assert body["model"] == MODEL and body["max_tokens"] == 4096
    assert body["tool_choice"] == {"type": "tool", "name": PROPOSE_TOOL}
    [tool] = body["tools"]
    assert tool["name"] == PROPOSE_TOOL
    item_schema = tool["input_schema"]["properties"]["interventions"]["items"]
    fields = {"kind", "changes", "hypothesis", "success_criterion", "rollback", "evidence"}
    assert set(item_schema["properties"]) == fields
    assert "optimizer" in item_schema["properties"]["kind"]["enum"]
    assert "2 interventions" in body["system"] and "tried" in body["system"]

    [[block]] = [m["content"] for m in body["messages"]]
    payload = json.loads(block["text"])
    ctx = payload["context"]
    assert (
        ctx["parent"] == "v1"
        and ctx["domain"] == "math"
        and ctx["tried"] == {"templates": ["kl_anchor"], "factors": ["recipe.beta"]}
    )
    assert ctx["diagnosis"]["bottleneck"] == "exploration_collapse"
    assert ctx["feedback"] == ["prefer optimizer changes"]
    assert "policy" not in ctx["parent_config"]
    assert ctx["parent_config"]["recipe"]["learning_rate"] == 2e-5
    assert [t["name"] for t in payload["catalog"]] == [t.name for t in CATALOG]
    assert set(payload["catalog"][0]) >= {"name", "kind", "triggers", "because"}


def test_extra_proposals_beyond_branches_are_dropped(api: FakeMessagesAPI) -> None:
    api.enqueue(tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR, CLOSENESS)))
    result = make_backend(api).propose(make_ctx(branches=1))
    assert [iv.changes for iv in result.interventions] == [LOWER_LR["changes"]]


# -- 2 -----------------------------------------------------------------------------------------------------
def test_rate_limit_is_retried_by_the_sdk(api: FakeMessagesAPI) -> None:
    reply = tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR), input_tokens=321, output_tokens=45)
    api.enqueue(rate_limited(), reply)
    backend = make_backend(api, max_retries=2)

    result = backend.propose(make_ctx())

    assert [iv.changes for iv in result.interventions] == [LOWER_LR["changes"]]
    assert len(api.requests) == 2
    assert [r.headers["x-stainless-retry-count"] for r in api.requests] == ["0", "1"]
    assert api.requests[0].body == api.requests[1].body
    # The SDK hides its retries: the backend sees (and records) one successful call.
    [call] = backend.calls
    assert call.ok and (call.input_tokens, call.output_tokens) == usage(reply)


# -- 3 -----------------------------------------------------------------------------------------------------
def test_server_error_on_every_request_is_a_backend_error(api: FakeMessagesAPI) -> None:
    retries = 1
    api.enqueue(*[server_error("overloaded upstream") for _ in range(retries + 1)])
    backend = make_backend(api, max_retries=retries)

    with pytest.raises(BackendError) as info:
        backend.propose(make_ctx())

    assert "500" in str(info.value) and "overloaded upstream" in str(info.value)
    assert len(api.requests) == retries + 1 and api.remaining == 0
    [call] = backend.calls
    assert not call.ok and "500" in (call.error or "")
    assert (call.input_tokens, call.output_tokens) == (0, 0)


def test_a_client_error_is_not_retried(api: FakeMessagesAPI) -> None:
    api.enqueue(error_reply(400, "invalid_request_error", "max_tokens: too large"))
    backend = make_backend(api, max_retries=2)
    with pytest.raises(BackendError, match="400 invalid_request_error: max_tokens: too large"):
        backend.propose(make_ctx())
    assert len(api.requests) == 1


def test_connection_refused_is_a_backend_error() -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = AnthropicBackend(MODEL, base_url=f"http://127.0.0.1:{port}", max_retries=0, timeout=2.0)
    with pytest.raises(BackendError, match="connection error"):
        backend.propose(make_ctx())
    [call] = backend.calls
    assert not call.ok and call.input_tokens == 0


# -- 4 -----------------------------------------------------------------------------------------------------
def test_a_reply_without_the_tool_is_reasked_once(api: FakeMessagesAPI) -> None:
    first = text_reply("I think you should lower the learning rate.", input_tokens=800, output_tokens=30)
    second = tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR), input_tokens=900, output_tokens=200)
    api.enqueue(first, second)
    backend = make_backend(api)

    result = backend.propose(make_ctx())

    assert [iv.changes for iv in result.interventions] == [LOWER_LR["changes"]]
    assert len(api.requests) == 2
    messages = api.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0] == api.requests[0].body["messages"][0]
    assert messages[1]["content"] == first[1]["content"]
    # No tool_use to answer, so the correction is text (a tool_result here would be a 400 from the API).
    [correction] = last_user_blocks(api.requests[1])
    assert correction["type"] == "text" and PROPOSE_TOOL in correction["text"]
    assert "did not call the tool" in correction["text"]
    assert api.requests[1].body["tool_choice"] == {"type": "tool", "name": PROPOSE_TOOL}

    assert [c.purpose for c in backend.calls] == ["propose", "propose:retry"]
    assert [c.ok for c in backend.calls] == [False, True]
    assert "malformed" in (backend.calls[0].error or "")
    assert sum(c.input_tokens for c in backend.calls) == usage(first)[0] + usage(second)[0]
    assert sum(c.output_tokens for c in backend.calls) == usage(first)[1] + usage(second)[1]


# -- 5 -----------------------------------------------------------------------------------------------------
def test_malformed_twice_is_a_backend_error(api: FakeMessagesAPI) -> None:
    api.enqueue(text_reply("no tool"), tool_use_reply(PROPOSE_TOOL, {"rationale": "x", "interventions": "none"}))
    backend = make_backend(api)

    with pytest.raises(BackendError, match="malformed") as info:
        backend.propose(make_ctx())

    assert "interventions" in str(info.value)
    assert len(api.requests) == 2 and api.remaining == 0
    assert [c.ok for c in backend.calls] == [False, False]


# -- 6 -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "complaint"),
    [
        (TWO_FACTORS, "without evidence"),
        ({**LOWER_LR, "kind": "magic"}, "kind"),
        ({k: v for k, v in LOWER_LR.items() if k != "hypothesis"}, "hypothesis"),
        ({**LOWER_LR, "changes": {"recipe.beta": 0.04}}, "already tried"),
        (proposals(LOWER_LR, LOWER_LR), "same factor"),
    ],
    ids=["multi-factor-without-evidence", "unknown-kind", "missing-field", "already-tried", "same-factor-twice"],
)
def test_invalid_tool_input_is_answered_with_an_error_tool_result(
    api: FakeMessagesAPI, bad: dict[str, Any], complaint: str
) -> None:
    first = tool_use_reply(PROPOSE_TOOL, bad if "interventions" in bad else proposals(bad), text="Here you go.")
    api.enqueue(first, tool_use_reply(PROPOSE_TOOL, proposals(CLOSENESS)))
    backend = make_backend(api)

    result = backend.propose(make_ctx())

    assert [iv.changes for iv in result.interventions] == [CLOSENESS["changes"]]
    assert api.requests[1].body["messages"][1]["content"] == first[1]["content"]
    [tool_result] = last_user_blocks(api.requests[1])
    assert tool_result["type"] == "tool_result"
    assert tool_result["is_error"] is True
    assert tool_result["tool_use_id"] == tool_use_id(first)
    assert complaint in tool_result["content"]
    assert complaint in (backend.calls[0].error or "")


def test_a_multi_factor_change_with_evidence_is_accepted(api: FakeMessagesAPI) -> None:
    api.enqueue(tool_use_reply(PROPOSE_TOOL, proposals({**TWO_FACTORS, "evidence": ["case c12: both moved"]})))
    result = make_backend(api).propose(make_ctx())
    assert result.interventions[0].factors == ["recipe.learning_rate", "recipe.temperature"]
    assert len(api.requests) == 1


# -- 7 -----------------------------------------------------------------------------------------------------
def test_propose_analyzer_returns_specs(api: FakeMessagesAPI) -> None:
    reply = tool_use_reply(ANALYZER_TOOL, {"rationale": "short outputs", "analyzers": [SPEC]})
    api.enqueue(reply)
    backend = make_backend(api)
    anomaly = {"metric": "completion_length", "observed": "collapsed to 3 tokens"}

    specs = backend.propose_analyzer(anomaly, make_ctx())

    assert specs == [AnalyzerSpec(**SPEC, source="model")]
    [request] = api.requests
    assert request.body["tool_choice"] == {"type": "tool", "name": ANALYZER_TOOL}
    items = request.body["tools"][0]["input_schema"]["properties"]["analyzers"]["items"]
    assert items["properties"]["name"]["pattern"] == AnalyzerSpec.model_json_schema()["properties"]["name"]["pattern"]
    assert "source" not in items["properties"]
    system = request.body["system"]
    assert "completions(" in system and "text VARCHAR" in system and "DuckDB" in system and "kind" in system
    assert json.loads(request.body["messages"][0]["content"][0]["text"])["anomaly"] == anomaly
    [call] = backend.calls
    assert call.purpose == "propose_analyzer" and (call.input_tokens, call.output_tokens) == usage(reply)


@pytest.mark.parametrize(
    ("bad", "complaint"),
    [
        ({**SPEC, "sql": "SELECT avg(reward) FROM rollouts"}, "may only read `completions`"),
        ({**SPEC, "sql": "SELECT 1 + 1 AS two"}, "must read `completions`"),
        ({**SPEC, "sql": "DELETE FROM completions"}, "SELECT"),
        ({**SPEC, "kind": "ratio"}, "kind"),
    ],
    ids=["reads-the-store", "reads-nothing", "not-a-select", "unknown-kind"],
)
def test_an_invalid_analyzer_is_reasked(api: FakeMessagesAPI, bad: dict[str, Any], complaint: str) -> None:
    first = tool_use_reply(ANALYZER_TOOL, {"analyzers": [bad]})
    api.enqueue(first, tool_use_reply(ANALYZER_TOOL, {"analyzers": [SPEC]}))
    backend = make_backend(api)

    specs = backend.propose_analyzer({"metric": "x"}, make_ctx())

    assert [s.name for s in specs] == [SPEC["name"]] and specs[0].source == "model"
    [tool_result] = last_user_blocks(api.requests[1])
    assert tool_result["is_error"] is True and tool_result["tool_use_id"] == tool_use_id(first)
    assert complaint in tool_result["content"]
    assert [c.purpose for c in backend.calls] == ["propose_analyzer", "propose_analyzer:retry"]


def test_a_models_analyzer_names_are_made_valid_and_unique(api: FakeMessagesAPI) -> None:
    """The crash a long metric key once caused: names come out valid by construction, and one
    the harness already has gets a suffix instead of being refused later."""
    long = {**SPEC, "name": "metric_completions/max_terminated_length_last_of_the_run"}
    taken = {**SPEC, "name": "Short Completion Share"}
    api.enqueue(tool_use_reply(ANALYZER_TOOL, {"analyzers": [long, taken]}))
    anomaly = {"verdict": "improved", "existing": ["short_completion_share"]}

    specs = make_backend(api).propose_analyzer(anomaly, make_ctx())

    assert [s.name for s in specs] == ["metric_completions_max_terminated_length", "short_completion_share_2"]


# -- 8 -----------------------------------------------------------------------------------------------------
def test_no_key_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(BackendError, match="ANTHROPIC_API_KEY is not set"):
        AnthropicBackend(MODEL)


def test_an_explicit_key_wins_and_is_sent(api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    api.enqueue(tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR)))
    make_backend(api, api_key="sk-explicit-456").propose(make_ctx())
    assert sent_key(api.requests[0].headers) == "sk-explicit-456"


def test_the_key_never_leaves_the_sdk_client(api: FakeMessagesAPI) -> None:
    api.enqueue(
        tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR)),  # ok
        text_reply("no tool"),  # malformed ...
        text_reply("still no tool"),  # ... twice
        # A server that echoes the key back in its error message must not get it into our errors.
        lambda body: error_reply(401, "authentication_error", f"invalid x-api-key {KEY}"),
    )
    backend = make_backend(api)
    errors: list[str] = []
    backend.propose(make_ctx())
    for _ in range(2):
        with pytest.raises(BackendError) as info:
            backend.propose(make_ctx())
        errors.append(str(info.value))

    assert sent_key(api.requests[0].headers) == KEY  # it was used ...
    assert "malformed" in errors[0] and "401" in errors[1] and "[redacted]" in errors[1]
    assert len(backend.calls) == 4
    for text in [repr(backend), str(backend), *errors, *(repr(c) for c in backend.calls)]:
        assert KEY not in text  # ... and it is nowhere else
    assert all(KEY not in json.dumps(asdict(c)) for c in backend.calls)
    assert all(KEY not in repr(v) for k, v in vars(backend).items() if k != "_client")


def test_the_model_reads_the_ranking_of_what_paid(api: FakeMessagesAPI, tmp_path: Path) -> None:
    from engine.coach import bandit
    from engine.store import Store

    store = Store(tmp_path / "s.duckdb")
    arms = [a.to_dict() for a in bandit.rank(store, "math", ["truncation"], [], "round 1")]
    store.close()
    api.enqueue(tool_use_reply(PROPOSE_TOOL, proposals(LOWER_LR, CLOSENESS)))
    make_backend(api).propose(make_ctx(ranking=arms))
    (request,) = api.requests
    assert json.loads(last_user_blocks(request)[0]["text"])["context"]["ranking"] == arms
    assert "`ranking`" in request.body["system"]
