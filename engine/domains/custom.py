"""Custom domains: a workspace's own domain, written in Python in `<workspace>/domains/<module>.py`.

The file provides the `Domain` protocol of `engine.domains.base`, either as a module-level
``DOMAIN`` object or as a ``make_domain(seed, options)`` factory (which receives the
``[domain]`` section's ``seed`` and ``options``); see docs/custom_domains.md.

A custom domain is the user's own code and runs in the engine's process, like a config file
with functions in it; it is NOT sandboxed. Code that the POLICY writes is another matter: a
custom domain that executes completions must do it through `engine.sandbox`.

Loading validates the whole interface at once (import, attributes, types, a few sample calls
of every function) so a mistake surfaces when the workspace opens, not halfway through a run.
Every problem is a `CustomDomainError` that names the file and the line (from the traceback's
frames in that file, or from where the offending object is defined) and says what to do.
The loaded domain is wrapped (`CustomDomain`) so an exception in its functions during training
is reported the same way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import random
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.config import CustomDomainConfig
from engine.domains.base import Episode, RewardFn, Task, ToolCall

DOMAINS_DIR = "domains"
DOCS = "docs/custom_domains.md"
#: Tasks of each split on which demonstrations, verifier and rewards are tried at load time.
SAMPLE_TASKS = 3
_COMPONENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CustomDomainError(Exception):
    """A custom domain could not be loaded or one of its functions failed.

    `path` and `line` say where (line None when no line can be blamed); the message ends with
    what to do."""

    def __init__(self, path: Path, line: int | None, problem: str, fix: str):
        self.path = path
        self.line = line
        self.problem = problem
        self.fix = fix
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {problem}. {fix[:1].upper()}{fix[1:]}")


# -- locating problems in the user's file -----------------------------------------------------------
def _same_file(a: str, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


def _line_of_exception(exc: BaseException, path: Path) -> tuple[int | None, str]:
    """The line of the innermost frame in `path` (else in its folder), and where the exception
    itself was raised when that is somewhere else (a library the domain calls)."""
    if isinstance(exc, SyntaxError) and exc.filename and _same_file(exc.filename, path):
        return exc.lineno, ""
    frames = traceback.extract_tb(exc.__traceback__)
    in_file = [f for f in frames if _same_file(f.filename, path)]
    in_folder = [f for f in frames if _same_file(str(Path(f.filename).parent), path.parent)]
    line = in_file[-1].lineno if in_file else in_folder[-1].lineno if in_folder else None
    raised = ""
    if frames and not _same_file(frames[-1].filename, path):
        raised = f" (raised in {frames[-1].filename}:{frames[-1].lineno})"
    return line, raised


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def _user_code(path: Path, what: str, fix: str) -> Iterator[None]:
    """Run the user's code; an exception becomes a CustomDomainError at the line that raised."""
    try:
        yield
    except CustomDomainError:
        raise
    except (Exception, SystemExit) as exc:
        line, raised = _line_of_exception(exc, path)
        raise CustomDomainError(path, line, f"{what} raised {_describe(exc)}{raised}", fix) from exc


def _line_of_object(obj: Any, path: Path) -> int | None:
    """Where a function or class is defined, when that is in `path`."""
    target = obj.__func__ if inspect.ismethod(obj) else obj
    if not (inspect.isfunction(target) or inspect.isclass(target)):
        target = type(target)
    try:
        source_file = inspect.getsourcefile(target)
        if source_file is None or not _same_file(source_file, path):
            return None
        return inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return None


def _line_of_name(path: Path, name: str) -> int | None:
    """The first line that defines `name` (assignment, def or class): where to look when an
    attribute has the wrong type and there is no function to point at."""
    pattern = re.compile(rf"^\s*(?:def\s+{re.escape(name)}\b|class\s+{re.escape(name)}\b|{re.escape(name)}\s*[:=])")
    try:
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if pattern.match(text):
                return number
    except OSError:
        return None
    return None


# -- loading --------------------------------------------------------------------------------------
def domain_path(workspace_root: Path, config: CustomDomainConfig) -> Path:
    return Path(workspace_root) / DOMAINS_DIR / f"{config.module}.py"


