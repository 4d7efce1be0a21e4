"""Domains: each a seeded task generator, a verifier, a prompt format and reward components."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.domains.base import Domain, RewardFn, Task

if TYPE_CHECKING:
    from engine.config import DomainConfig

__all__ = ["Domain", "RewardFn", "Task", "make_domain", "reward_component_names", "score"]

_COMPONENTS = {"math": ("correctness", "format", "closeness")}


def reward_component_names(domain: str) -> tuple[str, ...]:
    return _COMPONENTS[domain]


def make_domain(config: DomainConfig) -> Domain:
    if config.name == "math":
        from engine.domains.math import MathDomain

        return MathDomain(config)
    raise ValueError(f"unknown domain {config.name!r}; available: {', '.join(_COMPONENTS)}")


def score(domain: Domain, task: Task, completion: str, weights: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Every reward component of a completion, and their weighted sum (components missing from
    `weights` are scored and logged with weight 0)."""
    components = {name: float(fn(task, completion)) for name, fn in domain.reward_components.items()}
    return sum(weights.get(name, 0.0) * value for name, value in components.items()), components
