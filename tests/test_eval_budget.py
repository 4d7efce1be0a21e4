"""Evaluation's completion budget belongs to the evaluation protocol, not to the recipe: a recipe
that cuts its completions short trains (and samples its GRPO-shaped baseline) under that cut, while
every version is evaluated with the same room, so a verdict compares policies, not budgets."""

from __future__ import annotations

import re

from engine.config import load_config
from engine.core import Engine
from engine.domains import make_domain
from engine.policy.tiny import build_tiny_policy
from engine.runs.evaluate import EVAL_MAX_NEW_TOKENS, completion_room
from engine.workspace import Workspace
from tests.conftest import commit_workspace_toml


def test_the_room_is_the_context_left_after_the_longest_prompt(tiny_workspace: Workspace) -> None:
    config = load_config(tiny_workspace.root)
    domain = make_domain(config.domain, tiny_workspace.root)
    model, tokenizer = build_tiny_policy(config.policy.embedded, domain, seed=0)
    prompts = [t.prompt for t in domain.tasks("val")]
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
    assert completion_room(model, tokenizer, prompts) == config.policy.embedded.max_positions - longest
    model.config.max_position_embeddings = 10 * EVAL_MAX_NEW_TOKENS
    assert completion_room(model, tokenizer, prompts) == EVAL_MAX_NEW_TOKENS


def test_a_short_recipe_budget_cuts_training_rollouts_and_not_evaluation(tiny_workspace: Workspace) -> None:
    budget = 8  # fewer tokens than most chains need (`2+3=5;5*4=20;A:20` and its EOS)
    path = tiny_workspace.config_path
    text = re.sub(r"^max_completion_length = \d+", f"max_completion_length = {budget}", path.read_text(), flags=re.M)
    path.write_text(text)
    commit_workspace_toml(tiny_workspace, "a recipe that cuts completions short")
    with Engine(tiny_workspace) as engine:
        engine.ensure_base()
        run = engine.eval_run("v0")
        assert run is not None
        rows = {
            split: engine.store.query_one(
                "SELECT max(completion_length), avg(truncated::INT) FROM rollouts WHERE run_id = ? AND split = ?",
                [run.id, split],
            )
            for split in ("train", "val")
        }
    train, val = rows["train"], rows["val"]
    assert train is not None and val is not None
    # The baseline groups are sampled as GRPO would sample them: under the recipe's cut ...
    assert train[0] <= budget and train[1] > 0.5
    # ... while val gives the same policy the whole room, and its chains finish.
    assert val[0] > budget and val[1] < train[1]