def load_custom_domain(workspace_root: Path, config: CustomDomainConfig) -> CustomDomain:
    """Import `<workspace_root>/domains/<module>.py`, build its domain and validate it."""
    path = domain_path(workspace_root, config)
    if not path.is_file():
        folder = path.parent
        found = sorted(p.stem for p in folder.glob("*.py")) if folder.is_dir() else []
        hint = f"modules found there: {', '.join(found)}" if found else f"no .py file in {folder}"
        raise CustomDomainError(
            path,
            None,
            f"custom domain file not found ({hint})",
            f"create it (start from docs/examples/custom_domain.py) or fix [domain] module in workspace.toml; "
            f"see {DOCS}",
        )
    module = _import(path, config.module)
    domain = _build(module, path, config)
    _validate(domain, path)
    return CustomDomain(domain, path)


def _import(path: Path, stem: str) -> ModuleType:
    module_name = f"evotui_custom_domain_{stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CustomDomainError(path, None, "cannot be imported as a Python module", "name the file <module>.py")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as a normal import is: dataclasses and pickling look it up.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        line, _ = _line_of_exception(exc, path)
        raise CustomDomainError(path, line, f"syntax error: {exc.msg}", "fix the Python syntax there") from exc
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        line, raised = _line_of_exception(exc, path)
        raise CustomDomainError(
            path,
            line,
            f"importing the file raised {_describe(exc)}{raised}",
            "fix the module-level code there (a missing package? install it into the evotui environment)",
        ) from exc
    return module


def _build(module: ModuleType, path: Path, config: CustomDomainConfig) -> Any:
    factory = getattr(module, "make_domain", None)
    if factory is not None:
        if not callable(factory):
            raise CustomDomainError(
                path,
                _line_of_name(path, "make_domain"),
                "make_domain is not a function",
                "define def make_domain(seed, options)",
            )
        with _user_code(
            path, "make_domain(seed, options)", "make it return the domain object for any seed and options"
        ):
            domain = factory(config.seed, dict(config.options))
        if domain is None:
            raise CustomDomainError(
                path,
                _line_of_object(factory, path),
                "make_domain(seed, options) returned None",
                "return the domain object",
            )
        return domain
    if hasattr(module, "DOMAIN"):
        # A fixed object cannot take the seed or the options; silently ignoring them would make
        # two workspaces that differ only there train on the same tasks.
        given = sorted({"seed", "options"} & config.model_fields_set)
        if given and (config.options or "seed" in given):
            raise CustomDomainError(
                path,
                _line_of_name(path, "DOMAIN"),
                f"workspace.toml sets [domain] {' and '.join(given)}, but the module defines a fixed DOMAIN object",
                "define make_domain(seed, options) instead, or remove them from workspace.toml",
            )
        return module.DOMAIN
    raise CustomDomainError(
        path,
        None,
        "defines neither DOMAIN nor make_domain",
        f"add a module-level DOMAIN = YourDomain() or def make_domain(seed, options); see {DOCS}",
    )


# -- validation -------------------------------------------------------------------------------------
def _attribute(domain: Any, path: Path, name: str, what: str) -> Any:
    if not hasattr(domain, name):
        raise CustomDomainError(
            path,
            _line_of_object(domain, path),
            f"the domain has no attribute {name!r}",
            f"add {what}; see the Domain protocol in {DOCS}",
        )
    with _user_code(path, f"reading domain.{name}", "make the attribute readable"):
        return getattr(domain, name)


def _wrong(domain: Any, path: Path, name: str, problem: str, fix: str) -> CustomDomainError:
    return CustomDomainError(path, _line_of_name(path, name) or _line_of_object(domain, path), problem, fix)


