"""Messages of the workbench: what the engine connection and the widgets tell the app."""

from __future__ import annotations

from typing import Any

from textual.message import Message


class EngineConnected(Message):
    def __init__(self, hello: dict[str, Any], reconnected: bool) -> None:
        self.hello = hello
        self.reconnected = reconnected
        super().__init__()


class EngineDisconnected(Message):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__()


class EngineEvent(Message):
    """One event pushed by the engine (coach, gate, decision, coach_state)."""

    def __init__(self, event: str, data: dict[str, Any]) -> None:
        self.event = event
        self.data = data
        super().__init__()


class RunProgress(Message):
    """A run's progress; a newer one for the same run replaces a queued older one (floods collapse)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunProgress) and message.data.get("run_id") == self.data.get("run_id")


class VersionSelected(Message):
    def __init__(self, version: str) -> None:
        self.version = version
        super().__init__()


class GateAction(Message):
    """A person's answer to a gate, confirmed, to be sent to the engine."""

    def __init__(self, gate: str, verb: str, feedback: str = "") -> None:
        self.gate = gate
        self.verb = verb
        self.feedback = feedback
        super().__init__()
