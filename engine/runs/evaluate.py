"""Evaluation on a held-out split: greedy once, then sampled with fixed seeds.

Val is what every decision reads. Its episodes play in the environment as the workspace
configures it: with the SWE leak switch on, val leaks too, as a contaminated benchmark does, and
that is the score the loop sees; a leaky domain's val is also replayed clean (split ``clean``),
which the harness's leak check reads. Test is held out from everything that decides: only
`evotui eval --split test` and the benchmark's report evaluate it, clean (split ``test``); in a
leaky environment test is also played leaky (split ``test_leaky``), for the benchmark's leak
finding alone. Either replay plays only the tasks the leak touches (`replay_of`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.config import RecipeConfig
from engine.domains import Domain, Task, score
from engine.domains.audit import answer_key, auditor, one_answer
from engine.domains.base import AgenticDomain, is_agentic
from engine.policy.pretrained import PromptFormat
from engine.policy.sampler import MAX_ROWS, generate_ids
from engine.runs.artifacts import RolloutBatch
from engine.runs.episodes import EpisodeRollout, add_episode, play, score_episode


@dataclass(frozen=True)
class EvalResult:
    greedy: RolloutBatch
    sampled: RolloutBatch
    #: An agentic domain's episodes, one list per pass (greedy, then each sampled seed), for the
    #: same split's evaluation in the other environment to reuse (`evaluate`'s `replay_of`).
    episodes: tuple[list[EpisodeRollout], ...] = ()

    @property
    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for batch in (self.greedy, self.sampled):
            n = max(1, len(batch))
            prefix = f"eval/{batch.decoding}" if batch.split == "val" else f"eval_{batch.split}/{batch.decoding}"
            out[f"{prefix}_accuracy"] = sum(c.get("correctness", 0.0) for c in batch.reward_components) / n
            out[f"{prefix}_reward"] = sum(batch.reward) / n
            out[f"{prefix}_truncated"] = sum(batch.truncated) / n
            out[f"{prefix}_mean_length"] = sum(batch.completion_length) / n
        return out


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int,
    do_sample: bool,
    temperature: float = 1.0,
    batch_size: int = MAX_ROWS,
    fmt: PromptFormat | None = None,
) -> list[tuple[str, bool, int]]:
    """(completion text, truncated, completion length in tokens incl. EOS) per prompt; `fmt`
    encodes the prompts (plain text by default). The embedded policy samples through
    `engine.policy.sampler` (static KV cache), any other model through HF `generate`."""
    fmt = fmt or PromptFormat()
    eos = tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    # Encoded as TRL encodes GRPO prompts (special tokens, or the chat template), so that a
    # version is evaluated on exactly the inputs it trained on.
    rows = generate_ids(
        model,
        fmt.encode(tokenizer, prompts),
        max_new_tokens,
        [eos],
        tokenizer.pad_token_id,
        do_sample,
        temperature,
        batch_size=batch_size,
    )
    out: list[tuple[str, bool, int]] = []
    for row in rows:  # each row ends at its first EOS, if it has one
        ended = bool(row) and row[-1] == eos
        text = tokenizer.decode(row[:-1] if ended else row, skip_special_tokens=True)
        out.append((text, not ended, len(row)))
    if was_training:
        model.train()
    return out


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    domain: Domain,
    weights: dict[str, float],
    max_new_tokens: int | None,
    sampled_seeds: int,
    temperature: float,
    run_id: str,
    step: int,
    seed: int = 0,
    clean: bool = False,
    split: str = "val",
    fmt: PromptFormat | None = None,
    replay_of: EvalResult | None = None,
) -> EvalResult:
    """Rollouts of a held-out split, greedy and sampled, each completion (or episode) given
    `max_new_tokens` (None: the policy's whole room). Val: `clean` plays agentic episodes without
    the leak and stores them as split ``clean``. Test plays clean, unless `clean` is False in a
    leaky environment: then it stores split ``test_leaky``, which only the benchmark's leak
    finding reads (the final version's leaky-minus-clean gap on test).

    `replay_of`: the same split's evaluation in the other environment (leaky for a clean replay,
    clean for a leaky one), same model and seeds. A task the leak does not touch has one
    environment either way, so its episodes are taken from there instead of played again: only
    the leaking tasks are replayed. Each such task then scores exactly the same in both, and a
    leaky-minus-clean gap is the leak's alone, not the difference of two sampling draws."""
    tasks = list(domain.tasks(split))
    prompts = [t.prompt for t in tasks]
    if max_new_tokens is None:
        max_new_tokens = completion_room(model, tokenizer, prompts, fmt)
    if split == "test":
        split = "test" if clean or not getattr(domain, "leaky", False) else "test_leaky"
        clean = split == "test"
    elif clean and split == "val":
        split = "clean"
    greedy = RolloutBatch(run_id=run_id, step=step, split=split, decoding="greedy")
    sampled = RolloutBatch(run_id=run_id, step=step, split=split, decoding="sampled")
    if is_agentic(domain):
        episodes = _evaluate_episodes(
            model,
            tokenizer,
            domain,
            tasks,
            weights,
            max_new_tokens,
            sampled_seeds,
            temperature,
            seed,
            greedy,
            sampled,
            clean,
            replay_of.episodes if replay_of is not None else None,
        )
        return EvalResult(greedy, sampled, episodes)
    passes = [(greedy, 0, generate(model, tokenizer, prompts, max_new_tokens, do_sample=False, fmt=fmt))]
    for k in range(sampled_seeds):
        # Fixed seeds: a version is always judged on the same draws.
        torch.manual_seed(seed * 1000 + k)
        outputs = generate(model, tokenizer, prompts, max_new_tokens, True, temperature, fmt=fmt)
        passes.append((sampled, k + 1, outputs))
    for batch, sample_idx, outputs in passes:
        for i, (task, output) in enumerate(zip(tasks, outputs, strict=True)):
            add_completion(batch, domain, weights, task, output, i, sample_idx)
    return EvalResult(greedy, sampled)


#: The most tokens an evaluation gives a completion when the workspace sets no budget.
EVAL_MAX_NEW_TOKENS = 1024


def completion_room(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], fmt: PromptFormat | None = None
) -> int:
    """The tokens the policy has left after the longest prompt (at most EVAL_MAX_NEW_TOKENS): an
    evaluation budget that no recipe change moves, the same for a version and its parent."""
    context = getattr(model.config, "max_position_embeddings", None) or EVAL_MAX_NEW_TOKENS
    longest = max((len(ids) for ids in (fmt or PromptFormat()).encode(tokenizer, prompts)), default=0)
    return max(1, min(EVAL_MAX_NEW_TOKENS, context - longest))


