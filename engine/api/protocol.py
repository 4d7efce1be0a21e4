"""The engine's socket protocol: versioned JSON lines over a Unix socket.

Every message is one JSON object on one line, at most `MAX_MESSAGE_BYTES`.

- request  ``{"v": 1, "id": 7, "method": "list_versions", "params": {...}}``
- reply    ``{"v": 1, "id": 7, "ok": true, "result": ...}`` or
           ``{"v": 1, "id": 7, "ok": false, "error": {"type": "not_found", "message": "..."}}``
- event    ``{"v": 1, "event": "metrics", "data": {...}}`` (pushed after ``subscribe``)

Server and client validate with the same pydantic models, strictly: a value has the JSON type
its field says (`true` is not 1, `"1"` is not 1, `0` is not false; a float field takes an
integer, since JSON has one number type). A malformed, oversized or unknown-version message gets
an error reply (id null when it could not be read) and the connection and the engine go on.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20

#: DuckDB's BIGINT: an integer that reaches SQL (a step, an offset) must fit in it, or the query
#: fails as the engine's fault (`internal`) where the request was wrong (`bad_request`).
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
SqlInt = Annotated[int, Field(ge=BIGINT_MIN, le=BIGINT_MAX)]

#: How the engine names versions (`Engine.next_version_name`): v0, v1, v2, ... ASCII digits only,
#: since `\d` takes any Unicode digit; 18 of them at most, far past any workspace.
VERSION_NAME = r"^v[0-9]{1,18}$"
VersionName = Annotated[str, Field(pattern=VERSION_NAME, description="A version: v0, v1, ...")]

#: A rollout id, run/split/step/group/sample; its numbers of at most 18 digits fit a BIGINT.
ROLLOUT_ID = r"^[^/]+/[^/]+/-?[0-9]{1,18}/-?[0-9]{1,18}/-?[0-9]{1,18}$"

ErrorType = Literal[
    "bad_request",  # not JSON, or fields of the wrong type
    "too_large",  # over MAX_MESSAGE_BYTES
    "unsupported_version",
    "unknown_method",
    "not_found",  # a version, run, gate or rollout that does not exist
    "conflict",  # e.g. a gate already answered, a loop already running
    "internal",  # the engine failed on a valid request; it goes on
]


class ProtocolError(Exception):
    def __init__(self, type: ErrorType, message: str, id: int | None = None):
        self.type = type
        self.message = message
        self.id = id
        super().__init__(f"{type}: {message}")


class _Strict(BaseModel):
    # Strict: lax pydantic would take `true` or "1" for 1 and 0 for false, guessing at what a
    # client with a bug meant; the engine names the field instead.
    model_config = ConfigDict(extra="forbid", strict=True)


class Request(_Strict):
    v: int
    id: int
    method: str
    params: dict[str, Any] = Field(default_factory=dict)


class ErrorInfo(_Strict):
    type: ErrorType
    message: str


class Reply(_Strict):
    v: int = PROTOCOL_VERSION
    id: int | None
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None


class Event(_Strict):
    v: int = PROTOCOL_VERSION
    event: str
    data: dict[str, Any] = Field(default_factory=dict)


# -- typed params of each method --------------------------------------------------------------------
class NoParams(_Strict):
    pass


class VersionParams(_Strict):
    version: VersionName


class FlagParams(_Strict):
    version: VersionName
    reason: str = Field(min_length=1, max_length=2000, description="What is wrong with the version, in words.")


class MetricsParams(_Strict):
    run_id: str
    keys: list[str] = Field(default_factory=list, description="Empty: every key.")
    after_step: SqlInt = 0


class RolloutFilter(_Strict):
    version: VersionName | None = None
    run_id: str | None = None
    split: Literal["train", "val", "clean", "test", "test_leaky"] | None = None
    step_min: SqlInt | None = None
    step_max: SqlInt | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    group: Literal["dead", "live"] | None = None
    truncated: bool | None = None
    used_history: bool | None = None
    search: str | None = Field(None, max_length=200, description="Substring of the prompt or completion.")


class PageParams(_Strict):
    filter: RolloutFilter = Field(default_factory=RolloutFilter)
    offset: int = Field(0, ge=0, le=BIGINT_MAX)
    limit: int = Field(50, ge=1, le=500)


class RolloutParams(_Strict):
    rollout_id: str = Field(pattern=ROLLOUT_ID, description="run/split/step/group/sample")


class AnswerParams(_Strict):
    gate: str
    verb: Literal["approve", "revise", "abort"]
    feedback: str = ""


class StartParams(_Strict):
    versions: int = Field(1, ge=1, le=100)
    #: A budget of GRPO steps, spent as the coach's schedule plans (None: each version its recipe's steps).
    steps: int | None = Field(None, ge=1)
    auto_approve: bool = False
    harness: Literal["full", "score-only"] | None = None


class ReportParams(_Strict):
    version: VersionName
    against: VersionName | None = None


class BacktestParams(_Strict):
    kind: Literal["reward", "filter", "analyzer"]
    version: VersionName | None = Field(None, description="reward, filter: whose latest run")
    weights: dict[str, float] = Field(default_factory=dict, description="reward: the candidate composition")
    # filter: the [recipe.group_filter] fields; unset ones take that section's defaults.
    std_threshold: float | None = None
    keep_ratio: float | None = None
    ema: float | None = None
    metric: str | None = Field(None, description="analyzer: the finding's metric")


class DiffParams(_Strict):
    a: VersionName
    b: VersionName


METHODS: dict[str, type[BaseModel]] = {
    "hello": NoParams,
    "subscribe": NoParams,
    "status": NoParams,
    "list_versions": NoParams,
    "version": VersionParams,
    "diagnosis": VersionParams,
    "diagnose": VersionParams,
    "report": ReportParams,
    "backtest": BacktestParams,
    "list_runs": NoParams,
    "metrics": MetricsParams,
    "page_rollouts": PageParams,
    "rollout": RolloutParams,
    "gates": NoParams,
    "answer_gate": AnswerParams,
    "start": StartParams,
    "stop": NoParams,
    "memory": NoParams,
    "diff": DiffParams,
    "flips": VersionParams,
    "flag": FlagParams,
}


def encode(message: BaseModel) -> bytes:
    return message.model_dump_json().encode() + b"\n"


def decode_request(line: bytes) -> tuple[Request, BaseModel]:
    """A request line -> (request, its typed params). Raises ProtocolError, and nothing else, with
    the request id when it could be read, so that the error reply can name it."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError("too_large", f"message of {len(line)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    try:
        raw = json.loads(line)
    except RecursionError:
        # Python's parser recurses once per level: a line a few hundred levels deep (how many
        # depends on the stack it is parsed on) cannot be read, and no request nests past 3.
        raise ProtocolError("bad_request", "not JSON this engine reads: nested too deeply") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer over Python's 4,300 digits
        raise ProtocolError("bad_request", f"not JSON: {_clip(str(exc))}") from None
    # `type(...) is int`: a bool is an int to Python, and an id of `true` is no id.
    request_id = raw.get("id") if isinstance(raw, dict) and type(raw.get("id")) is int else None
    if isinstance(raw, dict) and raw.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            "unsupported_version",
            f"protocol version {_describe(raw.get('v'))}; this engine speaks {PROTOCOL_VERSION}",
            request_id,
        )
    try:
        request = Request.model_validate(raw)
    except ValidationError as exc:
        raise ProtocolError("bad_request", _short(exc), request_id) from None
    model = METHODS.get(request.method)
    if model is None:
        raise ProtocolError(
            "unknown_method", f"no method {_clip(repr(request.method))}; methods: {', '.join(METHODS)}", request.id
        )
    try:
        params = model.model_validate(request.params)
    except ValidationError as exc:
        raise ProtocolError("bad_request", f"{request.method}: {_short(exc)}", request.id) from None
    return request, params


