from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import CONFIG_FILE, WorkspaceConfigError, load_config, parse_config


def _errors(text: str) -> list[str]:
    with pytest.raises(WorkspaceConfigError) as info:
        parse_config(text, Path("ws/workspace.toml"))
    return info.value.problems


def test_sample_template_validates(sample_toml: str) -> None:
    config = parse_config(sample_toml, Path("sample/workspace.toml"))
    assert config.domain.name == "math"
    assert config.recipe.batch_size == config.recipe.prompts_per_step * config.recipe.num_generations


def test_unknown_field_names_file_line_and_field(sample_toml: str) -> None:
    text = sample_toml.replace("\nloss_type =", "\nlearning_rat = 0.1\nloss_type =", 1)
    line = text.splitlines().index("learning_rat = 0.1") + 1
    (problem,) = _errors(text)
    assert problem.startswith(f"ws/workspace.toml:{line}: field 'recipe.learning_rat'")
    assert "unknown field" in problem


def test_wrong_literal_lists_allowed_values(sample_toml: str) -> None:
    text = sample_toml.replace('loss_type = "dapo"', 'loss_type = "ppo"')
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("loss_type"))
    (problem,) = _errors(text)
    assert f"workspace.toml:{line}: field 'recipe.loss_type'" in problem
    for allowed in ("'grpo'", "'dapo'", "'dr_grpo'"):
        assert allowed in problem
    assert "'ppo'" in problem


def test_cross_field_rule_names_both_fields(sample_toml: str) -> None:
    text = sample_toml.replace("epsilon_high = 0.28", "epsilon_high = 0.1")
    (problem,) = _errors(text)
    assert "field 'recipe'" in problem and "epsilon_high (0.1) must be >= epsilon (0.2)" in problem


def test_unknown_reward_component_lists_the_domain_components(sample_toml: str) -> None:
    text = sample_toml.replace("format = 0.1", "format = 0.1\nbrevity = 0.5")
    (problem,) = _errors(text)
    assert "['brevity']" in problem and "allowed: correctness, format, closeness" in problem


def test_several_errors_are_all_reported(sample_toml: str) -> None:
    text = sample_toml.replace("num_generations = 8", "num_generations = 1").replace(
        "learning_rate = 2e-5", 'learning_rate = "fast"'
    )
    problems = _errors(text)
    assert len(problems) == 2
    assert any("recipe.num_generations" in p and "greater than or equal to 2" in p for p in problems)
    assert any("recipe.learning_rate" in p and "'fast'" in p for p in problems)


def test_local_policy_needs_a_model_directory(sample_toml: str, tmp_path: Path) -> None:
    text = sample_toml.replace('kind = "embedded"', f'kind = "local"\npath = "{tmp_path}"', 1)
    (problem,) = _errors(text)
    assert "field 'policy'" in problem and "no config.json" in problem


def test_invalid_toml_and_missing_table(tmp_path: Path) -> None:
    (problem,) = _errors("[workspace\nname = 1")
    assert problem.startswith("ws/workspace.toml: not valid TOML") and "line 1" in problem
    (problem,) = _errors("[domain]\nname = 'math'\n")
    assert "field 'workspace': required field is missing" in problem


def test_load_config_names_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceConfigError) as info:
        load_config(tmp_path)
    assert str(tmp_path / CONFIG_FILE) in str(info.value) and "evotui init" in str(info.value)


def test_a_guardrail_is_another_decoding_with_a_margin(sample_toml: str) -> None:
    config = parse_config(sample_toml, Path("sample/workspace.toml"))
    assert config.eval.primary == "sampled" and config.eval.guardrails == {"greedy": 0.05}
    (problem,) = _errors(sample_toml.replace("guardrails = { greedy = 0.05 }", "guardrails = { sampled = 0.05 }"))
    assert "guardrails.sampled: the primary decides" in problem
    (problem,) = _errors(sample_toml.replace("guardrails = { greedy = 0.05 }", "guardrails = { greedy = 5 }"))
    assert "guardrails.greedy = 5" in problem and "[0, 1)" in problem
    (problem,) = _errors(sample_toml.replace("guardrails = { greedy = 0.05 }", "guardrails = { beam = 0.05 }"))
    assert "beam" in problem
