"""Code domain: small Python functions judged by unit tests that run in the sandbox.

The prompt describes one function in a comment and opens a code block with its signature::

    # add 37 to x
    ```
    def f(x):

A well-formed completion writes the body and CLOSES the block (the format gate)::

        return x+37
    ```

The opening fence sits in the prompt so completions stay short (generation dominates step time
for the tiny embedded policy) and the format check is exactly DESIGN's "the code block must be
closed". Text after the closing fence is ignored. Code is compact (``x+37``, not ``x + 37``):
every character is a token of the character-level policy.

Ten templated families (`FAMILIES`), each with numeric parameters, give thousands of distinct
tasks that a sub-million-parameter model can learn: the constants of the comment are copied
into the body. Every task carries five unit tests chosen at the family's boundaries, so an
off-by-one constant or a wrong comparison fails some tests but not always all of them, and
`pass_fraction` is a real continuous signal.

What the policy writes is untrusted: all tests of one completion run in ONE sandbox execution
(`engine.sandbox`), through a small harness that prints a JSON list of per-test booleans. A
timeout or a blocked operation is a reward of 0 with the reason kept (`CodeDomain.verdict`,
`CodeDomain.last_failure`), never a crash. The harness guards the reward against casual tricks
(results must have the exact expected type, so an object whose ``__eq__`` always says yes
fails; the result line carries a per-run nonce) but not against code that inspects the
harness itself: the sandbox protects the machine, the harness layer watches the reward.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from engine.config import CodeDomainConfig
from engine.domains import reward_functions
from engine.domains.base import SPLITS, RewardFn, Task, draw_distinct, held_out_splits

FENCE = "```"
#: The verdict cache holds this many (task, completion) results: a GRPO batch scores each
#: completion with three components, and evaluation repeats greedy completions.
CACHE_SIZE = 4096

Params = tuple[int, ...]
Case = tuple[list[Any], Any]  # (arguments, expected result)


# -- task families ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One templated kind of task. `solution` and `flaws` are return expressions; `reference`
    computes the expected result in-process (trusted code), so test figures are derived, never
    written by hand; `inputs` picks arguments at the family's boundaries, where flaws show."""

    name: str
    signature: str
    draw: Callable[[random.Random], Params]
    describe: Callable[[Params], str]
    solution: Callable[[Params], str]
    flaws: Callable[[Params], list[str]]
    reference: Callable[[Params, list[Any]], Any]
    inputs: Callable[[Params, random.Random], list[list[Any]]]

    def cases(self, params: Params, rng: random.Random) -> list[Case]:
        return [(args, self.reference(params, args)) for args in self.inputs(params, rng)]


def _nonzero(rng: random.Random, lo: int, hi: int) -> int:
    """A constant where 0 would make a flaw harmless (`v>=0` adds nothing to a sum over `v>0`)."""
    while (value := rng.randint(lo, hi)) == 0:
        pass
    return value


def _span(rng: random.Random, lo: int, hi: int, min_width: int, max_width: int) -> Params:
    """An interval (start, end) with start in lo..hi and end - start in min_width..max_width."""
    start = rng.randint(lo, hi)
    return start, start + rng.randint(min_width, max_width)


def _shuffled(rng: random.Random, items: list[Any]) -> list[Any]:
    rng.shuffle(items)
    return items