def add_completion(
    batch: RolloutBatch,
    domain: Domain,
    weights: dict[str, float],
    task: Task,
    output: tuple[str, bool, int],
    group_id: int,
    sample_idx: int,
) -> None:
    """One scored single-turn completion (text, truncated, length) as a row of `batch`."""
    text, truncated, length = output
    total, components = score(domain, task, text, weights)
    check = auditor(domain)
    audit = None if check is None else check(task, text)
    batch.reference.append(None if audit is None else task.answer)
    batch.audit.append(audit)
    batch.answer_key.append(answer_key(text) if one_answer(domain) else None)
    batch.group_id.append(group_id)
    batch.sample_idx.append(sample_idx)
    batch.task_id.append(task.task_id)
    batch.subset.append(task.subset)
    batch.prompt.append(task.prompt)
    batch.completion.append(text)
    batch.reward.append(total)
    batch.reward_components.append(components)
    batch.truncated.append(truncated)
    batch.completion_length.append(length)


def sample_groups(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    domain: Domain,
    recipe: RecipeConfig,
    steps: int,
    run_id: str,
    fmt: PromptFormat | None = None,
) -> list[RolloutBatch]:
    """What GRPO would see from this policy before it trains: `steps` batches of the recipe's
    shape (`prompts_per_step` train prompts, `num_generations` samples each, at its temperature
    and completion budget), stored as train rollouts so that every layer of the harness can
    diagnose a policy that has no GRPO run yet (v0: round 1 reads rollouts, not only a score)."""
    rng = random.Random(f"groups:{run_id}")
    train = list(domain.tasks("train"))
    torch.manual_seed(recipe.seed)
    out = []
    for step in range(1, steps + 1):
        tasks = rng.sample(train, min(recipe.prompts_per_step, len(train)))
        repeated = [t for t in tasks for _ in range(recipe.num_generations)]
        batch = RolloutBatch(run_id=run_id, step=step, split="train", decoding="sampled")
        group_of = [g for g in range(len(tasks)) for _ in range(recipe.num_generations)]
        sample_of = [j for _ in tasks for j in range(recipe.num_generations)]
        if is_agentic(domain):
            rollouts = play(
                model,
                tokenizer,
                domain,
                repeated,
                max_tokens=recipe.max_completion_length,
                do_sample=True,
                temperature=recipe.temperature,
            )
            for rollout, g, j in zip(rollouts, group_of, sample_of, strict=True):
                total, components = score_episode(domain, rollout.episode, recipe.rewards)
                completion = tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
                add_episode(batch, rollout, g, j, total, components, completion)
        else:
            prompts = [t.prompt for t in repeated]
            outputs = generate(
                model, tokenizer, prompts, recipe.max_completion_length, True, recipe.temperature, fmt=fmt
            )
            for task, output, g, j in zip(repeated, outputs, group_of, sample_of, strict=True):
                add_completion(batch, domain, recipe.rewards, task, output, g, j)
        out.append(batch)
    return out


