"""Dataset domain: prompts with reference answers from your own files, scored by a standard verifier.

Data
----
``[domain]`` names a ``train`` and a ``val`` file (``test`` optional), or one ``file`` that is
split here by ``seed``: the rows are shuffled with ``random.Random(seed)``, the first
``val_fraction`` of them (at least one) become val, the next ``test_fraction`` (at least one when
the share is above 0) test, the rest train. The split keeps that shuffled order, so a cap
(``train_size``, ``val_size``, ``test_size``: the first N rows of a split) takes a random subset
of one file, and the first N rows, in file order, of a split's own file.

The format follows the suffix: ``.jsonl``/``.json`` (JSON Lines: one object a line), ``.csv`` (a
header line, then one record a row) and ``.parquet``. JSON Lines are read here, line by line,
with the json module, not with `datasets`: its JSON loader reports a bad line without its number,
casts a column to one Arrow type (so a prompt that is a number in one row is silently turned into
text, or the whole column refused), and cannot say which line lacks a field. CSV and Parquet are
read with `datasets` (``load_dataset("csv" | "parquet")``); CSV columns are read as text, so an
answer ``007`` stays ``007``, and each record is mapped to the line it starts on (the csv module
counts them, quoted newlines included).

Where an error points: ``file:line`` for JSON Lines and CSV (the header is line 1), ``file (row
index i)`` for Parquet (0-based, as ``dataset[i]`` reads it). Every problem is a `DatasetError`
that names the file, the line and the field, and says what to do; nothing is dropped silently:

- an empty or whitespace-only file, a JSON array instead of JSON Lines, a line that is not JSON
  or not an object, a file `datasets` cannot read, an unknown suffix;
- a missing field (or CSV/Parquet column); a prompt that is not text or is empty; a missing or
  empty answer (JSON numbers are accepted and written as text: ``12`` -> ``"12"``); with
  ``id_field``, ``completion_field`` or ``subset_field``, a row without that field;
- for the ``numeric`` verifier a reference that is not a number; for ``regex`` one that does
  not compile;
- a duplicate id (within a file or across files), a duplicate prompt within a split (or, with
  ``file``, within the file: both lines are named), a val or test prompt that is also in train,
  a test prompt that is also in val (prompts compare with surrounding whitespace stripped).

Task ids are the ``id_field`` values, else ``<split>-<line>`` (the row's line, or its row index
for Parquet, in the file it comes from): the same row keeps its id across caps.

Answer extraction (`extract_answer`)
------------------------------------
The answer of a completion is, in this order:

1. with ``answer_pattern``: its last match's group 1 (the whole match when it has no group); no
   match is no answer (format 0), the later rules do not apply;
2. the content of the last ``\\boxed{...}`` (braces balanced);
3. what follows the last ``####`` or ``Answer:`` (any case) up to the end of its line, when that
   is not empty;
4. ``numeric``: the last number of the text; ``math``: the whole completion (math-verify's
   ``parse`` finds the expression in it); the others: the last non-empty line.

Answers and references are compared with surrounding whitespace stripped.

Verifiers (``verifier``)
------------------------
- ``exact``: the answer equals the reference.
- ``numeric``: the last number of the answer is within ``tolerance`` of the reference:
  ``|a - r| <= tolerance * max(1, |r|)``. Numbers are ``12``, ``-3.5``, ``.5``, ``1,234``
  (commas between groups of three digits) and fractions of integers ``1/2``; no exponents,
  no units, no words.
- ``math``: math-verify, ``verify(parse(reference), parse(answer))``, so ``\\frac{1}{2}``,
  ``0.5`` and ``1/2`` all match; a reference that does not parse is tried again as LaTeX,
  wrapped in ``$...$`` (a reference that still does not parse is a DatasetError when it is first
  scored: parsing every reference at load would cost seconds). math-verify's timeouts use
  ``signal.alarm``, which only the main thread may set: in another thread they are off.
- ``regex``: the reference is a regular expression that the whole answer must match.
- ``python:module:function``: ``function(completion, answer) -> bool | float`` from
  ``<workspace>/domains/<module>.py`` when that file exists, else the importable module; it is
  given the whole completion. A bool is the verdict; a float in [0, 1] is the closeness, and
  1.0 is correct.

Rewards
-------
``correctness`` (1/0, the verifier's verdict), ``format`` (1 when an answer can be extracted:
for ``numeric`` a number, for ``math`` an expression math-verify parses) and ``closeness``
(``numeric``: 1 when correct, else ``1 - relative error / CLOSENESS_SPAN`` floored at 0, the
relative error being ``|a - r| / max(1, |r|)``, so 0 at 10% off; ``python``: the function's
float; the others: equal to correctness).
"""

