from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from engine.core import Engine
from engine.store import Store
from engine.versions import ACTOR
from engine.workspace import Workspace, init_workspace, template_dir
from tests.engine_support import Served, add_children, populate

#: The files that take longest, longest first (each file's test times summed, from a CI run). Collected
#: first, so that each of `.ci/run`'s workers starts on one and the short files fill in around
#: them; last, one of them would set the wall alone.
LONG_FILES = (
    "test_end_to_end.py",  # 214 s on one worker (2026-12-07), the shipped sample's v0 build 192 of them
    "test_ray_runner.py",  # 106
    "test_form_shift_loop.py",  # 105
    "test_forkserver.py",  # 65
    "test_survive.py",  # 58
    "test_schedule.py",  # 52
    "test_splits.py",  # 46
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: the rest keep their order


def tiny_toml(text: str, **overrides: int | float) -> str:
    """The sample workspace.toml shrunk so a whole version trains in seconds."""
    values: dict[str, int | float] = {
        "train_size": 200,
        "val_size": 24,
        "test_size": 24,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 2,
        "intermediate_size": 64,
        "warmup_steps": 300,  # enough for the tiny policy to write some chains: its GRPO groups have spread
        "batch_size": 32,
        "grpo_steps": 3,
        "sampled_seeds": 1,
        "prompts_per_step": 8,  # the math sample's: 8 x 8 completions a step are enough for a tiny test version
        "demo_shortcut_rate": 0.0,
    }
    values.update(overrides)
    replacements = {
        r"^train_size = \d+": f"train_size = {values['train_size']}",
        r"^val_size = \d+": f"val_size = {values['val_size']}",
        r"^test_size = \d+": f"test_size = {values['test_size']}",
        r"^hidden_size = \d+": f"hidden_size = {values['hidden_size']}",
        r"^num_layers = \d+": f"num_layers = {values['num_layers']}",
        r"^num_heads = \d+": f"num_heads = {values['num_heads']}",
        r"^intermediate_size = \d+": f"intermediate_size = {values['intermediate_size']}",
        r"^batch_size = \d+": f"batch_size = {values['batch_size']}",
        r"^sampled_seeds = \d+": f"sampled_seeds = {values['sampled_seeds']}",
    }
    for pattern, new in replacements.items():
        text, n = re.subn(pattern, new, text, count=1, flags=re.M)
        assert n == 1, pattern
    # The math sample (the one template with demo_shortcut_rate): chains only, so the tests' v0
    # writes chains, and 8 prompts a step. Other templates keep their own prompts_per_step.
    rate = f"demo_shortcut_rate = {values['demo_shortcut_rate']}   # chains only: the tests' v0 writes chains"
    text, math = re.subn(r"^demo_shortcut_rate = .*$", rate, text, count=1, flags=re.M)
    if math:
        text = re.sub(
            r"^prompts_per_step = \d+.*$", f"prompts_per_step = {values['prompts_per_step']}", text, count=1, flags=re.M
        )
    # Two `steps =` keys: the warm-up's comes first, the recipe's second.
    steps = iter([values["warmup_steps"], values["grpo_steps"]])
    text = re.sub(r"^steps = \d+", lambda _: f"steps = {next(steps)}", text, flags=re.M)
    return text


@pytest.fixture
def sample_toml() -> str:
    return (template_dir("sample") / "workspace.toml").read_text()


@pytest.fixture
def tiny_workspace(tmp_path: Path, sample_toml: str) -> Workspace:
    """A workspace from the sample template with the tiny settings committed (so v0 uses them)."""
    return workspace_with(tmp_path / "ws", tiny_toml(sample_toml), "tiny settings for tests")


@pytest.fixture(scope="session")
def built_tiny_v0(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The tiny workspace with v0 built (warm-up, baseline groups, val evaluation, diagnosis), once
    per test session: tests copy it (`tiny_workspace_v0`) and never change it."""
    text = tiny_toml((template_dir("sample") / "workspace.toml").read_text())
    ws = workspace_with(tmp_path_factory.mktemp("built-v0") / "ws", text, "tiny settings for tests")
    with Engine(ws) as engine:
        engine.ensure_base()
    return ws


@pytest.fixture
def tiny_workspace_v0(tmp_path: Path, built_tiny_v0: Workspace) -> Workspace:
    """`tiny_workspace` with v0 already built and promoted: for tests of what happens after v0
    (the v0 build itself is checked by test_end_to_end and test_runs)."""
    return copy_workspace(built_tiny_v0, tmp_path / "ws")


def copy_workspace(ws: Workspace, dest: Path) -> Workspace:
    """A copy of a workspace no engine holds open, its runs re-pointed at the copy's run directories."""
    shutil.copytree(ws.root, dest, symlinks=True)
    copy = Workspace(dest)
    with Store(copy.db_path) as store:
        for run in store.list_runs():
            store.update_run(run.id, run_dir=str(copy.runs_dir / Path(run.run_dir).name))
    return copy


def workspace_with(root: Path, text: str, message: str) -> Workspace:
    """A new workspace at `root` whose workspace.toml is `text`, committed (so v0 uses it)."""
    ws = init_workspace(root)
    ws.config_path.write_text(text)
    commit_workspace_toml(ws, message)
    return ws


def commit_workspace_toml(ws: Workspace, message: str) -> None:
    """Commit the working tree's workspace.toml, so that the next v0 is built from it."""
    repo = git.Repo(ws.root)
    repo.index.add(["workspace.toml"])
    repo.index.commit(message, author=ACTOR, committer=ACTOR)


@pytest.fixture
def versions_served(tiny_workspace: Workspace) -> Iterator[Served]:
    """An engine serving v0 (a small train run), v1 and v2 (one intervention each) and 3 pending gates."""
    populate(tiny_workspace)
    add_children(tiny_workspace.root)
    s = Served(tiny_workspace.root).start()
    yield s
    s.stop()


def until(condition: Callable[[], Any], seconds: float = 60.0) -> Any:
    """Wait for `condition` to hold (polling, never a fixed sleep); its value."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return value
