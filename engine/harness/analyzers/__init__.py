"""Built-in analyzers, one module per layer; importing this package registers them."""

from engine.harness.analyzers import agreement, audit, behavior, score, shift, signal, version

__all__ = ["agreement", "audit", "behavior", "score", "shift", "signal", "version"]
