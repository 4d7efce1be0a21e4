"""The workbench driven with Pilot against a real engine: the tree, live curves, gates answered
from the keyboard, and reconnecting after an engine restart."""

from __future__ import annotations

import asyncio

import pytest

from evotui.tui.app import EvoApp
from evotui.tui.widgets.curves import Curves, downsample
from tests.engine_support import Served, until


def gate_states(versions_served: Served) -> dict[str, tuple[str, str | None]]:
    with versions_served.client() as c:
        return {g["id"]: (g["state"], g["feedback"]) for g in c.call("gates")}


def test_tree_navigation_shows_the_selected_version(versions_served: Served) -> None:
    async def scenario() -> None:
        app = EvoApp(versions_served.root, start_engine=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.workbench.selected == "v2" and app.workbench.versions != [])
            info = app.workbench.query_one("#version-info")
            await until(pilot, lambda: "1e-05" in str(info.render()))
            app.workbench.query_one("#tree").focus()
            await pilot.press("up")
            await until(pilot, lambda: app.workbench.selected == "v1")
            await until(pilot, lambda: "4e-05" in str(info.render()))
            await pilot.press("up")
            await until(pilot, lambda: app.workbench.selected == "v0")
            # v0 has a train run: its curve is loaded from the engine.
            await until(pilot, lambda: app.workbench.query_one(Curves).series.get("reward") == [(1, 0.75), (2, 0.0)])

    asyncio.run(scenario())


def test_the_curve_updates_when_a_metrics_event_arrives(versions_served: Served) -> None:
    async def scenario() -> None:
        app = EvoApp(versions_served.root, start_engine=False)
        async with app.run_test(size=(80, 24)) as pilot:
            app.workbench.selected = "v0"
            await until(pilot, lambda: app.client is not None)
            app.workbench.load_version("v0")
            curves = app.workbench.query_one(Curves)
            await until(pilot, lambda: curves.run_id == "v0-train-1" and len(curves.series.get("reward", [])) == 2)
            store = versions_served.server.service.engine.store.cursor()
            store.upsert_metrics("v0-train-1", [(3, "reward", 0.5), (4, "reward", 0.625)])
            versions_served.server.publish(
                "run",
                {
                    "run_id": "v0-train-1",
                    "version": "v0",
                    "kind": "train",
                    "state": "running",
                    "step": 4,
                    "total_steps": 10,
                    "metrics": {},
                    "error": None,
                },
            )
            await until(pilot, lambda: curves.series["reward"][-2:] == [(3, 0.5), (4, 0.625)])
            await until(pilot, lambda: "step 4/10" in str(app.workbench.query_one("#activity").render()))

    asyncio.run(scenario())


def test_gates_are_approved_revised_and_aborted_from_the_keyboard(versions_served: Served) -> None:
    async def scenario() -> None:
        app = EvoApp(versions_served.root, start_engine=False)
        async with app.run_test(size=(80, 24)) as pilot:
            gates = app.workbench.query_one("#gates")
            await until(pilot, lambda: [g["id"] for g in gates.pending] == ["g1", "g2", "g3"])
            await pilot.press("a")  # approve g1 ...
            await pilot.press("n")  # ... no: nothing is sent
            await pilot.pause(0.2)
            assert gate_states(versions_served)["g1"] == ("pending", None)
            await pilot.press("a", "y")
            await until(pilot, lambda: gate_states(versions_served)["g1"] == ("approved", None))
            await until(pilot, lambda: [g["id"] for g in gates.pending] == ["g2", "g3"])
            await pilot.press("e")
            await pilot.press(*"more seeds", "enter")
            await pilot.press("y")
            await until(pilot, lambda: gate_states(versions_served)["g2"] == ("revised", "more seeds"))
            await until(pilot, lambda: [g["id"] for g in gates.pending] == ["g3"])
            await pilot.press("x", "y")
            await until(pilot, lambda: gate_states(versions_served)["g3"] == ("aborted", None))

    asyncio.run(scenario())


def test_the_app_reconnects_after_an_engine_restart_and_says_so(versions_served: Served) -> None:
    async def scenario() -> None:
        app = EvoApp(versions_served.root, start_engine=False, reconnect_delay=0.1)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.client is not None)
            first_pid = app.hello["pid"]
            await asyncio.to_thread(versions_served.stop)
            await until(pilot, lambda: app.client is None)
            await until(pilot, lambda: "reconnecting" in app.sub_title)  # the notice is a message: handled next
            again = await asyncio.to_thread(lambda: Served(versions_served.root).start())
            try:
                await until(pilot, lambda: app.client is not None)
                assert app.hello["pid"] == first_pid  # same process here; a new engine object
                assert "engine pid" in app.sub_title
                notices = [n.message for n in app._notifications]
                assert any("reconnected to the engine" in m for m in notices)
            finally:
                await asyncio.to_thread(again.stop)

    asyncio.run(scenario())


def test_downsampling_keeps_the_width_and_the_mean() -> None:
    points = [(s, float(s % 4)) for s in range(1, 1001)]
    thin = downsample(points, 100)
    assert len(thin) == 100
    assert sum(v for _, v in thin) / 100 == pytest.approx(sum(v for _, v in points) / 1000)
    assert downsample(points[:50], 100) == [(float(s), v) for s, v in points[:50]]


def test_the_workbench_follows_the_run_in_progress_until_a_version_is_picked(versions_served: Served) -> None:
    def progress(run_id: str, version: str, step: int) -> None:
        versions_served.server.publish(
            "run",
            {
                "run_id": run_id,
                "version": version,
                "kind": "train",
                "state": "running",
                "step": step,
                "total_steps": 10,
                "metrics": {},
                "error": None,
            },
        )

    async def scenario() -> None:
        app = EvoApp(versions_served.root, start_engine=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.workbench.selected == "v2")
            progress("v0-train-1", "v0", 3)  # a run of v0 moves: the workbench goes to it
            curves = app.workbench.query_one(Curves)
            await until(pilot, lambda: app.workbench.selected == "v0" and curves.run_id == "v0-train-1")
            app.workbench.query_one("#tree").focus()
            await pilot.press("down")  # a person picks v1 ...
            await until(pilot, lambda: app.workbench.selected == "v1")
            progress("v0-train-1", "v0", 4)  # ... and stays there while v0's run goes on
            await pilot.pause(0.5)
            assert app.workbench.selected == "v1" and not app.workbench.following

    asyncio.run(scenario())
