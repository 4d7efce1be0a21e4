"""Domains: each a seeded task generator, a verifier, a prompt format and reward components."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from engine.config import DOMAIN_SECTIONS, STATE_DIR, DomainConfig
from engine.domains.base import Domain, RewardFn, Task

__all__ = [
    "Domain",
    "RewardFn",
    "Task",
    "make_domain",
    "reward_component_names",
    "reward_functions",
    "score",
    "weighted",
]

Fn = TypeVar("Fn")

#: Where, under a workspace's state, the SWE domain keeps its sandboxed test reports for the
#: next process (`engine.domains.swe.env.ReportFile`).
SWE_REPORTS = "cache/swe-tests.sqlite"


def reward_component_names(domain: str) -> tuple[str, ...] | None:
    """The reward components a domain offers, or None for a custom domain: its components are
    known only once its file is loaded (`load_custom_domain` validates them then). Read from the
    domain's config section (`REWARD_COMPONENTS` in engine/config.py), their one definition."""
    if domain not in DOMAIN_SECTIONS:
        raise KeyError(f"unknown domain {domain!r}; available: {', '.join(DOMAIN_SECTIONS)}")
    return DOMAIN_SECTIONS[domain].REWARD_COMPONENTS


def reward_functions(domain: str, functions: Mapping[str, Fn]) -> dict[str, Fn]:
    """A built-in domain's reward functions, in the order of its section's `REWARD_COMPONENTS`.
    A name without a function, or a function without a name, raises: the names a workspace may
    weight and the functions that score them cannot drift apart."""
    names = reward_component_names(domain) or ()
    missing = [name for name in names if name not in functions]
    extra = [name for name in functions if name not in names]
    if missing or extra:
        section = DOMAIN_SECTIONS[domain].__name__
        raise TypeError(
            f"the {domain} domain's reward functions do not match {section}.REWARD_COMPONENTS "
            f"(engine/config.py): no function for {missing}, no name for {extra}; "
            "add the function or the name so that both list the same components"
        )
    return {name: functions[name] for name in names}


def make_domain(config: DomainConfig, root: Path | None = None) -> Domain:
    """The domain a config names; `root` is the workspace directory, needed by a custom domain
    (its code lives in `<root>/domains/<module>.py`) and by a dataset domain's python verifier."""
    if config.name == "math":
        from engine.domains.math import MathDomain

        return MathDomain(config)
    if config.name == "code":
        from engine.domains.code import CodeDomain

        return CodeDomain(config)
    if config.name == "swe":
        from engine.domains.swe import SweDomain

        return SweDomain(config, None if root is None else root / STATE_DIR / SWE_REPORTS)
    if config.name == "dataset":
        from engine.domains.dataset import DatasetDomain

        return DatasetDomain(config, root)
    if config.name == "custom":
        from engine.domains.custom import load_custom_domain

        if root is None:
            raise ValueError("a custom domain needs the workspace directory: make_domain(config, root=workspace)")
        return load_custom_domain(root, config)
    raise ValueError(f"unknown domain {config.name!r}; available: {', '.join(DOMAIN_SECTIONS)}")


def score(domain: Domain, task: Task, completion: str, weights: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Every reward component of a completion, and their weighted sum (components missing from
    `weights` are scored and logged with weight 0)."""
    components = {name: float(fn(task, completion)) for name, fn in domain.reward_components.items()}
    return weighted(components, weights), components


def weighted(components: dict[str, float], weights: dict[str, float]) -> float:
    """The reward: the weighted sum of a rollout's components (a component without a weight counts 0)."""
    return sum(weights.get(name, 0.0) * value for name, value in components.items())
