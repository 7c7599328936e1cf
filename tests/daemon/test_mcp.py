"""MCP servers under the daemon: the API lists them, an `ask` call waits for a decision over the API,
and no server process outlives its daemon, even one killed with `kill -9` (the next daemon reaps it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from daemon.client import Client, DaemonError, SyncClient, daemon_pid
from tests.agent.test_mcp import EVERYTHING, TIME, alive, descendants
from tests.conftest import trust
from tests.daemon.test_orphans import PRIME_AGENT, dead_within


def mcp_project(project: Path, policy: str = "allow") -> Path:
    # server-everything as a server that started a helper of its own (as browser or database servers
    # do): the helper would outlive the server, which itself stops when its stdin closes.
    everything = {"command": "sh", "args": ["-c", f"sleep 600 & exec {EVERYTHING} stdio"]}
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"everything": everything}}))
    (project / ".prime-agent").mkdir(exist_ok=True)
    (project / ".prime-agent" / "config.toml").write_text(
        f'[mcp.servers.time]\ncommand = "{TIME}"\npolicy = "{policy}"\n')
    trust(project, ".mcp.json", ".prime-agent/config.toml")
    return project


async def test_an_ask_call_waits_for_a_decision_over_the_api(daemon: Client, project: Path, model_server):
    mcp_project(project, policy="ask")
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    listed = {m.name: m for m in await daemon.mcp(s.id)}
    assert listed["time"].policy == "ask" and listed["time"].state == "stopped"
    assert listed["everything"].transport == "stdio"
    started = {m.name: m for m in await daemon.mcp(s.id, start=True)}  # as the app's /mcp asks
    assert started["time"].state == "ready" and "get_current_time" in [t.name for t in started["time"].tools or []]
    code = ("for _ in range(2):\n    try:\n        print(await mcp.time.get_current_time(timezone='UTC'))\n"
            "    except McpError as e:\n        print('McpError:', e)")
    accepted = await daemon.send(s.id, "run: " + code)
    decisions = iter(["deny", "approve"])
    async for e in daemon.events(s.id):
        if e.type == "approval.requested":
            assert e.kind == "mcp" and e.summary == "time.get_current_time(timezone='UTC')" and e.server == "time"
            decision = next(decisions)
            assert (await daemon.decide_approval(s.id, e.request_id, decision)).decision == decision
        if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
            break
    assert "McpError: the call time.get_current_time was not approved: the user denied it" in e.answer  # the model
    assert "'timezone': 'UTC'" in e.answer
    with pytest.raises(DaemonError) as err:
        await daemon.decide_approval(s.id, "nope", "approve")
    assert err.value.status == 404 and "no approval request 'nope' waits" in str(err.value)
    with pytest.raises(DaemonError) as err:
        await daemon.decide_approval(s.id, "nope", "maybe")
    assert err.value.status == 422
    listed = {m.name: m for m in await daemon.mcp(s.id)}
    assert listed["time"].state == "ready" and "get_current_time" in [t.name for t in listed["time"].tools or []]


async def test_an_untrusted_mcp_json_is_named_in_session_info_and_starts_nothing(daemon: Client, project: Path,
                                                                                 model_server, tmp_path: Path):
    marker = tmp_path / "started"
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"planted": {
        "command": "sh", "args": ["-c", f"echo started > {marker}; exec {TIME}"]}}}))
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    info = await daemon.session(s.id)
    assert info.ignored == [".mcp.json (MCP servers the host starts) is new and ignored until you trust it: "
                            "prime-agent trust"]
    assert await daemon.mcp(s.id, start=True) == [] and not marker.exists()  # not even when a person lists them
    accepted = await daemon.send(s.id, "run: await mcp.call('planted', 'get_current_time', timezone='UTC')")
    async for e in daemon.events(s.id):
        if e.type == "session.started":
            assert e.ignored == info.ignored
        if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
            break
    assert "no MCP server 'planted'" in e.answer and not marker.exists()


@pytest.fixture
def client(prime_home: Path, model_server):
    c = SyncClient()
    yield c
    c.close()


@pytest.mark.slow
def test_no_server_outlives_a_deleted_session_nor_a_daemon_killed_with_kill_9(client: SyncClient, project: Path,
                                                                             model_server):
    mcp_project(project)

    def started() -> tuple[str, list[int]]:
        s = client.create_session(project, model="fake", base_url=model_server.base_url)
        turn = client.send(s.id, "run: print(await mcp.everything.echo(message='hi'), await mcp.time.get_current_time("
                                 "timezone='UTC'))")
        for e in client.events(s.id):
            if e.type == "turn.finished" and e.turn_id == turn.turn_id:
                assert "Echo: hi" in e.answer, e
                break
        servers = client.mcp(s.id)
        assert {m.state for m in servers} == {"ready"}
        pids = [p for m in servers if m.pid for p in descendants(m.pid)]
        assert pids and all(map(alive, pids))
        return s.id, pids

    sid, pids = started()
    client.delete(sid)
    assert dead_within(pids) == []

    _, pids = started()
    daemon = daemon_pid()
    os.kill(daemon, signal.SIGKILL)  # the daemon only: nothing reaches its servers
    assert dead_within([daemon]) == []
    time.sleep(0.5)
    survivors = [p for p in pids if alive(p)]
    assert survivors  # the helper: what the reap is for
    start = subprocess.run([PRIME_AGENT, "daemon", "start"], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    assert dead_within(survivors) == []
