"""Built-in analyzers, one module per layer; importing this package registers them."""

from engine.harness.analyzers import behavior, score, shift, signal, version

__all__ = ["behavior", "score", "shift", "signal", "version"]
