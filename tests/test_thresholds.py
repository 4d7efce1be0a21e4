"""The harness's one table of thresholds: every line is written once, in `engine.harness.thresholds`,
and an analyzer's severity and a rule's firing on the same metric agree at that line."""

from __future__ import annotations

import ast
import inspect
import json
import re
from importlib.util import find_spec
from pathlib import Path

import pytest

import engine.harness.analyzers  # noqa: F401 - registers the built-in analyzers
import engine.harness.rules  # noqa: F401 - registers the built-in rules
from engine.config import parse_config
from engine.harness import thresholds
from engine.harness.base import BUILTIN_ANALYZERS, BUILTIN_RULES, Finding, Findings, severity_above, severity_below
from engine.harness.diagnose import diagnose
from engine.harness.thresholds import REWARD_MODE_SHARE, THRESHOLDS, Threshold
from engine.store import Store
from tests.harness_data import Rollout, RunBuilder, fired, severity

HARNESS = Path(thresholds.__file__).parent
ANALYZERS = {a.name: a.fn for a in BUILTIN_ANALYZERS if a.provenance == "built-in"}
RULES = {r.name: r.fn for r in BUILTIN_RULES if r.provenance == "built-in"}


# -- the table itself ---------------------------------------------------------------------------------
def test_each_entry_is_named_once_and_reachable_by_its_name() -> None:
    names = [t.name for t in THRESHOLDS]
    assert len(names) == len(set(names))
    for t in THRESHOLDS:
        assert getattr(thresholds, t.name.upper()) is t, f"{t.name}: the module constant is {t.name.upper()}"
        assert t.principle.strip() and t.readers, t.name
        if t.critical is not None:  # a critical line lies beyond the warning line
            assert t.crossed(t.critical), t.name


def test_quoted_values_are_the_values_where_they_are_defined() -> None:
    import importlib

    for t in THRESHOLDS:
        if t.defined_in == thresholds.__name__:
            continue
        module, _, attr = t.defined_in.rpartition(".")
        if module.endswith("CoachConfig"):  # a workspace setting: its default
            home = importlib.import_module(module.rpartition(".")[0]).CoachConfig.model_fields[attr].default
        else:
            home = getattr(importlib.import_module(module), attr)
        assert t.value == home, t.name


def test_the_table_grades_exactly_as_severity_above_and_below_did() -> None:
    # Analyzers graded with severity_above/below before the table: its strict lines are the same.
    for t in THRESHOLDS:
        if t.level != "warning" or t.op not in (">", "<"):
            continue
        old = severity_above if t.op == ">" else severity_below
        lines = [t.value, *([t.critical] if t.critical is not None else [])]
        for x in [None, *(line + d for line in lines for d in (-1e-9, 0.0, 1e-9)), -1e9, 1e9]:
            assert t.severity(x) == old(x, t.value, t.critical), (t.name, x)


# -- readers -------------------------------------------------------------------------------------------
def _reader_fn(reader: str):  # noqa: ANN202
    kind, _, name = reader.partition(":")
    return (ANALYZERS if kind == "analyzer" else RULES)[name]