def _validate(domain: Any, path: Path) -> None:
    """Check the whole Domain protocol on real calls; the first problem is raised."""
    name = _attribute(domain, path, "name", "name = 'my-domain'")
    if not isinstance(name, str) or not name:
        raise _wrong(
            domain, path, "name", f"domain.name must be a non-empty string, got {name!r}", "set name = 'my-domain'"
        )
    alphabet = _attribute(domain, path, "alphabet", "alphabet = '<every character of prompts and completions>'")
    if not isinstance(alphabet, str) or not alphabet:
        raise _wrong(
            domain,
            path,
            "alphabet",
            f"domain.alphabet must be a non-empty string, got {type(alphabet).__name__}",
            "set it to every character of prompts and completions",
        )
    for method in ("tasks", "demonstration", "is_correct"):
        if not callable(getattr(domain, method, None)):
            raise CustomDomainError(
                path, _line_of_object(domain, path), f"the domain has no method {method}()", f"add it; see {DOCS}"
            )

    splits = {split: _validated_tasks(domain, path, split) for split in ("train", "val")}
    if offers_test(domain):  # optional: a held-out split only reports read
        splits["test"] = _validated_tasks(domain, path, "test")
    ids: dict[str, str] = {}
    for split, tasks in splits.items():
        for task in tasks:
            if task.task_id in ids:
                raise _wrong(
                    domain,
                    path,
                    "tasks",
                    f"task id {task.task_id!r} appears twice ({ids[task.task_id]} and {split})",
                    "give every task of both splits its own id, e.g. f'{split}-{i:05d}'",
                )
            ids[task.task_id] = split
    for held_out in ("val", "test"):
        if held_out in splits and {t.prompt for t in splits["train"]} & {t.prompt for t in splits[held_out]}:
            raise _wrong(
                domain,
                path,
                "tasks",
                f"some {held_out} prompts also appear in train, so {held_out} is not held out",
                f"draw {held_out} first and skip its prompts when drawing train",
            )
    if "test" in splits and {t.prompt for t in splits["val"]} & {t.prompt for t in splits["test"]}:
        raise _wrong(
            domain,
            path,
            "tasks",
            "some test prompts also appear in val, so test is not apart from what decides",
            "draw test after val and skip val's prompts",
        )

    samples = [*splits["train"][:SAMPLE_TASKS], *splits["val"][:SAMPLE_TASKS]]
    demonstrations = [(task, _validated_demonstration(domain, path, task)) for task in samples]
    used = set().union(
        *(set(t.prompt) for tasks in splits.values() for t in tasks), *(set(d) for _, d in demonstrations)
    )
    missing = sorted(used - set(alphabet))
    if missing:
        raise _wrong(
            domain,
            path,
            "alphabet",
            f"domain.alphabet lacks {''.join(missing)!r}, used in prompts or demonstrations "
            "(the embedded policy's tokenizer would not know them)",
            "add them to alphabet",
        )
    for task, demonstration in demonstrations:
        with _user_code(path, f"is_correct() on task {task.task_id!r}", "make it return a bool for any completion"):
            verdicts = [domain.is_correct(task, demonstration), domain.is_correct(task, "")]
        for verdict in verdicts:
            if not isinstance(verdict, bool | int) or verdict not in (0, 1):
                raise CustomDomainError(
                    path,
                    _line_of_object(domain.is_correct, path),
                    f"is_correct() returned {verdict!r} on task {task.task_id!r}",
                    "return True or False",
                )
    _validate_components(domain, path, demonstrations)
    if hasattr(domain, "behavior"):
        _validate_behavior(domain, path, demonstrations)
    if hasattr(domain, "environment"):
        _validate_environment(domain, path, samples)


def offers_test(domain: Any) -> bool:
    """Whether a custom domain has a test split (optional): it says so with a `splits` attribute
    that names "test" (a domain written before test existed may answer any split name)."""
    return "test" in (getattr(domain, "splits", None) or ())


def _validated_tasks(domain: Any, path: Path, split: str) -> Sequence[Task]:
    with _user_code(path, f"tasks({split!r})", "make tasks('train') and tasks('val') return lists of Task"):
        tasks = domain.tasks(split)
    line = _line_of_object(domain.tasks, path)
    if not isinstance(tasks, Sequence) or isinstance(tasks, str):
        raise CustomDomainError(
            path, line, f"tasks({split!r}) returned {type(tasks).__name__}, not a list", "return a list of Task"
        )
    if not tasks:
        raise CustomDomainError(path, line, f"tasks({split!r}) is empty", "generate at least one task per split")
    for task in tasks:
        if not isinstance(task, Task):
            raise CustomDomainError(
                path,
                line,
                f"tasks({split!r}) holds a {type(task).__name__}, not a Task",
                "build tasks with `from engine.domains.base import Task`: Task(task_id, prompt, answer, subset)",
            )
        fields = (task.task_id, task.prompt, task.answer, task.subset)
        if not all(isinstance(v, str) for v in fields) or not task.task_id or not task.prompt:
            raise CustomDomainError(
                path,
                line,
                f"task {task.task_id!r} of {split!r} has a non-string or empty field",
                "task_id, prompt, answer and subset are strings; task_id and prompt are not empty",
            )
    return tasks


