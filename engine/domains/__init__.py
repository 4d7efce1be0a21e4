"""Domains: each a seeded task generator, a verifier, a prompt format and reward components."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine.domains.base import Domain, RewardFn, Task

if TYPE_CHECKING:
    from engine.config import DomainConfig

__all__ = ["Domain", "RewardFn", "Task", "make_domain", "reward_component_names", "score", "weighted"]

_COMPONENTS = {
    "math": ("correctness", "format", "closeness"),
    "code": ("correctness", "pass_fraction", "format"),
    # Behavior rewards are components like any other (tests check these match SweDomain's).
    "swe": (
        "correctness",
        "pass_fraction",
        "search_before_edit",
        "edit_then_test",
        "efficiency",
        "invalid_penalty",
        "judge",
    ),
}


def reward_component_names(domain: str) -> tuple[str, ...] | None:
    """The reward components a domain offers, or None for a custom domain: its components are
    known only once its file is loaded (`load_custom_domain` validates them then)."""
    if domain == "custom":
        return None
    return _COMPONENTS[domain]


def make_domain(config: DomainConfig, root: Path | None = None) -> Domain:
    """The domain a config names; `root` is the workspace directory, needed by a custom domain
    (its code lives in `<root>/domains/<module>.py`)."""
    if config.name == "math":
        from engine.domains.math import MathDomain

        return MathDomain(config)
    if config.name == "code":
        from engine.domains.code import CodeDomain

        return CodeDomain(config)
    if config.name == "swe":
        from engine.domains.swe import SweDomain

        return SweDomain(config)
    if config.name == "custom":
        from engine.domains.custom import load_custom_domain

        if root is None:
            raise ValueError("a custom domain needs the workspace directory: make_domain(config, root=workspace)")
        return load_custom_domain(root, config)
    raise ValueError(f"unknown domain {config.name!r}; available: {', '.join([*_COMPONENTS, 'custom'])}")


def score(domain: Domain, task: Task, completion: str, weights: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Every reward component of a completion, and their weighted sum (components missing from
    `weights` are scored and logged with weight 0)."""
    components = {name: float(fn(task, completion)) for name, fn in domain.reward_components.items()}
    return weighted(components, weights), components


def weighted(components: dict[str, float], weights: dict[str, float]) -> float:
    """The reward: the weighted sum of a rollout's components (a component without a weight counts 0)."""
    return sum(weights.get(name, 0.0) * value for name, value in components.items())
