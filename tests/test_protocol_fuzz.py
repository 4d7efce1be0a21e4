"""The socket protocol under hostile input: every line the engine cannot take gets a typed error
reply, on a connection that stays open; every line it takes holds what its params' types say.

Properties (hypothesis) at the level of `decode_request`, plus one explicit case for each defect
that fuzzing found: deep nesting and huge integers, integers past DuckDB's BIGINT, empty version
names, and lax coercion (`true` for 1, `"1"` for 1, `0` for false).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from engine.api.protocol import (
    MAX_MESSAGE_BYTES,
    METHODS,
    PROTOCOL_VERSION,
    ProtocolError,
    decode_request,
    encode,
    error_reply,
)
from engine.store import Store
from engine.workspace import Workspace
from tests.engine_support import Served, populate

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
VERSION_NAME = re.compile(r"v[0-9]+")
#: Params that name a version.
VERSION_FIELDS = {"version", "against", "a", "b"}


@pytest.fixture
def served(tiny_workspace: Workspace) -> Iterator[Served]:
    populate(tiny_workspace)
    s = Served(tiny_workspace.root).start()
    yield s
    s.stop()


class Connection:
    """One connection, one line at a time: each reply is read before the next line goes, so a
    connection the engine dropped shows at the line that dropped it."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(20)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")

    def ask(self, line: bytes) -> dict[str, Any]:
        self.sock.sendall(line + b"\n")
        reply = self.file.readline(MAX_MESSAGE_BYTES + 2)
        assert reply, f"the engine closed the connection after {line[:60]!r}"
        return json.loads(reply)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def request(method: str, id: Any = 1, **params: Any) -> bytes:
    return json.dumps({"v": PROTOCOL_VERSION, "id": id, "method": method, "params": params}).encode()


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def huge_int(digits: int) -> bytes:
    return b"9" * digits


def error_of(line: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        decode_request(line)
    return caught.value


# -- 1. nesting and integers that Python's json cannot read ------------------------------------------
HOSTILE_JSON = [
    pytest.param(deep(990), id="990-deep list"),
    pytest.param(deep(100_000), id="100k-deep list"),
    pytest.param(b'{"v": 1, "id": 3, "method": "hello", "params": {"x": ' + deep(990) + b"}}", id="deep params"),
    pytest.param(b'{"v": 1, "id": ' + huge_int(4301) + b', "method": "hello"}', id="4301-digit id"),
    pytest.param(
        b'{"v": 1, "id": 4, "method": "page_rollouts", "params": {"offset": ' + huge_int(5000) + b"}}",
        id="5000-digit offset",
    ),
]


@pytest.mark.parametrize("line", HOSTILE_JSON)
def test_deep_nesting_and_huge_integers_are_bad_requests(line: bytes) -> None:
    err = error_of(line)
    assert err.type == "bad_request" and err.id is None
    assert encode(error_reply(err)).count(b"\n") == 1


def test_deep_nesting_and_huge_integers_get_a_reply_and_the_connection_goes_on(served: Served) -> None:
    conn = Connection(served.path)
    try:
        for n, param in enumerate(HOSTILE_JSON):
            (line,) = param.values
            reply = conn.ask(line)
            assert reply["ok"] is False and reply["error"]["type"] == "bad_request", param.id
            assert reply["id"] is None
            after = conn.ask(request("hello", id=100 + n))
            assert after["ok"] is True and after["id"] == 100 + n, param.id
    finally:
        conn.close()


# -- 2. integers that reach SQL fit DuckDB's BIGINT ------------------------------------------------------
@pytest.mark.parametrize(
    "method, params",
    [
        ("page_rollouts", {"offset": 2**63}),
        ("page_rollouts", {"offset": 2**64 + 5}),
        ("page_rollouts", {"filter": {"step_min": 2**63}}),
        ("page_rollouts", {"filter": {"step_max": BIGINT_MIN - 1}}),
        ("metrics", {"run_id": "v0-train-1", "after_step": 2**63}),
        ("metrics", {"run_id": "v0-train-1", "after_step": BIGINT_MIN - 1}),
        ("rollout", {"rollout_id": f"v0-train-1/train/{2**63}/0/0"}),
    ],
)
def test_integers_past_bigint_are_refused_by_validation(method: str, params: dict[str, Any]) -> None:
    err = error_of(request(method, **params))
    assert err.type == "bad_request" and err.id == 1


def test_integers_at_bigint_s_edges_are_answered_and_past_them_are_bad_requests(served: Served) -> None:
    with served.client() as c:
        assert c.call("page_rollouts", offset=BIGINT_MAX)["rows"] == []
        edges = {"step_min": BIGINT_MIN, "step_max": BIGINT_MAX}
        assert c.call("page_rollouts", filter=edges)["total"] == 6
        assert c.call("metrics", run_id="v0-train-1", after_step=BIGINT_MAX) == {}
        assert c.call("metrics", run_id="v0-train-1", after_step=BIGINT_MIN)["reward"] == [[1, 0.75], [2, 0.0]]
    conn = Connection(served.path)
    try:
        reply = conn.ask(request("page_rollouts", id=5, offset=2**63))
        assert (reply["id"], reply["error"]["type"]) == (5, "bad_request")
        reply = conn.ask(request("rollout", id=6, rollout_id="v0-train-1/train/1/0/\u00b2"))  # '²'.isdigit()
        assert (reply["id"], reply["error"]["type"]) == (6, "bad_request")
    finally:
        conn.close()


# -- 3. version names --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "method, params",
    [
        ("version", {"version": ""}),
        ("diagnosis", {"version": ""}),
        ("diagnose", {"version": ""}),
        ("report", {"version": ""}),
        ("report", {"version": "v0", "against": ""}),
        ("diagnose", {"version": "v"}),
        ("diagnose", {"version": "1"}),
        ("diagnose", {"version": "v0 "}),
        ("diagnose", {"version": "v0\n"}),
        ("diagnose", {"version": "v\u0661"}),  # an Arabic-Indic one: a digit to \d, not to the engine
        ("backtest", {"kind": "filter", "version": ""}),
        ("diff", {"a": "", "b": "v0"}),
        ("page_rollouts", {"filter": {"version": ""}}),
    ],
)
def test_a_version_name_must_look_like_one(method: str, params: dict[str, Any]) -> None:
    assert error_of(request(method, **params)).type == "bad_request"