def _validated_demonstration(domain: Any, path: Path, task: Task) -> str:
    fix = "make demonstration(task, rng=None) return the completion text for every task"
    with _user_code(path, f"demonstration() on task {task.task_id!r}", fix):
        outputs = [domain.demonstration(task, random.Random(0)), domain.demonstration(task)]
    for output in outputs:
        if not isinstance(output, str):
            raise CustomDomainError(
                path,
                _line_of_object(domain.demonstration, path),
                f"demonstration() returned {type(output).__name__} on task {task.task_id!r}",
                "return the completion as a string",
            )
    return outputs[0]


def _validate_components(domain: Any, path: Path, demonstrations: list[tuple[Task, str]]) -> None:
    components = _attribute(domain, path, "reward_components", "a reward_components dict: name -> fn(task, completion)")
    if not isinstance(components, dict) or not components:
        raise _wrong(
            domain,
            path,
            "reward_components",
            f"reward_components must be a non-empty dict, got {type(components).__name__}",
            "map each component name to a function (task, completion) -> float",
        )
    for name, fn in components.items():
        if not isinstance(name, str) or not _COMPONENT_NAME.match(name):
            raise _wrong(
                domain,
                path,
                "reward_components",
                f"reward component name {name!r} is not an identifier",
                "use letters, digits and underscores (it becomes a key of [recipe.rewards])",
            )
        if not callable(fn):
            raise _wrong(
                domain,
                path,
                "reward_components",
                f"reward component {name!r} is not callable",
                "map it to a function (task, completion) -> float",
            )
        for task, demonstration in demonstrations:
            for completion in (demonstration, ""):
                with _user_code(
                    path,
                    f"reward component {name!r} on task {task.task_id!r} (completion {completion[:40]!r})",
                    "make it return a float for every completion, also an empty or malformed one",
                ):
                    value = fn(task, completion)
                if not isinstance(value, int | float) or not math.isfinite(value):
                    raise CustomDomainError(
                        path,
                        _line_of_object(fn, path),
                        f"reward component {name!r} returned {value!r} on task {task.task_id!r}",
                        "return a finite float (0.0 is the floor, 1.0 a full score)",
                    )


def _validate_behavior(domain: Any, path: Path, demonstrations: list[tuple[Task, str]]) -> None:
    behavior = domain.behavior
    if not callable(behavior):
        raise _wrong(domain, path, "behavior", "domain.behavior is not callable", "define behavior(task, completion)")
    for task, demonstration in demonstrations:
        with _user_code(path, f"behavior() on task {task.task_id!r}", "make it return a list of ToolCall"):
            calls = behavior(task, demonstration)
        if not isinstance(calls, list) or not all(isinstance(c, ToolCall) for c in calls):
            raise CustomDomainError(
                path,
                _line_of_object(behavior, path),
                f"behavior() returned {type(calls).__name__} on task {task.task_id!r}, not a list of ToolCall",
                "return [ToolCall(turn, tool, args, ok), ...] (`from engine.domains.base import ToolCall`)",
            )


