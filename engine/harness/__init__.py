"""The harness: analyzers and rules that turn a run's artifacts into a diagnosis.

Workspace harness files import from here: ``from engine.harness import Finding, analyzer, rule``.
"""

from engine.harness.base import (
    Context,
    Finding,
    Findings,
    RuleResult,
    analyzer,
    rule,
    severity_above,
    severity_below,
)

__all__ = [
    "Context",
    "Finding",
    "Findings",
    "RuleResult",
    "analyzer",
    "rule",
    "severity_above",
    "severity_below",
]
