"""The dataset domain: reading and checking the user's files, the verifiers, the seeded split.

Every malformed file below is written by the test, which knows the line it broke: the expected
line numbers come from where a row lands in the list that is written, not from a pasted number.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from engine.config import DatasetDomainConfig, WorkspaceConfigError, parse_config
from engine.domains import make_domain, reward_component_names, score
from engine.domains.base import Task
from engine.domains.dataset import DatasetDomain, DatasetError, extract_answer
from engine.workspace import Workspace, template_dir
from evotui.cli import app

Row = dict[str, Any] | str  # a str is written as the raw line (to break JSON on purpose)


def write_jsonl(path: Path, rows: list[Row]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def good(n: int, prefix: str, **extra: Callable[[int], Any]) -> list[Row]:
    """`n` valid rows whose prompts start with `prefix` (distinct across prefixes)."""
    return [{"prompt": f"{prefix} {i}?", "answer": str(i), **{k: f(i) for k, f in extra.items()}} for i in range(n)]


def domain(root: Path, **fields: Any) -> DatasetDomain:
    config = DatasetDomainConfig.model_validate({"name": "dataset", **fields}, context={"root": root})
    return DatasetDomain(config, root)


def jsonl_pair(root: Path, train: list[Row], val: list[Row], test: list[Row] | None = None) -> dict[str, str]:
    write_jsonl(root / "train.jsonl", train)
    write_jsonl(root / "val.jsonl", val)
    files = {"train": "train.jsonl", "val": "val.jsonl"}
    if test is not None:
        write_jsonl(root / "test.jsonl", test)
        files["test"] = "test.jsonl"
    return files


# -- malformed data: each case writes its files and says where the error must point -----------------
@dataclass
class Bad:
    """Where the error must point: the file's name, its line (or Parquet row index), the field,
    and further text the message must hold."""

    file: str
    line: int | None = None
    field_name: str | None = None
    row_index: bool = False
    also: list[str] = field(default_factory=list)


Case = Callable[[Path], tuple[dict[str, Any], Bad]]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


def _broken_train(root: Path, bad_row: Row, at: int = 2, **config: Any) -> tuple[dict[str, Any], Bad]:
    """Train rows with `bad_row` at index `at` (line at + 1), valid val rows."""
    rows = good(4, "train")
    rows.insert(at, bad_row)
    return {**jsonl_pair(root, rows, good(2, "val")), **config}, Bad("train.jsonl", at + 1)


@case
def wrong_prompt_field(root: Path) -> tuple[dict[str, Any], Bad]:
    rows: list[Row] = [{"question": f"q{i}", "answer": "1"} for i in range(3)]
    return jsonl_pair(root, rows, good(2, "val")), Bad("train.jsonl", 1, "prompt", also=["question", "prompt_field"])


@case
def wrong_answer_field_in_config(root: Path) -> tuple[dict[str, Any], Bad]:
    return {**jsonl_pair(root, good(3, "t"), good(2, "v")), "answer_field": "label"}, Bad("train.jsonl", 1, "label")


@case
def bad_json_line_in_the_middle(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, '{"prompt": "broken", "answer": }', at=3)
    bad.also = ["not valid JSON"]
    return config, bad


@case
def bad_json_after_blank_lines(root: Path) -> tuple[dict[str, Any], Bad]:
    rows: list[Row] = ["", "", '{"prompt": "x"', *good(2, "t")]  # blank lines are skipped, not renumbered
    return jsonl_pair(root, rows, good(2, "v")), Bad("train.jsonl", 3, also=["not valid JSON"])


@case
def empty_train_file(root: Path) -> tuple[dict[str, Any], Bad]:
    files = jsonl_pair(root, [], good(2, "v"))
    (root / "train.jsonl").write_text("")
    return files, Bad("train.jsonl", also=["empty"])


@case
def whitespace_only_val_file(root: Path) -> tuple[dict[str, Any], Bad]:
    files = jsonl_pair(root, good(3, "t"), [])
    (root / "val.jsonl").write_text("  \n\n\t\n")
    return files, Bad("val.jsonl", also=["empty"])


@case
def prompt_is_a_number(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": 12, "answer": "1"})
    return config, Bad(bad.file, bad.line, "prompt", also=["number"])


@case
def prompt_is_null(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": None, "answer": "1"}, at=0)
    return config, Bad(bad.file, bad.line, "prompt", also=["null"])


@case
def prompt_is_empty(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "", "answer": "1"}, at=4)
    return config, Bad(bad.file, bad.line, "prompt", also=["empty"])


@case
def prompt_is_whitespace(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "  \n ", "answer": "1"})
    return config, Bad(bad.file, bad.line, "prompt", also=["empty"])


@case
def prompt_is_a_list(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": ["a", "b"], "answer": "1"})
    return config, Bad(bad.file, bad.line, "prompt", also=["list"])


@case
def missing_answer(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "no answer here"}, at=1)
    return config, Bad(bad.file, bad.line, "answer", also=["missing", "answer_field"])


@case
def answer_is_null(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "p", "answer": None})
    return config, Bad(bad.file, bad.line, "answer")


@case
def answer_is_empty(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "p", "answer": " "})
    return config, Bad(bad.file, bad.line, "answer", also=["empty"])


@case
def answer_is_a_boolean(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "p", "answer": True})
    return config, Bad(bad.file, bad.line, "answer", also=["boolean"])


@case
def numeric_answer_that_is_not_a_number(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "p", "answer": "twelve"}, verifier="numeric")
    return config, Bad(bad.file, bad.line, "answer", also=["numeric"])


@case
def regex_answer_that_does_not_compile(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, {"prompt": "p", "answer": "(["}, verifier="regex")
    return config, Bad(bad.file, bad.line, "answer", also=["regular expression"])


@case
def missing_id(root: Path) -> tuple[dict[str, Any], Bad]:
    rows = good(3, "t", id=lambda i: f"t{i}")
    rows.append({"prompt": "no id", "answer": "1"})
    return {**jsonl_pair(root, rows, good(2, "v", id=lambda i: f"v{i}")), "id_field": "id"}, Bad(
        "train.jsonl", len(rows), "id", also=["id_field"]
    )


@case
def missing_completion(root: Path) -> tuple[dict[str, Any], Bad]:
    val = good(3, "v", solution=lambda i: f"Answer: {i}")
    del val[1]["solution"]  # type: ignore[union-attr]
    files = jsonl_pair(root, good(2, "t", solution=lambda i: f"Answer: {i}"), val)
    return {**files, "completion_field": "solution"}, Bad("val.jsonl", 2, "solution", also=["completion_field"])


@case
def null_subset(root: Path) -> tuple[dict[str, Any], Bad]:
    rows = good(3, "t", level=lambda i: i)
    rows[2]["level"] = None  # type: ignore[index]
    files = jsonl_pair(root, rows, good(2, "v", level=lambda i: i))
    return {**files, "subset_field": "level"}, Bad("train.jsonl", 3, "level")


@case
def duplicate_id_within_train(root: Path) -> tuple[dict[str, Any], Bad]:
    rows = good(4, "t", id=lambda i: f"id{i}")
    rows[3]["id"] = "id1"  # type: ignore[index]
    files = jsonl_pair(root, rows, good(2, "v", id=lambda i: f"v{i}"))
    return {**files, "id_field": "id"}, Bad("train.jsonl", 4, "id", also=["'id1'", "train.jsonl:2"])


@case
def duplicate_id_across_train_and_val(root: Path) -> tuple[dict[str, Any], Bad]:
    files = jsonl_pair(root, good(3, "t", id=lambda i: f"x{i}"), good(3, "v", id=lambda i: f"x{i + 2}"))
    return {**files, "id_field": "id"}, Bad("val.jsonl", 1, "id", also=["train.jsonl:3"])


@case
def duplicate_prompt_within_train(root: Path) -> tuple[dict[str, Any], Bad]:
    rows = good(5, "t")
    rows.append({"prompt": "t 1?", "answer": "9"})
    return jsonl_pair(root, rows, good(2, "v")), Bad("train.jsonl", len(rows), "prompt", also=["train.jsonl:2"])


@case
def val_prompt_in_train(root: Path) -> tuple[dict[str, Any], Bad]:
    val = good(3, "v")
    val[2] = {"prompt": "t 0?", "answer": "0"}
    return jsonl_pair(root, good(3, "t"), val), Bad("val.jsonl", 3, "prompt", also=["train.jsonl:1", "held out"])


@case
def held_out_test_prompt_in_train(root: Path) -> tuple[dict[str, Any], Bad]:
    test = [*good(2, "x"), {"prompt": "  t 2?\n", "answer": "2"}]  # surrounding whitespace does not hide it
    files = jsonl_pair(root, good(3, "t"), good(2, "v"), test)
    return files, Bad("test.jsonl", 3, "prompt", also=["train.jsonl:3", "held out"])


@case
def val_test_overlap(root: Path) -> tuple[dict[str, Any], Bad]:
    files = jsonl_pair(root, good(3, "t"), good(3, "v"), [{"prompt": "v 1?", "answer": "1"}])
    return files, Bad("test.jsonl", 1, "prompt", also=["val.jsonl:2"])


@case
def same_file_for_train_and_val(root: Path) -> tuple[dict[str, Any], Bad]:
    write_jsonl(root / "all.jsonl", good(3, "a"))
    return {"train": "all.jsonl", "val": "all.jsonl"}, Bad("all.jsonl", 1, "prompt", also=["held out"])


@case
def json_array_instead_of_jsonl(root: Path) -> tuple[dict[str, Any], Bad]:
    files = jsonl_pair(root, good(3, "t"), good(2, "v"))
    (root / "train.jsonl").write_text(json.dumps(good(3, "t"), indent=2))
    return files, Bad("train.jsonl", 1, also=["JSON array", "JSON Lines"])


@case
def json_array_in_a_json_file(root: Path) -> tuple[dict[str, Any], Bad]:
    (root / "train.json").write_text(json.dumps(good(3, "t")))
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": "train.json", "val": "val.jsonl"}, Bad("train.json", 1, also=["JSON array"])


@case
def a_line_that_is_a_list(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, "[1, 2]")
    return config, Bad(bad.file, bad.line, also=["list, not an object"])


@case
def a_line_that_is_a_string(root: Path) -> tuple[dict[str, Any], Bad]:
    config, bad = _broken_train(root, '"just text"', at=4)
    return config, Bad(bad.file, bad.line, also=["string, not an object"])


@case
def not_utf8(root: Path) -> tuple[dict[str, Any], Bad]:
    files = jsonl_pair(root, good(3, "t"), good(2, "v"))
    (root / "train.jsonl").write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff", "answer": "2"}\n')
    return files, Bad("train.jsonl", 2, also=["UTF-8"])


@case
def unknown_suffix(root: Path) -> tuple[dict[str, Any], Bad]:
    (root / "train.txt").write_text("what is 1+1?\t2\n")
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": "train.txt", "val": "val.jsonl"}, Bad("train.txt", also=["'.txt'"])


@case
def no_suffix(root: Path) -> tuple[dict[str, Any], Bad]:
    write_jsonl(root / "train", good(2, "t"))
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": "train", "val": "val.jsonl"}, Bad("train", also=["no suffix"])


@case
def one_file_with_a_duplicate_prompt(root: Path) -> tuple[dict[str, Any], Bad]:
    rows = good(20, "q")
    rows.insert(15, {"prompt": "q 3?", "answer": "3"})
    write_jsonl(root / "all.jsonl", rows)
    return {"file": "all.jsonl"}, Bad("all.jsonl", 16, "prompt", also=["all.jsonl:4"])


@case
def one_file_with_a_duplicate_id(root: Path) -> tuple[dict[str, Any], Bad]:
    rows = good(10, "q", id=lambda i: f"r{i % 9}")  # the last row repeats the first id
    write_jsonl(root / "all.jsonl", rows)
    return {"file": "all.jsonl", "id_field": "id"}, Bad("all.jsonl", 10, "id", also=["all.jsonl:1"])


@case
def one_file_too_small_to_split(root: Path) -> tuple[dict[str, Any], Bad]:
    write_jsonl(root / "all.jsonl", good(2, "q"))
    return {"file": "all.jsonl", "test_fraction": 0.1}, Bad("all.jsonl", also=["too few"])


def _csv(root: Path, name: str, text: str) -> str:
    (root / name).write_text(text, encoding="utf-8")
    return name


@case
def csv_without_the_prompt_column(root: Path) -> tuple[dict[str, Any], Bad]:
    train = _csv(root, "train.csv", "question,answer\nwhat?,1\nwho?,2\n")
    return {"train": train, "val": _csv(root, "val.csv", "prompt,answer\nv?,1\n")}, Bad(
        "train.csv", 1, "prompt", also=["question"]
    )


@case
def csv_empty_answer_after_a_quoted_newline(root: Path) -> tuple[dict[str, Any], Bad]:
    lines = ["prompt,answer", '"two-line', 'prompt",1', "second?,"]  # the record at index 2 lacks its answer
    train = _csv(root, "train.csv", "\n".join(lines) + "\n")
    return {"train": train, "val": _csv(root, "val.csv", "prompt,answer\nv?,1\n")}, Bad(
        "train.csv", lines.index("second?,") + 1, "answer"
    )


@case
def csv_header_only(root: Path) -> tuple[dict[str, Any], Bad]:
    train = _csv(root, "train.csv", "prompt,answer\n")
    return {"train": train, "val": _csv(root, "val.csv", "prompt,answer\nv?,1\n")}, Bad(
        "train.csv", 1, also=["no rows"]
    )


@case
def csv_empty(root: Path) -> tuple[dict[str, Any], Bad]:
    train = _csv(root, "train.csv", "")
    return {"train": train, "val": _csv(root, "val.csv", "prompt,answer\nv?,1\n")}, Bad("train.csv", also=["empty"])


@case
def csv_duplicate_prompt(root: Path) -> tuple[dict[str, Any], Bad]:
    lines = ["prompt,answer", "a?,1", "b?,2", "a?,3"]
    train = _csv(root, "train.csv", "\n".join(lines) + "\n")
    return {"train": train, "val": _csv(root, "val.csv", "prompt,answer\nv?,1\n")}, Bad(
        "train.csv", 4, "prompt", also=["train.csv:2"]
    )


def _parquet(root: Path, name: str, columns: dict[str, list[Any]]) -> str:
    pq.write_table(pa.table(columns), root / name)
    return name


@case
def parquet_without_the_answer_column(root: Path) -> tuple[dict[str, Any], Bad]:
    train = _parquet(root, "train.parquet", {"prompt": ["a", "b"], "label": ["1", "2"]})
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": train, "val": "val.jsonl"}, Bad("train.parquet", None, "answer", also=["label"])


@case
def parquet_null_prompt(root: Path) -> tuple[dict[str, Any], Bad]:
    prompts = ["a", "b", None, "d"]
    train = _parquet(root, "train.parquet", {"prompt": prompts, "answer": ["1", "2", "3", "4"]})
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": train, "val": "val.jsonl"}, Bad("train.parquet", prompts.index(None), "prompt", row_index=True)


@case
def parquet_prompts_that_are_numbers(root: Path) -> tuple[dict[str, Any], Bad]:
    train = _parquet(root, "train.parquet", {"prompt": [1, 2], "answer": [1, 2]})
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": train, "val": "val.jsonl"}, Bad("train.parquet", 0, "prompt", row_index=True, also=["number"])


@case
def parquet_no_rows(root: Path) -> tuple[dict[str, Any], Bad]:
    train = _parquet(root, "train.parquet", {"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())})
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": train, "val": "val.jsonl"}, Bad("train.parquet", also=["no rows"])


@case
def parquet_that_is_not_parquet(root: Path) -> tuple[dict[str, Any], Bad]:
    (root / "train.parquet").write_bytes(b"this is not a parquet file at all\n")
    write_jsonl(root / "val.jsonl", good(2, "v"))
    return {"train": "train.parquet", "val": "val.jsonl"}, Bad("train.parquet", also=["cannot be read as PARQUET"])


def _verifier_module(root: Path, source: str) -> dict[str, Any]:
    (root / "domains").mkdir()
    (root / "domains" / "judge.py").write_text(source)
    return jsonl_pair(root, good(3, "t"), good(2, "v"))


@case
def python_verifier_module_missing(root: Path) -> tuple[dict[str, Any], Bad]:
    files = jsonl_pair(root, good(3, "t"), good(2, "v"))
    return {**files, "verifier": "python:no_such_judge:check"}, Bad("no_such_judge.py", None, "verifier")


@case
def python_verifier_function_missing(root: Path) -> tuple[dict[str, Any], Bad]:
    files = _verifier_module(root, "def other(completion, answer):\n    return True\n")
    return {**files, "verifier": "python:judge:check"}, Bad("judge.py", None, "verifier", also=["'check'", "other"])


@case
def python_verifier_import_fails(root: Path) -> tuple[dict[str, Any], Bad]:
    source = ["import math", "raise RuntimeError('no judge today')", "def check(c, a):", "    return True"]
    files = _verifier_module(root, "\n".join(source) + "\n")
    return {**files, "verifier": "python:judge:check"}, Bad(
        "judge.py", source.index("raise RuntimeError('no judge today')") + 1, "verifier", also=["no judge today"]
    )


@case
def python_verifier_syntax_error(root: Path) -> tuple[dict[str, Any], Bad]:
    source = ["def check(c, a):", "    return (", ""]
    files = _verifier_module(root, "\n".join(source))
    return {**files, "verifier": "python:judge:check"}, Bad("judge.py", None, "verifier", also=["syntax error"])


@case
def python_verifier_returns_text(root: Path) -> tuple[dict[str, Any], Bad]:
    files = _verifier_module(root, "def check(completion, answer):\n    return 'yes'\n")
    return {**files, "verifier": "python:judge:check"}, Bad("judge.py", None, "verifier", also=["'yes'"])


@case
def python_verifier_raises(root: Path) -> tuple[dict[str, Any], Bad]:
    # Tried once at load (on the first train row): a function that fails on text fails there.
    source = ["def check(completion, answer):", "    return float(completion.split()[-1]) > 0"]
    files = _verifier_module(root, "\n".join(source) + "\n")
    write_jsonl(root / "train.jsonl", [{"prompt": "p?", "answer": "seven"}, *good(2, "t")])
    return {**files, "verifier": "python:judge:check"}, Bad("judge.py", 2, "verifier", also=["ValueError"])


def test_there_are_enough_malformed_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_data_raises_a_dataset_error_naming_file_line_and_field(tmp_path: Path, name: str) -> None:
    config, bad = CASES[name](tmp_path)
    with pytest.raises(DatasetError) as caught:
        domain(tmp_path, **config)
    error = caught.value
    message = str(error)
    assert type(error) is DatasetError
    assert bad.file in message, message
    if bad.line is not None:
        where = f"(row index {bad.line})" if bad.row_index else f"{bad.file}:{bad.line}:"
        assert where in message, message
        assert error.line == bad.line
    if bad.field_name is not None:
        assert f"field {bad.field_name!r}" in message, message
        assert error.field == bad.field_name
    for text in bad.also:
        assert text in message, message
    assert message.rstrip().endswith("."), message  # it ends with what to do


# -- config-level mistakes: the config's own error, with the workspace.toml line -------------------
#: The [domain] lines after `name`, the field the error names, and the line it points at
#: (a field's own line; a mistake of the section as a whole points at its header).
CONFIG_MISTAKES = {
    "unknown verifier": (['verifier = "fuzzy"'], "domain.verifier", 'verifier = "fuzzy"'),
    "answer_pattern that is no regex": (['answer_pattern = "(["'], "domain.answer_pattern", 'answer_pattern = "(["'),
    "python verifier without a function": (
        ['verifier = "python:judge"'],
        "domain.verifier",
        'verifier = "python:judge"',
    ),
    "a missing file": (['test = "nowhere.jsonl"'], "domain.test", 'test = "nowhere.jsonl"'),
    "both file and train": (['file = "train.jsonl"'], "domain", "[domain]"),
    "no val": (['train = "train.jsonl"'], "domain", "[domain]"),
    "fractions that leave no train": (
        ['file = "train.jsonl"', "val_fraction = 0.6", "test_fraction = 0.5"],
        "domain",
        "[domain]",
    ),
}
ALONE = ("no val", "fractions that leave no train")  # without the train and val lines


@pytest.mark.parametrize("mistake", sorted(CONFIG_MISTAKES))
def test_config_mistakes_are_workspace_config_errors(tmp_path: Path, mistake: str) -> None:
    jsonl_pair(tmp_path, good(3, "t"), good(2, "v"))
    extra, field_name, pointed = CONFIG_MISTAKES[mistake]
    sources = [] if mistake in ALONE else ['train = "train.jsonl"', 'val = "val.jsonl"']
    lines = ["[workspace]", 'name = "t"', "", "[domain]", 'name = "dataset"', *sources, *extra]
    text = "\n".join(lines) + "\n"
    with pytest.raises(WorkspaceConfigError) as caught:
        parse_config(text, tmp_path / "workspace.toml", root=tmp_path)
    message = str(caught.value)
    assert f"workspace.toml:{lines.index(pointed) + 1}: field '{field_name}" in message, message


# -- verifiers ------------------------------------------------------------------------------------
HALF = ("\\frac{1}{2}", "0.5", "1/2")


def test_math_verifier_matches_every_way_of_writing_a_half(tmp_path: Path) -> None:
    rows: list[Row] = [{"prompt": f"Write one half ({i}).", "answer": form} for i, form in enumerate(HALF)]
    files = jsonl_pair(tmp_path, rows, good(1, "v"))
    d = domain(tmp_path, verifier="math", **files)
    for task in d.tasks("train"):
        for form in HALF:
            completion = f"Halving 1 gives \\boxed{{{form}}}"
            assert d.is_correct(task, completion), (task.answer, form)
            assert score(d, task, completion, {"correctness": 1.0})[1] == {
                "correctness": 1.0,
                "format": 1.0,
                "closeness": 1.0,
            }
        assert not d.is_correct(task, "Halving 1 gives \\boxed{0.51}"), task.answer
        assert d.reward_components["format"](task, "\\boxed{0.51}") == 1.0
    task = d.tasks("train")[0]
    assert d.is_correct(task, "so the answer is 1/2")  # no marker: math-verify reads the whole completion
    assert d.reward_components["format"](task, "no math here") == 0.0


def test_exact_verifier(tmp_path: Path) -> None:
    rows: list[Row] = [{"prompt": "Capital of France?", "answer": "Paris"}]
    d = domain(tmp_path, **jsonl_pair(tmp_path, rows, good(1, "v")))
    task = d.tasks("train")[0]
    components = d.reward_components
    assert list(components) == list(reward_component_names("dataset") or ())
    assert d.is_correct(task, "It is in Europe.\nAnswer: Paris")
    assert d.is_correct(task, "thinking...\n  Paris  \n\n")  # the last non-empty line
    assert not d.is_correct(task, "Answer: paris")
    assert components["format"](task, "Answer: London") == 1.0 and components["closeness"](task, "Answer: London") == 0
    assert components["format"](task, "") == 0.0 and components["correctness"](task, " \n") == 0.0


def test_numeric_verifier_and_its_closeness(tmp_path: Path) -> None:
    rows: list[Row] = [
        {"prompt": "Big?", "answer": 1234},  # a JSON number becomes text
        {"prompt": "Half?", "answer": "1/2"},
        {"prompt": "Hundred?", "answer": "100"},
    ]
    d = domain(tmp_path, verifier="numeric", **jsonl_pair(tmp_path, rows, good(1, "v")))
    big, half, hundred = d.tasks("train")
    closeness, fmt = d.reward_components["closeness"], d.reward_components["format"]
    assert big.answer == "1234"
    assert d.is_correct(big, "#### 1,234") and d.is_correct(big, "so 1000+234 = 1234 apples")
    assert d.is_correct(half, "Answer: 0.5") and d.is_correct(half, "\\boxed{2/4}")
    assert not d.is_correct(half, "Answer: 0.51")
    assert closeness(hundred, "Answer: 105") == pytest.approx(0.5)  # 5% off: half way to the 10% floor
    assert closeness(hundred, "Answer: 111") == 0.0 and closeness(hundred, "Answer: 100") == 1.0
    assert closeness(hundred, "Answer: 95") == pytest.approx(0.5)
    assert fmt(hundred, "I do not know") == 0.0 and fmt(hundred, "maybe 3") == 1.0
    assert not d.is_correct(hundred, "27-73 = -46")  # the last number, with its sign
    tolerant = domain(tmp_path, verifier="numeric", tolerance=0.05, **jsonl_pair(tmp_path, rows, good(1, "v")))
    assert tolerant.is_correct(tolerant.tasks("train")[2], "Answer: 104")


def test_regex_verifier(tmp_path: Path) -> None:
    rows: list[Row] = [{"prompt": "How many apples?", "answer": r"\d+ apples?"}]
    d = domain(tmp_path, verifier="regex", **jsonl_pair(tmp_path, rows, good(1, "v")))
    task = d.tasks("train")[0]
    assert d.is_correct(task, "Answer: 3 apples") and d.is_correct(task, "\\boxed{1 apple}")
    assert not d.is_correct(task, "Answer: three apples") and not d.is_correct(task, "Answer: 3 apples, I think")
    assert d.reward_components["format"](task, "") == 0.0


def test_python_verifier_from_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "domains").mkdir()
    (tmp_path / "domains" / "judge.py").write_text(
        "def check(completion, answer):\n"
        "    words = completion.split()\n"
        "    return 1.0 if answer in words else (0.5 if answer.lower() in completion.lower() else 0.0)\n"
    )
    rows: list[Row] = [{"prompt": "Say Paris.", "answer": "Paris"}]
    d = domain(tmp_path, verifier="python:judge:check", **jsonl_pair(tmp_path, rows, good(1, "v")))
    task = d.tasks("train")[0]
    _, right = score(d, task, "It is Paris", {})
    _, partial = score(d, task, "it is paris!", {})
    _, wrong = score(d, task, "London", {})
    assert right == {"correctness": 1.0, "format": 1.0, "closeness": 1.0}
    assert partial == {"correctness": 0.0, "format": 1.0, "closeness": 0.5}
    assert wrong == {"correctness": 0.0, "format": 1.0, "closeness": 0.0}
    assert score(d, task, "", {})[1]["format"] == 0.0


def test_answer_pattern_that_matches_nothing_is_format_zero_not_an_error(tmp_path: Path) -> None:
    rows: list[Row] = [{"prompt": "Two?", "answer": "2"}]
    d = domain(tmp_path, answer_pattern=r"ANS=(\d+)", **jsonl_pair(tmp_path, rows, good(1, "v")))
    task = d.tasks("train")[0]
    assert score(d, task, "Answer: 2 \\boxed{2}", {})[1] == {"correctness": 0.0, "format": 0.0, "closeness": 0.0}
    assert d.is_correct(task, "ANS=3 then ANS=2") and not d.is_correct(task, "ANS=2 then ANS=3")


def test_answer_extraction_rules() -> None:
    assert extract_answer("x \\boxed{1} then \\boxed{\\frac{1}{2}}", "exact") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{7} and \\boxed{unclosed", "exact") == "7"
    assert extract_answer("#### 5\nANSWER:  6 \nmore", "exact") == "6"
    assert extract_answer("Answer:\n42", "exact") == "42"  # nothing after the marker: the last line
    assert extract_answer("one 1, two 2.", "numeric") == "2"
    assert extract_answer("no number", "numeric") is None
    assert extract_answer("  \n", "math") is None and extract_answer("", "exact") is None
    assert extract_answer("a: 1, b: 2", "exact", re.compile(r"\w: \d")) == "b: 2"


# -- splits ---------------------------------------------------------------------------------------
def test_one_file_is_split_by_seed_reproducibly_and_disjointly(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "all.jsonl", good(50, "q"))
    first = domain(tmp_path, file="all.jsonl", val_fraction=0.1, test_fraction=0.2, seed=3)
    again = domain(tmp_path, file="all.jsonl", val_fraction=0.1, test_fraction=0.2, seed=3)
    other = domain(tmp_path, file="all.jsonl", val_fraction=0.1, test_fraction=0.2, seed=4)
    splits = {s: first.tasks(s) for s in ("train", "val", "test")}
    assert {s: len(t) for s, t in splits.items()} == {"train": 35, "val": 5, "test": 10}
    assert all(first.tasks(s) == again.tasks(s) for s in splits)
    assert first.tasks("val") != other.tasks("val")
    prompts = [t.prompt for tasks in splits.values() for t in tasks]
    assert len(prompts) == len(set(prompts)) == 50
    ids = [t.task_id for tasks in splits.values() for t in tasks]
    assert len(set(ids)) == 50 and all(re.fullmatch(r"(train|val|test)-\d+", i) for i in ids)
    for split, tasks in splits.items():  # `<split>-<line>`: the line the row is on
        for task in tasks:
            assert task.task_id == f"{split}-{int(task.answer) + 1}"


def test_caps_take_the_first_rows_and_ids_are_stable(tmp_path: Path) -> None:
    files = jsonl_pair(tmp_path, good(20, "t", id=lambda i: f"row{i}"), good(6, "v", id=lambda i: f"val{i}"))
    full = domain(tmp_path, id_field="id", **files)
    capped = domain(tmp_path, id_field="id", train_size=5, val_size=2, **files)
    assert capped.tasks("train") == full.tasks("train")[:5] and capped.tasks("val") == full.tasks("val")[:2]
    assert [t.task_id for t in capped.tasks("train")] == [f"row{i}" for i in range(5)]
    assert full.tasks("test") == []
    write_jsonl(tmp_path / "all.jsonl", good(30, "q"))
    whole = domain(tmp_path, file="all.jsonl")
    small = domain(tmp_path, file="all.jsonl", train_size=4, test_size=0)
    assert small.tasks("train") == whole.tasks("train")[:4] and small.tasks("val") == whole.tasks("val")
    assert small.tasks("test") == []
    plain = domain(tmp_path, **files)  # no id_field: ids name the line
    assert [t.task_id for t in plain.tasks("val")] == [f"val-{i + 1}" for i in range(6)]


def test_demonstrations_alphabet_and_system_prompt(tmp_path: Path) -> None:
    files = jsonl_pair(
        tmp_path, good(3, "t", solution=lambda i: f"So: {i}ü"), good(2, "v", solution=lambda i: f"{i} #")
    )
    d = make_domain(
        DatasetDomainConfig.model_validate(
            {"name": "dataset", "completion_field": "solution", "system_prompt": "Be brief ~", **files},
            context={"root": tmp_path},
        ),
        tmp_path,
    )
    assert isinstance(d, DatasetDomain) and d.name == "dataset" and d.system_prompt == "Be brief ~"
    task = d.tasks("train")[1]
    assert d.demonstration(task) == d.reference_completion(task) == "So: 1ü"
    for char in "ü#~?":
        assert char in d.alphabet
    text = "".join(t.prompt + t.answer + d.demonstration(t) for s in ("train", "val") for t in d.tasks(s))
    assert set(text) <= set(d.alphabet)
    without = domain(tmp_path, **files)
    assert without.reference_completion(without.tasks("train")[0]) is None
    with pytest.raises(DatasetError, match="completion_field"):
        without.demonstration(without.tasks("train")[0])
    with pytest.raises(KeyError):
        without.reference_completion(Task("elsewhere", "p", "a", "all"))


def test_csv_and_parquet_read_as_text_with_their_lines(tmp_path: Path) -> None:
    lines = ["id,prompt,answer", 'a,"two', 'lines",007', "b,plain?,12"]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    pq.write_table(pa.table({"prompt": ["x?", "y?"], "answer": [3, 4]}), tmp_path / "val.parquet")
    d = domain(tmp_path, train="train.csv", val="val.parquet")
    train = d.tasks("train")
    assert [(t.task_id, t.prompt, t.answer) for t in train] == [
        ("train-2", "two\nlines", "007"),  # text stays text: no 007 -> 7
        (f"train-{lines.index('b,plain?,12') + 1}", "plain?", "12"),
    ]
    assert [(t.task_id, t.answer) for t in d.tasks("val")] == [("val-0", "3"), ("val-1", "4")]


# -- the CLI --------------------------------------------------------------------------------------
def dataset_workspace(root: Path, train: list[Row]) -> Path:
    """The sample's workspace.toml with a dataset [domain] over files written here."""
    root.mkdir()
    text = (template_dir("sample") / "workspace.toml").read_text()
    section = '[domain]\nname = "dataset"\ntrain = "data/train.jsonl"\nval = "data/val.jsonl"\nverifier = "numeric"\n\n'
    text, n = re.subn(r"^\[domain\]\n.*?(?=^\[policy\])", section, text, count=1, flags=re.S | re.M)
    assert n == 1
    (root / "workspace.toml").write_text(text)
    (root / "data").mkdir()
    write_jsonl(root / "data" / "train.jsonl", train)
    write_jsonl(root / "data" / "val.jsonl", good(3, "v"))
    return root