def _module_level_code(fn) -> str:  # noqa: ANN001
    """The source of `fn`'s module outside every function (module-level SQL an analyzer runs)."""
    source = Path(inspect.getsourcefile(fn)).read_text()
    tree = ast.parse(source)
    kept = [node for node in tree.body if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    return "\n".join(ast.get_source_segment(source, node) or "" for node in kept)


def test_every_reader_exists_and_the_analyzers_and_rules_named_read_the_entry() -> None:
    for t in THRESHOLDS:
        constant = t.name.upper()
        for reader in t.readers:
            if reader.startswith(("analyzer:", "rule:")):
                fn = _reader_fn(reader)
                if t.defined_in == thresholds.__name__:
                    code = inspect.getsource(fn) + _module_level_code(fn)
                    # A rule may read the entry through the severity the analyzer graded with it.
                    graded = bool(t.metric) and f'"{t.metric}"' in code and re.search(r"\.severity\b|at_least\(", code)
                    assert re.search(rf"\b{constant}\b", code) or (reader.startswith("rule:") and graded), (
                        f"{reader} is listed as reading {constant} but reads neither it nor the severity of {t.metric}"
                    )
            else:
                assert find_spec(reader) is not None, f"{t.name}: no module {reader}"


def test_every_analyzer_and_rule_that_reads_an_entry_is_listed_as_its_reader() -> None:
    for kind, registry in (("analyzer", ANALYZERS), ("rule", RULES)):
        for name, fn in registry.items():
            source = inspect.getsource(fn)
            for t in THRESHOLDS:
                if re.search(rf"\b{t.name.upper()}\b", source):
                    assert f"{kind}:{name}" in t.readers, f"{kind} {name} reads {t.name.upper()}: list it as a reader"


# -- no stray literals ---------------------------------------------------------------------------------
#: Numbers a comparison in the harness may still write: 0 and 1 (sign, empty, boolean), and the few
#: that are structure, not a threshold, each with why.
ALLOWED = {0, 1}
ALLOWED_IN = {
    "cutoffs.py": {2: "a range needs two passes"},
    "analyzers/shift.py": {2: "a range needs two passes", 0.01: "display precision of a small share"},
    "analyzers/agreement.py": {2: "a paired test needs two tasks"},
    "analyzers/version.py": {4: "the width of an empty row, (None,) * 4"},
    "health.py": {2: "a reward flow within a run needs two evaluated steps"},
    "backtest.py": {0.5: "the AUC of chance", 1e-12: "float round-off of a tie"},
}
#: A comparison written in SQL inside a string: an operator, then a number.
SQL_COMPARISON = re.compile(r"(?:<=|>=|<>|!=|(?<![<>!=])[<>=])\s*(-?\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.])")


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    return None


def _numbers(node: ast.AST) -> list[tuple[float, int]]:
    """Numeric literals under `node`, skipping subscripts (`row[0]` is an index, not a line)."""
    out: list[tuple[float, int]] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if (x := _number(n)) is not None:
            out.append((x, n.lineno))
            continue
        for child in ast.iter_child_nodes(n):
            if isinstance(n, ast.Subscript) and child is n.slice:
                continue
            stack.append(child)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def stray_literals(source: str) -> list[tuple[int, float, str]]:
    """(line, number, where) of every numeric literal the harness compares or grades with: in a
    comparison, as an argument of `severity_above`/`severity_below`, as a finding's `threshold=`,
    or in a comparison written in an SQL string."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found: list[tuple[int, float, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            found += [(line, x, "comparison") for x, line in _numbers(node)]
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee in ("severity_above", "severity_below"):
                found += [(line, x, callee) for arg in node.args for x, line in _numbers(arg)]
            found += [
                (node.lineno, x, "threshold=")
                for kw in node.keywords
                if kw.arg == "threshold" and (x := _number(kw.value)) is not None
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [(node.lineno, float(m.group(1)), "SQL") for m in SQL_COMPARISON.finditer(node.value)]
    return sorted(found)


def test_the_scanner_finds_what_it_looks_for() -> None:
    source = '''
def f(x, ctx):
    """Docstrings may say (completion_length < 5)."""
    if x > 0.6 or x <= -0.1 or row[3] == 0:
        return Finding("m", x, severity_above(x, 0.8), threshold=0.8)
    return ctx.q(f"SELECT avg(c) >= 0.5 FROM t WHERE a = 1 AND b<>7")
'''
    assert sorted((x, where) for _, x, where in stray_literals(source)) == sorted(
        [
            (0, "comparison"),
            (0.6, "comparison"),
            (-0.1, "comparison"),
            (0.8, "severity_above"),
            (0.8, "threshold="),
            (0.5, "SQL"),
            (1, "SQL"),
            (7, "SQL"),
        ]
    )


def test_no_threshold_is_written_outside_the_table() -> None:
    lines = {v: t.name for t in THRESHOLDS for v in (t.value, t.critical) if v is not None}
    stray = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS).as_posix()
        if rel == "thresholds.py":
            continue
        allowed = ALLOWED_IN.get(rel, {})
        for line, x, where in stray_literals(path.read_text()):
            if x in ALLOWED or x in allowed:
                continue
            hint = f" (the table's {lines[x]}: read it from there)" if x in lines else ""
            stray.append(f"engine/harness/{rel}:{line}: {x:g} in a {where}{hint}")
    assert not stray, "numbers compared outside engine/harness/thresholds.py:\n" + "\n".join(stray)


# -- an analyzer's severity and a rule's firing agree --------------------------------------------------
#: For each (entry, rule) that shares a metric with an analyzer: the other findings that make the
#: rest of the rule's condition true, so that its firing turns on the entry's metric alone.
OTHERS: dict[tuple[str, str], dict[str, float]] = {
    ("dead_groups", "insufficient_signal"): {"signal.reward_mode_share": 0.95},
    ("reward_mode_share", "insufficient_signal"): {"signal.dead_group_ratio": 0.4},
    ("truncation", "truncation"): {},
    ("length_reward_corr", "length_gaming"): {"signal.length_trend": 2.0},
    ("entropy_ratio", "exploration_collapse"): {"behavior.completion_diversity_trend": -0.5},
    ("filter_keep_ratio", "over_filtering"): {},
    ("edit_failures", "poor_edit_quality"): {},
    ("self_test", "laziness"): {"score.train_correctness_trend": 0.0, "behavior.turns_mean": 10.0},
    ("turns_giving_up", "laziness"): {"score.train_correctness_trend": 0.0, "behavior.self_test_rate": 0.9},
    ("turns_echo_trap", "echo_trap"): {"behavior.turns_trend": 1.0},
    ("solution_diversity", "exploration_collapse"): {
        "signal.entropy_ratio": 0.3,
        "behavior.completion_diversity_trend": 0.0,
    },
    ("format_violations", "format_gate"): {},
}


def _shared() -> list[tuple[Threshold, str]]:
    """Entries that grade a finding (an analyzer reads them) and that a rule reads too."""
    out = []
    for t in THRESHOLDS:
        if t.op is None or t.level is None or not any(r.startswith("analyzer:") for r in t.readers):
            continue
        out += [(t, r.removeprefix("rule:")) for r in t.readers if r.startswith("rule:")]
    return out


def _by_metric(metric: str) -> Threshold | None:
    """The entry that grades `metric` in an analyzer (None: an info finding)."""
    graded = [t for t in THRESHOLDS if t.metric == metric and t.level is not None]
    return graded[0] if len(graded) == 1 else None


def test_every_shared_metric_has_a_case() -> None:
    assert {(t.name, rule) for t, rule in _shared()} == set(OTHERS)


@pytest.mark.parametrize(("entry", "rule"), _shared(), ids=lambda x: x.name if isinstance(x, Threshold) else x)
def test_an_analyzers_severity_and_the_rules_firing_agree_at_the_line(entry: Threshold, rule: str) -> None:
    lines = [entry.value, *([entry.critical] if entry.critical is not None else [])]
    for x in sorted({line + d for line in lines for d in (-1e-6, 0.0, 1e-6)}):
        graded = entry.severity(x)  # what the analyzer writes (it grades with the entry)
        findings = [Finding(entry.metric or "", x, graded, threshold=entry.value)]
        for metric, other in OTHERS[(entry.name, rule)].items():
            grader = _by_metric(metric)
            findings.append(Finding(metric, other, grader.severity(other) if grader else "info"))
        result = RULES[rule](Findings(findings), None)  # type: ignore[arg-type]
        assert (result is not None) == (graded != "info"), f"{entry.name} = {x}: {graded}, {rule} fired {result}"
        if result is not None and entry.name == "dead_groups":  # the rule's severity is the finding's
            assert result.severity == graded


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "evo.duckdb") as s:
        yield s


def test_reward_mode_share_warns_where_insufficient_signal_fires(store: Store) -> None:
    # Two dead groups (all 0) and two live ones, each 4 zeros and 4 distinct rewards: 24 of 32
    # rollouts share reward 0 (0.75: above the rule's 0.6, under the analyzer's former 0.8).
    live = [Rollout(reward=0.0)] * 4 + [Rollout(reward=r) for r in (0.2, 0.4, 0.6, 0.8)]
    d = RunBuilder(store).step(1, [[Rollout(reward=0.0)] * 8] * 2 + [live, live]).diagnose(steps=1)
    (mode,) = [f for f in d.findings if f.metric == "signal.reward_mode_share"]
    assert mode.value == pytest.approx(24 / 32) and mode.threshold == REWARD_MODE_SHARE.value
    assert mode.severity == "warning" and "insufficient_signal" in fired(d)


def test_consecutive_failures_are_graded_against_the_workspaces_coach_settings(store: Store) -> None:
    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    for name, parent in (("v1", "v0"), ("v2", "v1"), ("v3", "v2")):
        store.add_version(name, parent, f"versions/{name}", "x", state="rejected")
        store.update_version(name, verdict="regressed")
    b = RunBuilder(store, run_id="v3-train-1", version="v3").step(1, [[Rollout(reward=float(i % 2)) for i in range(8)]])
    b.save(steps=1)
    run, version = store.get_run("v3-train-1"), store.get_version("v3")
    assert run is not None and version is not None
    config = parse_config('[workspace]\nname = "t"\n[coach]\nescalate_after = 4\n', Path("t.toml"))
    (f,) = [f for f in diagnose(store, run, version, config, window=1).findings if f.metric.endswith("failures")]
    assert (f.value, f.severity, f.threshold) == (3.0, "warning", 2.0)  # critical from 4, as the coach escalates
    assert severity(b.diagnose_saved(), "version.consecutive_failures") == "critical"  # the default, 3


# -- the CLI ---------------------------------------------------------------------------------------
def test_report_prints_the_table() -> None:
    from typer.testing import CliRunner

    from evotui.cli import app

    runner = CliRunner()
    as_json = runner.invoke(app, ["report", "--thresholds", "--json"])
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.output)
    assert [r["name"] for r in rows] == [t.name for t in THRESHOLDS]
    mode = next(r for r in rows if r["name"] == "reward_mode_share")
    assert (mode["value"], mode["op"], mode["readers"]) == (
        0.6,
        ">",
        ["analyzer:reward_components", "rule:insufficient_signal"],
    )
    text = runner.invoke(app, ["report", "--thresholds"])
    assert text.exit_code == 0 and "reward_mode_share  > 0.6 warning" in text.output
    both = runner.invoke(app, ["report", ".", "v1", "--thresholds"])
    assert both.exit_code == 1 and "--thresholds prints the built-in table" in both.output
    neither = runner.invoke(app, ["report"])
    assert neither.exit_code == 1 and "report needs WORKSPACE and VERSION" in neither.output
