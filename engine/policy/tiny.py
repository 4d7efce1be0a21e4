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
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from engine.config import EmbeddedPolicyConfig, WarmupConfig
from engine.domains import Domain, Task
from engine.policy.tokenizer import build_char_tokenizer


def build_tiny_policy(
    config: EmbeddedPolicyConfig, alphabet: str, seed: int = 0
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    tokenizer = build_char_tokenizer(alphabet)
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


def load_policy(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tokenizer


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


@dataclass(frozen=True)
class WarmupStats:
    steps: int
    final_loss: float
    seconds: float


def _demo_batch(
    tasks: Sequence[Task], domain: Domain, tokenizer: PreTrainedTokenizerBase, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt+demonstration+EOS; the loss covers the completion tokens only."""
    rows, labels = [], []
    for task in tasks:
        prompt_ids = tokenizer(task.prompt)["input_ids"]  # special tokens as TRL's prompts get them
        completion_ids = tokenizer(domain.demonstration(task, rng), add_special_tokens=False)["input_ids"]
        ids = prompt_ids + completion_ids + [tokenizer.eos_token_id]
        rows.append(ids)
        labels.append([-100] * len(prompt_ids) + completion_ids + [tokenizer.eos_token_id])
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return input_ids, attention, label_ids


def warmup_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    domain: Domain,
    config: WarmupConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> WarmupStats:
    """Supervised warm-up on demonstrations of the domain's train split (cosine schedule)."""
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
    loss_value = float("nan")
    for step in range(config.steps):
        batch = [tasks[rng.randrange(len(tasks))] for _ in range(config.batch_size)]
        input_ids, attention, labels = _demo_batch(batch, domain, tokenizer, rng)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if on_step is not None:
            on_step(step + 1, loss_value)
    model.eval()
    return WarmupStats(config.steps, loss_value, time.perf_counter() - start)
