"""Captures every GRPO rollout by wrapping the domain's reward components as TRL reward functions.

TRL calls the reward functions of a generation batch one after another with the same
completions; when the last one has scored the batch, the recorder writes it as one Parquet
file (group id, sample index, every component, total, truncation, length) and logs an event.

For a multi-turn domain the batch was played by `rollout_func` (see `rollout_function`), which
hands the recorder its episodes; the components score episodes, and every rollout is stored with
its turns and tool calls.

When a weighted component is the Claude judge, each step also logs the share of the batch the
judge could not score (its offline fallback scored it) and the kinds of failure, as metrics
(`engine.domains.judge.FALLBACK_RATIO`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.domains import Domain, Task, weighted
from engine.domains.base import is_agentic
from engine.domains.judge import ClaudeJudge
from engine.policy.pretrained import PromptFormat
from engine.runs.artifacts import EventLog, RolloutBatch, write_rollouts
from engine.runs.episodes import EpisodeRollout, add_episode, play


class RolloutRecorder:
    def __init__(
        self,
        run_id: str,
        run_dir: Path,
        domain: Domain,
        weights: dict[str, float],
        num_generations: int,
        eos_token_ids: Sequence[int],
        events: EventLog | None,
        start: int = 0,
    ):
        self.run_id = run_id
        #: TRL's global step at the run's start (a continuation's parent's last): the steps the
        #: recorder writes are the run's own, 1..recipe.steps.
        self.start = start
        self.run_dir = run_dir
        self.domain = domain
        self.weights = weights
        self.num_generations = num_generations
        self.stop_ids = set(eos_token_ids)
        self.events = events
        self.agentic = is_agentic(domain)
        rewards = domain.episode_rewards if self.agentic else domain.reward_components  # type: ignore[attr-defined]
        self.components = list(rewards)
        #: The Claude judge when it pays part of the reward (a weight of 0 only logs its scores).
        self.judge: ClaudeJudge | None = next(
            (fn for name, fn in rewards.items() if isinstance(fn, ClaudeJudge) and self.weights.get(name, 0.0)), None
        )
        self._tasks: dict[str, Task] = {t.task_id: t for t in domain.tasks("train")}
        #: The episodes of the batch being scored (multi-turn domains; set by `rollout_function`).
        self.episodes: list[EpisodeRollout] = []
        self._pending: dict[str, list[float]] = {}
        #: The latest train step's rollouts, in batch order (the group filter and the collapse guard read it).
        self.last_batch: RolloutBatch | None = None

    @property
    def reward_weights(self) -> list[float]:
        """Weights in the order of `reward_functions()`, for GRPOConfig.reward_weights."""
        return [self.weights.get(name, 0.0) for name in self.components]

    def reward_functions(self) -> list[Callable[..., list[float]]]:
        return [self._make_reward_fn(name) for name in self.components]

    def rollout_function(self, max_tokens: int, temperature: float) -> Callable[[list[str], Any], dict[str, Any]]:
        """TRL's `rollout_func` for a multi-turn domain: plays one episode per prompt.

        TRL hands over the prompts only; the trainer keeps the batch's rows (`current_inputs`),
        whose `task_id` names the task, since two tasks may share a prompt text."""

        def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
            rows = trainer.current_inputs
            tasks = [self._tasks[row["task_id"]] for row in rows]
            model = trainer.accelerator.unwrap_model(trainer.model)
            self.episodes = play(
                model,
                trainer.processing_class,
                self.domain,  # type: ignore[arg-type]
                tasks,
                max_tokens=max_tokens,
                do_sample=True,
                temperature=temperature,
            )
            return {
                "prompt_ids": [r.prompt_ids for r in self.episodes],
                "completion_ids": [r.completion_ids for r in self.episodes],
                "logprobs": None,
                "env_mask": [r.env_mask for r in self.episodes],
                "episode_index": list(range(len(self.episodes))),
            }

        return rollout_func

    def _make_reward_fn(self, name: str) -> Callable[..., list[float]]:
        if self.agentic:
            score_episode = self.domain.episode_rewards[name]  # type: ignore[attr-defined]
        else:
            component = self.domain.reward_components[name]

        def reward_fn(
            prompts: list[Any],
            completions: list[Any],
            completion_ids: list[list[int]],
            task_id: list[str],
            **kw: Any,
        ) -> list[float]:
            # A conversational dataset (a chat-template policy) hands over messages: score their text.
            completions = [PromptFormat.completion_text(c) for c in completions]
            if self.agentic:
                scores = [float(score_episode(self.episodes[j].episode)) for j in kw["episode_index"]]
            else:
                scores = [float(component(self._tasks[t], c)) for t, c in zip(task_id, completions, strict=True)]
            self._pending[name] = scores
            if len(self._pending) == len(self.components):
                self._flush(completions, completion_ids, task_id, kw["trainer_state"].global_step + 1 - self.start)
            return scores

        # TRL names the component's metrics (`rewards/<name>/mean`) after the function.
        reward_fn.__name__ = name
        return reward_fn

    def _flush(
        self,
        completions: list[str],
        completion_ids: list[list[int]],
        task_ids: list[str],
        step: int,
    ) -> None:
        pending, self._pending = self._pending, {}
        batch = RolloutBatch(run_id=self.run_id, step=step, split="train", decoding="sampled")
        if self.agentic:
            for i, (rollout, completion) in enumerate(zip(self.episodes, completions, strict=True)):
                components = {name: pending[name][i] for name in self.components}
                reward = weighted(components, self.weights)
                add_episode(
                    batch, rollout, i // self.num_generations, i % self.num_generations, reward, components, completion
                )
            self._write(batch, step)
            return
        for i, (completion, ids, task_id) in enumerate(zip(completions, completion_ids, task_ids, strict=True)):
            components = {name: pending[name][i] for name in self.components}
            batch.group_id.append(i // self.num_generations)
            batch.sample_idx.append(i % self.num_generations)
            batch.task_id.append(task_id)
            batch.subset.append(self._tasks[task_id].subset)
            batch.prompt.append(self._tasks[task_id].prompt)  # the task's text, also for a conversation
            batch.completion.append(completion)
            batch.reward.append(weighted(components, self.weights))
            batch.reward_components.append(components)
            # Same rule as TRL's completions/clipped_ratio: no EOS at the end means truncated.
            batch.truncated.append(not ids or ids[-1] not in self.stop_ids)
            batch.completion_length.append(len(ids))
        self._write(batch, step)

    def _write(self, batch: RolloutBatch, step: int) -> None:
        self.last_batch = batch
        # Taken every batch, so a tally never spills into the next step's.
        judge = self.judge.take_tally().metrics() if self.judge is not None else {}
        if self.events is not None and self.events.path is None:
            return  # a rank other than 0 of a multi-GPU run: rank 0 records (its share of the batch)
        file = write_rollouts(self.run_dir, f"train-{step:06d}", batch)
        if self.events is not None:
            self.events.write("rollouts", step=step, split="train", file=file, rows=len(batch))
            if judge:
                self.events.write("metrics", step=step, values=judge)
