"""Runs: the worker child process, its artifacts, the runner that launches it, and ingestion."""
