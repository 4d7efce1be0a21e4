"""Checkpoints of every policy kind, and what a pretrained (Hugging Face) policy adds.

A version's model directory is one of three things:

- a whole model (`save_pretrained` of weights and tokenizer): the embedded policy, or a
  pretrained one after a warm-up or a full fine-tune;
- a LoRA adapter (`adapter_config.json`, peft): a version trained with `[policy.lora]`; its
  base model is the one the adapter's config names;
- a pointer (`pretrained.json`): v0 of a pretrained policy that was not warmed up, so that a
  multi-GB base model is not copied into the workspace.

`load_policy` reads all three. Prompts reach the model through `PromptFormat`: plain text (as
TRL tokenizes a standard dataset) or, with `chat_template = true`, a conversation through the
tokenizer's chat template (as TRL tokenizes a conversational dataset), the same in training,
warm-up and evaluation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from engine.config import LoraConfig, PolicyConfig

#: The file of a pointer checkpoint: {"name_or_path": ..., "dtype": ...}.
POINTER_FILE = "pretrained.json"
ADAPTER_FILE = "adapter_config.json"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def load_model(name_or_path: str | Path, dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer by Hub id or directory, padded on the left for generation."""
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=_DTYPES[dtype])
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_policy(
    path: Path, dtype: str | None = None, trainable: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A version's policy from its model directory (a whole model, an adapter or a pointer).

    `trainable`: an adapter's LoRA weights are loaded for training on (a child version continues
    its parent's adapter), else for inference."""
    if (path / POINTER_FILE).is_file():
        pointer = json.loads((path / POINTER_FILE).read_text(encoding="utf-8"))
        return load_model(pointer["name_or_path"], dtype or pointer.get("dtype", "float32"))
    if (path / ADAPTER_FILE).is_file():
        from peft import PeftModel

        base = json.loads((path / ADAPTER_FILE).read_text(encoding="utf-8"))["base_model_name_or_path"]
        model, _ = load_model(base, dtype or "float32")
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return PeftModel.from_pretrained(model, path, is_trainable=trainable), tokenizer
    return load_model(path, dtype or "float32")


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """The model (a peft model saves its adapter only) and its tokenizer."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def save_pointer(policy: PolicyConfig, path: Path) -> None:
    """v0 of a pretrained policy without a warm-up: a pointer to its source, not a copy."""
    assert policy.pretrained is not None
    path.mkdir(parents=True, exist_ok=True)
    pointer = {"name_or_path": policy.pretrained, "dtype": policy.dtype}
    (path / POINTER_FILE).write_text(json.dumps(pointer, indent=2) + "\n", encoding="utf-8")


def is_adapter(path: Path) -> bool:
    return (path / ADAPTER_FILE).is_file()


def peft_config(lora: LoraConfig) -> Any:
    """TRL's `peft_config` for a `[policy.lora]` section."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


@dataclass(frozen=True)
class PromptFormat:
    """How a task's prompt text becomes the policy's input: as it is, or as a conversation (an
    optional system message, then the prompt as the user's) through the chat template."""

    chat: bool = False
    system: str = ""

    @classmethod
    def of(cls, policy: PolicyConfig, domain: object) -> PromptFormat:
        return cls(policy.chat_template, getattr(domain, "system_prompt", "") or "")

    def messages(self, prompt: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, {"role": "user", "content": prompt}]

    def dataset_prompt(self, prompt: str) -> str | list[dict[str, str]]:
        """The `prompt` column of TRL's dataset: TRL tokenizes either kind as `encode` does."""
        return self.messages(prompt) if self.chat else prompt

    def encode(self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt, exactly as TRL's GRPOTrainer tokenizes them: a standard prompt
        with the tokenizer's special tokens (a BOS for most models), a conversational one through
        the chat template with the generation prompt."""
        if not prompts:
            return []
        if not self.chat:
            return [list(ids) for ids in tokenizer(list(prompts))["input_ids"]]
        if tokenizer.chat_template is None:
            raise ValueError(
                "policy.chat_template = true, but the tokenizer has no chat template; "
                "set chat_template = false or use a model whose tokenizer has one"
            )
        encoded = tokenizer.apply_chat_template(
            [self.messages(p) for p in prompts], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return [list(ids) for ids in encoded["input_ids"]]

    @staticmethod
    def completion_text(completion: Any) -> str:
        """A completion as TRL hands it to reward functions: text, or (conversational) messages."""
        if isinstance(completion, str):
            return completion
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def batch_inputs(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[Sequence[int]], device: torch.device
) -> dict[str, torch.Tensor]:
    """Left-padded input ids and attention mask of a batch of token-id lists (for generate)."""
    width = max(len(row) for row in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(row)) + list(row) for row in ids], device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], device=device)
    return {"input_ids": input_ids, "attention_mask": mask}
