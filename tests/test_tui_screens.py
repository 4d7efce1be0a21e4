"""The rollout browser, the memory screen and the diff screen, driven through the real app against a
real engine served from a thread of the test process (no training anywhere).

Each test runs the app with `asyncio.run` (pytest-asyncio is not a dependency) and waits on the
current screen's workers, never on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Select, Static, TabbedContent
from textual.worker import WorkerState

from engine.api.protocol import RolloutFilter
from engine.coach.interventions import Intervention, apply
from engine.coach.skills import SkillCard, SkillLibrary
from engine.config import CONFIG_FILE
from engine.core import Engine, VersionPlan
from engine.workspace import Workspace
from evotui.tui.app import EvoApp
from evotui.tui.screens.diff import DiffScreen, diff_summary
from evotui.tui.screens.flips import FlipsScreen, flips_summary
from evotui.tui.screens.memory import MemoryScreen
from evotui.tui.screens.rollouts import (
    DETAIL_DELAY_SECONDS,
    PAGE_SIZE,
    FilterError,
    RolloutsScreen,
    build_filter,
    parse_range,
    rows_label,
)
from evotui.tui.widgets.page_table import PageTable
from evotui.tui.widgets.rollout_detail import RolloutDetail, render_rollout
from tests.engine_support import Served, populate
from tests.harness_data import Rollout, RunBuilder, call

SMALL = (80, 24)
LARGE = (160, 48)
DEAD = ["v0-train-1/train/1/1/0", "v0-train-1/train/1/1/1", "v0-train-1/train/2/0/0", "v0-train-1/train/2/0/1"]
ALL_SIX = [
    "v0-train-1/train/1/0/0",
    "v0-train-1/train/1/0/1",
    "v0-train-1/train/1/1/0",
    "v0-train-1/train/1/1/1",
    "v0-train-1/train/2/0/0",
    "v0-train-1/train/2/0/1",
]


# -- workspaces and engines ----------------------------------------------------------------------
def serve(ws: Workspace) -> Iterator[Served]:
    served = Served(ws.root).start()
    yield served
    served.stop()


@pytest.fixture
def served(tiny_workspace: Workspace) -> Iterator[Served]:
    """`populate`'s v0: 6 rollouts in two steps (4 of them in dead groups, 1 truncated)."""
    populate(tiny_workspace)
    yield from serve(tiny_workspace)


@pytest.fixture
def served_many(tiny_workspace: Workspace) -> Iterator[Served]:
    """v0 with 130 rollouts: 13 steps of 5 groups of 2 (three pages of 50, 50 and 30)."""
    with Engine.open(tiny_workspace.root) as engine:
        sha = engine.tree.create_base("v0")
        engine.store.add_version("v0", None, "versions/v0", sha, state="promoted")
        builder = RunBuilder(engine.store, run_id="v0-train-1", version="v0")
        for step in range(1, 14):
            builder.step(step, [[Rollout(float(g % 2)), Rollout(0.5)] for g in range(5)])
        builder.save(13)
    yield from serve(tiny_workspace)


@pytest.fixture
def served_child(tiny_workspace: Workspace) -> Iterator[Served]:
    """`populate`'s v0 and a child v1 whose only change is the learning rate (4e-05)."""
    populate(tiny_workspace)
    with Engine.open(tiny_workspace.root) as engine:
        iv = Intervention(kind="optimizer", changes={"recipe.learning_rate": 4e-5}, hypothesis="a bigger step")
        text, _ = apply(iv, engine.config_text("v0"), Path(CONFIG_FILE))
        engine.create_version(
            VersionPlan(
                "v0", "v1", {CONFIG_FILE: text}, iv.kind, iv.factor, {}, iv.hypothesis, "c", "r", 1, iv.template
            )
        )
    yield from serve(tiny_workspace)


