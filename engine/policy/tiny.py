"""The embedded default policy: a tiny Llama-style causal LM and its supervised warm-up.

The warm-up is a plain PyTorch loop on purpose: for a sub-million-parameter model on a CPU,
`transformers.Trainer` spends more time on its own machinery than on the model.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from engine.config import EmbeddedPolicyConfig, WarmupConfig
from engine.domains import Domain, Task
from engine.domains.base import is_agentic
from engine.policy.pretrained import PromptFormat
from engine.policy.tokenizer import build_char_tokenizer


def build_tiny_policy(
    config: EmbeddedPolicyConfig, domain: Domain, seed: int = 0
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """A fresh tiny model with the domain's tokenizer: characters for single-turn domains, words
    for multi-turn ones (a character-level episode is too long to train on here)."""
    if is_agentic(domain):
        from engine.policy.words import build_word_tokenizer

        tokenizer = build_word_tokenizer(domain.vocabulary())  # type: ignore[attr-defined]
    else:
        tokenizer = build_char_tokenizer(domain.alphabet)
    torch.manual_seed(seed)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(model_config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


@dataclass(frozen=True)
class WarmupStats:
    steps: int
    final_loss: float
    seconds: float


def _demo_rows(
    task: Task, domain: Domain, tokenizer: PreTrainedTokenizerBase, rng: random.Random, fmt: PromptFormat
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + demonstration, and their labels (-100 where no loss applies).

    Single-turn: the completion and EOS are learned. Multi-turn: only the actions are learned;
    the environment's answers are context (as `env_mask` makes them in GRPO), and so is the EOS
    the environment appends after `submit`."""
    prompt_ids = fmt.encode(tokenizer, [task.prompt])[0]  # as TRL's prompts get them
    ids, labels = list(prompt_ids), [-100] * len(prompt_ids)
    if is_agentic(domain):
        for action, observation in domain.demonstration_episode(task, rng):  # type: ignore[attr-defined]
            action_ids = tokenizer(action, add_special_tokens=False)["input_ids"]
            observation_ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
            ids += action_ids + observation_ids
            labels += action_ids + [-100] * len(observation_ids)
        return ids, labels
    completion_ids = tokenizer(domain.demonstration(task, rng), add_special_tokens=False)["input_ids"]
    return ids + completion_ids + [tokenizer.eos_token_id], labels + completion_ids + [tokenizer.eos_token_id]


#: Scripted episodes a multi-turn warm-up draws its batches from. Playing a demonstration runs its
#: tests in the sandbox (~10 ms each), so the pool is played once and reused, as epochs are.
EPISODE_POOL = 3000


def _batch(rows: Sequence[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    label_ids = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows])
    attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    return input_ids, attention, label_ids


#: Pieces a warm-up batch is cut into at most, sorted by length (see `_backward`), and the
#: padded tokens a piece needs at least: below that, a smaller op costs more in per-op overhead
#: than it saves in padding (the tests' 32-wide policy at batch 32 ran 2x slower cut in four).
MICRO_BATCHES = 4
MIN_PIECE_TOKENS = 1024


def _backward(model: PreTrainedModel, rows: Sequence[tuple[list[int], list[int]]], pad: int) -> torch.Tensor:
    """Back-propagate the batch's mean next-token loss over its labelled tokens; returns it.

    The rows are sorted by length and cut into up to MICRO_BATCHES pieces, each padded only to its
    own longest row: a batch padded to its longest row spends about 40% of its arithmetic on padding
    (math sample). Each piece's mean loss is weighted by its share of the labelled tokens, so the
    sum and its gradient are the whole batch's, up to float rounding."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    padded = len(rows) * len(rows[order[-1]][0])
    size = math.ceil(len(rows) / max(1, min(MICRO_BATCHES, padded // MIN_PIECE_TOKENS)))
    pieces = [_batch([rows[i] for i in order[k : k + size]], pad) for k in range(0, len(rows), size)]
    counts = [int((labels[:, 1:] != -100).sum()) for _, _, labels in pieces]  # HF shifts the labels
    total = sum(counts)
    loss = torch.zeros((), device=model.device)
    for (input_ids, attention, labels), count in zip(pieces, counts, strict=True):
        if count == 0:
            continue
        piece = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss * (count / total)
        piece.backward()
        loss += piece.detach()
    return loss


def warmup_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    domain: Domain,
    config: WarmupConfig,
    on_step: Callable[[int, float], None] | None = None,
    fmt: PromptFormat | None = None,
) -> WarmupStats:
    """Supervised warm-up on demonstrations of the domain's train split (cosine schedule); `fmt`:
    how prompts are encoded (a pretrained policy's chat template), plain text by default."""
    fmt = fmt or PromptFormat()
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    tasks = list(domain.tasks("train"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    warm = max(1, config.steps // 20)

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, config.steps - warm)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    start = time.perf_counter()
    pool: list[tuple[list[int], list[int]]] = []
    if is_agentic(domain):
        size = min(EPISODE_POOL, config.steps * config.batch_size)
        pool = [_demo_rows(tasks[rng.randrange(len(tasks))], domain, tokenizer, rng, fmt) for _ in range(size)]
    loss_value = float("nan")
    for step in range(config.steps):
        if pool:
            rows = [pool[rng.randrange(len(pool))] for _ in range(config.batch_size)]
        else:  # the tasks first, then their demonstrations: the draws of every earlier v0
            batch = [tasks[rng.randrange(len(tasks))] for _ in range(config.batch_size)]
            rows = [_demo_rows(task, domain, tokenizer, rng, fmt) for task in batch]
        loss = _backward(model, rows, tokenizer.pad_token_id)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if on_step is not None:
            on_step(step + 1, loss_value)
    model.eval()
    return WarmupStats(config.steps, loss_value, time.perf_counter() - start)