def _clamp(p: Params, a: list[Any]) -> int:
    return min(max(a[0], p[0]), p[1])


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "add",
            "x",
            lambda r: (r.randint(1, 499),),
            lambda p: f"add {p[0]} to x",
            lambda p: f"x+{p[0]}",
            lambda p: [f"x+{p[0] + 1}", f"x+{p[0] - 1}"],
            lambda p, a: a[0] + p[0],
            lambda p, r: [[0], *([r.randint(-50, 99)] for _ in range(4))],
        ),
        Family(
            "gt",
            "x",
            lambda r: (r.randint(-99, 399),),
            lambda p: f"is x greater than {p[0]}",
            lambda p: f"x>{p[0]}",
            lambda p: [f"x>={p[0]}", f"x>{p[0] + 1}", f"x<{p[0]}"],
            lambda p, a: a[0] > p[0],
            lambda p, r: [[p[0] - r.randint(2, 20)], [p[0]], [p[0] + 1], [p[0] + r.randint(3, 30)], [p[0] - 1]],
        ),
        Family(
            "clamp",
            "x",
            lambda r: _span(r, -20, 60, 2, 40),
            lambda p: f"clamp x to {p[0]}..{p[1]}",
            lambda p: f"min(max(x,{p[0]}),{p[1]})",
            lambda p: [f"min(max(x,{p[0] + 1}),{p[1]})", f"min(max(x,{p[0]}),{p[1] - 1})", f"max(x,{p[0]})"],
            _clamp,
            lambda p, r: [[p[0] - r.randint(1, 9)], [p[0]], [r.randint(p[0] + 1, p[1] - 1)], [p[1]], [p[1] + 5]],
        ),
        Family(
            "sumgt",
            "xs",
            lambda r: (_nonzero(r, -99, 299),),
            lambda p: f"sum of items of xs above {p[0]}",
            lambda p: f"sum(v for v in xs if v>{p[0]})",
            lambda p: [f"sum(v for v in xs if v>={p[0]})", f"sum(v for v in xs if v>{p[0] + 1})"],
            lambda p, a: sum(v for v in a[0] if v > p[0]),
            lambda p, r: [
                [_shuffled(r, [p[0], p[0] + 1, p[0] + r.randint(2, 9), p[0] - r.randint(1, 9)])],
                *([[r.randint(p[0] - 5, p[0] + 9) for _ in range(r.randint(1, 5))]] for _ in range(3)),
                [[]],
            ],
        ),
        Family(
            "max3",
            "x,y",
            lambda r: (r.randint(-99, 399),),
            lambda p: f"max of x, y and {p[0]}",
            lambda p: f"max(x,y,{p[0]})",
            lambda p: [f"max(x,y,{p[0] + 1})", f"min(x,y,{p[0]})", "max(x,y)"],
            lambda p, a: max(a[0], a[1], p[0]),
            lambda p, r: [
                [p[0] - 3, p[0] - 8],
                [p[0] + 4, p[0] - 2],
                [p[0] - 5, p[0] + 7],
                [p[0] + r.randint(1, 9), p[0] + r.randint(1, 9)],
                [p[0] - r.randint(1, 9), p[0]],
            ],
        ),
        Family(
            "count",
            "xs",
            lambda r: (r.randint(0, 399),),
            lambda p: f"count items of xs equal to {p[0]}",
            lambda p: f"xs.count({p[0]})",
            lambda p: [f"xs.count({p[0] + 1})", f"xs.count({p[0] - 1})"],
            lambda p, a: a[0].count(p[0]),
            lambda p, r: [
                [_shuffled(r, [p[0], p[0], p[0] + 1, p[0] - 1, p[0] - 1, p[0] - 1])],
                *([[r.randint(p[0] - 1, p[0] + 1) for _ in range(r.randint(0, 5))]] for _ in range(3)),
                [[p[0]]],
            ],
        ),
        Family(
            "item",
            "xs",
            lambda r: (r.randint(-4, 3), r.randint(1, 99)),
            lambda p: f"item {p[0]} of xs plus {p[1]}",
            lambda p: f"xs[{p[0]}]+{p[1]}",
            lambda p: [f"xs[{p[0] + 1}]+{p[1]}", f"xs[{p[0] - 1}]+{p[1]}", f"xs[{p[0]}]+{p[1] + 1}"],
            lambda p, a: a[0][p[0]] + p[1],
            # Distinct items of at least 6, so every index from -5 to 4 exists and points elsewhere.
            lambda p, r: [[r.sample(range(-30, 90), r.randint(6, 8))] for _ in range(5)],
        ),
        Family(
            "dist",
            "x",
            lambda r: (r.randint(-99, 399),),
            lambda p: f"distance from x to {p[0]}",
            lambda p: f"abs(x-{p[0]})",
            lambda p: [f"abs(x-{p[0] + 1})", f"x-{p[0]}"],
            lambda p, a: abs(a[0] - p[0]),
            lambda p, r: [[p[0]], [p[0] - r.randint(1, 30)], [p[0] + r.randint(1, 30)], [p[0] - 1], [p[0] + 2]],
        ),
        Family(
            "between",
            "x",
            lambda r: _span(r, -50, 150, 1, 40),
            lambda p: f"is x in {p[0]}..{p[1]}",
            lambda p: f"{p[0]}<=x<={p[1]}",
            lambda p: [f"{p[0]}<x<={p[1]}", f"{p[0]}<=x<{p[1]}", f"{p[0]}<=x<={p[1] + 1}"],
            lambda p, a: p[0] <= a[0] <= p[1],
            lambda p, r: [[p[0] - 1], [p[0]], [r.randint(p[0], p[1])], [p[1]], [p[1] + 1]],
        ),
        Family(
            "linear",
            "x",
            lambda r: (r.randint(2, 9), _nonzero(r, -20, 99)),
            lambda p: f"{p[0]} times x plus {p[1]}",
            lambda p: f"{p[0]}*x+{p[1]}",
            lambda p: [f"{p[0]}*x+{p[1] + 1}", f"{p[0] + 1}*x+{p[1]}", f"{p[0]}*(x+{p[1]})"],
            lambda p, a: p[0] * a[0] + p[1],
            lambda p, r: [[0], [1], *([r.randint(-20, 40)] for _ in range(3))],
        ),
    ]
}


