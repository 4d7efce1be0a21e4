"""`workspace.toml` refuses values a person could not mean, naming the file, the line and the field;
and each built-in domain's reward component names are defined once (its config section)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from engine import config as config_module
from engine.config import (
    CONFIG_FILE,
    DOMAIN_SECTIONS,
    CodeDomainConfig,
    MathDomainConfig,
    SweDomainConfig,
    WorkspaceConfig,
    WorkspaceConfigError,
    load_config,
    parse_config,
)
from engine.domains import reward_component_names, reward_functions
from engine.domains.code import CodeDomain
from engine.domains.math import MathDomain
from engine.domains.swe import SweDomain
from engine.workspace import Workspace, template_dir

PATH = Path("ws/workspace.toml")


def _set(text: str, table: str, key: str, value: str) -> tuple[str, int]:
    """`text` with `key = value` under `[table]` (replaced, or added below the header), and its line."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if re.match(rf"^\[{re.escape(table)}\]", line))
    end = next((i for i in range(header + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    at = next((i for i in range(header + 1, end) if re.match(rf"^{re.escape(key)}\s*=", lines[i])), None)
    if at is None:
        at = header + 1
        lines.insert(at, f"{key} = {value}")
    else:
        lines[at] = f"{key} = {value}"
    return "\n".join(lines) + "\n", at + 1


def _refusal(text: str) -> str:
    with pytest.raises(WorkspaceConfigError) as info:
        parse_config(text, PATH)
    (problem,) = info.value.problems
    return problem


@pytest.mark.parametrize(
    ("table", "key", "value", "says"),
    [
        # learning rates: (0, 1], finite (the recipe's keeps its tighter bound of 1e-2)
        ("policy.warmup", "learning_rate", "1e308", "less than or equal to 1"),
        ("policy.warmup", "learning_rate", "inf", "finite number"),
        ("recipe", "learning_rate", "inf", "finite number"),
        ("recipe", "learning_rate", "nan", "finite number"),
        # temperatures: (0, 10]
        ("recipe", "temperature", "1e308", "less than or equal to 10"),
        ("eval", "temperature", "1e308", "less than or equal to 10"),
        ("eval", "temperature", "nan", "finite number"),
        # the KL coefficient: [0, 10]
        ("recipe", "beta", "1e308", "less than or equal to 10"),
        ("recipe", "beta", "inf", "finite number"),
        # reward weights: [0, 100], finite
        ("recipe.rewards", "correctness", "1e308", "less than or equal to 100"),
        ("recipe.rewards", "correctness", "-1", "greater than or equal to 0"),
        ("recipe.rewards", "format", "nan", "finite number"),
        ("recipe.rewards", "format", "-inf", "finite number"),
        # any other float: TOML spells inf and nan, no field means them
        ("recipe.group_filter", "std_threshold", "inf", "finite number"),
        ("domain", "demo_shortcut_rate", "nan", "finite number"),
        # booleans are booleans: no "yes", no 1
        ("recipe.group_filter", "enabled", '"yes"', "valid boolean"),
        ("recipe.group_filter", "enabled", "1", "valid boolean"),
        ("gates", "after_design", "0", "valid boolean"),
        # integers are integers: no true, no "300"
        ("policy.warmup", "steps", "true", "valid integer"),
        ("recipe", "num_generations", '"8"', "valid integer"),
        # and numbers are numbers
        ("recipe", "learning_rate", '"2e-5"', "valid number"),
    ],
)
def test_a_value_no_one_means_is_refused_with_file_line_and_field(
    sample_toml: str, table: str, key: str, value: str, says: str
) -> None:
    text, line = _set(sample_toml, table, key, value)
    problem = _refusal(text)
    assert problem.startswith(f"{PATH}:{line}: field '{table}.{key}': "), problem
    assert says in problem, problem


def test_an_integer_is_still_a_float(sample_toml: str) -> None:
    text, _ = _set(sample_toml, "policy.warmup", "learning_rate", "1")
    config = parse_config(text, PATH)
    assert config.policy.warmup.learning_rate == 1.0 and isinstance(config.policy.warmup.learning_rate, float)


def test_every_boolean_field_refuses_a_string_and_an_int() -> None:
    """Whatever bool field a section gains later, lax coercion does not come back with it."""
    sections: set[type[BaseModel]] = {WorkspaceConfig}
    todo: list[type[BaseModel]] = [WorkspaceConfig, *DOMAIN_SECTIONS.values()]
    flags: list[tuple[type[BaseModel], str]] = []
    while todo:
        section = todo.pop()
        for name, field in section.model_fields.items():
            if field.annotation is bool:
                flags.append((section, name))
            for inner in _models(field.annotation):
                if inner not in sections:
                    sections.add(inner)
                    todo.append(inner)
    assert len(flags) >= 8  # gates (4), group_filter, collapse_guard, swe's leak switch, ...
    for section, name in flags:
        for wrong in ("yes", 1):
            with pytest.raises(ValidationError) as info:
                section.model_validate({name: wrong})
            assert any(e["loc"] == (name,) and e["type"] == "bool_type" for e in info.value.errors()), (section, name)


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models(arg)]


def test_all_weights_zero_is_refused(sample_toml: str) -> None:
    text, _ = _set(sample_toml, "recipe.rewards", "correctness", "0")
    text, _ = _set(text, "recipe.rewards", "format", "0")
    line = text.splitlines().index("[recipe.rewards]           # weight of each named reward component of the domain")
    problem = _refusal(text)
    assert problem.startswith(f"{PATH}:{line + 1}: field 'recipe.rewards': "), problem
    assert "weight > 0" in problem


def test_an_unknown_reward_component_names_the_recipe_line(sample_toml: str) -> None:
    text, _ = _set(sample_toml, "recipe.rewards", "brevity", "0.5")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("[recipe]"))
    problem = _refusal(text)
    assert problem.startswith(f"{PATH}:{line}: field 'recipe': recipe.rewards names unknown component(s) ['brevity']")


def test_the_default_rewards_are_checked_against_the_domain_too() -> None:
    """[recipe] left out: its default weights name `format`, which the swe domain does not have."""
    problem = _refusal('[workspace]\nname = "w"\n[domain]\nname = "swe"\n')
    assert "field 'recipe'" in problem and "['format']" in problem and "(got" not in problem


def _non_utf8(tmp_path: Path, sample_toml: str) -> tuple[Path, int, int]:
    """A workspace whose workspace.toml was saved as Latin-1 ("café" in its description); the
    line and byte offset of the first byte that is not UTF-8."""
    text, line = _set(sample_toml, "workspace", "description", '"café"')
    raw = text.encode("utf-8").replace("café".encode(), b"caf\xe9")
    (tmp_path / CONFIG_FILE).write_bytes(raw)
    return tmp_path / CONFIG_FILE, line, raw.index(b"\xe9")


def test_a_file_that_is_not_utf8_names_the_file_the_line_and_the_byte(tmp_path: Path, sample_toml: str) -> None:
    path, line, offset = _non_utf8(tmp_path, sample_toml)
    with pytest.raises(WorkspaceConfigError) as info:
        load_config(tmp_path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}:{line}: not UTF-8 text (byte {offset} is 0xe9"), problem
    assert "save the file as UTF-8" in problem
    # the workspace's own reader is the same reader
    with pytest.raises(WorkspaceConfigError) as again:
        Workspace.open(tmp_path).load_config()
    assert again.value.problems == info.value.problems


def test_the_sample_and_its_variants_validate() -> None:
    sample = template_dir("sample")
    for path in [sample / CONFIG_FILE, *sorted((sample / "variants").glob("*.toml"))]:
        if path.stem == "dataset":
            continue  # its data and model exist only in a workspace: tests/test_hf_policy.py inits one
        parse_config(path.read_text(encoding="utf-8"), path, root=sample)


# -- reward component names: one definition -------------------------------------------------------


def test_each_domain_builds_its_rewards_from_its_sections_names() -> None:
    assert tuple(MathDomain(MathDomainConfig()).reward_components) == MathDomainConfig.REWARD_COMPONENTS
    assert tuple(CodeDomain(CodeDomainConfig()).reward_components) == CodeDomainConfig.REWARD_COMPONENTS
    swe = SweDomain(SweDomainConfig(train_size=5, val_size=5))
    assert tuple(swe.episode_rewards) == SweDomainConfig.REWARD_COMPONENTS and swe.reward_components == {}
    for name, section in DOMAIN_SECTIONS.items():
        assert reward_component_names(name) is section.REWARD_COMPONENTS


def test_a_reward_function_without_a_name_or_a_name_without_a_function_is_an_error() -> None:
    def fn(*_: object) -> float:
        return 0.0

    with pytest.raises(TypeError) as info:
        reward_functions("math", {"correctness": fn, "format": fn, "brevity": fn})
    message = str(info.value)
    assert "MathDomainConfig.REWARD_COMPONENTS" in message
    assert "no function for ['closeness']" in message and "no name for ['brevity']" in message


def test_validating_a_config_does_not_import_the_domains(sample_toml: str) -> None:
    """engine.config is a leaf (pyproject's import-linter contract); this checks the lazy imports
    that a static contract could miss if it were ever relaxed."""
    code = (
        "import sys; from pathlib import Path; from engine.config import parse_config; "
        f"parse_config({sample_toml!r}, Path('w.toml')); "
        "print(sorted(m for m in sys.modules if m.startswith('engine.')))"
    )
    root = Path(config_module.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert "engine.domains" not in out.stdout, out.stdout
