"""Headless core of the EvoTrainer workbench: store, version tree, policies, domains and runs.

Nothing in this package imports the terminal UI; the UI and the CLI are clients of it.
"""

__version__ = "0.1.0"
