"""Multi-turn episodes: the policy writes one action line per turn, the environment answers.

`play` runs a batch of episodes in lockstep: each turn is one batched decode over every episode
still running, stopped at a newline (the end of an action) or EOS. The environment's answer is
tokenized and appended as environment tokens. The embedded policy decodes through
`engine.policy.sampler.Session`, whose KV cache holds each episode's context across turns; any
other model re-encodes the context each turn through HF `generate`. What comes out is what TRL's
`rollout_func` must return (TINY_POLICY_NOTES: the contract): prompt ids, completion ids that
hold model AND environment tokens, and `env_mask` (1 for a model token, 0 for an environment
token), so GRPO trains on the actions only. A submitted episode ends with EOS (an environment
token); one that ran out of turns or tokens has none, which TRL counts as truncated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.domains import weighted
from engine.domains.base import AgenticDomain, Episode, Task, is_agentic
from engine.policy.sampler import MAX_ROWS, open_session
from engine.runs.artifacts import RolloutBatch

#: Tokens one action line may take before it is cut (an action is a few words).
MAX_ACTION_TOKENS = 24


@dataclass
class EpisodeRollout:
    episode: Episode
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]

    @property
    def truncated(self) -> bool:
        return self.episode.truncated

    @property
    def model_tokens(self) -> int:
        return sum(self.env_mask)


@torch.no_grad()
def play(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    domain: AgenticDomain,
    tasks: Sequence[Task],
    *,
    max_tokens: int,
    do_sample: bool,
    temperature: float = 1.0,
    clean: bool = False,
) -> list[EpisodeRollout]:
    """One episode per task (repeat a task for a group), at most `domain.max_turns` actions and
    `max_tokens` completion tokens (model and environment) each; batches of at most `MAX_ROWS`
    episodes play in lockstep."""
    rollouts: list[EpisodeRollout] = []
    for start in range(0, len(tasks), MAX_ROWS):
        rollouts += _play_batch(
            model, tokenizer, domain, tasks[start : start + MAX_ROWS], max_tokens, do_sample, temperature, clean
        )
    return rollouts


def _play_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    domain: AgenticDomain,
    tasks: Sequence[Task],
    max_tokens: int,
    do_sample: bool,
    temperature: float,
    clean: bool,
) -> list[EpisodeRollout]:
    newline = tokenizer.convert_tokens_to_ids("\n")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    stops = [t for t in (newline, eos) if isinstance(t, int) and t != tokenizer.unk_token_id]
    envs = [domain.environment(task, clean=clean) for task in tasks]
    rollouts = [EpisodeRollout(Episode(task=task), list(tokenizer(task.prompt)["input_ids"]), [], []) for task in tasks]
    running = list(range(len(tasks)))
    was_training = model.training
    model.eval()
    # Each running episode's context (prompt, actions, observations) lives in one session: the
    # sampler's KV cache keeps it across turns, so a turn encodes only the newest observation.
    longest = max(len(r.prompt_ids) for r in rollouts)
    session = open_session(model, [r.prompt_ids for r in rollouts], pad, capacity=longest + max_tokens)
    in_session = list(running)  # the episode of each session row
    for turn in range(domain.max_turns):
        running = [i for i in running if len(rollouts[i].completion_ids) < max_tokens]
        if not running:
            break
        row_of = {i: k for k, i in enumerate(in_session)}
        session.keep([row_of[i] for i in running])
        in_session = list(running)
        budget = min(MAX_ACTION_TOKENS, max_tokens - min(len(rollouts[i].completion_ids) for i in running))
        generated = session.decode(max(1, budget), stops, do_sample, temperature)
        still: list[int] = []
        observations: dict[int, list[int]] = {}
        for i, row in zip(running, generated, strict=True):
            r = rollouts[i]
            room = max_tokens - len(r.completion_ids)
            action_ids = row[:room]  # a row ends at its first stop token
            r.completion_ids += action_ids
            r.env_mask += [1] * len(action_ids)
            if action_ids and action_ids[-1] == eos:  # the policy ended the episode without submitting
                r.episode.actions.append(tokenizer.decode(action_ids, skip_special_tokens=True))
                continue
            action = tokenizer.decode(action_ids, skip_special_tokens=True)
            result = envs[i].step(action.strip())
            call = replace(result.call, turn=turn)
            r.episode.actions.append(action)
            r.episode.calls.append(call)
            observation_ids = list(tokenizer(result.observation, add_special_tokens=False)["input_ids"])
            room = max_tokens - len(r.completion_ids)
            r.episode.observations.append(result.observation)
            r.completion_ids += observation_ids[:room]
            r.env_mask += [0] * len(observation_ids[:room])
            if result.done:
                r.episode.submitted = True
                r.completion_ids.append(eos)
                r.env_mask.append(0)
            elif len(observation_ids) <= room:
                still.append(i)
                observations[i] = observation_ids
        running = still
        if still:
            row_of = {i: k for k, i in enumerate(in_session)}
            session.keep([row_of[i] for i in still])
            session.append([observations[i] for i in still])
            in_session = list(still)
    for r, env in zip(rollouts, envs, strict=True):
        ended = r.completion_ids and r.completion_ids[-1] == eos
        r.episode.truncated = not ended
        env.finish(r.episode)
    if was_training:
        model.train()
    return rollouts


def trace_columns(episode: Episode) -> tuple[str, int, list[dict[str, Any]]]:
    """The rollout's `turns` (JSON: each action with the environment's answer), `num_turns` and
    `tool_calls` (the harness's typed list) columns."""
    turns = [
        {
            "turn": k,
            "action": action.strip(),
            "observation": episode.observations[k].rstrip().removesuffix(">").strip()
            if k < len(episode.observations)
            else "",
        }
        for k, action in enumerate(episode.actions)
    ]
    calls = [
        {"turn": c.turn, "tool": c.tool, "args": c.args, "ok": c.ok, "files": list(c.files)} for c in episode.calls
    ]
    return json.dumps(turns, ensure_ascii=False), episode.turns, calls


def score_episode(domain: AgenticDomain, episode: Episode, weights: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Every episode reward component, and their weighted sum (unweighted ones are logged too)."""
    components = {name: float(fn(episode)) for name, fn in domain.episode_rewards.items()}
    return weighted(components, weights), components


def add_episode(
    batch: RolloutBatch,
    rollout: EpisodeRollout,
    group_id: int,
    sample_idx: int,
    reward: float,
    components: dict[str, float],
    completion: str,
) -> None:
    """Append one episode to a rollout batch with its full trace."""
    episode = rollout.episode
    turns, num_turns, calls = trace_columns(episode)
    batch.group_id.append(group_id)
    batch.sample_idx.append(sample_idx)
    batch.task_id.append(episode.task.task_id)
    batch.subset.append(episode.task.subset)
    batch.prompt.append(episode.task.prompt)
    batch.completion.append(completion)
    batch.reward.append(reward)
    batch.reward_components.append(components)
    batch.truncated.append(episode.truncated)
    batch.completion_length.append(rollout.model_tokens)
    batch.turns.append(turns)
    batch.num_turns.append(num_turns)
    batch.tool_calls.append(calls)


__all__ = ["EpisodeRollout", "add_episode", "is_agentic", "play", "score_episode", "trace_columns"]