from __future__ import annotations

import csv
import functools
import importlib
import importlib.util
import io
import json
import math
import random
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.config import DatasetDomainConfig
from engine.domains import reward_functions
from engine.domains.base import SPLITS, RewardFn, Task

#: `numeric` closeness falls linearly from 1 (at the reference) to 0 at this relative error.
CLOSENESS_SPAN = 0.1
#: Seconds math-verify may spend parsing or comparing one answer (main thread only).
MATH_TIMEOUT_S = 5
#: The subset of every row when no `subset_field` is configured.
DEFAULT_SUBSET = "all"
#: Where a `python:module:function` verifier's module is looked for first.
VERIFIERS_DIR = "domains"
#: Judgements kept per domain: the three reward components and `is_correct` judge a completion once.
JUDGEMENT_CACHE = 8192

_BOXED = "\\boxed{"
_MARKER = re.compile(r"####|answer\s*:", re.IGNORECASE)
# A minus sign right after a word, a digit or ")" is an operator ("27-3"), not part of the number.
_NUMBER = re.compile(r"(?:(?<![\w).])-)?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:/\d+)?")
_CONFIG_HINT = "in [domain] of workspace.toml"


class DatasetError(ValueError):
    """A data file (or the verifier) of the dataset domain cannot be used.

    `where` says the file and the line or row (None when no line can be blamed), `field` the
    field; the message ends with what to do."""

    def __init__(self, where: Where, field: str | None, problem: str, fix: str):
        self.where = where
        self.path = where.path
        self.line = where.line
        self.field = field
        about = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{about} {problem}. {fix[:1].upper()}{fix[1:]}.")


@dataclass(frozen=True)
class Where:
    """A place in a data file: a line (JSON Lines, CSV) or a row index (Parquet, 0-based)."""

    path: Path
    line: int | None = None
    row_index: bool = False

    def __str__(self) -> str:
        if self.line is None:
            return str(self.path)
        return f"{self.path} (row index {self.line})" if self.row_index else f"{self.path}:{self.line}"


@dataclass(frozen=True)
class _Row:
    where: Where
    prompt: str
    answer: str
    row_id: str | None
    completion: str | None
    subset: str


@dataclass(frozen=True)
class Judgement:
    """How the verifier judged one completion."""

    answer: str | None  # what extraction found (None: no answer, format 0)
    formatted: bool
    correct: bool
    closeness: float