def test_a_wrong_version_is_not_found_or_a_bad_request_never_internal(served: Served) -> None:
    conn = Connection(served.path)
    try:
        for method in ("version", "diagnosis", "diagnose", "report"):
            for name, expected in (("", "bad_request"), ("v9", "not_found")):
                reply = conn.ask(request(method, version=name))
                if method == "diagnosis" and expected == "not_found":
                    assert reply["ok"] is True and reply["result"] is None  # no diagnosis stored yet
                else:
                    assert reply["error"]["type"] == expected, (method, name, reply)
    finally:
        conn.close()


def test_an_empty_version_filters_runs_to_none(tmp_path: Path) -> None:
    with Store(tmp_path / "evo.duckdb") as store:
        store.add_version("v0", None, "versions/v0", "abc")
        store.add_run("v0-train-1", "v0", "train", "runs/v0-train-1", {}, 3)
        assert [r.id for r in store.list_runs()] == ["v0-train-1"]
        assert [r.id for r in store.list_runs("v0")] == ["v0-train-1"]
        assert store.list_runs("") == []


# -- 4. strict types: JSON's own, no coercion ------------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        request("start", versions=True),
        request("start", versions="1"),
        request("start", versions=1.0),
        request("start", auto_approve=0),
        request("start", auto_approve="true"),
        request("page_rollouts", offset="10"),
        request("page_rollouts", filter={"truncated": 1}),
        request("page_rollouts", filter={"step_min": False}),
        request("backtest", kind="filter", version="v0", keep_ratio="0.5"),
        request("backtest", kind="filter", version="v0", ema=True),
        json.dumps({"v": True, "id": 1, "method": "hello"}).encode(),
        json.dumps({"v": 1.0, "id": 1, "method": "hello"}).encode(),
    ],
)
def test_lax_coercions_are_refused(line: bytes) -> None:
    assert error_of(line).type == "bad_request"


@pytest.mark.parametrize("id", ["7", True, 7.0])
def test_an_id_that_is_not_an_integer_is_refused_and_the_reply_s_id_is_null(id: Any) -> None:
    err = error_of(json.dumps({"v": 1, "id": id, "method": "hello"}).encode())
    assert (err.type, err.id) == ("bad_request", None)
    assert json.loads(encode(error_reply(err)))["id"] is None


