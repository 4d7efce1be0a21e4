"""What every domain provides: a seeded task generator, a verifier, a prompt format, rewards."""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    answer: str
    subset: str  # for per-subset scores, e.g. the number of operands


def draw_distinct(
    split: str,
    count: int,
    exclude: set[str],
    draw: Callable[[], tuple[str, Callable[[], tuple[str, str]]]],
    impossible: str,
) -> list[Task]:
    """`count` tasks with distinct prompts, none in `exclude`, ids `<split>-00000`...

    `draw()` proposes a prompt and a `finish()` that gives its (answer, subset); `finish` runs
    only for a new prompt, so a generator's random draws stay in one reproducible order. After
    50 proposals per task without enough new ones, the generator's space is too small:
    `impossible` says what to change."""
    tasks: list[Task] = []
    seen = set(exclude)
    attempts = 0
    while len(tasks) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(impossible)
        prompt, finish = draw()
        if prompt in seen:
            continue
        seen.add(prompt)
        answer, subset = finish()
        tasks.append(Task(f"{split}-{len(tasks):05d}", prompt, answer, subset))
    return tasks


#: The splits: train (GRPO trains on it), val (every decision reads it), test (held out from
#: everything that decides: only `evotui eval --split test` and the benchmark's report read it).
SPLITS = ("train", "val", "test")

#: Every printable ASCII character and the whitespace an edit can carry: the alphabet of a tool
#: domain, and the character fallback of the word tokenizer (`engine.policy.words`).
PRINTABLE = sorted(set(string.printable) - set("\x0b\x0c"))


def held_out_splits(
    draw: Callable[[str, int, set[str]], list[Task]], train_size: int, val_size: int, test_size: int
) -> dict[str, list[Task]]:
    """The three splits of a generated domain, none sharing a prompt: val first, each from its
    own random stream (`draw(split, count, exclude)`), then test without val's prompts, then train
    without either. Val does not depend on test_size, nor on train_size, so adding a test split
    leaves val as it was; all three are fixed by the seed alone."""
    val = draw("val", val_size, set())
    test = draw("test", test_size, {t.prompt for t in val}) if test_size else []
    train = draw("train", train_size, {t.prompt for t in [*val, *test]})
    return {"train": train, "val": val, "test": test}


# A reward component scores one completion of one task; 0.0 is the floor, 1.0 a full score.
RewardFn = Callable[[Task, str], float]


class Domain(Protocol):
    name: str
    #: Every character the embedded character-level tokenizer must know.
    alphabet: str

    @property
    def reward_components(self) -> dict[str, RewardFn]: ...

    def tasks(self, split: str) -> Sequence[Task]: ...

    def demonstration(self, task: Task, rng: random.Random | None = None) -> str:
        """A completion for the supervised warm-up of the embedded policy; `rng` lets a domain
        mix demonstration styles reproducibly."""
        ...

    def is_correct(self, task: Task, completion: str) -> bool: ...


# -- multi-turn (agentic) domains -------------------------------------------------------------------
# The tools of the agentic protocol, by role. The habits below are defined here once: the behavior
# analyzers (SQL over `rollouts.tool_calls`) and the reward components of the same names (Python
# over an `Episode`) both build on these constants, so a rate the harness reports and the reward
# that pays for it cannot drift apart.
#
# - search before edit: a look (any of LOOK_TOOLS) comes before the first edit;
# - edit then test: a test comes after the last edit, i.e. the final code was tested.
#
# An edit is any call of EDIT_TOOL, failed or not. Both habits are about editing episodes: the
# harness reports them as shares of the rollouts that edited, and the rewards score an episode
# without an edit 0.

#: Tools that look at the code before changing it.
LOOK_TOOLS = ("search", "read")
EDIT_TOOL = "edit"
TEST_TOOL = "test"
#: History commands: reading future commits can leak a fix (the leak the harness must catch).
HISTORY_TOOLS = ("git_log", "git_show", "git_diff")


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an episode, as stored in `rollouts.tool_calls` (the harness reads these).

    Tool names of the agentic protocol: search, read, edit, test, submit, git_log, git_show,
    git_diff, plus `invalid` for a line the environment could not parse.
    """

    turn: int
    tool: str
    args: str
    ok: bool
    files: tuple[str, ...] = ()
    #: What the environment answered (shown in the rollout browser; not in the harness schema).
    result: str = ""


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to one action line."""

    observation: str  # text appended after the action (ends with the next prompt marker unless done)
    done: bool
    call: ToolCall


@dataclass
class Episode:
    """One finished (or truncated) episode: what the policy did and how it ended."""

    task: Task
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    submitted: bool = False
    #: The hidden tests' verdict (binary correctness); False until submitted.
    success: bool = False
    #: The share of hidden tests that pass (continuous), when the domain measures it.
    pass_fraction: float = 0.0
    #: The policy ran out of turns or tokens before it submitted.
    truncated: bool = False

    @property
    def turns(self) -> int:
        return len(self.actions)

    def transcript(self) -> str:
        """The completion as text: each action followed by the environment's answer."""
        return "".join(a + o for a, o in zip(self.actions, self.observations, strict=False)) + "".join(
            self.actions[len(self.observations) :]
        )


class Environment(Protocol):
    """One episode's world (a fresh one per rollout). Its side effects on code run in the sandbox."""

    def step(self, action: str) -> StepResult: ...

    def finish(self, episode: Episode) -> None:
        """Fill the episode's outcome (success, pass fraction); called once, after the last turn,
        also when the policy never submitted."""
        ...


#: A reward component of a multi-turn domain scores a whole episode.
EpisodeRewardFn = Callable[[Episode], float]


class AgenticDomain(Domain, Protocol):
    """A domain whose completions are episodes: the policy writes one action line per turn and the
    environment answers; TRL trains on the actions only (`env_mask`). One with a leak switch (SWE)
    also has `leaky` (the switch is on) and `leaks(task)` (this task's environment differs when
    clean); an evaluation replays clean only the tasks that leak."""

    max_turns: int

    def environment(self, task: Task, *, clean: bool = False) -> Environment:
        """A fresh environment for the task; `clean` ignores leak switches (evaluation)."""
        ...

    @property
    def episode_rewards(self) -> dict[str, EpisodeRewardFn]: ...

    def demonstration_episode(self, task: Task, rng: random.Random) -> list[tuple[str, str]]:
        """(action, observation) pairs of a scripted episode for the warm-up (mixed quality)."""
        ...

    def vocabulary(self) -> list[str]:
        """The words of the embedded word-level tokenizer (actions and observations)."""
        ...


def is_agentic(domain: object) -> bool:
    """Whether a domain's completions are episodes (it has an environment)."""
    return callable(getattr(domain, "environment", None))
