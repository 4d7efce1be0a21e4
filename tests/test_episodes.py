"""Multi-turn episodes: the lockstep loop, `env_mask`, truncation and the stored trace."""

from __future__ import annotations

import json
from typing import Any

import torch

from engine.domains.base import Episode, StepResult, Task, ToolCall
from engine.policy.tokenizer import build_char_tokenizer
from engine.runs.artifacts import RolloutBatch
from engine.runs.episodes import add_episode, play, score_episode

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 :>\n"


class CounterEnv:
    """`inc` adds one, `submit` ends; success when the count reaches the task's target."""

    def __init__(self, task: Task):
        self.target = int(task.answer)
        self.count = 0

    def step(self, action: str) -> StepResult:
        if action == "inc":
            self.count += 1
            return StepResult(f" now {self.count}\n>", False, ToolCall(0, "edit", action, True, ("n",)))
        if action == "submit":
            return StepResult(" done\n>", True, ToolCall(0, "submit", "", True))
        return StepResult(" what\n>", False, ToolCall(0, "invalid", action, False))

    def finish(self, episode: Episode) -> None:
        episode.success = episode.submitted and self.count == self.target


class CounterDomain:
    name = "counter"
    alphabet = ALPHABET
    max_turns = 4

    def environment(self, task: Task, *, clean: bool = False) -> CounterEnv:
        return CounterEnv(task)

    @property
    def episode_rewards(self) -> dict[str, Any]:
        return {"correctness": lambda e: float(e.success), "efficiency": lambda e: 1 - 0.3 * e.turns / self.max_turns}


class ScriptedModel:
    """Stands in for a causal LM: each call returns the next scripted action of every episode
    still running (identified by its prompt), so the loop's bookkeeping can be checked exactly."""

    training = False
    device = torch.device("cpu")

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.scripts = {prompt: list(actions) for prompt, actions in scripts.items()}
        self.calls: list[int] = []

    def eval(self) -> None: ...

    def train(self) -> None: ...

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.calls.append(len(input_ids))
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            text = self.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=True)
            prompt = next(p for p in self.scripts if text.startswith(p))
            action = self.scripts[prompt].pop(0)
            out = self.tokenizer(action, add_special_tokens=False)["input_ids"][: kw["max_new_tokens"]]
            if action == "<eos>":
                out = [self.tokenizer.eos_token_id]
            rows.append(ids + out)
        width = max(map(len, rows))
        return torch.tensor([r + [self.tokenizer.pad_token_id] * (width - len(r)) for r in rows])


def tasks() -> list[Task]:
    return [Task(f"t{i}", f"reach {i}\n>", str(i), "s") for i in (1, 2, 3)]


def test_episodes_mask_the_environment_and_end_with_eos_only_when_submitted() -> None:
    tokenizer = build_char_tokenizer(ALPHABET)
    t1, t2, t3 = tasks()
    scripts = {
        t1.prompt: ["inc\n", "submit\n"],  # solves it in two turns
        t2.prompt: ["inc\n", "jump\n", "inc\n", "inc\n"],  # never submits: out of turns
        t3.prompt: ["<eos>"],  # ends without a word
    }
    model = ScriptedModel(tokenizer, scripts)
    rollouts = play(model, tokenizer, CounterDomain(), [t1, t2, t3], max_tokens=200, do_sample=False)  # type: ignore[arg-type]
    one, two, three = rollouts
    # Lockstep: one generate per turn over the episodes still running.
    assert model.calls == [3, 2, 1, 1]
    for r in rollouts:
        assert len(r.completion_ids) == len(r.env_mask)
        model_text = tokenizer.decode([t for t, m in zip(r.completion_ids, r.env_mask, strict=True) if m])
        env_text = tokenizer.decode(
            [t for t, m in zip(r.completion_ids, r.env_mask, strict=True) if not m], skip_special_tokens=True
        )
        assert model_text.replace("</s>", "") == "".join(r.episode.actions).replace("</s>", "")
        assert env_text == "".join(r.episode.observations)
    assert one.episode.submitted and one.episode.success and not one.truncated
    assert one.completion_ids[-1] == tokenizer.eos_token_id and one.env_mask[-1] == 0
    assert [c.tool for c in one.episode.calls] == ["edit", "submit"] and [c.turn for c in one.episode.calls] == [0, 1]
    assert two.truncated and not two.episode.submitted and not two.episode.success
    assert [c.tool for c in two.episode.calls] == ["edit", "invalid", "edit", "edit"]
    assert three.episode.calls == [] and three.env_mask == [1] and not three.episode.success


def test_the_token_budget_cuts_an_episode_and_counts_it_truncated() -> None:
    tokenizer = build_char_tokenizer(ALPHABET)
    t1 = tasks()[0]
    model = ScriptedModel(tokenizer, {t1.prompt: ["inc\n", "inc\n", "submit\n"]})
    (r,) = play(model, tokenizer, CounterDomain(), [t1], max_tokens=12, do_sample=False)  # type: ignore[arg-type]
    assert len(r.completion_ids) <= 12 and r.truncated and not r.episode.submitted


def test_a_stored_episode_carries_its_turns_and_tool_calls() -> None:
    tokenizer = build_char_tokenizer(ALPHABET)
    t1 = tasks()[0]
    model = ScriptedModel(tokenizer, {t1.prompt: ["inc\n", "submit\n"]})
    (r,) = play(model, tokenizer, CounterDomain(), [t1], max_tokens=200, do_sample=False)  # type: ignore[arg-type]
    total, components = score_episode(CounterDomain(), r.episode, {"correctness": 1.0, "efficiency": 0.5})  # type: ignore[arg-type]
    assert components == {"correctness": 1.0, "efficiency": 1 - 0.3 * 2 / 4}
    assert total == 1.0 + 0.5 * components["efficiency"]
    batch = RolloutBatch(run_id="r", step=1, split="train", decoding="sampled")
    add_episode(batch, r, 0, 0, total, components, tokenizer.decode(r.completion_ids, skip_special_tokens=True))
    table = batch.to_arrow().to_pylist()[0]
    assert table["num_turns"] == 2 and table["completion_length"] == sum(r.env_mask)
    assert [c["tool"] for c in table["tool_calls"]] == ["edit", "submit"] and table["tool_calls"][0]["files"] == ["n"]
    turns = json.loads(table["turns"])
    assert turns[0] == {"turn": 0, "action": "inc", "observation": "now 1"}
    assert table["completion"] == "inc\n now 1\n>submit\n done\n>"
