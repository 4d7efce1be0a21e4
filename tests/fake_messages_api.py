"""A local HTTP server that speaks enough of the Anthropic Messages API to test a client end to end.

The real SDK talks to it over a socket (retries, headers, error classes and all), so tests exercise
the same code paths as production without network access. Replies come from a scripted queue; each
entry is ``(status, json_body, headers)`` or a callable that gets the request body and returns one.
Every request is recorded (path, lower-cased headers, JSON body).

Like the real API, the server refuses (400) a conversation whose ``tool_result`` blocks do not answer
``tool_use`` ids of the assistant turn just before them, and a request without a key (401; ``x-api-key``,
or ``authorization: Bearer`` as SDK 2.14 sends it), so a client that builds an invalid follow-up turn
fails here too.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, Any, dict[str, str]]
ScriptEntry = Reply | Callable[[dict[str, Any]], Reply]

#: Makes SDK retries immediate: `retry-after-ms` is read first, and any value > 0 is slept as given.
#: (`retry-after: 0` is NOT immediate: the SDK ignores values <= 0 and falls back to its backoff,
#: 0.5 s * 2**n with jitter.)
FAST_RETRY = {"retry-after-ms": "1"}

_ids = itertools.count(1)


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeMessagesAPI:
    """Context manager: ``with FakeMessagesAPI() as api: ... api.url ... api.requests``."""

    script: deque[ScriptEntry] = field(default_factory=deque)
    requests: list[RecordedRequest] = field(default_factory=list)
    #: Requests the server refused on its own (bad conversation, missing key, exhausted script).
    refusals: list[str] = field(default_factory=list)
    validate: bool = True

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def __enter__(self) -> FakeMessagesAPI:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        # A short poll interval: `shutdown()` waits for the next poll, 0.5 s by default, on every test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-messages-api", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        assert self._server is not None, "start the server with `with FakeMessagesAPI() as api:`"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- script ------------------------------------------------------------------------------------------
    def enqueue(self, *entries: ScriptEntry) -> FakeMessagesAPI:
        with self._lock:
            self.script.extend(entries)
        return self

    @property
    def remaining(self) -> int:
        return len(self.script)

    def _answer(self, path: str, headers: dict[str, str], raw: bytes) -> Reply:
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            return error_reply(400, "invalid_request_error", f"body is not JSON: {exc}")
        with self._lock:
            self.requests.append(RecordedRequest(path=path, headers=headers, body=body))
            if path != "/v1/messages":
                return self._refuse(404, "not_found_error", f"no route {path}")
            if self.validate:
                problem = _check_request(headers, body)
                if problem is not None:
                    return self._refuse(*problem)
            if not self.script:
                return self._refuse(500, "api_error", "fake server: script exhausted", {"x-should-retry": "false"})
            entry = self.script.popleft()
        return entry(body) if callable(entry) else entry

    def _refuse(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
        self.refusals.append(f"{status} {kind}: {message}")
        return error_reply(status, kind, message, headers)


def _handler_for(api: FakeMessagesAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body, extra = api._answer(self.path.split("?", 1)[0], headers, raw)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("request-id", f"req_fake_{next(_ids)}")
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base signature)
            pass  # keep test output clean

    return Handler


def _check_request(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, str, str] | None:
    """The subset of the real API's request validation that a tool-using client can get wrong."""
    if not sent_key(headers):
        return 401, "authentication_error", "x-api-key header is required"
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return 400, "invalid_request_error", f"{name}: Field required"
    tools = {t.get("name") for t in body.get("tools", [])}
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool" and choice.get("name") not in tools:
        return 400, "invalid_request_error", f"tool_choice names unknown tool {choice.get('name')!r}"
    previous: dict[str, Any] | None = None
    for i, message in enumerate(body["messages"]):
        content = message.get("content")
        if isinstance(content, list) and not content:
            return 400, "invalid_request_error", f"messages.{i}: content must be non-empty"
        blocks = content if isinstance(content, list) else []
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if results:
            asked = _tool_use_ids(previous) if previous and previous.get("role") == "assistant" else set()
            unknown = [r for r in results if r not in asked]
            if message.get("role") != "user" or unknown:
                return (
                    400,
                    "invalid_request_error",
                    f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: {unknown or results}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                )
        if previous is not None and previous.get("role") == "assistant":
            missing = _tool_use_ids(previous) - set(results)
            if missing:
                return (
                    400,
                    "invalid_request_error",
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{sorted(missing)}",
                )
        previous = message
    return None


def sent_key(headers: dict[str, str]) -> str | None:
    """The API key a request carried: `x-api-key`, or `authorization: Bearer` (what SDK 2.14 sends)."""
    if headers.get("x-api-key"):
        return headers["x-api-key"]
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def _tool_use_ids(message: dict[str, Any]) -> set[str]:
    content = message.get("content")
    return {b["id"] for b in content if b.get("type") == "tool_use"} if isinstance(content, list) else set()


# -- reply builders --------------------------------------------------------------------------------------
def message_reply(
    content: Iterable[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    input_tokens: int = 100,
    output_tokens: int = 20,
    model: str = "claude-fake",
) -> Reply:
    body = {
        "id": f"msg_fake_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
    return 200, body, {}


def tool_use_reply(
    name: str,
    input: dict[str, Any],  # noqa: A002 (the API's field name)
    *,
    id: str | None = None,  # noqa: A002
    text: str | None = None,
    input_tokens: int = 100,
    output_tokens: int = 20,
    model: str = "claude-fake",
) -> Reply:
    """A reply whose content is (optional text and) one `tool_use` block."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks.append({"type": "tool_use", "id": id or f"toolu_fake_{next(_ids)}", "name": name, "input": input})
    return message_reply(
        blocks, stop_reason="tool_use", input_tokens=input_tokens, output_tokens=output_tokens, model=model
    )


def text_reply(text: str, *, input_tokens: int = 100, output_tokens: int = 20, model: str = "claude-fake") -> Reply:
    """A reply with prose only (a model that ignored the forced tool)."""
    return message_reply(
        [{"type": "text", "text": text}], input_tokens=input_tokens, output_tokens=output_tokens, model=model
    )


def error_reply(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return status, {"type": "error", "error": {"type": kind, "message": message}}, dict(headers or {})


def rate_limited(message: str = "Number of request tokens has exceeded your per-minute rate limit") -> Reply:
    return error_reply(429, "rate_limit_error", message, {"retry-after": "0", **FAST_RETRY})


def server_error(message: str = "Internal server error") -> Reply:
    return error_reply(500, "api_error", message, dict(FAST_RETRY))


#: Environment the anthropic SDK reads besides the key; a test clears them so a developer's own
#: settings never reach the fake server (or a real one).
SDK_ENVIRONMENT = ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_CUSTOM_HEADERS", "ANTHROPIC_PROFILE")


def use_test_key(monkeypatch: Any, key: str) -> None:
    """Set `key` as ANTHROPIC_API_KEY and clear the SDK's other settings (a pytest MonkeyPatch)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    for name in SDK_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