def test_evotui_run_reports_bad_data_and_exits_1(tmp_path: Path) -> None:
    ok = dataset_workspace(tmp_path / "ok", good(4, "t"))
    assert Workspace.open(ok).load_config().domain.name == "dataset"  # the toml itself is fine
    rows = good(4, "t")
    rows.insert(2, {"prompt": 17, "answer": "1"})
    ws = dataset_workspace(tmp_path / "bad", rows)
    with pytest.raises(DatasetError):
        Workspace.open(ws).load_config()
    result = CliRunner().invoke(app, ["run", str(ws)])
    assert result.exit_code == 1, result.output
    unwrapped = "".join(result.output.split())  # rich wraps a long path anywhere
    assert "error:" in unwrapped and "train.jsonl:3:field'prompt':17isanumber,nottext" in unwrapped, result.output
    assert not (ws / ".evotrainer").exists()  # it failed before any store or run was made


def test_math_verifier_works_outside_the_main_thread(tmp_path: Path) -> None:
    """math-verify's signal-based timeouts only work in the main thread; elsewhere they are off."""
    rows: list[Row] = [{"prompt": "Half of 3?", "answer": "\\frac{3}{2}"}]
    d = domain(tmp_path, verifier="math", **jsonl_pair(tmp_path, rows, good(1, "v")))
    task = d.tasks("train")[0]
    results: list[tuple[bool, bool]] = []

    def judge() -> None:
        results.append((d.is_correct(task, "\\boxed{1.5}"), d.is_correct(task, "\\boxed{2}")))

    worker = threading.Thread(target=judge)
    worker.start()
    worker.join(timeout=60)
    assert results == [(True, False)]