# -- answer extraction ------------------------------------------------------------------------------
def extract_answer(completion: str, verifier: str, pattern: re.Pattern[str] | None = None) -> str | None:
    """The answer of a completion, by the rules of the module docstring; None when there is none."""
    if pattern is not None:
        matches = list(pattern.finditer(completion))
        if not matches:
            return None
        found = matches[-1].group(1) if pattern.groups else matches[-1].group(0)
        if found is None:  # an optional group that took no part
            return None
        return found.strip() or None
    if (boxed := _last_boxed(completion)) is not None and boxed.strip():
        return boxed.strip()
    markers = list(_MARKER.finditer(completion))
    if markers and (after := completion[markers[-1].end() :].split("\n", 1)[0].strip()):
        return after
    if verifier == "numeric":
        numbers = _numbers(completion)
        return numbers[-1] if numbers else None
    if verifier == "math":
        return completion.strip() or None
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` whose braces close."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth = 0
        for index in range(start + len(_BOXED) - 1, len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len(_BOXED) : index]
        start = text.rfind(_BOXED, 0, start)
    return None


def _numbers(text: str) -> list[str]:
    return _NUMBER.findall(text)


def parse_number(text: str) -> float | None:
    """The value of a text that is one number (`12`, `-3.5`, `1,234`, `1/2`), else None."""
    text = text.strip()
    if _NUMBER.fullmatch(text) is None:
        return None
    numerator, _, denominator = text.replace(",", "").partition("/")
    try:
        value = Fraction(numerator) / Fraction(denominator) if denominator else Fraction(numerator)
    except (ValueError, ZeroDivisionError):
        return None
    return float(value)


def last_number(text: str) -> float | None:
    """The value of the last number in a text (see `parse_number`), else None."""
    for candidate in reversed(_numbers(text)):
        if (value := parse_number(candidate)) is not None:
            return value
    return None


# -- reading files ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataFile:
    """The rows of one data file, each with where it starts; `columns` for CSV and Parquet (one
    schema for every row, so a missing column is reported once, at `header`)."""

    path: Path
    records: list[tuple[Where, dict[str, Any]]]
    columns: list[str] | None = None
    header: Where | None = None


def read_file(path: Path) -> DataFile:
    """A data file read by its suffix; raises DatasetError."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DatasetError(
        Where(path),
        None,
        f"unknown file type {suffix or '(no suffix)'!r}",
        "use .jsonl (one JSON object a line), .csv (a header line) or .parquet, and name the file by its format",
    )


def _text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DatasetError(
            Where(path, line), None, f"not UTF-8 text (byte {exc.start}: {exc.reason})", "save the file as UTF-8"
        ) from None
    if not text.strip():
        raise DatasetError(
            Where(path), None, "the file is empty", "write the rows, or point [domain] at the right file"
        )
    return text


def _read_jsonl(path: Path) -> DataFile:
    text = _text(path)
    stripped = text.lstrip()
    if stripped.startswith("["):
        line = text[: len(text) - len(stripped)].count("\n") + 1
        raise DatasetError(
            Where(path, line),
            None,
            "the file is one JSON array, not JSON Lines",
            "write one JSON object per line (e.g. `jq -c '.[]' data.json > data.jsonl`)",
        )
    records: list[tuple[Where, dict[str, Any]]] = []
    # "\n" only: str.splitlines() also splits at U+2028 and the like, which JSON allows inside strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = Where(path, number)
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                where,
                None,
                f"not valid JSON ({exc.msg} at column {exc.colno})",
                'fix the line: each line is one JSON object, e.g. {"prompt": "...", "answer": "..."}',
            ) from None
        if not isinstance(value, dict):
            raise DatasetError(
                where,
                None,
                f"a JSON {_json_kind(value)}, not an object",
                'make each line one JSON object, e.g. {"prompt": "...", "answer": "..."}',
            )
        records.append((where, value))
    return DataFile(path, records)


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "null" if value is None else type(value).__name__


def _read_csv(path: Path) -> DataFile:
    from datasets import Features, Value

    text = _text(path)
    # The line each record starts on (the header's first): the csv module counts quoted newlines.
    starts: list[int] = []
    header: list[str] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    previous = 0
    try:
        for record in reader:
            if record:  # a blank line is no record (pandas skips it too)
                header = header or record
                starts.append(previous + 1)
            previous = reader.line_num
    except csv.Error as exc:
        raise DatasetError(Where(path, reader.line_num), None, f"not valid CSV ({exc})", "fix the quoting") from None
    header_at = Where(path, starts[0])
    if twice := sorted({name for name in header if header.count(name) > 1}):
        raise DatasetError(header_at, twice[0], "the header names this column twice", "give every column its own name")
    if len(starts) == 1:
        raise DatasetError(header_at, None, "the file has a header but no rows", "add rows below the header")
    # Every column as text: pandas would read "007" as 7, and a column of numbers as numbers.
    features = Features({name: Value("string") for name in header})
    rows = _load_with_datasets("csv", path, features=features).to_list()
    lines = starts[1:] if len(starts) - 1 == len(rows) else [index + 2 for index in range(len(rows))]
    return DataFile(path, [(Where(path, line), row) for line, row in zip(lines, rows, strict=True)], header, header_at)


def _read_parquet(path: Path) -> DataFile:
    import pyarrow.parquet as pq

    nothing = "write the rows, or point [domain] at the right file"
    if path.stat().st_size == 0:
        raise DatasetError(Where(path), None, "the file is empty", nothing)
    # The row count from the footer first: `datasets` fails on a Parquet file without rows
    # with an Arrow error about batch sizes.
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is no Parquet
        raise DatasetError(
            Where(path), None, f"cannot be read as PARQUET ({type(exc).__name__}: {exc})", "write a valid Parquet file"
        ) from exc
    if rows == 0:
        raise DatasetError(Where(path), None, "the file has no rows", nothing)
    dataset = _load_with_datasets("parquet", path)
    records = [(Where(path, index, row_index=True), row) for index, row in enumerate(dataset.to_list())]
    return DataFile(path, records, list(dataset.column_names), Where(path))


def _load_with_datasets(kind: str, path: Path, **options: Any) -> Any:
    import datasets

    try:
        with _quiet_datasets():
            return datasets.load_dataset(kind, data_files=str(path), split="train", **options)
    except Exception as exc:  # datasets, pandas and pyarrow raise many types for a file they cannot read
        cause: BaseException = exc
        while cause.__cause__ is not None:  # datasets wraps the reader's error in a vague one
            cause = cause.__cause__
        raise DatasetError(
            Where(path),
            None,
            f"cannot be read as {kind.upper()} ({type(cause).__name__}: {cause})",
            f"write a valid {kind.upper()} file",
        ) from exc


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bar per load (restored after, for whoever else uses datasets)."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


# -- checking rows ----------------------------------------------------------------------------------
#: The config knob that names each field, for the fix an error suggests.
_KNOBS = ("prompt_field", "answer_field", "id_field", "completion_field", "subset_field")


def _checked_rows(data: DataFile, config: DatasetDomainConfig) -> list[_Row]:
    if data.columns is not None:
        for knob in _KNOBS:
            name = getattr(config, knob)
            if name is not None and name not in data.columns:
                raise DatasetError(
                    data.header or Where(data.path),
                    name,
                    f"no such column (the columns are: {', '.join(data.columns)})",
                    f"add the column, or name the right one: {knob} = '...' {_CONFIG_HINT}",
                )
    return [_row(where, record, config) for where, record in data.records]


def _field(where: Where, record: dict[str, Any], name: str, knob: str, *, numbers: bool) -> str:
    """The text of one field; numbers become text where `numbers`; anything else raises."""
    if name not in record:
        raise DatasetError(
            where,
            name,
            f"missing (this row has: {', '.join(record) or 'no fields'})",
            f"add it to the row, or name the field that holds it: {knob} = '...' {_CONFIG_HINT}",
        )
    value = record[name]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise DatasetError(where, name, "empty (null)", f"give this row a value for {name!r}, or remove the row")
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(where, name, "empty text", f"give this row a value for {name!r}, or remove the row")
        return value
    if numbers and isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    kind = _json_kind(value)
    fix = f'write it as text, e.g. "{value}"' if kind in ("number", "boolean") else "write it as text"
    raise DatasetError(where, name, f"{value!r} is a {kind}, not text", fix)


def _row(where: Where, record: dict[str, Any], config: DatasetDomainConfig) -> _Row:
    prompt = _field(where, record, config.prompt_field, "prompt_field", numbers=False)
    answer = _field(where, record, config.answer_field, "answer_field", numbers=True)
    if config.verifier == "numeric" and parse_number(answer) is None:
        raise DatasetError(
            where,
            config.answer_field,
            f"{answer!r} is not a number the numeric verifier reads (such as 12, -3.5, 1,234 or 1/2)",
            "write the number alone, or choose verifier = 'exact' or 'math'",
        )
    if config.verifier == "regex":
        try:
            re.compile(answer)
        except re.error as exc:
            raise DatasetError(
                where,
                config.answer_field,
                f"{answer!r} is not a regular expression ({exc})",
                "fix it (the regex verifier reads each reference answer as a pattern), or choose verifier = 'exact'",
            ) from None
    row_id = _field(where, record, config.id_field, "id_field", numbers=True) if config.id_field else None
    completion = (
        _field(where, record, config.completion_field, "completion_field", numbers=False)
        if config.completion_field
        else None
    )
    subset = _field(where, record, config.subset_field, "subset_field", numbers=True) if config.subset_field else None
    return _Row(where, prompt, answer, row_id, completion, subset or DEFAULT_SUBSET)


def _check_distinct(groups: Sequence[tuple[str, Sequence[_Row]]], config: DatasetDomainConfig) -> None:
    """No id twice; no prompt twice within a group; no val/test prompt in train, no test in val.

    Groups are checked in order (train, val, test), so the later row is the one reported."""
    ids: dict[str, _Row] = {}
    prompts: dict[str, tuple[str, _Row]] = {}
    for group, rows in groups:
        for row in rows:
            if row.row_id is not None:
                if (first := ids.get(row.row_id)) is not None:
                    raise DatasetError(
                        row.where,
                        config.id_field,
                        f"id {row.row_id!r} is also the id of {first.where}",
                        "give every row its own id (ids are unique across train, val and test)",
                    )
                ids[row.row_id] = row
            key = row.prompt.strip()
            if (seen := prompts.get(key)) is None:
                prompts[key] = (group, row)
                continue
            seen_group, other = seen
            if seen_group == group:
                problem, fix = (
                    f"the same prompt as {other.where}",
                    "remove one of the two rows (a repeated prompt counts twice in training and in every score)",
                )
            else:
                problem, fix = (
                    f"this {group} prompt is also in {seen_group} ({other.where}), so {group} is not held out",
                    f"remove it from one of the two files: a {group} score must come from prompts "
                    f"{seen_group} does not have",
                )
            raise DatasetError(row.where, config.prompt_field, problem, fix)


def load_splits(config: DatasetDomainConfig) -> dict[str, list[_Row]]:
    """The checked rows of every split, capped; raises DatasetError on the first problem."""
    if config.file is not None:
        rows = _checked_rows(read_file(config.file), config)
        _check_distinct([("file", rows)], config)
        splits = _seeded_split(config.file, rows, config)
    else:
        assert config.train is not None and config.val is not None  # the config's validator
        files = {"train": config.train, "val": config.val, "test": config.test}
        splits = {split: _checked_rows(read_file(path), config) if path else [] for split, path in files.items()}
        _check_distinct([(split, splits[split]) for split in SPLITS], config)
    caps = {"train": config.train_size, "val": config.val_size, "test": config.test_size}
    return {split: rows[: caps[split]] if caps[split] is not None else rows for split, rows in splits.items()}


def _seeded_split(path: Path, rows: list[_Row], config: DatasetDomainConfig) -> dict[str, list[_Row]]:
    n = len(rows)
    n_val = max(1, round(n * config.val_fraction))
    n_test = max(1, round(n * config.test_fraction)) if config.test_fraction > 0 else 0
    if n - n_val - n_test < 1:
        raise DatasetError(
            Where(path),
            None,
            f"{n} rows are too few to split into val ({n_val}), test ({n_test}) and train (at least 1)",
            "add rows, or lower val_fraction and test_fraction " + _CONFIG_HINT,
        )
    order = list(range(n))
    random.Random(config.seed).shuffle(order)
    shuffled = [rows[i] for i in order]
    return {
        "val": shuffled[:n_val],
        "test": shuffled[n_val : n_val + n_test],
        "train": shuffled[n_val + n_test :],
    }


# -- verifiers --------------------------------------------------------------------------------------
PythonVerifier = Callable[[str, str], Any]


def load_python_verifier(spec: str, root: Path | None) -> tuple[PythonVerifier, Path]:
    """The function of `python:module:function` and the file it comes from."""
    _, module_name, function_name = spec.split(":")
    local = Path(root) / VERIFIERS_DIR / (module_name.replace(".", "/") + ".py") if root is not None else None
    fix = (
        f"define def {function_name}(completion: str, answer: str) -> bool | float in "
        f"{VERIFIERS_DIR}/{module_name}.py of the workspace, or fix verifier = 'python:module:function' {_CONFIG_HINT}"
    )
    if local is not None and local.is_file():
        module = _import_file(local, module_name, fix)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            looked = f"{local} does not exist and " if local is not None else ""
            raise DatasetError(
                Where(local or Path(f"{module_name}.py")),
                "verifier",
                f"{looked}no module {module_name!r} can be imported ({exc})",
                fix,
            ) from None
    source = Path(module.__file__) if module.__file__ else (local or Path(f"{module_name}.py"))
    function = getattr(module, function_name, None)
    if not callable(function):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise DatasetError(
            Where(source),
            "verifier",
            f"the module has no function {function_name!r} (it defines: {', '.join(defined) or 'none'})",
            fix,
        )
    return function, source


def _import_file(path: Path, module_name: str, fix: str) -> ModuleType:
    name = f"evotui_dataset_verifier_{module_name.replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DatasetError(Where(path), "verifier", "cannot be imported as a Python module", fix)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered before it runs, as a normal import is
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise DatasetError(Where(path, exc.lineno), "verifier", f"syntax error: {exc.msg}", "fix the syntax") from None
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise DatasetError(
            Where(path, _line_in(exc, path)), "verifier", f"importing it raised {type(exc).__name__}: {exc}", fix
        ) from exc
    return module


def _line_in(exc: BaseException, path: Path) -> int | None:
    """The line of the innermost traceback frame in `path`."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    return frames[-1].lineno if frames else None


def _math_timeout() -> int | None:
    # signal.alarm, which math-verify times out with, can only be set from the main thread;
    # elsewhere (a reward thread, the API server) it would raise, so it runs without a limit.
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _math_parse(text: str) -> list[Any]:
    from math_verify import parse

    # None turns the timeout off (math-verify documents it for threads).
    return list(parse(text, parsing_timeout=_math_timeout()))  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4096)
def _math_gold(reference: str) -> tuple[Any, ...]:
    """The parsed reference; one that does not parse as it is is tried as LaTeX (`$...$`).
    Only the reference: wrapped, any words parse (as a product of symbols), so a completion's
    answer is parsed as written and one without math is no answer (format 0)."""
    parsed = _math_parse(reference)
    if not parsed and "$" not in reference:
        parsed = _math_parse(f"${reference}$")
    return tuple(parsed)


# -- the domain -------------------------------------------------------------------------------------
class DatasetDomain:
    """Tasks from the user's files (`DatasetDomainConfig`), judged by the configured verifier.

    Reading and checking the data happens here, at construction: a bad file raises DatasetError
    before anything trains. `root` is the workspace (where a python verifier's module lives)."""

    name = "dataset"
    #: Every row has a reference answer: the verifier audit re-checks accepted answers.
    AUDITED = True

    def __init__(self, config: DatasetDomainConfig, root: Path | None = None):
        self.config = config
        #: One right answer per task up to the canonical key (`engine.domains.audit.answer_key`)
        #: for the exact verifier and a numeric one at the default tolerance (1e-6, relative); the
        #: others accept answers whose keys differ (`\\frac{1}{2}` and `0.5`, two numbers within a
        #: wider tolerance, any string a pattern matches, whatever a python function accepts).
        self.one_answer = config.verifier == "exact" or (config.verifier == "numeric" and config.tolerance <= 1e-6)
        #: The system message of chat-template policies.
        self.system_prompt: str = config.system_prompt
        self._pattern = re.compile(config.answer_pattern) if config.answer_pattern is not None else None
        self._python: tuple[PythonVerifier, Path] | None = None
        if config.verifier.startswith("python:"):
            self._python = load_python_verifier(config.verifier, root)
        splits = load_splits(config)
        self._tasks: dict[str, list[Task]] = {
            split: [Task(self._task_id(split, row), row.prompt, row.answer, row.subset) for row in rows]
            for split, rows in splits.items()
        }
        self._rows = {self._task_id(split, row): row for split, rows in splits.items() for row in rows}
        used = [self.system_prompt]
        for row in self._rows.values():
            used += [row.prompt, row.answer, row.completion or ""]
        #: Every character of the prompts, answers, reference completions and system prompt.
        self.alphabet = "".join(sorted(set("".join(used))))
        #: How the verifier judges a completion (cached: every reward component and is_correct ask).
        self.judge: Callable[[Task, str], Judgement] = functools.lru_cache(maxsize=JUDGEMENT_CACHE)(self._judge)
        self._rewards = reward_functions(
            self.name, {"correctness": self._correctness, "format": self._format, "closeness": self._closeness}
        )
        if self._python is not None:  # a broken function fails now, not in the first reward step
            first = self._tasks["train"][0]
            self.judge(first, self.reference_completion(first) or first.answer)

    @staticmethod
    def _task_id(split: str, row: _Row) -> str:
        return row.row_id if row.row_id is not None else f"{split}-{row.where.line}"

    def tasks(self, split: str) -> Sequence[Task]:
        if split not in self._tasks:
            raise KeyError(f"unknown split {split!r}; the dataset domain has {', '.join(SPLITS)}")
        return self._tasks[split]

    def reference_completion(self, task: Task) -> str | None:
        """The row's reference completion (`completion_field`), None when none is configured."""
        row = self._rows.get(task.task_id)
        if row is None:
            raise KeyError(f"task {task.task_id!r} is not a task of this dataset")
        return row.completion

    def demonstration(self, task: Task, rng: random.Random | None = None) -> str:
        """The row's reference completion: the warm-up trains on the user's own solutions."""
        completion = self.reference_completion(task)
        if completion is None:
            raise DatasetError(
                self._where(task),
                "completion_field",
                "a demonstration was asked for (a warm-up), but no completion_field is configured",
                f"set completion_field = '<the field of worked solutions>' {_CONFIG_HINT}, or train without a warm-up",
            )
        return completion

    def _where(self, task: Task) -> Where:
        row = self._rows.get(task.task_id)
        return row.where if row is not None else Where(self.config.file or self.config.train or Path())

    def is_correct(self, task: Task, completion: str) -> bool:
        return self.judge(task, completion).correct

    @property
    def reward_components(self) -> dict[str, RewardFn]:
        return dict(self._rewards)

    def _correctness(self, task: Task, completion: str) -> float:
        """Binary: 1.0 when the verifier accepts the answer."""
        return 1.0 if self.judge(task, completion).correct else 0.0

    def _format(self, task: Task, completion: str) -> float:
        """1.0 when an answer can be extracted from the completion (numeric: a number; math: an
        expression math-verify parses)."""
        return 1.0 if self.judge(task, completion).formatted else 0.0

    def _closeness(self, task: Task, completion: str) -> float:
        """Continuous in [0, 1]: numeric falls linearly from 1 at the reference to 0 at 10%
        relative error; a python verifier's float; otherwise equal to correctness."""
        return self.judge(task, completion).closeness

    # -- judging --------------------------------------------------------------------------------
    def _judge(self, task: Task, completion: str) -> Judgement:
        verifier = self.config.verifier
        answer = extract_answer(completion, verifier, self._pattern)
        if self._python is not None:
            return self._judge_python(task, completion, answer)
        if answer is None:
            return Judgement(None, False, False, 0.0)
        if verifier == "numeric":
            value, reference = last_number(answer), parse_number(task.answer)
            assert reference is not None  # checked when the rows were read
            if value is None:
                return Judgement(answer, False, False, 0.0)
            error = abs(value - reference) / max(1.0, abs(reference))
            correct = error <= self.config.tolerance
            return Judgement(answer, True, correct, 1.0 if correct else max(0.0, 1.0 - error / CLOSENESS_SPAN))
        if verifier == "math":
            return self._judge_math(task, answer)
        if verifier == "regex":
            correct = re.fullmatch(task.answer.strip(), answer.strip()) is not None
        else:
            correct = answer.strip() == task.answer.strip()
        return Judgement(answer, True, correct, float(correct))

    def _judge_math(self, task: Task, answer: str) -> Judgement:
        from math_verify import verify

        parsed = _math_parse(answer)
        if not parsed:
            return Judgement(answer, False, False, 0.0)
        gold = _math_gold(task.answer)
        if not gold:
            raise DatasetError(
                self._where(task),
                self.config.answer_field,
                f"math-verify cannot parse the reference answer {task.answer!r}",
                "write it as LaTeX ($\\frac{1}{2}$) or a plain number, or choose verifier = 'exact'",
            )
        correct = bool(verify(list(gold), parsed, timeout_seconds=_math_timeout()))
        return Judgement(answer, True, correct, float(correct))

    def _judge_python(self, task: Task, completion: str, answer: str | None) -> Judgement:
        assert self._python is not None
        function, source = self._python
        fix = "make it return True/False or a float in [0, 1] for any completion, also an empty one"
        try:
            value = function(completion, task.answer)
        except Exception as exc:
            raise DatasetError(
                Where(source, _line_in(exc, source)),
                "verifier",
                f"the verifier raised {type(exc).__name__}: {exc} on task {task.task_id!r}",
                fix,
            ) from exc
        if isinstance(value, bool):
            return Judgement(answer, answer is not None, value, float(value))
        if isinstance(value, int | float) and math.isfinite(value) and 0.0 <= value <= 1.0:
            return Judgement(answer, answer is not None, value >= 1.0, float(value))
        raise DatasetError(Where(source), "verifier", f"the verifier returned {value!r} on task {task.task_id!r}", fix)
