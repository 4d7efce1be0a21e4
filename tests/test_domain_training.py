"""Real GRPO steps on the code and SWE domains, through the engine: v0's warm-up, a child's run,
its rollouts (and for SWE every turn and tool call) stored; a leaky SWE val is also scored clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import CONFIG_FILE
from engine.core import Engine, VersionPlan
from engine.domains import reward_component_names
from engine.workspace import Workspace, init_workspace
from tests.conftest import commit_workspace_toml, tiny_toml

pytestmark = pytest.mark.slow

SWE_TOOLS = {"search", "read", "edit", "test", "submit", "git_log", "git_show", "invalid"}


def workspace(tmp_path: Path, template: str, **overrides: int | float) -> Workspace:
    ws = init_workspace(tmp_path / "ws", template)
    ws.config_path.write_text(tiny_toml(ws.config_path.read_text(), **overrides))
    commit_workspace_toml(ws, "tiny settings for tests")
    return ws


def child_with(engine: Engine, name: str, old: str, new: str) -> None:
    text = engine.config_text("v0")
    assert old in text
    changed = text.replace(old, new)
    engine.create_version(VersionPlan("v0", name, {CONFIG_FILE: changed}, "test", "domain", {}, "h", "c", "r"))


def test_code_domain_trains_with_sandboxed_unit_tests(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "code", train_size=100, val_size=12, grpo_steps=2)
    with Engine(ws) as engine:
        engine.ensure_base()
        child_with(engine, "v1", "prompts_per_step = 8", "prompts_per_step = 2")
        run = engine.train("v1")
        rows = engine.store.query(
            "SELECT count(*), count(DISTINCT step), min(map_keys(reward_components)), bool_or(truncated) IS NOT NULL "
            "FROM rollouts WHERE run_id = $run AND split = 'train'",
            {"run": run.id},
        )
        count, steps, components, _ = rows[0]
        assert count == 2 * 2 * 8 and steps == 2  # 2 steps x 2 prompts x 8 samples
        assert sorted(components) == ["correctness", "format", "pass_fraction"]
        # Scores: a pass needs a closed block (the format gate), and a pass means every test passed.
        bad = engine.store.query(
            "SELECT count(*) FROM rollouts WHERE run_id = $run AND ("
            "(reward_components['correctness'] = 1 AND reward_components['format'] = 0) OR "
            "(reward_components['correctness'] = 1 AND reward_components['pass_fraction'] < 1))",
            {"run": run.id},
        )
        assert bad[0][0] == 0
        val = engine.store.query("SELECT count(*) FROM rollouts WHERE run_id = $run AND split = 'val'", {"run": run.id})
        assert val[0][0] == 12 * 2  # greedy and one sampled pass


def test_swe_domain_trains_on_episodes_and_stores_every_turn(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "swe", train_size=60, val_size=8, grpo_steps=2, warmup_steps=10)
    with Engine(ws) as engine:
        engine.ensure_base()
        # The child turns the leak switch on: val leaks as configured, and is also played clean.
        child_with(engine, "v1", "leak_fix_in_history = false", "leak_fix_in_history = true")
        run = engine.train("v1")
        rows = engine.store.query(
            "SELECT split, num_turns, tool_calls, turns, completion_length, reward_components "
            "FROM rollouts WHERE run_id = $run ORDER BY split, step, group_id, sample_idx",
            {"run": run.id},
        )
        train = [r for r in rows if r[0] == "train"]
        val = [r for r in rows if r[0] == "val"]
        clean = [r for r in rows if r[0] == "clean"]
        assert len(train) == 2 * 4 * 8 and len(val) == len(clean) == 8 * 2  # 2 steps x 4 prompts x 8 samples
        v0 = engine.eval_run("v0")
        assert v0 is not None and engine.store.count_rollouts(v0.id, "clean") == 0  # v0 had no leak
        for _, num_turns, calls, turns, length, components in rows:
            assert num_turns == len(json.loads(turns)) >= 1 and length >= 1
            assert len(calls) <= num_turns and {c["tool"] for c in calls} <= SWE_TOOLS
            assert [c["turn"] for c in calls] == sorted(c["turn"] for c in calls)
            # Every component the config may weigh is scored and stored, whatever its weight.
            assert set(components) == set(reward_component_names("swe") or ())
            assert components["efficiency"] == pytest.approx(1 - 0.3 * num_turns / 10)
        # The harness reads these traces: its behavior layer has something to say about them.
        diagnosis = engine.diagnose_version("v1")
        assert any(f.metric.startswith("behavior.") for f in diagnosis.findings)
