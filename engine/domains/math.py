"""Math domain: multi-step integer arithmetic with every intermediate result written out.

Prompt ``Q:12+7-5\\n``; a well-formed completion ``12+7=19;19-5=14;A:14``. The verifier reads
the final ``A:`` answer; the format check requires the whole chain. More operands make longer
chains, so a tight ``max_completion_length`` truncates them: the truncation the harness sees.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from functools import cached_property

from engine.config import MathDomainConfig
from engine.domains import reward_functions
from engine.domains.base import SPLITS, RewardFn, Task, draw_distinct, held_out_splits

_ANSWER = re.compile(r"A:(-?\d+)\s*$")
_WELL_FORMED = re.compile(r"(-?\d+[+-]\d+=-?\d+;)*A:-?\d+")


def parse_answer(completion: str) -> str | None:
    match = _ANSWER.search(completion)
    return match.group(1) if match else None


def is_well_formed(completion: str) -> bool:
    return _WELL_FORMED.fullmatch(completion.strip()) is not None


class MathDomain:
    name = "math"
    #: Every task has a reference answer: the verifier audit re-checks accepted answers.
    AUDITED = True
    #: One right answer per task: accepted answers that disagree cannot all be right.
    ONE_ANSWER = True
    alphabet = "0123456789+-=;:AQ\n"

    def __init__(self, config: MathDomainConfig):
        self.config = config

    @cached_property
    def _splits(self) -> dict[str, list[Task]]:
        return held_out_splits(self._draw, self.config.train_size, self.config.val_size, self.config.test_size)

    def _draw(self, split: str, count: int, exclude: set[str]) -> list[Task]:
        cfg = self.config
        rng = random.Random(f"math:{cfg.seed}:{split}")

        def draw() -> tuple[str, Callable[[], tuple[str, str]]]:
            n = rng.randint(cfg.min_operands, cfg.max_operands)
            operands = [rng.randint(0, cfg.max_operand) for _ in range(n)]
            ops = [rng.choice("+-") for _ in range(n - 1)]
            expr = str(operands[0]) + "".join(f"{op}{x}" for op, x in zip(ops, operands[1:], strict=True))
            return f"Q:{expr}\n", lambda: (str(_evaluate(operands, ops)), f"ops{n}")

        return draw_distinct(
            split,
            count,
            exclude,
            draw,
            f"math domain: cannot draw {count} distinct {split} problems with operands 0..{cfg.max_operand} "
            f"and {cfg.min_operands}-{cfg.max_operands} operands; raise max_operand or max_operands",
        )

    def tasks(self, split: str) -> Sequence[Task]:
        if split not in self._splits:
            raise KeyError(f"unknown split {split!r}; the math domain has {', '.join(SPLITS)}")
        return self._splits[split]

    def demonstration(self, task: Task, rng: random.Random | None = None) -> str:
        """A correct completion for the warm-up. Without `rng`, always the full chain.

        With `rng`, a share (`demo_shortcut_rate`) states the answer at once without the chain:
        warm-up data of mixed style, as real SFT data has. v0 learns both habits, and the
        shortcut is the less reliable one, so RL has a choice to make: on the sample workspace
        GRPO gains by replacing guesses with chains, and gains nothing from a chain-only v0
        (docs/architecture.md).
        """
        if rng is not None and rng.random() < self.config.demo_shortcut_rate:
            return f"A:{task.answer}"
        expr = task.prompt.removeprefix("Q:").strip()
        tokens = re.findall(r"\d+|[+-]", expr)
        acc = int(tokens[0])
        steps = []
        for op, x in zip(tokens[1::2], tokens[2::2], strict=True):
            new = acc + int(x) if op == "+" else acc - int(x)
            steps.append(f"{acc}{op}{x}={new};")
            acc = new
        return "".join(steps) + f"A:{acc}"

    def is_correct(self, task: Task, completion: str) -> bool:
        return parse_answer(completion) == task.answer

    @property
    def reward_components(self) -> dict[str, RewardFn]:
        return dict(_REWARDS)


def _evaluate(operands: list[int], ops: list[str]) -> int:
    acc = operands[0]
    for op, x in zip(ops, operands[1:], strict=True):
        acc = acc + x if op == "+" else acc - x
    return acc


def correctness(task: Task, completion: str) -> float:
    """Binary: 1.0 when the final answer equals the true value."""
    return 1.0 if parse_answer(completion) == task.answer else 0.0


def format_reward(task: Task, completion: str) -> float:
    """1.0 when the completion is a complete, well-formed chain ending in an answer."""
    return 1.0 if is_well_formed(completion) else 0.0


def closeness(task: Task, completion: str) -> float:
    """Continuous: 1 for the right answer, falling linearly to 0 at 10 off (0 without an answer).
    Logged with weight 0 by default, so a reward backtest can price it without re-scoring."""
    answer = parse_answer(completion)
    if answer is None:
        return 0.0
    return max(0.0, 1.0 - abs(int(answer) - int(task.answer)) / 10)


#: Built when the module is imported, so a function missing from (or extra to) the names in
#: `MathDomainConfig.REWARD_COMPONENTS` fails at once.
_REWARDS: dict[str, RewardFn] = reward_functions(
    MathDomain.name, {"correctness": correctness, "format": format_reward, "closeness": closeness}
)
