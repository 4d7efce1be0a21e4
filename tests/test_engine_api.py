"""The engine daemon and its socket protocol: round trips, bad input, concurrency, events, gates,
the single-engine lock and stale files."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.api.client import AsyncEngineClient, EngineClient, EngineError, EngineUnavailable
from engine.api.protocol import MAX_MESSAGE_BYTES, PROTOCOL_VERSION, Event, Reply
from engine.daemon import EngineRunningError, WorkspaceLock, socket_path
from engine.grpo import DEAD_STD
from engine.workspace import Workspace
from tests.engine_support import Served, populate


@pytest.fixture
def workspace(tiny_workspace: Workspace) -> Workspace:
    populate(tiny_workspace)
    return tiny_workspace


@pytest.fixture
def served(workspace: Workspace) -> Iterator[Served]:
    s = Served(workspace.root).start()
    yield s
    s.stop()


def raw_exchange(path: Path, data: bytes) -> list[dict]:
    """Send raw bytes, read replies until the engine has answered every line sent."""
    expected = data.count(b"\n")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(data)
        buf = b""
        while buf.count(b"\n") < expected:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    return [json.loads(line) for line in buf.splitlines()]


def test_round_trip_and_typed_results(served: Served) -> None:
    with served.client() as c:
        hello = c.call("hello")
        assert hello["protocol"] == PROTOCOL_VERSION and hello["pid"] == os.getpid()
        versions = c.call("list_versions")
        assert [v["name"] for v in versions] == ["v0"] and versions[0]["state"] == "promoted"
        series = c.call("metrics", run_id="v0-train-1", keys=["reward"])
        assert series == {"reward": [[1, 0.75], [2, 0.0]]}
        with pytest.raises(EngineError) as missing:
            c.call("version", version="v9")
        assert missing.value.type == "not_found"
    mode = stat.S_IMODE(os.stat(served.path).st_mode)
    assert mode == 0o600


def test_malformed_oversized_and_unknown_input_get_error_replies_and_the_engine_goes_on(served: Served) -> None:
    ok = json.dumps({"v": PROTOCOL_VERSION, "id": 9, "method": "hello"}).encode() + b"\n"
    replies = raw_exchange(
        served.path,
        b"this is not json\n"
        + json.dumps({"v": 99, "id": 1, "method": "hello"}).encode()
        + b"\n"
        + json.dumps({"v": PROTOCOL_VERSION, "id": 2, "method": "format_disk"}).encode()
        + b"\n"
        + json.dumps({"v": PROTOCOL_VERSION, "id": 3, "method": "page_rollouts", "params": {"limit": 10**6}}).encode()
        + b"\n"
        + b"x" * (MAX_MESSAGE_BYTES + 10)
        + b"\n"
        + ok,
    )
    kinds = [(r["id"], r["ok"], (r.get("error") or {}).get("type")) for r in replies]
    assert kinds == [
        (None, False, "bad_request"),
        (1, False, "unsupported_version"),
        (2, False, "unknown_method"),
        (3, False, "bad_request"),
        (None, False, "too_large"),
        (9, True, None),
    ]
    with served.client() as c:
        assert c.call("hello")["workspace"] == str(served.root)


def test_concurrent_clients_each_get_their_own_answers(served: Served) -> None:
    results: dict[int, list[str]] = {}

    def worker(n: int) -> None:
        with served.client() as c:
            results[n] = [c.call("version", version="v0")["name"] for _ in range(20)]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {n: ["v0"] * 20 for n in range(6)}


def test_rollout_paging_and_filters_are_sql_in_the_engine(served: Served) -> None:
    with served.client() as c:
        page = c.call("page_rollouts", limit=2)
        assert page["total"] == 6 and [r["id"] for r in page["rows"]] == [
            "v0-train-1/train/1/0/0",
            "v0-train-1/train/1/0/1",
        ]
        dead = c.call("page_rollouts", filter={"group": "dead"}, limit=50)
        # Group 1 of step 1 (two rewards of 1) and the step-2 group (two zeros) have no spread.
        assert sorted(r["id"] for r in dead["rows"]) == [
            "v0-train-1/train/1/1/0",
            "v0-train-1/train/1/1/1",
            "v0-train-1/train/2/0/0",
            "v0-train-1/train/2/0/1",
        ]
        assert c.call("page_rollouts", filter={"truncated": True})["total"] == 1
        assert c.call("page_rollouts", filter={"reward_min": 0.5, "step_max": 1})["total"] == 3
        detail = c.call("rollout", rollout_id="v0-train-1/train/1/0/1")
        assert detail["reward"] == 1.0 and detail["components"] == {"correctness": 1.0}
        assert [g["sample_idx"] for g in detail["group"]] == [0, 1]


def test_answering_a_gate_through_the_socket_changes_the_stored_gate(served: Served) -> None:
    with served.client() as c:
        (gate,) = [g for g in c.call("gates") if g["state"] == "pending"]
        answer = c.call("answer_gate", gate=gate["id"], verb="revise", feedback="smaller steps")
        assert answer == {"gate": gate["id"], "state": "revised", "taken_by": "store"}
        with pytest.raises(EngineError) as again:
            c.call("answer_gate", gate=gate["id"], verb="approve")
        assert again.value.type == "conflict"
        assert c.call("status")["pending_gates"] == []


def test_subscribers_receive_events_and_a_stuck_client_does_not_block_them(served: Served) -> None:
    async def scenario() -> list[Event]:
        got: list[Event] = []
        client = AsyncEngineClient(served.path, on_event=got.append)
        await client.connect()
        assert (await client.call("subscribe"))["subscribed"]
        stuck = socket.socket(socket.AF_UNIX)  # subscribes and never reads
        stuck.connect(str(served.path))
        stuck.sendall(json.dumps({"v": PROTOCOL_VERSION, "id": 1, "method": "subscribe"}).encode() + b"\n")
        await asyncio.sleep(0.2)
        server = served.server
        # 2,000 events in bursts of 200 (a run publishes about one a second): the reading client gets
        # every one while a subscriber that never reads is connected.
        for step in range(1, 2001):
            server.publish("run", {"run_id": "v1-train-1", "step": step})
            if step % 200 == 0:
                await asyncio.sleep(0.05)
        for _ in range(100):
            if len(got) >= 2000:
                break
            await asyncio.sleep(0.05)
        await client.close()
        stuck.close()
        return got

    events = asyncio.run(scenario())
    assert [e.data["step"] for e in events] == list(range(1, 2001))


def test_one_engine_per_workspace_and_stale_files_are_cleaned(workspace: Workspace) -> None:
    path = socket_path(workspace.root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("stale")  # a socket file left by a killed engine
    first = Served(workspace.root).start()
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        with pytest.raises(EngineRunningError, match=f"pid {os.getpid()}"):
            WorkspaceLock(workspace.root).acquire()
        assert WorkspaceLock(workspace.root).held_by_other()
    finally:
        first.stop()
    assert not path.exists() and not WorkspaceLock(workspace.root).held_by_other()
    with pytest.raises(EngineUnavailable):
        EngineClient(path)
    # A new engine starts on the same workspace (the lock died with the first one).
    Served(workspace.root).start().stop()


def test_a_reply_the_client_cannot_validate_is_an_error_not_a_crash() -> None:
    from engine.api.protocol import ProtocolError, decode_incoming

    with pytest.raises(ProtocolError, match="protocol"):
        decode_incoming(b'{"v": 2, "id": 1, "ok": true}\n')
    assert isinstance(decode_incoming(b'{"v": 1, "id": 1, "ok": true, "result": 3}\n'), Reply)


def test_the_cli_goes_through_a_running_engine(workspace: Workspace) -> None:
    """A real engine process (as `evotui engine --detach` starts it): the CLI answers a gate, shows
    status and the tree through the socket, runs the coach in the engine, and stops it."""
    from typer.testing import CliRunner

    from engine.daemon import spawn
    from evotui.cli import app

    runner = CliRunner()
    ws = str(workspace.root)
    pid = spawn(workspace.root)
    try:
        assert pid > 0 and WorkspaceLock(workspace.root).held_by_other()
        status = runner.invoke(app, ["status", ws])
        assert status.exit_code == 0 and f"engine: pid {pid}" in status.output and "gate g1 waits" in status.output
        answered = runner.invoke(app, ["revise", ws, "g1", "smaller steps"])
        assert answered.exit_code == 0 and "revised" in answered.output
        listed = " ".join(runner.invoke(app, ["gates", ws, "--all"]).output.split())
        assert "g1 after_design round1-design0: revised" in listed and "feedback: smaller steps" in listed
        tree = runner.invoke(app, ["versions", ws])
        assert tree.exit_code == 0 and "v0 promoted" in tree.output
        # The harness, the report and a backtest run inside the engine (it holds the store).
        report = runner.invoke(app, ["report", ws, "v0", "--json"])
        assert report.exit_code == 0, report.output
        dead = [
            f for f in json.loads(report.output)["diagnosis"]["findings"] if f["metric"] == "signal.dead_group_ratio"
        ]
        assert dead[0]["value"] == 2 / 3  # of the 3 groups, 2 have no reward spread
        diagnosed = runner.invoke(app, ["diagnose", ws, "v0"])
        assert diagnosed.exit_code == 0 and "v0-train-1" in diagnosed.output
        bt = runner.invoke(app, ["backtest", "filter", ws, "v0", "--std-threshold", "0.001", "--json"])
        assert bt.exit_code == 0 and json.loads(bt.output)["kept"] == 1 / 3
        # Unset, the filter's settings are [recipe.group_filter]'s defaults: one definition.
        default = json.loads(runner.invoke(app, ["backtest", "filter", ws, "v0", "--json"]).output)
        assert (default["std_threshold"], default["keep_ratio"], default["ema"]) == (DEAD_STD, 1.0, 0.0)
        bad = runner.invoke(app, ["backtest", "reward", ws, "v0", "--weights", "nope=1"])
        assert bad.exit_code == 1 and "unknown reward component(s) ['nope']" in bad.output
        started = runner.invoke(app, ["engine", ws])
        assert "already serves" in started.output
    finally:
        stopped = runner.invoke(app, ["engine", ws, "--stop"])
    assert f"engine (pid {pid}) stopped" in stopped.output
    assert not WorkspaceLock(workspace.root).held_by_other()
