"""Policies: the embedded tiny model built in code, or any local Hugging Face causal-LM directory."""

from engine.policy.tiny import build_tiny_policy, load_policy, warmup_policy
from engine.policy.tokenizer import build_char_tokenizer

__all__ = ["build_char_tokenizer", "build_tiny_policy", "load_policy", "warmup_policy"]
