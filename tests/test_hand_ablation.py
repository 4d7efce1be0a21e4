"""The hand-recipe ablation's factors (`benchmarks/hand_ablation.py`): one per field the hand
recipe changes, and each variant's recipe makes exactly its factors."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from engine.bench.arms import BenchSettings
from engine.workspace import init_workspace

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ablation() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hand_ablation", ROOT / "benchmarks" / "hand_ablation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("template", ["sample", "code", "swe"])
def test_each_factor_is_one_changed_field_and_variants_rebuild_it(
    ablation: ModuleType, tmp_path: Path, template: str
) -> None:
    config = init_workspace(tmp_path / template, template).load_config()
    recipe, hand = config.recipe.model_dump(), BenchSettings.from_config(config).hand_recipe
    factors = ablation.hand_factors(recipe, hand)
    assert factors, f"{template}: its hand recipe changes something"

    for key, value in factors.items():  # each factor differs from the workspace's own recipe
        own = recipe["rewards"].get(key.removeprefix("rewards."), 0.0) if key.startswith("rewards.") else recipe[key]
        assert own != value, key
    # A reward weight the hand recipe repeats unchanged is no factor.
    same = {k for k, v in hand.get("rewards", {}).items() if recipe["rewards"].get(k) == v}
    assert not same & {k.removeprefix("rewards.") for k in factors}

    # Every variant's recipe, read back, holds exactly its factors; all of them rebuild the hand recipe's.
    for key, value in factors.items():
        assert ablation.hand_factors(recipe, ablation.variant_recipe(recipe, {key: value})) == {key: value}
    assert ablation.hand_factors(recipe, ablation.variant_recipe(recipe, factors)) == factors
    assert ablation.hand_factors(recipe, ablation.variant_recipe(recipe, {})) == {}


def test_a_reward_the_hand_recipe_drops_is_a_change_to_zero(ablation: ModuleType) -> None:
    recipe = {"learning_rate": 5e-5, "rewards": {"correctness": 1.0, "format": 0.1}}
    hand = {"learning_rate": 5e-5, "rewards": {"correctness": 1.0, "pass_fraction": 0.5}}
    assert ablation.hand_factors(recipe, hand) == {"rewards.format": 0.0, "rewards.pass_fraction": 0.5}
    dropped = ablation.variant_recipe(recipe, {"rewards.format": 0.0})
    assert dropped == {"rewards": {"correctness": 1.0, "format": 0.0}}


def test_pooling_averages_each_task_over_the_seeds_that_all_scored_it(ablation: ModuleType) -> None:
    seeds = [{"a": 1.0, "b": 0.0, "c": 0.5}, {"a": 0.0, "b": 1.0}, {"a": 0.5, "b": 0.5, "d": 1.0}]
    pooled = ablation.pooled_per_task(seeds)
    assert set(pooled) == {"a", "b"}  # c and d were not scored on every seed
    assert pooled["a"] == pytest.approx(sum(s["a"] for s in seeds) / 3)
    assert pooled["b"] == pytest.approx(sum(s["b"] for s in seeds) / 3)


def test_the_paired_text_reads_the_difference_and_an_interval_around_it(ablation: ModuleType) -> None:
    parent = {f"t{i}": float(i % 2) for i in range(200)}
    better = {task: min(1.0, value + 0.5) for task, value in parent.items()}
    text = ablation.paired_text(parent, better)
    mean, low, high = (float(x) for x in text.replace("[", "").replace("]", "").replace(",", "").split())
    assert mean == pytest.approx(0.25) and low <= mean <= high and low > 0
    assert ablation.paired_text(parent, parent) == "+0.000 [+0.000, +0.000]"
