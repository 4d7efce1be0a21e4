"""evotui: the terminal workbench and command line of the EvoTrainer engine."""

from engine import __version__

__all__ = ["__version__"]