def prompt_for(family: Family, params: Params) -> str:
    return f"# {family.describe(params)}\n{FENCE}\ndef f({family.signature}):\n"


def body_for(expression: str) -> str:
    return f"    return {expression}\n"


# -- the format gate --------------------------------------------------------------------------------
def extract_body(completion: str) -> str | None:
    """The function body when the completion closes the code block, else None (format gate).

    The body is every line before the first line that is a fence; it must hold some code, so
    a bare fence is no shortcut to the format reward."""
    lines = completion.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == FENCE:
            body = "\n".join(lines[:i])
            return body if body.strip() else None
    return None


def is_closed(completion: str) -> bool:
    return extract_body(completion) is not None


# -- verdicts ---------------------------------------------------------------------------------------
class SandboxInfrastructureError(RuntimeError):
    """The sandbox itself failed twice on one completion: the code was not judged. Never a score
    of 0, which would read as a regression; the run fails with this error instead, and a version
    whose evaluation failed is not judged at all."""


@dataclass(frozen=True)
class CodeVerdict:
    """The outcome of one completion's tests.

    `reason`: "passed"; "failed" (ran, some tests wrong); "error" (the code raised or did not
    compile; `detail` has the first exception); "unclosed" (format gate: not run); "no_result"
    (the process ended without the harness's result, e.g. `os._exit`); or the sandbox's own
    reason for stopping the code ("timeout", "cpu", "memory", "violation", ...). A failure of the
    sandbox itself is no verdict: `SandboxInfrastructureError`.
    """

    format_ok: bool
    passed: tuple[bool, ...]
    reason: str
    detail: str = ""
    seconds: float = 0.0
    tier: str = ""

    @property
    def pass_fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)

    @property
    def failure(self) -> str | None:
        """Why not every test passed, as 'reason: detail' (what the recorder stores); None if all did."""
        if self.all_passed:
            return None
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


_HARNESS = """\
import json, os, sys


def _main():
    # Bound before the policy's code runs, so rebinding builtins there cannot fake a pass.
    write, dumps, same_type = os.write, json.dumps, type
    cases = json.loads(CASES)
    passed = [False] * len(cases)
    error = None
    fn = None
    namespace = {"__name__": "solution"}
    try:
        exec(compile(SOURCE, "solution.py", "exec"), namespace)
        fn = namespace["f"]
    except BaseException as exc:  # the policy's code: anything can happen, even SystemExit
        error = same_type(exc).__name__ + ": " + str(exc)[:200]
    if fn is not None:
        for i, (args, want) in enumerate(cases):
            try:
                got = fn(*args)
                # The exact type first: an object whose __eq__ always says yes is no pass.
                passed[i] = same_type(got) is same_type(want) and got == want
            except BaseException as exc:
                passed[i] = False
                if error is None:
                    error = same_type(exc).__name__ + ": " + str(exc)[:200]
    write(1, ("\\n" + NONCE + dumps({"passed": passed, "error": error}) + "\\n").encode())


_main()
"""


