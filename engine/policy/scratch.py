"""A Hugging Face model directory built from scratch, offline: a byte-level BPE tokenizer trained
on the task texts, with a chat template, and a small causal LM with random weights.

It stands in for "your model" wherever no model can be downloaded (the `dataset` template, the
tests): everything downstream loads it through `from_pretrained` as it would a Hub model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, START, END = "<|pad|>", "<|im_start|>", "<|im_end|>"

#: ChatML, as many chat models write it: each message between START and END, and the assistant's
#: turn opened by the generation prompt. The model ends its answer with END (its EOS).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    + START
    + "{{ message['role'] }}\n{{ message['content'] }}"
    + END
    + "\n{% endfor %}"
    + "{% if add_generation_prompt %}"
    + START
    + "assistant\n{% endif %}"
)


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, with ChatML's special tokens and template."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, START, END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=END,
        padding_side="left",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_scratch_model(
    directory: Path,
    texts: Iterable[str],
    architecture: Literal["llama", "qwen2"] = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    vocab_size: int = 512,
    max_positions: int = 512,
    seed: int = 0,
) -> Path:
    """Write a random-weight causal LM and its tokenizer to `directory` (a `from_pretrained` dir)."""
    tokenizer = build_bpe_tokenizer(texts, vocab_size)
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=max(1, hidden_size // 16),
        num_key_value_heads=max(1, hidden_size // 16),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    if architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