def _evaluate_episodes(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    domain: AgenticDomain,
    tasks: Sequence[Task],
    weights: dict[str, float],
    max_tokens: int,
    sampled_seeds: int,
    temperature: float,
    seed: int,
    greedy: RolloutBatch,
    sampled: RolloutBatch,
    clean: bool,
    reuse: tuple[list[EpisodeRollout], ...] | None,
) -> tuple[list[EpisodeRollout], ...]:
    """Plays the passes (greedy, then each sampled seed) into `greedy` and `sampled`; returns
    each pass's episodes. With `reuse` (the passes of the other environment), only the tasks
    that environment plays differently are played."""
    leaks = getattr(domain, "leaks", None)
    replayed = [i for i, task in enumerate(tasks) if reuse is None or leaks is None or leaks(task)]
    if reuse is not None and (len(reuse) != sampled_seeds + 1 or any(len(p) != len(tasks) for p in reuse)):
        raise ValueError("replay_of holds another number of passes or tasks than this evaluation: evaluate afresh")
    subset = [tasks[i] for i in replayed]

    def play_pass(pass_idx: int, do_sample: bool) -> list[EpisodeRollout]:
        played = play(
            model,
            tokenizer,
            domain,
            subset,
            max_tokens=max_tokens,
            do_sample=do_sample,
            temperature=temperature,
            clean=clean,
        )
        if reuse is None or len(replayed) == len(tasks):
            return played
        merged = list(reuse[pass_idx])
        for i, rollout in zip(replayed, played, strict=True):
            merged[i] = rollout
        return merged

    passes = [(greedy, 0, play_pass(0, False))]
    for k in range(sampled_seeds):
        torch.manual_seed(seed * 1000 + k)
        passes.append((sampled, k + 1, play_pass(k + 1, True)))
    for batch, sample_idx, rollouts in passes:
        for i, rollout in enumerate(rollouts):
            total, components = score_episode(domain, rollout.episode, weights)
            completion = tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
            add_episode(batch, rollout, i, sample_idx, total, components, completion)
    return tuple(rollouts for _, _, rollouts in passes)
