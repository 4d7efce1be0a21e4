"""Clients of the engine socket: a blocking one (the CLI, tests) and an asyncio one (the TUI).

Both validate what the engine sends with the protocol's models, and raise `EngineError` with the
engine's typed error, or `EngineUnavailable` when no engine answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from engine.api.protocol import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    Event,
    ProtocolError,
    Reply,
    Request,
    decode_incoming,
    encode,
)


class EngineUnavailable(ConnectionError):
    """No engine listens on the socket (none started, or it died)."""


class EngineError(RuntimeError):
    def __init__(self, type: str, message: str):
        self.type = type
        self.message = message
        super().__init__(message)


def _result(reply: Reply) -> Any:
    if reply.ok:
        return reply.result
    assert reply.error is not None
    raise EngineError(reply.error.type, reply.error.message)


class EngineClient:
    """One blocking connection. Replies arrive in order; events are queued until read."""

    def __init__(self, path: Path, timeout: float | None = 10.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError, OSError) as exc:
            self.sock.close()
            raise EngineUnavailable(f"no engine answers on {path} ({exc.strerror or exc})") from None
        self.file = self.sock.makefile("rb")
        self.ids = itertools.count(1)
        self.pending_events: list[Event] = []

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
            self.sock.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise EngineUnavailable(f"the engine went away ({exc})") from None

    def read(self) -> Reply | Event:
        try:
            line = self.file.readline(MAX_MESSAGE_BYTES + 2)
        except OSError as exc:
            raise EngineUnavailable(f"the engine went away ({exc})") from None
        if not line:
            raise EngineUnavailable("the engine closed the connection")
        return decode_incoming(line)

    def reply(self) -> Reply:
        while True:
            message = self.read()
            if isinstance(message, Reply):
                return message
            self.pending_events.append(message)

    def call(self, method: str, **params: Any) -> Any:
        request = Request(v=PROTOCOL_VERSION, id=next(self.ids), method=method, params=params)
        self.send_raw(encode(request))
        return _result(self.reply())

    def events(self) -> Iterator[Event]:
        """Events after `call("subscribe")`, as they come (blocks; the socket timeout applies)."""
        while True:
            while self.pending_events:
                yield self.pending_events.pop(0)
            message = self.read()
            if isinstance(message, Event):
                yield message


class AsyncEngineClient:
    """One asyncio connection: calls are awaited by id; events go to `on_event`."""

    def __init__(self, path: Path, on_event: Callable[[Event], None] | None = None):
        self.path = path
        self.on_event = on_event
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[Reply]] = {}
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    async def connect(self) -> None:
        try:
            self.reader, self.writer = await asyncio.open_unix_connection(str(self.path), limit=MAX_MESSAGE_BYTES + 2)
        except (FileNotFoundError, ConnectionRefusedError, OSError) as exc:
            raise EngineUnavailable(f"no engine answers on {self.path} ({exc})") from None
        self.closed.clear()
        self.task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        assert self.reader is not None
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                try:
                    message = decode_incoming(line)
                except ProtocolError:
                    continue  # a bad line from the engine is skipped, not fatal
                if isinstance(message, Event):
                    if self.on_event is not None:
                        self.on_event(message)
                elif message.id in self.waiting:
                    future = self.waiting.pop(message.id)
                    if not future.done():  # the caller may have given up (a cancelled worker)
                        future.set_result(message)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(EngineUnavailable("the engine closed the connection"))
            self.waiting.clear()
            self.closed.set()

    async def call(self, method: str, timeout: float = 30.0, **params: Any) -> Any:
        if self.writer is None or self.closed.is_set():
            raise EngineUnavailable("not connected to the engine")
        request = Request(v=PROTOCOL_VERSION, id=next(self.ids), method=method, params=params)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.waiting[request.id] = future
        try:
            self.writer.write(encode(request))
            await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            self.waiting.pop(request.id, None)
            raise EngineUnavailable(f"the engine went away ({exc})") from None
        try:
            return _result(await asyncio.wait_for(future, timeout))
        finally:
            self.waiting.pop(request.id, None)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        if self.task is not None:
            self.task.cancel()