def test_strict_types_still_take_json_natural_input() -> None:
    """A float field takes an integer (JSON writes 1.0 as 1 in many encoders), and what the CLI and
    the TUI send passes."""
    taken = [
        request("backtest", kind="filter", version="v0", keep_ratio=1, ema=0.5),
        request("backtest", kind="reward", version="v12", weights={"correctness": 1, "format": 0.5}),
        request("backtest", kind="analyzer", metric="signal.dead_group_ratio"),
        request("page_rollouts", filter={"version": "v0", "step_min": 2, "reward_min": 0, "truncated": True}),
        request("page_rollouts", filter={}, offset=50, limit=50),
        request("metrics", run_id="v0-train-1", after_step=12),
        request("start", versions=3, auto_approve=False, harness=None),
        request("report", version="v1", against=None),
        request("diff", a="v0", b="v1"),
        request("answer_gate", gate="g1", verb="revise", feedback="smaller steps"),
    ]
    for line in taken:
        decode_request(line)
    (_, params) = decode_request(request("backtest", kind="filter", version="v0", keep_ratio=1))
    assert params.keep_ratio == 1.0 and type(params.keep_ratio) is float  # type: ignore[attr-defined]
    # ...and what lax validation let through is refused.
    assert error_of(request("start", versions=True)).type == "bad_request"


# -- properties -------------------------------------------------------------------------------------------
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 3, max_value=2**64),
    st.integers(min_value=-(2**64), max_value=-(2**63) + 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 1.0, 0.0, "", "0", "1", "true", "v0", "v1", "v", "v-1", "V1", "v01"]),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


@st.composite
def params_for(draw: st.DrawFn, method: str) -> dict[str, Any]:
    """Params of `method`: its own field names (and now and then a stranger), hostile values."""
    model = METHODS[method]
    names = _field_names(model) + ["stranger"]
    out: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))):
        if name == "filter":
            filter_names = _field_names(METHODS["page_rollouts"].model_fields["filter"].annotation)  # type: ignore[arg-type]
            keys = draw(st.lists(st.sampled_from(filter_names), unique=True, max_size=4))
            out[name] = {k: draw(json_scalars) for k in keys}
        else:
            out[name] = draw(json_values if name in ("params", "stranger", "weights", "keys") else json_scalars)
    return out


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    method = draw(st.sampled_from(sorted(METHODS)))
    return {
        "v": draw(st.sampled_from([PROTOCOL_VERSION, True, 1.0]) | json_scalars),
        "id": draw(json_scalars),
        "method": method,
        "params": draw(params_for(method)),
    }


hostile_lines = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    requests().map(lambda r: json.dumps(r).encode()),
    st.integers(min_value=900, max_value=3000).map(deep),
    st.integers(min_value=4301, max_value=6000).map(lambda n: b'{"v": 1, "id": ' + huge_int(n) + b"}"),
    st.builds(
        lambda method, n: b'{"v": 1, "id": 1, "method": "' + method.encode() + b'", "params": {"a": ' + deep(n) + b"}}",
        st.sampled_from(sorted(METHODS)),
        st.integers(min_value=900, max_value=3000),
    ),
)


# too_slow: building lines thousands of levels deep or digits long is the point, not a slow strategy.
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_lines)
def test_any_line_is_taken_or_gets_a_typed_error_reply_that_encodes(line: bytes) -> None:
    try:
        request_, _ = decode_request(line)
    except ProtocolError as exc:
        assert exc.id is None or type(exc.id) is int
        out = encode(error_reply(exc))
        assert len(out) <= MAX_MESSAGE_BYTES and out.endswith(b"\n") and out.count(b"\n") == 1
        return
    assert type(request_.id) is int


def _same_json_type(raw: Any, taken: Any) -> bool:
    """What validation kept is what was sent: no bool taken as 1, no "1" as 1, no 0 as false."""
    if isinstance(taken, float) and type(raw) is int:
        return True  # a float field takes an integer: JSON has one number type
    if isinstance(taken, BaseModel):
        return isinstance(raw, dict) and all(_same_json_type(v, getattr(taken, k)) for k, v in raw.items())
    return type(raw) is type(taken)


def _ints(value: Any) -> Iterator[int]:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if type(value) is int:
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _ints(v)
    elif isinstance(value, list):
        for v in value:
            yield from _ints(v)


@settings(max_examples=600, deadline=None)
@given(requests())
def test_a_taken_request_holds_what_its_types_say(raw: dict[str, Any]) -> None:
    try:
        request_, params = decode_request(json.dumps(raw).encode())
    except ProtocolError as exc:
        assert exc.id == (raw["id"] if type(raw["id"]) is int else None)
        return
    assert type(raw["v"]) is int and type(raw["id"]) is int
    for name, value in raw["params"].items():
        assert _same_json_type(value, getattr(params, name)), (name, value)
    for n in _ints(params):
        assert BIGINT_MIN <= n <= BIGINT_MAX
    names = {k: getattr(params, k) for k in VERSION_FIELDS if k in type(params).model_fields}
    rollout_filter = getattr(params, "filter", None)
    if rollout_filter is not None:
        names["filter.version"] = rollout_filter.version
    for where, name in names.items():
        assert name is None or VERSION_NAME.fullmatch(name), (where, name)
    assert request_.method == raw["method"]
