"""Built-in analyzers, one module per layer; importing this package registers them."""

from engine.harness.analyzers import behavior, score, signal, version

__all__ = ["behavior", "score", "signal", "version"]
