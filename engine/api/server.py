"""The engine's Unix-socket server (asyncio): JSON-lines requests in, replies and events out.

Requests are handled on a thread pool (database reads must not block the event loop, and the
coach thread holds the engine's own connection). A bad message gets an error reply; a client
that disconnects or reads too slowly loses its events, never the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError

from engine.api.protocol import (
    MAX_MESSAGE_BYTES,
    Event,
    ProtocolError,
    Reply,
    decode_request,
    encode,
    error_reply,
)
from engine.api.service import Service

log = logging.getLogger(__name__)

#: Events a slow subscriber may have queued before new ones are dropped for it.
MAX_QUEUED_EVENTS = 1000


class _Client:
    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self.events: asyncio.Queue[bytes] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self.dropped = 0


class EngineServer:
    def __init__(self, service: Service, socket_path: Path, threads: int = 4):
        self.service = service
        self.socket_path = socket_path
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="api")
        self.subscribers: set[_Client] = set()
        self.connections: set[asyncio.StreamWriter] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        old = os.umask(0o177)  # the socket is created 0600: only this user talks to the engine
        try:
            self.server = await asyncio.start_unix_server(
                self._serve, path=str(self.socket_path), limit=MAX_MESSAGE_BYTES + 1
            )
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        # Closing the connections ends their handlers normally (cancelling them would not).
        for writer in list(self.connections):
            writer.close()
        for _ in range(50):
            if not self.connections:
                break
            await asyncio.sleep(0.02)
        if self.server is not None:
            await self.server.wait_closed()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- events ------------------------------------------------------------------------------------
    def publish(self, event: str, data: dict[str, Any]) -> None:
        """Thread-safe: called by the coach thread (and the service)."""
        if self.loop is None:
            return
        line = encode(Event(event=event, data=data))
        self.loop.call_soon_threadsafe(self._fan_out, line)

    def _fan_out(self, line: bytes) -> None:
        for client in list(self.subscribers):
            try:
                client.events.put_nowait(line)
            except asyncio.QueueFull:
                client.dropped += 1  # a stuck client; the engine does not wait for it

    async def _pump(self, client: _Client) -> None:
        while True:
            line = await client.events.get()
            client.writer.write(line)
            await client.writer.drain()

    # -- requests ------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _Client(writer)
        self.connections.add(writer)
        pump: asyncio.Task[None] | None = None
        write_lock = asyncio.Lock()
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    break  # the client went away
                except asyncio.LimitOverrunError:
                    await self._discard_line(reader)
                    err = ProtocolError("too_large", f"message over {MAX_MESSAGE_BYTES} bytes; the limit")
                    await self._send(writer, write_lock, error_reply(err))
                    continue
                reply = await self._reply(line)
                await self._send(writer, write_lock, reply)
                if reply.ok and isinstance(reply.result, dict) and reply.result.get("subscribed") and pump is None:
                    self.subscribers.add(client)
                    pump = asyncio.create_task(self._pump(client))
        except (ConnectionError, BrokenPipeError):
            pass
        finally:
            self.connections.discard(writer)
            self.subscribers.discard(client)
            if pump is not None:
                pump.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _discard_line(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                await reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                await reader.readexactly(exc.consumed)
            except asyncio.IncompleteReadError:
                return

    async def _reply(self, line: bytes) -> Reply:
        try:
            request, params = decode_request(line)
        except ProtocolError as exc:
            return error_reply(exc)
        except Exception:  # noqa: BLE001 - a line decode_request failed to judge: its bug, not the client's
            log.exception("decoding a request line failed")
            return error_reply(ProtocolError("internal", "the engine failed to read this line; it goes on"))
        assert self.loop is not None
        try:
            result = await self.loop.run_in_executor(self.pool, self.service.handle, request.method, params)
        except ProtocolError as exc:
            exc.id = request.id
            return error_reply(exc)
        except Exception as exc:  # noqa: BLE001 - one failed request never stops the engine
            log.exception("request %s failed", request.method)
            return error_reply(ProtocolError("internal", f"{type(exc).__name__}: {exc}", request.id))
        return Reply(id=request.id, ok=True, result=result)

    async def _send(self, writer: asyncio.StreamWriter, lock: asyncio.Lock, reply: Reply) -> None:
        try:
            data = encode(reply)
        except PydanticSerializationError:  # a result JSON cannot carry: the engine's bug; the connection goes on
            log.exception("reply %s could not be encoded", reply.id)
            data = encode(error_reply(ProtocolError("internal", "the reply could not be encoded as JSON", reply.id)))
        async with lock:
            writer.write(data)
            await writer.drain()