def _validate_environment(domain: Any, path: Path, samples: list[Task]) -> None:
    """An agentic custom domain: its protocol attributes, then one scripted episode played
    through a fresh environment and scored, so every episode reward runs once."""
    if not callable(domain.environment):
        raise _wrong(
            domain,
            path,
            "environment",
            "domain.environment is not callable",
            "define environment(task, *, clean=False)",
        )
    max_turns = _attribute(domain, path, "max_turns", "max_turns = <the most actions an episode may take>")
    if not isinstance(max_turns, int) or max_turns < 1:
        raise _wrong(domain, path, "max_turns", f"max_turns must be a positive int, got {max_turns!r}", "set max_turns")
    rewards = _attribute(domain, path, "episode_rewards", "an episode_rewards dict: name -> fn(episode)")
    if not isinstance(rewards, dict) or not rewards or not all(callable(f) for f in rewards.values()):
        raise _wrong(
            domain,
            path,
            "episode_rewards",
            "episode_rewards must be a non-empty dict of functions (episode) -> float",
            "map each component name to a function of an Episode",
        )
    for method in ("demonstration_episode", "vocabulary"):
        if not callable(getattr(domain, method, None)):
            raise CustomDomainError(
                path, _line_of_object(domain, path), f"an agentic domain needs {method}()", f"add it; see {DOCS}"
            )
    with _user_code(path, "vocabulary()", "return the list of words of the word-level tokenizer"):
        vocabulary = domain.vocabulary()
    if not isinstance(vocabulary, list) or not all(isinstance(w, str) for w in vocabulary):
        raise CustomDomainError(
            path, _line_of_object(domain.vocabulary, path), "vocabulary() must return a list of strings", "fix it"
        )
    task = samples[0]
    with _user_code(path, f"playing the demonstration episode of task {task.task_id!r}", "fix the environment"):
        steps = domain.demonstration_episode(task, random.Random(0))
        environment = domain.environment(task)
        episode = Episode(task=task)
        for action, _ in steps[:max_turns]:
            result = environment.step(action)
            episode.actions.append(action)
            episode.observations.append(result.observation)
            episode.calls.append(result.call)
            if result.done:
                episode.submitted = True
                break
        environment.finish(episode)
    for name, fn in rewards.items():
        with _user_code(path, f"episode reward {name!r}", "make it return a float for any episode"):
            value = fn(episode)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise CustomDomainError(
                path, _line_of_object(fn, path), f"episode reward {name!r} returned {value!r}", "return a finite float"
            )


# -- the loaded domain ------------------------------------------------------------------------------
class CustomDomain:
    """A validated custom domain. Delegates to the user's object; an exception in its functions
    (during training too) becomes a CustomDomainError naming the file and line.

    `source` and `source_digest` identify the code a version trained with: the file can change
    between versions, which makes two versions' scores incomparable.
    """

    #: Tasks whose `answer` is set are audited (`engine.domains.audit`); the user's object may
    #: define its own `audit(task, completion)`, which passes through.
    AUDITED = True
    #: Accepted answers to one task are compared for agreement (`engine.domains.audit`) unless the
    #: user's object says its tasks have many right answers (`one_answer = False`, passed through).
    ONE_ANSWER = True

    def __init__(self, inner: Any, source: Path):
        self.inner = inner
        self.source = source
        self.source_digest = hashlib.sha256(source.read_bytes()).hexdigest()
        self.name: str = inner.name
        self.alphabet: str = inner.alphabet
        self.has_test = offers_test(inner)

    def tasks(self, split: str) -> Sequence[Task]:
        if split == "test" and not self.has_test:
            return []
        with _user_code(self.source, f"tasks({split!r})", "fix the task generator"):
            return self.inner.tasks(split)

    def demonstration(self, task: Task, rng: random.Random | None = None) -> str:
        with _user_code(self.source, f"demonstration() on task {task.task_id!r}", "fix the demonstration"):
            return self.inner.demonstration(task, rng)

    def is_correct(self, task: Task, completion: str) -> bool:
        with _user_code(self.source, f"is_correct() on task {task.task_id!r}", "fix the verifier"):
            return bool(self.inner.is_correct(task, completion))

    @property
    def reward_components(self) -> dict[str, RewardFn]:
        return {name: self._located(name, fn) for name, fn in self.inner.reward_components.items()}

    def _located(self, name: str, fn: Callable[[Task, str], float]) -> RewardFn:
        def component(task: Task, completion: str) -> float:
            with _user_code(
                self.source,
                f"reward component {name!r} on task {task.task_id!r}",
                "make it return a float for every completion",
            ):
                return float(fn(task, completion))

        component.__name__ = name
        component.__doc__ = fn.__doc__
        return component

    def __getattr__(self, attribute: str) -> Any:
        # The optional parts (behavior, environment, episode_rewards, ...) pass straight through,
        # so `is_agentic` and friends see what the user's object has.
        if attribute.startswith("__") or "inner" not in self.__dict__:
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)

    def __repr__(self) -> str:
        return f"CustomDomain({self.name!r} from {self.source})"
