"""`Engine.view`: what another thread of the engine process judges with is built from what it needs
(its own store connection, its own version tree), and has no way to launch or stop runs."""

from __future__ import annotations

import threading
from typing import Any

from engine.core import Engine, Judge
from engine.harness.diagnose import load_diagnosis
from engine.workspace import Workspace
from tests.scripted_runs import ScriptedRunner


def test_a_view_judges_through_its_own_connection_and_tree_and_holds_no_runner(tiny_workspace: Workspace) -> None:
    with Engine(tiny_workspace, runner=ScriptedRunner(lambda version: 0.5)) as engine:
        engine.ensure_base()
        found: dict[str, Any] = {}

        def request() -> None:  # as a request thread of the daemon does (`Service._view`)
            store = engine.store.cursor()
            try:
                view = engine.view(store)
                found["view"] = view
                found["primary"] = view.reader.version_config("v0").eval.primary
                found["run"] = view.reader.latest_run("v0").id
                found["diagnosis"] = view.diagnose_version("v0").run_id
            finally:
                store.close()

        thread = threading.Thread(target=request)
        thread.start()
        thread.join(120)
        view = found["view"]
        assert isinstance(view, Judge)
        assert view.store is not engine.store and view.reader.tree is not engine.tree
        assert not any(hasattr(view, name) for name in ("runner", "stop_requested", "follower"))
        assert found["primary"] == engine.version_config("v0").eval.primary
        assert found["run"] == found["diagnosis"] == engine.latest_run("v0").id
        assert load_diagnosis(engine.store, found["run"]) is not None  # stored through the view's connection
