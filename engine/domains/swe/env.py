"""The SWE environment: one action line in, one observation line out, tests run in the sandbox.

Protocol (one action per line; each observation is one line ending in the prompt marker
``\\n>``, so the next action follows it directly):

    search NAME              -> search: calc.py:2 test_calc.py:2      (word matches, file:line)
    read FILE                -> read: from util import * | def add(a, b): return a - b
    edit FILE: OLD => NEW    -> edit: ok | edit: no match | edit: 2 matches | edit: no file x.py
    test                     -> test: 1 of 2 passed, fail add(3, 4) = -1 want 7
    git log                  -> log: 151 fix add | 122 add half | 108 init        (newest first)
    git show ID              -> show: 151 fix add: calc.py: a - b => a + b
    git show                 -> the newest commit, as git shows HEAD
    submit                   -> (episode over; the hidden tests decide success)
    anything else            -> invalid action

Leading and trailing whitespace of an action is ignored (the rubric judge scores it); the
action's trailing newline is the token the rollout loop stops generation at.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.domains.base import Environment, Episode, StepResult, Task, ToolCall
from engine.domains.swe.repos import HIDDEN_TEST_FILE, TEST_FILE, Commit, Repo
from engine.sandbox import Limits, get_sandbox

PROMPT_MARKER = "\n>"
MAX_SEARCH_HITS = 4
#: A run takes ~20 ms; tighter limits than the sandbox's defaults keep an endless loop written by
#: the policy from stalling a whole GRPO step.
TEST_LIMITS = Limits(wall_seconds=2.0, cpu_seconds=1.0, memory_mb=128)

_ACTIONS = (
    ("search", re.compile(r"search (\S+)")),
    ("read", re.compile(r"read (\S+)")),
    ("edit", re.compile(r"edit (\S+): (.+?) =>(?: (.*))?")),
    ("test", re.compile(r"test")),
    ("git_log", re.compile(r"git log")),
    ("git_show", re.compile(r"git show(?: (\S+))?")),
    ("submit", re.compile(r"submit")),
)


def parse_action(line: str) -> tuple[str, str, tuple[str, ...]]:
    """The tool of one action line (whitespace around it ignored), its argument text as the trace
    records it (the line after the verb), and its parsed arguments; the tool is ``invalid`` when
    the line follows none of the formats."""
    text = line.strip()
    for tool, pattern in _ACTIONS:
        match = pattern.fullmatch(text)
        if match:
            verb = tool.replace("_", " ")
            return tool, text.removeprefix(verb).strip(), tuple(group or "" for group in match.groups())
    return "invalid", text, (text,)


# The runner executes a test file inside the sandbox and prints one line: the pass counts and the
# first failure with the value the call returned. The nonce marks the runner's own line, so a
# policy's code that prints a fake result line is not believed (it would have to dig the nonce
# out of the runner's frame, which a policy does not stumble upon).
_RUNNER = """\
import ast, os, sys
sys.dont_write_bytecode = True
sys.path.insert(0, os.getcwd())
NAME, NONCE = {name!r}, {nonce!r}
source = open(NAME).read()
scope = {{"__name__": "tests"}}
try:
    exec(compile(source, NAME, "exec"), scope)
except BaseException as error:
    where = os.path.basename(getattr(error, "filename", None) or "")
    print(NONCE, "error", type(error).__name__, where, flush=True)
    raise SystemExit(0)
passed = total = 0
fail = ""
for node in ast.parse(source).body:
    if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
        continue
    total += 1
    try:
        scope[node.name]()
        passed += 1
    except BaseException as error:
        if fail:
            continue
        fail = "fail " + node.name
        check = node.body[0].test if len(node.body) == 1 and isinstance(node.body[0], ast.Assert) else None
        if isinstance(check, ast.Compare) and len(check.comparators) == 1:
            call = ast.get_source_segment(source, check.left)
            want = ast.get_source_segment(source, check.comparators[0])
            try:
                fail = "fail %s = %r want %s" % (call, eval(call, scope), want)
            except BaseException as error:
                fail = "fail %s raised %s" % (call, type(error).__name__)
