"""Snapshots of the workbench screens at 80x24 (over SSH) and 160x48, on a fixed workspace.

Update after an intended change with `pytest tests/test_tui_snapshots.py --snapshot-update`,
then look at the SVGs under `tests/__snapshots__/`."""

from __future__ import annotations

import pytest

from evotui.tui.app import EvoApp
from evotui.tui.widgets.curves import Curves
from tests.engine_support import Served, until


def settled(app: EvoApp, *keys: str):  # type: ignore[no-untyped-def]
    """Wait for the data, select v0 (it has curves), press `keys`, hide what differs per run."""

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await until(pilot, lambda: app.client is not None and app.workbench.versions != [])
        await until(pilot, lambda: len(app.workbench.query_one("#gates").pending) == 3)
        app.workbench.selected = "v0"
        app.workbench.load_version("v0")
        await until(pilot, lambda: len(app.workbench.query_one(Curves).series.get("reward", [])) == 2)
        app.clear_notifications()  # "connected to the engine (pid N)" differs from run to run
        app.sub_title = "tiny-math · engine"
        await pilot.pause(0.2)
        await pilot.press(*keys)
        await pilot.pause(0.3)

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_workbench(versions_served: Served, snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    app = EvoApp(versions_served.root, start_engine=False)
    assert snap_compare(app, terminal_size=size, run_before=settled(app))


def test_workbench_confirming_an_approval(versions_served: Served, snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = EvoApp(versions_served.root, start_engine=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settled(app, "a"))


def test_help(versions_served: Served, snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = EvoApp(versions_served.root, start_engine=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settled(app, "question_mark"))