def decode_incoming(line: bytes) -> Reply | Event:
    """A line from the engine: a reply or an event (the client's side of the validation)."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError("too_large", f"message of {len(line)} bytes from the engine")
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("bad_request", f"engine sent non-JSON: {_clip(str(exc))}") from None
    if not isinstance(raw, dict) or raw.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            "unsupported_version",
            f"engine speaks protocol {_describe(raw.get('v') if isinstance(raw, dict) else None)}",
        )
    try:
        return Event.model_validate(raw) if "event" in raw else Reply.model_validate(raw)
    except ValidationError as exc:
        raise ProtocolError("bad_request", f"engine sent an invalid message: {_short(exc)}") from None


def error_reply(exc: ProtocolError) -> Reply:
    return Reply(id=exc.id, ok=False, error=ErrorInfo(type=exc.type, message=exc.message))


def _short(exc: ValidationError) -> str:
    parts = [f"{'.'.join(_clip(str(x)) for x in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()[:3]]
    return "; ".join(parts)


def _clip(text: str, limit: int = 60) -> str:
    """Sent text in an error message: short (a line of a megabyte must not come back whole) and
    UTF-8 (a lone surrogate, which JSON's `\\ud800` can carry, would fail the reply's encoding)."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(value: Any) -> str:
    """A sent value in an error message; a list or an object by its type (its repr may be huge,
    and a deep one exhausts the stack)."""
    if isinstance(value, list | dict):
        return f"(a JSON {'array' if isinstance(value, list) else 'object'})"
    return _clip(repr(value))