print(NONCE, "result", passed, total, fail, flush=True)
"""


@dataclass(frozen=True)
class TestReport:
    """What one run of a test file found."""

    passed: int
    total: int
    #: One line for the observation: the first failure, an import error, or why nothing ran.
    detail: str
    #: The runner printed its result (False: the sandbox stopped it, or the code killed it).
    ran: bool

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


class ReportFile:
    """Test reports kept across processes in one SQLite file (a workspace's): a version's worker
    starts with what the workers before it ran, where the in-process cache starts empty. Keyed
    by a hash of the runner, its limits, the test file's name and every file's contents. Best
    effort: an error reading or writing the file is a miss, never a failed test run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._pid = 0

    def _connection(self) -> sqlite3.Connection:
        # A connection never crosses a fork: a forked worker opens its own.
        if self._db is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            # A cache: no fsync a report (a file lost to a crash is a miss), and no WAL side
            # files, so that copying a workspace between runs copies one consistent file.
            db.execute("PRAGMA synchronous=OFF")
            db.execute("CREATE TABLE IF NOT EXISTS reports (key TEXT PRIMARY KEY, passed INT, total INT, detail TEXT)")
            self._db, self._pid = db, os.getpid()
        return self._db

    #: The runner and its limits, hashed once: a report is only as valid as the code that made it.
    _SALT = hashlib.sha256(json.dumps([_RUNNER, asdict(TEST_LIMITS)]).encode()).digest()

    @classmethod
    def key(cls, files: dict[str, str], test_file: str) -> str:
        text = json.dumps([test_file, sorted(files.items())])
        return hashlib.sha256(cls._SALT + text.encode()).hexdigest()

    def get(self, key: str) -> TestReport | None:
        try:
            query = "SELECT passed, total, detail FROM reports WHERE key = ?"
            row = self._connection().execute(query, [key]).fetchone()
        except (sqlite3.Error, OSError):
            return None
        return None if row is None else TestReport(row[0], row[1], row[2], ran=True)

    def put(self, key: str, report: TestReport) -> None:
        try:
            self._connection().execute(
                "INSERT OR IGNORE INTO reports VALUES (?, ?, ?, ?)", [key, report.passed, report.total, report.detail]
            )
        except (sqlite3.Error, OSError):
            pass


class TestRunner:
    """Runs test files against a repository's files in the sandbox, one sandbox call per run.

    Reports are cached by the files' contents: the code is deterministic, and the 8 samples of a
    GRPO group (and the warm-up's passes over the same tasks) often test identical code. Runs the
    sandbox refused or stopped are not cached, so a busy machine's time-out is not remembered.
    With a `ReportFile`, the reports of runs that ended cleanly are also kept there, for the next
    process (a later version's evaluation tests much the same edits of the same val tasks).
    """

    def __init__(self, cache_size: int = 65536, reports: ReportFile | None = None) -> None:
        self._cache: OrderedDict[tuple[tuple[str, str], ...], TestReport] = OrderedDict()
        self._cache_size = cache_size
        self.reports = reports

    def run(self, files: dict[str, str], test_file: str) -> TestReport:
        key = (("", test_file), *sorted(files.items()))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        stored = self.reports.key(files, test_file) if self.reports else ""
        report = self.reports.get(stored) if self.reports else None
        if report is None:
            report, settled = self._run(files, test_file)
            if settled and self.reports:
                self.reports.put(stored, report)
        if report.ran:
            self._cache[key] = report
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return report

    @staticmethod
    def _run(files: dict[str, str], test_file: str) -> tuple[TestReport, bool]:
        """The report, and whether the run ended cleanly (exit 0, no limit hit): only such a
        report is kept in the report file."""
        nonce = secrets.token_hex(8)
        code = _RUNNER.format(name=test_file, nonce=nonce)
        result = get_sandbox().run_python(code, files=files, limits=TEST_LIMITS)
        lines = [line.split(" ", 2)[1:] for line in result.stdout.splitlines() if line.startswith(nonce + " ")]
        if not lines:
            return TestReport(0, 0, result.reason or f"exit {result.exit_code}", ran=False), False
        kind, rest = lines[-1] if len(lines[-1]) == 2 else (lines[-1][0], "")
        if kind == "error":
            return TestReport(0, 0, "error " + rest.strip(), ran=True), result.ok
        passed, total, *fail = rest.split(" ", 2)
        return TestReport(int(passed), int(total), fail[0].strip() if fail else "", ran=True), result.ok


class SweEnvironment(Environment):
    """One episode's repository: a private copy of the files, the history it shows, a turn count."""

    def __init__(self, repo: Repo, *, history: tuple[Commit, ...], max_turns: int, tests: TestRunner) -> None:
        self.repo = repo
        self.files = dict(repo.files)
        self.history = history
        self.max_turns = max_turns
        self.tests = tests
        self.turn = 0
        self.submitted = False
        self.done = False

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("this episode is over (submitted or out of turns); start a fresh environment")
        tool, args_text, args = parse_action(action)
        ok, result, files = getattr(self, f"_{tool}")(*args)
        call = ToolCall(self.turn, tool, args_text, ok, files, result)
        self.turn += 1
        self.done = tool == "submit" or self.turn >= self.max_turns
        # No observation once the episode is over: nothing follows it for the policy to read.
        return StepResult("" if self.done else result + PROMPT_MARKER, self.done, call)

    def finish(self, episode: Episode) -> None:
        """Success needs a submit and every hidden test passing. The hidden tests also run on the
        final code of an episode that never submitted: its pass fraction tells how close a
        truncated episode came (diagnostics), while its success stays False."""
        report = self.tests.run({**self.files, HIDDEN_TEST_FILE: self.repo.hidden_tests}, HIDDEN_TEST_FILE)
        episode.submitted = self.submitted
        episode.truncated = not self.submitted
        episode.pass_fraction = report.fraction
        episode.success = self.submitted and report.total > 0 and report.passed == report.total

    # -- tools: each returns (ok, result line, files it read or edited) ---------------------------
    def _search(self, name: str) -> tuple[bool, str, tuple[str, ...]]:
        word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")
        hits = [
            f"{file}:{number}"
            for file, text in self.files.items()
            for number, line in enumerate(text.splitlines(), 1)
            if word.search(line)
        ]
        if not hits:
            return False, "search: no match", ()
        return True, "search: " + " ".join(hits[:MAX_SEARCH_HITS]), ()

    def _read(self, file: str) -> tuple[bool, str, tuple[str, ...]]:
        if file not in self.files:
            return False, f"read: no file {file}", ()
        return True, "read: " + " | ".join(self.files[file].splitlines()), (file,)

    def _edit(self, file: str, old: str, new: str) -> tuple[bool, str, tuple[str, ...]]:
        if file not in self.files:
            return False, f"edit: no file {file}", ()
        count = self.files[file].count(old)
        if count != 1:
            return False, "edit: no match" if count == 0 else f"edit: {count} matches", ()
        self.files[file] = self.files[file].replace(old, new)
        return True, "edit: ok", (file,)

    def _test(self) -> tuple[bool, str, tuple[str, ...]]:
        report = self.tests.run(self.files, TEST_FILE)
        if not report.ran or report.total == 0:
            return report.ran, f"test: {report.detail or 'no tests'}", ()
        summary = f"test: {report.passed} of {report.total} passed"
        return True, f"{summary}, {report.detail}" if report.detail else summary, ()

    def _git_log(self) -> tuple[bool, str, tuple[str, ...]]:
        return True, "log: " + " | ".join(f"{c.commit_id} {c.message}" for c in reversed(self.history)), ()

    def _git_show(self, commit_id: str) -> tuple[bool, str, tuple[str, ...]]:
        for commit in reversed(self.history):
            if commit.commit_id == commit_id or not commit_id:
                return True, f"show: {commit.commit_id} {commit.message}: {commit.change}", ()
        return False, f"show: no commit {commit_id}", ()

    def _submit(self) -> tuple[bool, str, tuple[str, ...]]:
        self.submitted = True
        return True, "submitted", ()

    def _invalid(self, line: str) -> tuple[bool, str, tuple[str, ...]]:
        return False, "invalid action", ()


def replay(env: Environment, task: Task, actions: Iterable[str]) -> Episode:
    """Play action lines through an environment and finish the episode (stops at `done`)."""
    episode = Episode(task)
    for action in actions:
        result = env.step(action)
        episode.actions.append(action)
        episode.observations.append(result.observation)
        episode.calls.append(result.call)
        if result.done:
            break
    env.finish(episode)
    return episode
