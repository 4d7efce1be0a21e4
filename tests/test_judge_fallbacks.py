"""The Claude judge's fallbacks reach the user: the recorder logs them per step as metrics, ingest
stores them, and the harness reports them (`signal.judge_fallback_ratio`).

The judge talks to a local server that speaks the Messages API; the recorder's reward functions are
called the way TRL calls them, on hand-made episodes, so no model is trained."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.config import SweDomainConfig, parse_config
from engine.domains.base import Episode, ToolCall
from engine.domains.judge import FALLBACK_RATIO, FALLBACKS_PREFIX
from engine.domains.swe import SweDomain
from engine.harness.base import Finding
from engine.harness.diagnose import diagnose, headline
from engine.harness.thresholds import JUDGE_FALLBACKS
from engine.runs.artifacts import EVENTS_FILE, EventLog
from engine.runs.episodes import EpisodeRollout
from engine.runs.ingest import ingest_run
from engine.runs.recorder import RolloutRecorder
from engine.store import Store
from tests.fake_messages_api import FakeMessagesAPI, error_reply, text_reply, tool_use_reply, use_test_key

KEY = "sk-ant-test-judge-fallbacks-0000"
RUN = "v1-train-1"
GROUP = 2
ACTIONS = (("search add", "search"), ("read calc.py", "read"), ("edit calc.py: a - b => a + b", "edit"))


@pytest.fixture(autouse=True)
def fake_key(monkeypatch: pytest.MonkeyPatch) -> None:
    use_test_key(monkeypatch, KEY)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)  # the SDK's own switch: the judge passes none
        yield server
        assert not server.refusals, f"the fake refused requests the real API would refuse: {server.refusals}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "evo.duckdb") as s:
        yield s


def swe(judge: str) -> SweDomain:
    return SweDomain(SweDomainConfig(train_size=4, val_size=2, judge=judge, judge_model="claude-test"))


def rollouts(domain: SweDomain, step: int) -> list[EpisodeRollout]:
    """One group of GROUP episodes per train task, every transcript distinct (no cache hits)."""
    out = []
    for t, task in enumerate(domain.tasks("train")[:2]):
        for s in range(GROUP):
            action, tool = ACTIONS[(step + t + s) % len(ACTIONS)]
            ep = Episode(task)
            calls = [(action, tool), (f"test {step} {t} {s}", "invalid"), ("submit", "submit")]
            for turn, (text, name) in enumerate(calls):
                ep.actions.append(text + "\n")
                ep.observations.append(f"{name}: ok\n>")
                ep.calls.append(ToolCall(turn, name, text, name != "invalid"))
            out.append(EpisodeRollout(ep, [1], [1, 2, 3], [1, 1, 0]))
    return out


def record(
    store: Store, run_dir: Path, domain: SweDomain, weights: dict[str, float], steps: int
) -> tuple[list[Finding], list[str]]:
    """Score `steps` batches through the recorder's reward functions as TRL calls them, ingest the
    run directory and diagnose it: the judge findings, and the headline `evotui diagnose` prints."""
    events = EventLog(run_dir / EVENTS_FILE)
    recorder = RolloutRecorder(RUN, run_dir, domain, weights, GROUP, [0], events)
    for step in range(1, steps + 1):
        recorder.episodes = batch = rollouts(domain, step)
        tasks = [r.episode.task for r in batch]
        for reward_fn in recorder.reward_functions():
            reward_fn(
                prompts=[t.prompt for t in tasks],
                completions=[r.episode.transcript() for r in batch],
                completion_ids=[r.completion_ids for r in batch],
                task_id=[t.task_id for t in tasks],
                episode_index=list(range(len(batch))),
                trainer_state=SimpleNamespace(global_step=step - 1),
            )
    events.close()
    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    store.add_version("v1", "v0", "versions/v1", "b", state="trained")
    store.add_run(RUN, "v1", "train", str(run_dir), {}, steps)
    ingest_run(store, RUN, run_dir)
    run, version = store.get_run(RUN), store.get_version("v1")
    assert run is not None and version is not None
    d = diagnose(store, run, version, parse_config('[workspace]\nname = "t"\n', Path("t.toml")), window=1)
    return [f for f in d.findings if f.metric == "signal.judge_fallback_ratio"], headline(d.to_dict(), limit=50)


def judge_metrics(store: Store) -> list[tuple[int, str, float]]:
    return store.query("SELECT step, key, value FROM metrics WHERE key LIKE 'judge/%' ORDER BY step, key")


WEIGHTS = {"correctness": 1.0, "judge": 0.2}


def test_fallbacks_are_stored_per_step_and_the_finding_warns_with_their_kinds(
    api: FakeMessagesAPI, store: Store, tmp_path: Path
) -> None:
    score = tool_use_reply("score", {"score": 0.5, "reason": "fine"})
    # Step 1: two of four episodes fall back (no tool in the reply; a client error); step 2: none.
    api.enqueue(score, text_reply("looks fine"), score, error_reply(400, "invalid_request_error", "bad"))
    api.enqueue(score, score, score, score)
    findings, lines = record(store, tmp_path, swe("claude"), WEIGHTS, steps=2)
    assert api.remaining == 0 and len(api.requests) == 8
    assert judge_metrics(store) == [
        (1, FALLBACK_RATIO, 0.5),
        (1, FALLBACKS_PREFIX + "BadRequestError", 1.0),
        (1, FALLBACKS_PREFIX + "ValueError", 1.0),
        (2, FALLBACK_RATIO, 0.0),
    ]
    (f,) = findings
    assert f.value == pytest.approx(0.25) and f.severity == "warning"  # above the JUDGE_FALLBACKS line
    assert f.layer == "signal" and f.threshold == JUDGE_FALLBACKS.value and f.steps == (1,)
    assert "BadRequestError x1" in f.explanation and "ValueError x1" in f.explanation
    assert any(line.startswith("warning: signal.judge_fallback_ratio") for line in lines)  # `evotui diagnose`


def test_without_a_key_every_episode_falls_back_and_the_finding_says_so(
    monkeypatch: pytest.MonkeyPatch, store: Store, tmp_path: Path
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    (f,), _ = record(store, tmp_path, swe("claude"), WEIGHTS, steps=1)
    assert f.value == 1.0 and f.severity == "warning" and "no key x4" in f.explanation


def test_every_episode_scored_by_claude_gives_no_warning(api: FakeMessagesAPI, store: Store, tmp_path: Path) -> None:
    api.enqueue(*[tool_use_reply("score", {"score": 0.9, "reason": "fine"})] * 8)
    (f,), lines = record(store, tmp_path, swe("claude"), WEIGHTS, steps=2)
    assert judge_metrics(store) == [(1, FALLBACK_RATIO, 0.0), (2, FALLBACK_RATIO, 0.0)]
    assert f.value == 0.0 and f.severity == "info" and "no failures" in f.explanation
    assert not any("judge_fallback" in line for line in lines)


@pytest.mark.parametrize(
    ("judge", "weights"),
    [("rubric", WEIGHTS), ("claude", {"correctness": 1.0, "judge": 0.0}), ("claude", {"correctness": 1.0})],
    ids=["rubric judge", "judge weight 0", "judge not weighted"],
)
def test_a_judge_not_in_use_logs_nothing_and_finds_nothing(
    monkeypatch: pytest.MonkeyPatch, store: Store, tmp_path: Path, judge: str, weights: dict[str, float]
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")  # a Claude judge would fall back for every episode
    findings, _ = record(store, tmp_path, swe(judge), weights, steps=1)
    assert judge_metrics(store) == [] and findings == []
