"""`prime-agent acp` driven by the official SDK's own client (`spawn_agent_process`), as an editor
drives it: the agent is a real process, its sessions the real daemon's, its model the fake server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import schema as s

from agent.kernel.sandbox import unavailable
from agent.testing.openai_server import OpenAIServer
from daemon.client import connect
from tests.daemon.conftest import agent_script, no_daemon_left_behind  # noqa: F401 - the fixture is autouse

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


class Editor:
    """The client side: records every update, answers permission requests with `answers` in turn."""

    def __init__(self, answers: list[str] | None = None):
        self.updates: list[tuple[str, Any]] = []
        self.answers = list(answers or [])
        self.asked: list[s.RequestPermissionRequest] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(self, options, session_id, tool_call, **kwargs) -> s.RequestPermissionResponse:
        self.asked.append(tool_call)
        answer = self.answers.pop(0)
        if answer == "cancel":
            return s.RequestPermissionResponse(outcome=s.DeniedOutcome(outcome="cancelled"))
        return s.RequestPermissionResponse(outcome=s.AllowedOutcome(outcome="selected", option_id=answer))

    def of(self, kind: type) -> list:
        return [u for _, u in self.updates if isinstance(u, kind)]

    def text(self) -> str:
        return "".join(u.content.text for u in self.of(s.AgentMessageChunk))

    def on_connect(self, conn) -> None:
        pass


@pytest.fixture
def model_server():
    with OpenAIServer(agent_script) as server:
        yield server


def _agent(model_server) -> tuple[str, ...]:
    return (PRIME_AGENT, "acp", "--model", "fake", "--base-url", model_server.base_url)


async def _initialize(conn) -> s.InitializeResponse:
    return await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=s.ClientCapabilities(),
                                 client_info=s.Implementation(name="test-editor", version="1"))


@pytest.mark.slow
async def test_an_editor_prompts_sees_the_cell_as_a_tool_call_and_a_new_process_loads_the_session(
        project: Path, model_server):
    editor = Editor()
    async with acp.spawn_agent_process(editor, *_agent(model_server), env=dict(os.environ)) as (conn, process):
        init = await _initialize(conn)
        assert init.agent_capabilities.load_session and init.agent_info.name == "prime-agent"
        new = await conn.new_session(cwd=str(project), mcp_servers=[])
        assert new.modes.current_mode_id == "workspace-write"
        reply = await conn.prompt(session_id=new.session_id,
                                  prompt=[acp.text_block("run: x = 6 * 7\nprint('x is', x)")])
        assert reply.stop_reason == "end_turn"
        started, = editor.of(s.ToolCallStart)
        assert started.kind == "execute" and started.raw_input == {"code": "x = 6 * 7\nprint('x is', x)"}
        assert started.title == "x = 6 * 7"
        final = editor.of(s.ToolCallProgress)[-1]
        assert final.status == "completed" and final.content[0].content.text == "x is 42\n"
        assert editor.text() == "ran: x is 42"
        assert {u.message_id for u in editor.of(s.AgentMessageChunk)} == {"t1-2"}  # the turn's second model call
        # the editor's session is the daemon's: listed, with its turn
        async with await connect(autostart=False) as daemon:
            listed = {i.id: i for i in await daemon.sessions()}
        assert listed[new.session_id].turns == 1
        process.stdin.close()  # the editor went away: the agent exits and its session's kernel stops
        assert await asyncio.wait_for(process.wait(), 30) == 0
    async with await connect(autostart=False) as daemon:
        assert (await daemon.session(new.session_id)).state != "live"

    later = Editor()
    async with acp.spawn_agent_process(later, *_agent(model_server), env=dict(os.environ)) as (conn, process):
        await _initialize(conn)
        await conn.load_session(cwd=str(project), session_id=new.session_id, mcp_servers=[])
        assert [u.content.text for u in later.of(s.UserMessageChunk)] == ["run: x = 6 * 7\nprint('x is', x)"]
        assert later.of(s.ToolCallStart)[0].raw_input["code"].startswith("x = 6 * 7")
        assert "ran: x is 42" in later.text()
        later.updates.clear()
        reply = await conn.prompt(session_id=new.session_id, prompt=[acp.text_block("run: print(41 + 2)")])
        assert reply.stop_reason == "end_turn" and later.text() == "ran: 43"
    async with await connect(autostart=False) as daemon:
        assert (await daemon.session(new.session_id)).turns == 2  # the same session, continued


@pytest.mark.slow
async def test_the_files_a_cell_changed_are_diff_blocks_of_its_tool_call(project: Path, model_server):
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "old.txt").write_text("bye\n")
    (project / "data.bin").write_bytes(b"\0" * 10)
    code = ("edit('calc.py', 'a - b', 'a + b')\nwrite('new.txt', 'hello\\n')\nimport os; os.remove('old.txt')\n"
            "open('data.bin', 'wb').write(bytes(20))\nprint('done')")
    editor = Editor()
    async with acp.spawn_agent_process(editor, *_agent(model_server), env=dict(os.environ)) as (conn, process):
        await _initialize(conn)
        new = await conn.new_session(cwd=str(project), mcp_servers=[])
        reply = await conn.prompt(session_id=new.session_id, prompt=[acp.text_block("run: " + code)])
        assert reply.stop_reason == "end_turn"
    final = editor.of(s.ToolCallProgress)[-1]
    assert final.status == "completed" and final.content[0].content.text == "done\n"
    diffs = {Path(c.path).relative_to(project).as_posix(): c for c in final.content if c.type == "diff"}
    assert sorted(diffs) == ["calc.py", "new.txt", "old.txt"]
    assert (diffs["calc.py"].old_text, diffs["calc.py"].new_text) == ("def add(a, b):\n    return a - b\n",
                                                                       "def add(a, b):\n    return a + b\n")
    assert (diffs["new.txt"].old_text, diffs["new.txt"].new_text) == (None, "hello\n")
    assert (diffs["old.txt"].old_text, diffs["old.txt"].new_text) == ("bye\n", "")
    (binary,) = [c.content.text for c in final.content[1:] if c.type == "content"]  # no text to diff: said so
    assert binary == "data.bin (binary: 10 -> 20 bytes)"


@pytest.mark.slow
async def test_permissions_go_to_the_client_and_cancel_stops_a_running_cell(project: Path, model_server):
    editor = Editor(answers=["approve", "deny"])
    code = ("import subprocess\nfor cmd in ['echo first', 'echo second\\r\\x1b[2K']:\n"
            "    try:\n        print(await request_permission(cmd, 'to test'))\n"
            "    except PermissionError as e:\n        print('refused:', e)")
    async with acp.spawn_agent_process(editor, *_agent(model_server), env=dict(os.environ)) as (conn, process):
        await _initialize(conn)
        new = await conn.new_session(cwd=str(project), mcp_servers=[])
        reply = await conn.prompt(session_id=new.session_id, prompt=[acp.text_block("run: " + code)])
        assert reply.stop_reason == "end_turn"
        assert [c.title for c in editor.asked] == ["echo first", "echo second\\x0d\\x1b[2K"]  # escapes shown (E15)
        out = editor.of(s.ToolCallProgress)[-1].content[0].content.text
        assert "first" in out and "refused:" in out and "second" not in out.replace("echo second", "")

        editor.updates.clear()
        prompt = asyncio.ensure_future(conn.prompt(
            session_id=new.session_id, prompt=[acp.text_block("run: import time\nprint('going', flush=True)\n"
                                                              "time.sleep(120)")]))
        deadline = time.monotonic() + 60
        while not editor.of(s.ToolCallProgress) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        with pytest.raises(acp.RequestError):  # one prompt at a time
            await conn.prompt(session_id=new.session_id, prompt=[acp.text_block("again")])
        began = time.monotonic()
        await conn.cancel(session_id=new.session_id)
        reply = await asyncio.wait_for(prompt, 30)
        assert reply.stop_reason == "cancelled" and time.monotonic() - began < 10


@pytest.mark.slow
@pytest.mark.skipif(unavailable() is not None, reason=f"plan mode needs the sandbox: {unavailable()}")
async def test_plan_mode_is_a_session_mode_its_plan_an_update_and_the_client_approves_or_rejects_it(
        project: Path, model_server):
    editor = Editor(answers=["approve", "reject", "cancel"])
    plan = "1. look around\n2. run: open('w.txt', 'w').write('w')\nprint('wrote')"
    propose = [acp.text_block(f"run: propose_plan({plan!r})")]
    async with acp.spawn_agent_process(editor, *_agent(model_server), env=dict(os.environ)) as (conn, process):
        await _initialize(conn)
        new = await conn.new_session(cwd=str(project), mcp_servers=[])
        assert "plan" in [m.id for m in new.modes.available_modes]
        await conn.set_session_mode(session_id=new.session_id, mode_id="plan")
        assert editor.of(s.CurrentModeUpdate)[-1].current_mode_id == "plan"
        reply = await conn.prompt(session_id=new.session_id, prompt=propose)
        assert reply.stop_reason == "end_turn"
        shown, = editor.of(s.AgentPlanUpdate)
        assert [e.content for e in shown.entries] == ["look around", plan.split("2. ")[1]]
        asked, = editor.asked
        assert asked.kind == "switch_mode" and asked.raw_input == {"plan": plan}
        # approved within the same prompt: the plan carried out, writable, in workspace-write from now on
        assert (project / "w.txt").read_text() == "w" and editor.text().endswith("ran: wrote")
        assert editor.of(s.CurrentModeUpdate)[-1].current_mode_id == "workspace-write"
        async with await connect(autostart=False) as daemon:
            assert not (await daemon.session(new.session_id)).planning

        (project / "w.txt").unlink()
        await conn.set_session_mode(session_id=new.session_id, mode_id="plan")
        reply = await conn.prompt(session_id=new.session_id, prompt=propose)
        assert reply.stop_reason == "end_turn", editor.text()[-3000:]  # a turn that could not run says why
        assert len(editor.asked) == 2 and not (project / "w.txt").exists()
        async with await connect(autostart=False) as daemon:  # rejected: still planning, nothing waits
            info = await daemon.session(new.session_id)
        assert info.planning and info.plan is None
        reply = await conn.prompt(session_id=new.session_id, prompt=propose)
        assert reply.stop_reason == "cancelled" and len(editor.asked) == 3
        async with await connect(autostart=False) as daemon:  # cancelled: the plan still waits
            assert (await daemon.session(new.session_id)).plan == plan
        await conn.set_session_mode(session_id=new.session_id, mode_id="full-access")  # leaves plan mode
        assert editor.of(s.CurrentModeUpdate)[-1].current_mode_id == "full-access"
        reply = await conn.prompt(session_id=new.session_id, prompt=[acp.text_block(plan.split("2. ")[1])])
        assert reply.stop_reason == "end_turn" and (project / "w.txt").read_text() == "w"
        async with await connect(autostart=False) as daemon:
            info = await daemon.session(new.session_id)
        assert not info.planning and info.sandbox.startswith("full-access")


@pytest.mark.slow
async def test_bad_input_gets_json_rpc_errors_and_stdout_carries_only_the_protocol(project: Path, model_server):
    proc = await asyncio.create_subprocess_exec(*_agent(model_server), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=os.environ.copy())

    async def call(line: bytes) -> dict:
        proc.stdin.write(line + b"\n")
        await proc.stdin.drain()
        return json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": acp.PROTOCOL_VERSION}}
    assert (await call(json.dumps(init).encode()))["result"]["protocolVersion"] == acp.PROTOCOL_VERSION
    assert (await call(b"{not json"))["error"]["code"] == -32700
    unknown = await call(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/frobnicate", "params": {}}).encode())
    assert unknown["error"]["code"] == -32601
    nobody = {"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
              "params": {"sessionId": "no-such-session", "prompt": [{"type": "text", "text": "hi"}]}}
    assert (await call(json.dumps(nobody).encode()))["error"]["code"] == -32002
    mode = {"jsonrpc": "2.0", "id": 4, "method": "session/new", "params": {"cwd": str(project), "mcpServers": []}}
    session_id = (await call(json.dumps(mode).encode()))["result"]["sessionId"]
    bad = {"jsonrpc": "2.0", "id": 5, "method": "session/set_mode", "params": {"sessionId": session_id, "modeId": "yolo"}}
    assert (await call(json.dumps(bad).encode()))["error"]["code"] == -32602
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert await proc.stdout.read() == b""  # nothing but the protocol's answers


ACPLINT_QUIRKS = {"initialize_v1", "protocol_version_returned", "schema_initialize"}
"""acplint 0.1.0 wants `protocolVersion` as the string "1"; the spec and the SDK send the integer 1."""


@pytest.mark.slow
def test_acplint_finds_nothing_wrong_with_initialization_sessions_and_schemas(project: Path, model_server,
                                                                            tmp_path: Path):
    import subprocess

    report = tmp_path / "acplint.json"
    subprocess.run([str(Path(sys.executable).parent / "acplint"), "--agent", PRIME_AGENT, "--agent-args",
                    f"acp --model fake --base-url {model_server.base_url}", "--cwd", str(project), "--timeout", "60",
                    "--output", "json", "--output-file", str(report),
                    "--categories", "initialization", "session_lifecycle", "session_modes", "cancel",
                    "schema_validation"], capture_output=True, timeout=600)
    results = json.loads(report.read_text())["results"]
    assert {r["category"] for r in results} >= {"initialization", "session_lifecycle", "schema_validation"}
    failed = {r["name"]: r["message"] for r in results if r["status"] != "PASS" and r["name"] not in ACPLINT_QUIRKS}
    assert failed == {}
