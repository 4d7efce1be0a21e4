"""The instruction-following judge through Claude, against a local server that speaks the Messages
API: a forced `score` tool, a cache by transcript, and the rubric whenever Claude cannot answer."""

from __future__ import annotations

import pytest

from engine.domains.base import Episode, Task, ToolCall
from engine.domains.judge import ClaudeJudge
from engine.domains.swe import rubric_score
from tests.fake_messages_api import FakeMessagesAPI, error_reply, text_reply, tool_use_reply

KEY = "sk-ant-test-judge-0000"


def episode(*actions: str) -> Episode:
    tools = {"search": "search", "edit": "edit", "test": "test", "submit": "submit"}
    ep = Episode(Task("t1", "issue: add(3, 4) gives -1 want 7\nfiles: calc.py\n>", "", "op"))
    for turn, action in enumerate(actions):
        tool = tools.get(action.split()[0], "invalid")
        ep.actions.append(action + "\n")
        ep.calls.append(ToolCall(turn, tool, action, tool != "invalid"))
        ep.observations.append(f"{tool}: ok\n>")
    return ep


def judge(api: FakeMessagesAPI) -> ClaudeJudge:
    return ClaudeJudge(rubric_score, "claude-test", api_key=KEY, base_url=api.url, timeout=5.0)


def test_claude_scores_through_the_forced_tool_and_repeats_are_cached() -> None:
    with FakeMessagesAPI() as api:
        api.script.append(tool_use_reply("score", {"score": 0.75, "reason": "tests after editing"}))
        j = judge(api)
        ep = episode("search add", "edit calc.py: a - b => a + b", "test", "submit")
        assert j(ep) == 0.75 and j(ep) == 0.75  # the second is the cache
        assert len(api.requests) == 1 and j.judged == 1 and not j.fallbacks
        body = api.requests[0].body
        assert body["tool_choice"] == {"type": "tool", "name": "score"} and body["model"] == "claude-test"
        assert "search add" in body["messages"][0]["content"] and "submit" in body["messages"][0]["content"]
        assert KEY not in str(body)


@pytest.mark.parametrize(
    "reply",
    [
        text_reply("it looks fine"),  # ignored the tool
        tool_use_reply("score", {"score": 3, "reason": "out of range"}),
        error_reply(400, "invalid_request_error", "bad"),
    ],
    ids=["no tool", "out of range", "client error"],
)
def test_anything_claude_cannot_score_falls_back_to_the_rubric(reply: object) -> None:
    with FakeMessagesAPI() as api:
        api.script.append(reply)  # type: ignore[arg-type]
        j = judge(api)
        ep = episode("search add", "jump", "submit")
        assert j(ep) == pytest.approx(rubric_score(ep)) and sum(j.fallbacks.values()) == 1 and j.judged == 0


def test_without_a_key_the_judge_is_the_rubric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    j = ClaudeJudge(rubric_score)
    ep = episode("test", "submit")
    assert not j.available and j(ep) == pytest.approx(rubric_score(ep)) and j.fallbacks == {"no key": 1}
