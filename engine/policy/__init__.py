"""Policies: the embedded tiny model built in code, or any Hugging Face causal LM (whole, LoRA, chat)."""

from engine.policy.pretrained import PromptFormat, load_policy, save_policy
from engine.policy.tiny import build_tiny_policy, warmup_policy
from engine.policy.tokenizer import build_char_tokenizer

__all__ = ["PromptFormat", "build_char_tokenizer", "build_tiny_policy", "load_policy", "save_policy", "warmup_policy"]