@pytest.fixture
def served_flips(tiny_workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """v0 and a better v1, both evaluated (scripted runs: tests/scripted_runs.py)."""
    from typer.testing import CliRunner

    from evotui.cli import app
    from tests.scripted_runs import ScriptedRunner

    monkeypatch.setattr("engine.core.make_runner", lambda compute: ScriptedRunner({"v0": 0.3, "v1": 0.5}.__getitem__))
    result = CliRunner().invoke(app, ["run", str(tiny_workspace.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    yield from serve(tiny_workspace)


@pytest.fixture
def served_memory(tiny_workspace: Workspace) -> Iterator[Served]:
    """`populate`'s v0 and one skill card with one validation (the memory has a row in two tabs)."""
    populate(tiny_workspace)
    card = SkillCard(
        id="continuous-correctness",
        title="Partial credit revives dead groups",
        trigger=["insufficient_signal"],
        intervention={"kind": "reward", "template": "continuous_correctness", "changes": {}},
        expected_outcome="fewer groups with no reward spread",
        validation=[
            {
                "version": "v3",
                "parent": "v2",
                "verdict": "better",
                "delta_greedy": 0.125,
                "delta_sampled": None,
                "domain": "math",
                "date": "2025-06-01",
            }
        ],
        domains=["math"],
        body="Give partial credit so that a group of wrong answers still ranks its samples.",
    )
    SkillLibrary(tiny_workspace.root).write(card)
    yield from serve(tiny_workspace)


# -- driving the app -----------------------------------------------------------------------------
async def connected(pilot: Pilot[None], timeout: float = 20.0) -> None:
    """Wait until the app talks to the engine and the workbench has picked its version (the version
    the screens open with), so that what a screen shows does not depend on timing."""
    app = pilot.app
    assert isinstance(app, EvoApp)
    deadline = time.monotonic() + timeout
    while app.client is None or app.workbench.selected is None:
        assert time.monotonic() < deadline, "the app did not connect to the engine"
        await pilot.pause(0.05)


async def settle(pilot: Pilot[None], timeout: float = 20.0) -> None:
    """Wait until the current screen's workers are done and their messages handled (a finished page
    starts the detail's worker, so quiet must last a few rounds). The app's engine worker never ends,
    so `app.workers.wait_for_complete()` would wait forever."""
    deadline = time.monotonic() + timeout
    await pilot.pause(DETAIL_DELAY_SECONDS + 0.05)  # a detail loads once the cursor has rested
    quiet = 0
    while quiet < 3:
        assert time.monotonic() < deadline, "the screen's workers did not finish"
        busy: list[object] = [
            w
            for w in pilot.app.workers
            if w.node is pilot.app.screen and w.state in (WorkerState.PENDING, WorkerState.RUNNING)
        ]
        # A DataTable updates its scrollable size on its own idle event; `pilot.pause()` judges
        # idleness by CPU time, which a loaded machine (the engine thread runs in this process) can
        # fool, and a snapshot taken in between would show stale scrollbars.
        busy += [t for t in pilot.app.screen.query(DataTable) if t._require_update_dimensions or t._updated_cells]
        quiet = 0 if busy else quiet + 1
        await pilot.pause(0.02 if busy else None)


def drive(root: Path, script: Callable[[Pilot[None]], Awaitable[None]], size: tuple[int, int] = SMALL) -> None:
    async def main() -> None:
        app = EvoApp(root, start_engine=False)
        async with app.run_test(size=size) as pilot:
            await connected(pilot)
            await script(pilot)

    asyncio.run(main())


def table_ids(pilot: Pilot[None], selector: str = "#rollout-table") -> list[str]:
    table = pilot.app.screen.query_one(selector)
    if isinstance(table, PageTable):
        return list(table.keys)
    assert isinstance(table, DataTable)
    return [str(key.value) for key in table.rows]


def status(pilot: Pilot[None], selector: str = "#rollout-status") -> str:
    return str(pilot.app.screen.query_one(selector, Static).render())


def text_of(renderable: Any, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


# -- pure helpers of the filter bar --------------------------------------------------------------
def test_ranges_read_min_max_at_least_at_most_and_name_the_field_when_wrong() -> None:
    assert parse_range("2-10", "step range", "f-step", whole=True) == (2, 10)
    assert parse_range("2-", "step range", "f-step", whole=True) == (2, None)
    assert parse_range("-10", "step range", "f-step", whole=True) == (None, 10)
    assert parse_range(" 5 ", "step range", "f-step", whole=True) == (5, 5)
    assert parse_range("-1..0.5", "reward range", "f-reward", whole=False) == (-1.0, 0.5)
    assert parse_range("", "reward range", "f-reward", whole=False) == (None, None)
    with pytest.raises(FilterError, match="step range 'a-b': write min-max"):
        parse_range("a-b", "step range", "f-step", whole=True)
    with pytest.raises(FilterError, match="whole numbers"):
        parse_range("1.5-2", "step range", "f-step", whole=True)
    with pytest.raises(FilterError, match="minimum is above the maximum") as wrong:
        parse_range("3-1", "reward range", "f-reward", whole=False)
    assert wrong.value.field_id == "f-reward"


def test_the_filter_bar_sends_only_the_fields_that_are_set() -> None:
    assert build_filter("", "", "", "", "any", "any", "any", "any") == {}
    with pytest.raises(FilterError, match="'x1': write a version name like v3") as wrong:
        build_filter("x1", "", "", "", "any", "any", "any", "any")
    assert wrong.value.field_id == "f-version"
    assert build_filter(" v2 ", "3-", "-0.5", "x", "val", "dead", "no", "yes") == {
        "version": "v2",
        "step_min": 3,
        "reward_max": 0.5,
        "search": "x",
        "split": "val",
        "group": "dead",
        "truncated": False,
        "used_history": True,
    }
    # Every split the filter offers is one the engine's protocol accepts (clean: a leaky val played clean).
    for split in ("train", "val", "clean", "test"):
        assert RolloutFilter.model_validate(build_filter("", "", "", "", split, "any", "any", "any")).split == split
    assert rows_label(50, 50, 1234) == "rows 51-100 of 1,234"
    assert rows_label(0, 0, 0) == "no rows of 0"


def test_the_detail_shows_every_turn_and_tool_call_with_ok_failed_and_files() -> None:
    rollout = {
        "id": "r/train/1/0/1",
        "prompt": "what is [b]2+2[/b]?",  # model text with brackets must not be read as markup
        "completion": "4",
        "reward": 1.0,
        "components": {"correctness": 1.0, "format": 0.5},
        "truncated": True,
        "completion_length": 3,
        "num_turns": 2,
        "turns": [{"role": "assistant", "content": "look"}, {"role": "tool", "content": "found"}],
        "calls": [call("read_history", 1, files=["notes.md"]), call("run", 2, ok=False)],
        "sample_idx": 1,
        "group": [
            {"sample_idx": 0, "reward": 0.0, "completion": "5"},
            {"sample_idx": 1, "reward": 1.0, "completion": "4"},
        ],
    }
    text = text_of(render_rollout(rollout))
    assert "what is [b]2+2[/b]?" in text and "truncated" in text
    assert "correctness  1.000" in text and "format       0.500" in text
    assert "assistant: look" in text and "tool: found" in text
    assert "tool calls (2, 1 failed)" in text
    assert "read_history ok     files: notes.md" in text and "run          FAILED files: -" in text
    assert "▸ 1  1.000  4" in text and "  0  0.000  5" in text


# -- the rollout browser -------------------------------------------------------------------------
def test_the_first_page_shows_every_rollout_and_the_total(served: Served) -> None:
    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("o")
        await settle(pilot)
        assert isinstance(pilot.app.screen, RolloutsScreen)
        assert table_ids(pilot) == ALL_SIX
        assert status(pilot).startswith("rows 1-6 of 6")
        # The table has the keys and the first row's detail is on screen.
        assert pilot.app.screen.focused is pilot.app.screen.query_one("#rollout-table")
        assert pilot.app.screen.query_one(RolloutDetail).rollout["id"] == ALL_SIX[0]

    drive(served.root, script)


def test_filters_run_in_the_engine_dead_groups_truncated_and_search(served: Served) -> None:
    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("o")
        await settle(pilot)
        screen = pilot.app.screen
        # group = dead: a Select applies as soon as it changes.
        screen.query_one("#f-group", Select).value = "dead"
        await settle(pilot)
        assert table_ids(pilot) == DEAD and status(pilot).startswith("rows 1-4 of 4")
        screen.query_one("#f-group", Select).value = "any"
        await settle(pilot)
        assert len(table_ids(pilot)) == 6

        # truncated = yes with the keyboard only: focus the select, open it, move down, choose.
        screen.query_one("#f-truncated", Select).focus()
        await pilot.press("enter", "down", "enter")
        await settle(pilot)
        assert screen.query_one("#f-truncated", Select).value == "yes"
        assert table_ids(pilot) == ["v0-train-1/train/2/0/0"] and "of 1" in status(pilot)
        screen.query_one("#f-truncated", Select).value = "any"
        await settle(pilot)

        # Search text: `/` focuses it, enter applies.
        await pilot.press("slash", *"c1-1", "enter")
        await settle(pilot)
        assert table_ids(pilot) == ["v0-train-1/train/1/1/0", "v0-train-1/train/1/1/1"]

        # A step range typed without enter is applied by `f` (from the table).
        screen.query_one("#f-search", Input).value = ""
        screen.query_one("#f-step", Input).value = "2-2"
        screen.query_one("#rollout-table").focus()
        await pilot.press("f")
        await settle(pilot)
        assert table_ids(pilot) == ["v0-train-1/train/2/0/0", "v0-train-1/train/2/0/1"]

        # A range that cannot be read is refused where it was typed; the page stays as it was.
        screen.query_one("#f-reward", Input).value = "high"
        await pilot.press("f")
        await settle(pilot)
        assert screen.query_one("#f-reward", Input).has_class("-invalid")
        assert any("reward range 'high'" in n.message for n in pilot.app._notifications)
        assert len(table_ids(pilot)) == 2

    drive(served.root, script)


def test_moving_to_a_row_shows_that_rollout_whole(served: Served) -> None:
    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("o")
        await settle(pilot)
        await pilot.press("down")
        await settle(pilot)
        detail = pilot.app.screen.query_one(RolloutDetail)
        assert detail.rollout is not None and detail.rollout["id"] == "v0-train-1/train/1/0/1"
        assert detail.rollout["components"] == {"correctness": 1.0}
        text = text_of(detail.content)
        assert "correctness  1.000" in text and "c1-0-1" in text and "group (2 samples)" in text
        # enter puts the keys on the detail (to scroll it); z zooms it to the whole screen.
        await pilot.press("enter")
        assert pilot.app.screen.focused is pilot.app.screen.query_one("#rollout-detail-box")
        await pilot.press("z")
        assert pilot.app.screen.maximized is pilot.app.screen.query_one("#rollout-detail-box")
        await pilot.press("escape")
        assert pilot.app.screen.maximized is None and isinstance(pilot.app.screen, RolloutsScreen)
        await pilot.press("escape")
        assert not isinstance(pilot.app.screen, RolloutsScreen)

    drive(served.root, script)


def test_paging_asks_the_engine_for_one_page_at_a_time(served_many: Served) -> None:
    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("o")
        await settle(pilot)
        assert status(pilot).startswith("rows 1-50 of 130") and len(table_ids(pilot)) == PAGE_SIZE
        await pilot.press("n")
        await settle(pilot)
        assert status(pilot).startswith("rows 51-100 of 130")
        ids = table_ids(pilot)
        assert len(ids) == 50 and ids[0] == "v0-train-1/train/6/0/0" and ids[-1] == "v0-train-1/train/10/4/1"
        assert pilot.app.screen.query_one(RolloutDetail).rollout["id"] == ids[0]
        # pagedown works from the table too (it would otherwise only move the table's cursor).
        await pilot.press("pagedown")
        await settle(pilot)
        assert status(pilot).startswith("rows 101-130 of 130") and len(table_ids(pilot)) == 30
        await pilot.press("n")  # the last page: nothing to fetch
        await settle(pilot)
        assert status(pilot).startswith("rows 101-130 of 130")
        await pilot.press("p")
        await settle(pilot)
        assert status(pilot).startswith("rows 51-100 of 130")
        await pilot.press("pageup")
        await settle(pilot)
        assert status(pilot).startswith("rows 1-50 of 130") and table_ids(pilot)[0] == "v0-train-1/train/1/0/0"

    drive(served_many.root, script)


def test_the_focused_filter_is_visible_and_a_lost_engine_is_said_on_screen(served: Served) -> None:
    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("o")
        await settle(pilot)
        screen = pilot.app.screen
        search, step = screen.query_one("#f-search", Input), screen.query_one("#f-step", Input)
        await pilot.press("slash")
        assert screen.focused is search
        assert search.styles.background != step.styles.background
        # A failed page load is a notice and a status line, not a silent worker error (worker
        # state changes do not bubble from a screen to the app).
        served.stop()
        app = pilot.app
        assert isinstance(app, EvoApp)
        deadline = time.monotonic() + 20
        while app.client is not None:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        screen.query_one("#rollout-table").focus()
        await pilot.press("r")
        await settle(pilot)
        assert status(pilot) == "could not load rows 1-6 of 6; r retries"
        assert any(n.title == "load_page failed" for n in pilot.app._notifications)

    drive(served.root, script)


# -- memory and diff -----------------------------------------------------------------------------
def test_the_memory_screen_shows_the_cards_the_ledger_and_switches_tabs_with_digits(served_memory: Served) -> None:
    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("m")
        await settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, MemoryScreen)
        tabs = screen.query_one(TabbedContent)
        assert tabs.active == "skills"
        skills = screen.query_one("#skills-table", DataTable)
        assert [str(c) for c in skills.get_row_at(0)] == [
            "continuous-correctness",
            "insufficient_signal",
            "continuous_correctness",
            "math",
            "1",
        ]
        card = text_of(screen.query_one("#skill-card", Static).content)
        assert "Partial credit revives dead groups" in card and "a group of wrong answers" in card
        assert "v3 from v2: better" in card and "delta_greedy 0.125" in card
        await pilot.press("3")
        assert tabs.active == "ledger" and screen.focused is screen.query_one("#ledger-table")
        ledger = screen.query_one("#ledger-table", DataTable)
        assert ledger.row_count == 1
        assert [str(c) for c in ledger.get_row_at(0)] == ["v0", "-", "-", "-", "promoted", "-", "-"]
        await pilot.press("4")
        assert tabs.active == "retrievals"
        await pilot.press("r")
        await settle(pilot)
        assert status(pilot, "#memory-status") == "1 skills · 0 cases · 1 versions · 0 retrievals"

    drive(served_memory.root, script)


def test_the_flips_screen_shows_each_flipped_task_with_both_answers(served_flips: Served) -> None:
    with Engine.open(served_flips.root) as engine:  # the flips, recomputed here from the rollouts
        runs = {v: engine.eval_run(v) for v in ("v0", "v1")}
        rows = engine.store.query(
            "SELECT o.run_id, o.task_id, avg(o.reward_components['correctness']) FROM rollouts o"
            " WHERE o.run_id IN (?, ?) AND o.split = 'val' AND o.decoding = 'sampled' GROUP BY ALL",
            [runs["v0"].id, runs["v1"].id],  # type: ignore[union-attr]
        )
    solved = {(run, task): mean >= 0.5 for run, task, mean in rows}
    tasks = {task for _, task, _ in rows}
    before = {t: solved[(runs["v0"].id, t)] for t in tasks}  # type: ignore[union-attr]
    after = {t: solved[(runs["v1"].id, t)] for t in tasks}  # type: ignore[union-attr]
    to_right = sorted(t for t in tasks if after[t] and not before[t])
    to_wrong = sorted(t for t in tasks if before[t] and not after[t])
    assert to_right and to_wrong  # a scripted 0.3 -> 0.5 flips tasks both ways

    async def script(pilot: Pilot[None]) -> None:
        assert isinstance(pilot.app, EvoApp)
        pilot.app.workbench.selected = "v1"
        await pilot.press("F")
        await settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, FlipsScreen) and screen.reply is not None
        assert (screen.reply["to_right"], screen.reply["to_wrong"]) == (len(to_right), len(to_wrong))
        assert screen.reply["tasks"] == len(tasks)
        table = screen.query_one("#flips-table", DataTable)
        shown = [table.get_row_at(i) for i in range(table.row_count)]
        assert [r[1] for r in shown if r[0] == "→ right"] == to_right[: len([r for r in shown if r[0] == "→ right"])]
        assert {r[1] for r in shown} <= set(to_right) | set(to_wrong)
        assert all(r[3] and r[4] for r in shown)  # both versions' answers, side by side
        assert status(pilot, "#flips-status") == flips_summary("v1", screen.reply)

    drive(served_flips.root, script)


def test_the_diff_screen_shows_what_the_child_changed(served_child: Served) -> None:
    async def script(pilot: Pilot[None]) -> None:
        assert isinstance(pilot.app, EvoApp) and pilot.app.workbench.selected == "v1"
        await pilot.press("D")
        await settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, DiffScreen)
        assert screen.pair == ("v0", "v1")
        assert "+learning_rate = 4e-05" in screen.diff_text.splitlines()
        assert "-learning_rate = 2e-5" in screen.diff_text.splitlines()
        assert status(pilot, "#diff-status") == diff_summary("v0", "v1", screen.diff_text)
        assert "v0 → v1: " in status(pilot, "#diff-status")
        await pilot.press("s")
        await settle(pilot)
        assert screen.pair == ("v1", "v0") and "-learning_rate = 4e-05" in screen.diff_text.splitlines()
        assert screen.query_one("#diff-a", Select).value == "v1"

    drive(served_child.root, script)


# -- snapshots -----------------------------------------------------------------------------------
def opened(key: str, *then: str) -> Callable[[Pilot[None]], Awaitable[None]]:
    """A `run_before` that connects, opens a screen and hides what changes from run to run (the
    engine's pid in the sub-title and the "connected" notice)."""

    async def run_before(pilot: Pilot[None]) -> None:
        await connected(pilot)
        await pilot.press(key)
        await settle(pilot)
        if then:
            await pilot.press(*then)
            await settle(pilot)
        pilot.app.sub_title = "sample-math"
        pilot.app.clear_notifications()
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_snapshot_rollouts(served: Served, snap_compare: Any, size: tuple[int, int]) -> None:
    app = EvoApp(served.root, start_engine=False)
    assert snap_compare(app, terminal_size=size, run_before=opened("o", "down"))


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_snapshot_memory(served_memory: Served, snap_compare: Any, size: tuple[int, int]) -> None:
    app = EvoApp(served_memory.root, start_engine=False)
    assert snap_compare(app, terminal_size=size, run_before=opened("m"))


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_snapshot_diff(served_child: Served, snap_compare: Any, size: tuple[int, int]) -> None:
    app = EvoApp(served_child.root, start_engine=False)
    assert snap_compare(app, terminal_size=size, run_before=opened("D"))
