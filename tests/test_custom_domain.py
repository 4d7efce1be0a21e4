from __future__ import annotations

import random
import shutil
import textwrap
from pathlib import Path

import pytest

from engine.config import CustomDomainConfig
from engine.domains import make_domain, reward_component_names, score
from engine.domains.custom import CustomDomainError, load_custom_domain

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "custom_domain.py"
SMALL = {"train_size": 300, "val_size": 40}

# A minimal valid domain: each error test below breaks one thing of it and knows the line.
VALID = textwrap.dedent(
    """\
    from engine.domains.base import Task


    def exact(task, completion):
        return 1.0 if completion == task.answer else 0.0


    class Echo:
        name = "echo"
        alphabet = "abctv:\\n"

        def tasks(self, split):
            return [Task(f"{split}-{i}", f"{split[0]}:{'abc'[i]}\\n", "abc"[i], "one") for i in range(3)]

        def demonstration(self, task, rng=None):
            return task.answer

        def is_correct(self, task, completion):
            return completion == task.answer

        @property
        def reward_components(self):
            return {"exact": exact}


    DOMAIN = Echo()
    """
)


def workspace_with(tmp_path: Path, source: str, module: str = "mine") -> Path:
    (tmp_path / "domains").mkdir(exist_ok=True)
    (tmp_path / "domains" / f"{module}.py").write_text(source, encoding="utf-8")
    return tmp_path


def load_error(tmp_path: Path, source: str, **config: object) -> CustomDomainError:
    root = workspace_with(tmp_path, source)
    with pytest.raises(CustomDomainError) as caught:
        load_custom_domain(root, CustomDomainConfig(module="mine", **config))  # type: ignore[arg-type]
    return caught.value


def line_of(source: str, needle: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), start=1) if needle in text)


def test_the_documented_example_loads_from_a_workspace_and_scores(tmp_path: Path) -> None:
    (tmp_path / "domains").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "domains" / "reverse.py")
    config = CustomDomainConfig(module="reverse", seed=3, options=SMALL)
    domain = make_domain(config, root=tmp_path)
    again = make_domain(config, root=tmp_path)
    train, val = domain.tasks("train"), domain.tasks("val")
    assert (len(train), len(val)) == (300, 40)
    assert train == again.tasks("train")  # seeded
    assert not {t.prompt for t in train} & {t.prompt for t in val}
    task = val[0]
    right = domain.demonstration(task)
    assert domain.is_correct(task, right) and not domain.is_correct(task, right + "x")
    total, parts = score(domain, task, right, {"correctness": 1.0, "format": 0.1})
    assert parts == {"correctness": 1.0, "format": 1.0, "similarity": 1.0} and abs(total - 1.1) < 1e-12
    rng = random.Random(0)
    demos = [domain.demonstration(t, rng) for t in train]
    assert 0.1 < sum(not domain.is_correct(t, d) for t, d in zip(train, demos, strict=True)) / len(train) < 0.5
    assert domain.name == "reverse" and domain.source_digest and reward_component_names("custom") is None


def test_a_fixed_domain_object_loads_and_rejects_options(tmp_path: Path) -> None:
    domain = load_custom_domain(workspace_with(tmp_path, VALID), CustomDomainConfig(module="mine"))
    assert [t.task_id for t in domain.tasks("val")] == ["val-0", "val-1", "val-2"]
    error = load_error(tmp_path, VALID, options={"size": 3})
    assert error.line == line_of(VALID, "DOMAIN = Echo()") and "make_domain(seed, options)" in str(error)


def test_make_domain_needs_the_workspace_root_for_a_custom_domain() -> None:
    with pytest.raises(ValueError, match="workspace directory"):
        make_domain(CustomDomainConfig(module="mine"))


def test_a_missing_file_names_the_path_and_what_is_there(tmp_path: Path) -> None:
    workspace_with(tmp_path, VALID, module="other")
    with pytest.raises(CustomDomainError, match=r"domains/mine\.py: custom domain file not found .*other"):
        load_custom_domain(tmp_path, CustomDomainConfig(module="mine"))


def test_a_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    source = VALID.replace("return completion == task.answer", "return completion == = task.answer")
    error = load_error(tmp_path, source)
    assert error.line == line_of(source, "== =")
    assert str(error).startswith(f"{tmp_path / 'domains' / 'mine.py'}:{error.line}: syntax error")


def test_an_exception_at_import_names_the_line_that_raised(tmp_path: Path) -> None:
    source = VALID.replace("DOMAIN = Echo()", 'LIMIT = int("ten")\nDOMAIN = Echo()')
    error = load_error(tmp_path, source)
    assert error.line == line_of(source, 'int("ten")')
    assert "importing the file raised ValueError" in str(error) and "mine.py:" in str(error)


def test_a_missing_attribute_names_the_domain_class(tmp_path: Path) -> None:
    source = VALID.replace('    alphabet = "abctv:\\n"\n', "")
    error = load_error(tmp_path, source)
    assert error.line == line_of(source, "class Echo") and "no attribute 'alphabet'" in str(error)
    nothing = load_error(tmp_path, VALID.replace("DOMAIN = Echo()", "domain = Echo()"))
    assert "neither DOMAIN nor make_domain" in str(nothing)


def test_an_alphabet_that_misses_characters_is_rejected(tmp_path: Path) -> None:
    source = VALID.replace('alphabet = "abctv:\\n"', 'alphabet = "abtv:\\n"')
    error = load_error(tmp_path, source)
    assert error.line == line_of(source, "alphabet =") and "lacks 'c'" in str(error)


def test_a_reward_function_that_raises_names_its_line(tmp_path: Path) -> None:
    source = VALID.replace(
        "    return 1.0 if completion == task.answer else 0.0",
        "    first = completion[0]\n    return 1.0 if first == task.answer else 0.0",
    )
    error = load_error(tmp_path, source)  # raises IndexError on the empty completion
    assert error.line == line_of(source, "first = completion[0]")
    assert "reward component 'exact'" in str(error) and "IndexError" in str(error)


def test_a_reward_function_returning_no_number_names_its_definition(tmp_path: Path) -> None:
    source = VALID.replace("return 1.0 if completion == task.answer else 0.0", "return None")
    error = load_error(tmp_path, source)
    assert error.line == line_of(source, "def exact") and "returned None" in str(error)


def test_errors_during_training_are_located_too(tmp_path: Path) -> None:
    source = VALID.replace(
        "    return 1.0 if completion == task.answer else 0.0",
        "    if completion == 'boom':\n        raise RuntimeError('bad input')\n    return 0.0",
    )
    domain = load_custom_domain(workspace_with(tmp_path, source), CustomDomainConfig(module="mine"))
    task = domain.tasks("train")[0]
    with pytest.raises(CustomDomainError) as caught:
        score(domain, task, "boom", {"exact": 1.0})
    assert caught.value.line == line_of(source, "raise RuntimeError") and "RuntimeError: bad input" in str(caught.value)
