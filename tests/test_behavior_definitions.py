"""One definition per habit: the behavior analyzer's rate (SQL over the stored traces) equals the
mean of the SWE reward component of the same name (Python over the episodes), on any episodes."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.domains.base import EDIT_TOOL, Episode, Task, ToolCall
from engine.domains.swe import edit_then_test, search_before_edit
from engine.harness.analyzers.behavior import habits
from engine.harness.base import Context
from engine.runs.episodes import trace_columns
from engine.store import Store
from tests.harness_data import Rollout, RunBuilder

#: Every tool of the SWE protocol, and `invalid` for an unparsed line.
TOOLS = ("search", "read", "edit", "test", "submit", "git_log", "git_show", "git_diff", "invalid")
HABITS: dict[str, Callable[[Episode], float]] = {
    "behavior.search_before_edit_rate": search_before_edit,
    "behavior.edit_then_test_rate": edit_then_test,
}
_run_ids = itertools.count(1)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with Store(tmp_path_factory.mktemp("habits") / "evo.duckdb") as s:
        yield s


def episode(calls: list[tuple[str, bool]]) -> Episode:
    ep = Episode(Task("train-00000", "issue\n>", "", "op"))
    for turn, (tool, ok) in enumerate(calls):
        ep.actions.append(f"{tool}\n")
        ep.observations.append(f"{tool}: ok\n>")
        ep.calls.append(ToolCall(turn, tool, "", ok, ("calc.py",) if tool == EDIT_TOOL else ()))
    return ep


def analyzer_rates(store: Store, episodes: list[Episode]) -> dict[str, float | None]:
    """The habits analyzer's findings for one run whose train rollouts are `episodes`, stored with
    the columns the recorder writes (`trace_columns`)."""
    builder = RunBuilder(store, run_id=f"v1-train-{next(_run_ids)}")
    rollouts = []
    for ep in episodes:
        _, num_turns, calls = trace_columns(ep)
        rollouts.append(Rollout(reward=0.0, calls=calls, turns=num_turns))
    builder.step(1, [rollouts]).save(steps=1)
    run, version = store.get_run(builder.run_id), store.get_version(builder.version)
    assert run is not None and version is not None
    ctx = Context(store, run, version, parse_config('[workspace]\nname = "t"\n', Path("t.toml")), window=1)
    try:
        return {f.metric: f.value for f in habits(ctx)}
    finally:
        ctx.close()


def reward_means(episodes: list[Episode]) -> dict[str, float | None]:
    """The rewards' mean over the episodes that edited: the rate's population (both habits are
    about editing episodes; the rewards score the others 0)."""
    editing = [ep for ep in episodes if any(c.tool == EDIT_TOOL for c in ep.calls)]
    return {
        metric: sum(reward(ep) for ep in editing) / len(editing) if editing else None
        for metric, reward in HABITS.items()
    }


def check(store: Store, episodes: list[Episode]) -> None:
    rates, means = analyzer_rates(store, episodes), reward_means(episodes)
    assert {metric: rates[metric] for metric in means} == pytest.approx(means)


@pytest.mark.parametrize(
    "tools",
    [
        ["read", "edit", "test", "submit"],  # read is a look: searched-or-read before the first edit
        ["search", "edit", "test", "edit", "submit"],  # the final code was not tested
        ["edit", "search", "edit", "test"],  # the look came after the first edit
        ["git_log", "edit", "invalid", "test", "test"],
        ["search", "read", "test", "submit"],  # no edit: not in either rate
    ],
)
def test_the_analyzer_and_the_reward_agree_on_the_cases_that_once_differed(store: Store, tools: list[str]) -> None:
    # A second editing episode that does both habits keeps every rate defined.
    check(store, [episode([(t, True) for t in tools]), episode([("search", True), ("edit", True), ("test", True)])])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from(TOOLS), st.booleans()), max_size=10),
        min_size=1,
        max_size=8,
    )
)
def test_the_analyzer_rate_is_the_mean_reward_on_random_episodes(
    store: Store, traces: list[list[tuple[str, bool]]]
) -> None:
    check(store, [episode(calls) for calls in traces])
