"""One way for the CLI to talk to a workspace: through the engine's socket when an engine serves
it (only the engine may open the store), else in-process through the same service the engine
runs. Either way a command calls `access.call(method, **params)` of the socket protocol."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from engine.api.client import EngineClient, EngineError, EngineUnavailable
from engine.api.protocol import METHODS, ProtocolError
from engine.api.service import Service
from engine.core import Engine
from engine.daemon import SOCKET_FILE, WorkspaceLock
from engine.workspace import Workspace


class Access(Protocol):
    remote: bool

    def call(self, method: str, **params: Any) -> Any: ...


class RemoteAccess:
    remote = True

    def __init__(self, client: EngineClient):
        self.client = client

    def call(self, method: str, **params: Any) -> Any:
        return self.client.call(method, **params)


class LocalAccess:
    remote = False

    def __init__(self, engine: Engine):
        self.engine = engine
        self.service = Service(engine, lambda event, data: None)

    def call(self, method: str, **params: Any) -> Any:
        try:
            return self.service.handle(method, METHODS[method].model_validate(params))
        except ProtocolError as exc:
            raise EngineError(exc.type, exc.message) from None


def engine_socket(root: Path) -> Path | None:
    """The socket of the engine serving `root`, if one does."""
    ws = Workspace.open(root)
    path = ws.state_dir / SOCKET_FILE
    return path if WorkspaceLock(ws.root).held_by_other() and path.exists() else None


@contextmanager
def open_access(workspace: Path) -> Iterator[Access]:
    path = engine_socket(workspace)
    client = None
    if path is not None:
        try:
            client = EngineClient(path)
        except EngineUnavailable:
            client = None  # it stopped between the check and the connect: open the workspace here
    if client is not None:
        with client:
            yield RemoteAccess(client)
        return
    with Engine.open(workspace) as engine:
        local = LocalAccess(engine)
        try:
            yield local
        finally:
            local.service.close()