def harness_script(source: str, cases: Sequence[Case], nonce: str) -> str:
    """A self-contained script that runs `source` against `cases` and prints one result line."""
    head = f"SOURCE = {source!r}\nCASES = {json.dumps(cases)!r}\nNONCE = {nonce!r}\n"
    return head + _HARNESS


def parse_harness_output(stdout: str, nonce: str, count: int) -> tuple[tuple[bool, ...], str | None] | None:
    """The per-test booleans and first error of the LAST nonce line, or None when there is none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(nonce):
            try:
                data = json.loads(line[len(nonce) :])
                passed = tuple(bool(v) for v in data["passed"])
            except (ValueError, KeyError, TypeError):
                return None
            return (passed, data.get("error")) if len(passed) == count else None
    return None


@lru_cache(maxsize=CACHE_SIZE)
def _parse_answer(answer: str) -> tuple[str, Params, tuple[Case, ...]]:
    data = json.loads(answer)
    return data["family"], tuple(data["params"]), tuple((list(a), w) for a, w in data["tests"])


# -- the domain -------------------------------------------------------------------------------------
class CodeDomain:
    name = "code"
    #: Every character of prompts and demonstrations (the tests check it); code the policy can
    #: write is limited to these.
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 \n#`()[]:,.+-*<>="

    def __init__(self, config: CodeDomainConfig):
        self.config = config
        self._cache: OrderedDict[tuple[str, str], tuple[str, CodeVerdict]] = OrderedDict()
        self._lock = threading.Lock()
        # Built here (the functions are bound methods), so a drift from the names in
        # CodeDomainConfig.REWARD_COMPONENTS fails on construction.
        self._rewards: dict[str, RewardFn] = reward_functions(
            self.name,
            {"correctness": self.pass_reward, "pass_fraction": self.pass_fraction_reward, "format": format_reward},
        )

    # -- tasks ---------------------------------------------------------------------------------
    @cached_property
    def _splits(self) -> dict[str, list[Task]]:
        return held_out_splits(self._draw, self.config.train_size, self.config.val_size, self.config.test_size)

    def _draw(self, split: str, count: int, exclude: set[str]) -> list[Task]:
        rng = random.Random(f"code:{self.config.seed}:{split}")
        families = list(FAMILIES.values())

        def draw() -> tuple[str, Callable[[], tuple[str, str]]]:
            family = rng.choice(families)
            params = family.draw(rng)

            def finish() -> tuple[str, str]:
                cases = family.cases(params, rng)
                return json.dumps({"family": family.name, "params": list(params), "tests": cases}), family.name

            return prompt_for(family, params), finish

        return draw_distinct(
            split,
            count,
            exclude,
            draw,
            f"code domain: cannot draw {count} distinct {split} tasks from {len(families)} families; "
            "lower train_size, val_size or test_size",
        )

    def tasks(self, split: str) -> Sequence[Task]:
        if split not in self._splits:
            raise KeyError(f"unknown split {split!r}; the code domain has {', '.join(SPLITS)}")
        return self._splits[split]

    def demonstration(self, task: Task, rng: random.Random | None = None) -> str:
        """A completion for the warm-up. Without `rng`, always the correct body, block closed.

        With `rng`, of mixed quality so v0 is only partly competent: a share
        (`demo_flaw_rate`) has a subtle bug (an off-by-one constant, a wrong comparison) that
        fails some of the task's tests, and a smaller share (`demo_unclosed_rate`) is correct
        code left in an open block, which the format gate scores 0.
        """
        family_name, params, _ = _parse_answer(task.answer)
        family = FAMILIES[family_name]
        if rng is None:
            return body_for(family.solution(params)) + FENCE
        u = rng.random()
        if u < self.config.demo_unclosed_rate:
            return body_for(family.solution(params))
        if u < self.config.demo_unclosed_rate + self.config.demo_flaw_rate:
            return body_for(rng.choice(family.flaws(params))) + FENCE
        return body_for(family.solution(params)) + FENCE

    # -- verification --------------------------------------------------------------------------
    def verdict(self, task: Task, completion: str) -> CodeVerdict:
        """The tests' outcome for one completion: run once in the sandbox, then cached."""
        key = (task.task_id, completion)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] == task.answer:
                self._cache.move_to_end(key)
                return hit[1]
        result = self._run(task, completion)
        with self._lock:
            self._cache[key] = (task.answer, result)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return result

    def verify_many(self, pairs: Iterable[tuple[Task, str]], max_workers: int | None = None) -> list[CodeVerdict]:
        """Verdicts of a batch, uncached ones run concurrently (a GRPO batch is 64 sandbox runs of
        a few tens of ms each; in order they would rival the generation time)."""
        pairs = list(pairs)
        workers = max_workers or min(8, os.cpu_count() or 1)
        unique = list({(t.task_id, c): (t, c) for t, c in pairs}.values())
        if workers > 1 and len(unique) > 1:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(lambda pair: self.verdict(*pair), unique))
        return [self.verdict(t, c) for t, c in pairs]

    def last_failure(self, task_id: str, completion: str) -> str | None:
        """Why a completion already scored did not pass ("timeout: ...", "unclosed", ...), or None
        when it passed or is no longer cached. Never runs anything."""
        with self._lock:
            hit = self._cache.get((task_id, completion))
        return hit[1].failure if hit is not None else None

    def _run(self, task: Task, completion: str) -> CodeVerdict:
        _, _, cases = _parse_answer(task.answer)
        body = extract_body(completion)
        if body is None:
            return CodeVerdict(False, (False,) * len(cases), "unclosed", "the code block is not closed; not run")
        source = task.prompt.split(FENCE, 1)[1].lstrip("\n") + body + "\n"
        nonce = "@result-" + secrets.token_hex(8) + ":"
        script = harness_script(source, cases, nonce)
        from engine.sandbox import Limits, get_sandbox

        # CPU time above wall time: a busy loop is then reported as the timeout it is.
        limits = Limits(wall_seconds=self.config.timeout_seconds, cpu_seconds=self.config.timeout_seconds + 1)
        result = get_sandbox().run_python(script, limits=limits)
        if result.reason == "error":  # the sandbox itself failed, not the code: once more, then an error
            result = get_sandbox().run_python(script, limits=limits)
            if result.reason == "error":
                raise SandboxInfrastructureError(
                    f"the sandbox failed twice on task {task.task_id} ({result.tier}): {result.detail}; "
                    "the code was not judged (docs/architecture.md: the sandbox and its isolation tiers)"
                )
        failed = (False,) * len(cases)
        # The sandbox's verdict comes first: code that tried the network or a file outside its
        # directory scores 0 even when it caught the error and the tests passed anyway.
        if not result.ok and result.reason not in (None, "exit"):
            return CodeVerdict(True, failed, result.reason, result.detail, result.seconds, result.tier)
        parsed = parse_harness_output(result.stdout, nonce, len(cases))
        if parsed is None:
            tail = result.stderr.strip().splitlines()[-1:]
            detail = f"exit code {result.exit_code}" + (f"; {tail[0][:200]}" if tail else "")
            return CodeVerdict(True, failed, "no_result", detail, result.seconds, result.tier)
        passed, error = parsed
        if all(passed):
            reason, detail = "passed", ""
        elif error:
            reason, detail = "error", error
        else:
            reason, detail = "failed", f"{sum(passed)} of {len(passed)} tests pass"
        return CodeVerdict(True, passed, reason, detail, result.seconds, result.tier)

    def is_correct(self, task: Task, completion: str) -> bool:
        return self.verdict(task, completion).all_passed

    # -- rewards -------------------------------------------------------------------------------
    def pass_reward(self, task: Task, completion: str) -> float:
        """Binary: 1.0 when every unit test passes (0 when the block is not closed)."""
        return 1.0 if self.verdict(task, completion).all_passed else 0.0

    def pass_fraction_reward(self, task: Task, completion: str) -> float:
        """Continuous: the share of unit tests that pass (0 when the block is not closed)."""
        return self.verdict(task, completion).pass_fraction

    @property
    def reward_components(self) -> dict[str, RewardFn]:
        return dict(self._rewards)


def format_reward(task: Task, completion: str) -> float:
    """The format gate: 1.0 when the completion closes the code block after some code."""
    return 1.0 if is_closed(completion) else 0.0
