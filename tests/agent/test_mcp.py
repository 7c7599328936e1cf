"""MCP servers from the kernel, against real third-party servers: `mcp-server-time` (PyPI, stdio),
`@modelcontextprotocol/server-everything` (npm, over stdio and over streamable HTTP) and
`@modelcontextprotocol/server-filesystem` (npm, stdio). One scripted session, its servers and the
HTTP server are shared by the module; tests that need a session of their own say so."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_asyncio

from agent import events as ev
from agent.config import ENV_VARS, load_config
from agent.config_models import Config
from agent.mcp import McpServers, ServerInfo, ToolInfo, cached_tools, prompt_section
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import McpCallRecord, SessionRecord, read_records
from tests.conftest import trust

pytestmark = pytest.mark.asyncio(loop_scope="module")

NODE_BIN = Path(sys.prefix) / "mcp-servers" / "node_modules" / ".bin"
"""Where scripts/setup.sh installs the npm servers (beside the venv's own)."""
TIME = str(Path(sys.prefix) / "mcp-servers" / "time" / "bin" / "mcp-server-time")  # its own venv: scripts/setup.sh
EVERYTHING = str(NODE_BIN / "mcp-server-everything")
FILESYSTEM = str(NODE_BIN / "mcp-server-filesystem")
SECRET = "s3cret-value-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (npm's bin scripts start node, node may start more)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """server-everything in its streamable HTTP mode, on a free port of the loopback."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("http") / "everything.log", "w")
    proc = subprocess.Popen([EVERYTHING, "streamableHttp"], env={**os.environ, "PORT": str(port)},
                            stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def write_project(root: Path, http_url: str) -> None:
    """.mcp.json (Claude Code's format, with ${VAR}) and [mcp.servers.NAME] in the project's config.toml."""
    root.mkdir(parents=True, exist_ok=True)
    (root / ".git").mkdir(exist_ok=True)
    (root / "notes.txt").write_text("hello from the project\n")
    (root / ".mcp.json").write_text(json.dumps({"mcpServers": {
        "everything": {"command": EVERYTHING, "args": ["stdio"], "env": {"SECRET_TOKEN": "${MCP_TEST_SECRET}"}},
        "files": {"command": FILESYSTEM, "args": [str(root)]},
        "web": {"type": "http", "url": "${MCP_TEST_URL}", "headers": {"Authorization": "Bearer ${MCP_TEST_SECRET}"}},
    }}))
    (root / ".prime-agent").mkdir(exist_ok=True)
    (root / ".prime-agent" / "config.toml").write_text(f"""
[kernel]
interrupt_grace = 1.0

[refine]
auto_every = 0

[mcp.servers.time]
command = "{TIME}"
args = ["--local-timezone", "UTC"]

[mcp.servers.slow]
command = "{EVERYTHING}"
args = ["stdio"]
timeout = 1.5
""")
    trust(root, ".mcp.json", ".prime-agent/config.toml")


class Driver:
    """A scripted session: `await d.cell(code)` runs one cell in a turn and returns its output."""

    def __init__(self, session: Session, model: ScriptedModel):
        self.session, self.model = session, model
        self.events: list[ev.Event] = []
        session.listeners.append(self.events.append)

    async def cell(self, code: str) -> str:
        self.model.outputs += [cells(code), "done"]
        start = len(self.events)
        await self.session.prompt("go")
        finished = [e for e in self.events[start:] if isinstance(e, ev.CellFinished)]
        assert finished, [e.type for e in self.events[start:]]
        self.last = finished[-1]
        r = finished[-1].result
        return r.stdout + (r.result or "") + (f"{r.error_name}: {r.error_value}" if r.error_name else "")

    def since(self, kind: type, start: int = 0) -> list:
        return [e for e in self.events[start:] if isinstance(e, kind)]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mcp")


@pytest.fixture(autouse=True)
def prime_home(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One $PRIME_AGENT_HOME for the module, as its shared session has (tests/conftest.py's, widened)."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PRIME_AGENT_HOME", str(root / "home"))
    return root / "home"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def d(http_server, root: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRIME_AGENT_HOME", str(root / "home"))
        mp.setenv("MCP_TEST_SECRET", SECRET)
        mp.setenv("MCP_TEST_URL", http_server)
        write_project(root / "project", http_server)
        config = load_config(root / "project")
        model = ScriptedModel([])
        session = Session(config, model, cwd=root / "project")
        await session.start()
        yield Driver(session, model)
        pids = [p for s in session.mcp.servers.values() if s.pid for p in descendants(s.pid)]
        await session.close()
        assert pids and not [p for p in pids if alive(p)], "an MCP server outlived its session"


async def test_servers_start_at_their_first_use_and_a_call_returns_a_python_value(d: Driver):
    assert {s.state for s in d.session.mcp.servers.values()} == {"stopped"}
    out = await d.cell('now = await mcp.time.get_current_time(timezone="Europe/Paris")\n'
                       'print(type(now).__name__, now["timezone"], sorted(now))')
    assert out.strip() == "dict Europe/Paris ['datetime', 'day_of_week', 'is_dst', 'timezone']"
    assert d.session.mcp.servers["time"].state == "ready"
    assert d.session.mcp.servers["everything"].state == "stopped"  # not used yet, not started
    out = await d.cell('total = await mcp.call("everything", "get-sum", a=1, b=2)\n'
                       'weather = await mcp.everything.get_structured_content(location="Chicago")\n'
                       'print(repr(total), sorted(weather))')
    assert out.strip() == "'The sum of 1 and 2 is 3.' ['conditions', 'humidity', 'temperature']"


async def test_fifty_calls_in_one_cell(d: Driver):
    out = await d.cell('got = [await mcp.everything.echo(message=f"m{i}") for i in range(50)]\n'
                       'print(got == [f"Echo: m{i}" for i in range(50)], len(got))')
    assert out.strip() == "True 50"
    records = [r for r in read_records(d.session.layout.trajectory) if isinstance(r, McpCallRecord)]
    echoes = [r for r in records if r.tool == "echo"]
    assert len(echoes) == 50 and echoes[-1].result["content"][0]["text"] == "Echo: m49"
    assert echoes[-1].cell_id == d.last.cell_id and echoes[-1].outcome == "ok"


async def test_help_and_list_show_descriptions_and_schemas(d: Driver):
    out = await d.cell("help(mcp.everything.get_sum)")
    assert "get_sum(*, a: float, b: float)" in out and "Returns the sum of two numbers" in out
    assert '"required": [' in out
    out = await d.cell("print(mcp.list('time'))\nprint(sorted(dir(mcp)))")
    assert "get_current_time(timezone: string): Get current time in a specific timezone" in out
    assert "'everything', 'files'" in out and "'web'" in out


async def test_a_tool_error_raises_mcp_error_with_the_servers_message(d: Driver):
    out = await d.cell('try:\n    await mcp.time.get_current_time(timezone="Nowhere/Land")\n'
                       'except McpError as e:\n    print("McpError:", e)')
    assert out.startswith("McpError: time.get_current_time:") and "Invalid timezone" in out
    out = await d.cell('try:\n    await mcp.files.read_text_file(path="/etc/hostname")\n'
                       'except McpError as e:\n    print("McpError:", e)')
    assert "McpError: files.read_text_file:" in out and "denied" in out.lower()
    out = await d.cell('print(await mcp.files.read_text_file(path="notes.txt"))')
    assert "hello from the project" in out


async def test_unknown_servers_and_tools_are_clear_errors_that_list_what_exists(d: Driver):
    out = await d.cell('try:\n    await mcp.call("nope", "x")\nexcept McpError as e:\n    print(e)')
    assert out.strip() == "no MCP server 'nope'; configured: everything, files, slow, time, web"
    out = await d.cell('try:\n    await mcp.call("time", "get_tomorrow")\nexcept McpError as e:\n    print(e)')
    assert out.strip() == "MCP server 'time' has no tool 'get_tomorrow'; its tools: convert_time, get_current_time"
    out = await d.cell("mcp.time.get_tomorrow")
    assert "AttributeError: MCP server 'time' has no tool 'get_tomorrow'; its tools: convert_time, get_current_time" in out
    out = await d.cell("mcp.nope")
    assert "AttributeError: no MCP server 'nope'; configured: everything, files, slow, time, web" in out


async def test_images_are_attachments_and_resources_read_as_values(d: Driver):
    out = await d.cell("img = await mcp.everything.get_tiny_image()\nprint(img)")
    assert "Here's the image you requested:" in out and "<image/png," in out
    assert d.last.attachments == ["image/png"]
    out = await d.cell('doc = await mcp.read("everything", "demo://resource/static/document/architecture.md")\n'
                       'print(type(doc).__name__, doc.splitlines()[0])')
    assert out.strip().startswith("str # Everything Server")
    out = await d.cell('try:\n    await mcp.read("everything", "demo://nothing/here")\nexcept McpError as e:\n'
                       '    print("McpError:", e)')
    assert out.startswith("McpError: everything: reading demo://nothing/here:")


async def test_streamable_http_works_the_same_way(d: Driver):
    out = await d.cell('print(await mcp.web.echo(message="over http"), await mcp.web.get_sum(a=2, b=5))')
    assert out.strip() == "Echo: over http The sum of 2 and 5 is 7."
    assert d.session.mcp.servers["web"].info().transport == "http"


async def test_credentials_reach_the_server_and_never_the_kernel_or_the_records(d: Driver):
    out = await d.cell('import os\nenv = await mcp.everything.get_env()\n'
                       f'print(env["SECRET_TOKEN"] == {SECRET!r}, "SECRET_TOKEN" in os.environ, "MCP_TEST_SECRET" in os.environ)')
    # The server (in the host, outside the sandbox) got the expanded value; the kernel has neither
    # SECRET_TOKEN nor the host's MCP_TEST_SECRET (the sandbox's environment policy drops it).
    assert out.strip() == "True False False"
    [start] = [r for r in read_records(d.session.layout.trajectory) if isinstance(r, SessionRecord)]
    servers = start.config["mcp"]["servers"]
    assert servers["everything"]["env"] == {"SECRET_TOKEN": "<not recorded>"}
    assert servers["web"]["headers"] == {"Authorization": "<not recorded>"}
    assert SECRET not in d.session.messages[0].content and f"Bearer {SECRET}" not in d.session.layout.trajectory.read_text()


async def test_a_server_that_crashes_mid_call_fails_that_call_and_the_next_one_works(d: Driver):
    await d.cell('await mcp.everything.echo(message="up")')
    server = d.session.mcp.servers["everything"]
    pid, restarts = server.pid, server.restarts
    cell = asyncio.ensure_future(d.cell(
        "import asyncio\n"
        "call = asyncio.ensure_future(mcp.everything.trigger_long_running_operation(duration=20, steps=20))\n"
        "await asyncio.sleep(0.5)\nopen('calling', 'w').close()\n"
        "try:\n    await call\nexcept McpError as e:\n    print('McpError:', e)\n"
        "print(await mcp.everything.echo(message='back'))"))
    while not (d.session.cwd / "calling").exists():  # the kill comes from here: the sandboxed kernel sees no
        assert not cell.done(), cell.result()        # process of the host's, the server included
        await asyncio.sleep(0.02)
    os.kill(pid, 9)
    out = await cell
    assert "McpError: MCP server 'everything' crashed during the call" in out and "Echo: back" in out
    assert server.restarts == restarts + 1 and server.pid != pid and not alive(pid)


async def test_a_call_times_out_and_a_cell_waiting_on_one_can_be_interrupted(d: Driver):
    out = await d.cell('try:\n    await mcp.slow.trigger_long_running_operation(duration=30, steps=1)\n'
                       'except McpError as e:\n    print("McpError:", e)')
    assert "McpError: slow.trigger-long-running-operation: no answer within 1.5 s" in out
    d.model.outputs += [cells("await mcp.everything.trigger_long_running_operation(duration=60, steps=1)"), "done"]
    start = len(d.events)
    turn = asyncio.ensure_future(d.session.prompt("go"))
    while not any(isinstance(e, ev.CellStarted) for e in d.events[start:]):
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    began = time.monotonic()
    await d.session.interrupt()
    result = await turn
    assert result.outcome == "interrupted" and time.monotonic() - began < 10
    d.model.outputs.clear()  # the "done" the interrupted turn never reached
    called = d.since(ev.McpCalled, start)
    assert [(c.tool, c.outcome) for c in called] == [("trigger-long-running-operation", "cancelled")]
    out = await d.cell('print(await mcp.everything.echo(message="still here"), x := 1)')
    assert out.strip() == "Echo: still here 1"  # the kernel kept its state; the server its connection


async def test_every_call_is_an_event_under_its_cell(d: Driver):
    start = len(d.events)
    await d.cell('await mcp.time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")')
    [called] = d.since(ev.McpCalled, start)
    assert called.cell_id == d.last.cell_id and called.server == "time" and called.outcome == "ok"
    assert called.arguments == {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    assert called.result["structured"]["target"]["timezone"] == "Asia/Tokyo"


async def test_the_prompt_lists_servers_and_tools_compactly_and_stably(d: Driver):
    # What this session listed is cached, so the next session's prompt names the tools unstarted.
    infos = d.session.mcp.infos()
    assert all(i.tools for i in infos), [(i.name, i.state) for i in infos]
    again = McpServers(d.session.config.mcp, d.session.cwd, d.session.dir).infos()
    section = prompt_section(again, 3000)
    assert section == prompt_section(list(reversed(again)), 3000)
    assert section.startswith("# MCP servers\n") and len(section) <= 3000
    assert "- time (stdio)\n  - convert_time: Convert time between timezones\n  - get_current_time: Get current" in section
    assert "- web (http)" in section and "more: `mcp.list(\"" in section  # the budget cut the rest
    first = d.session.messages[0].content  # the servers were not listed yet when this session began
    assert "- time (stdio): tools not listed yet" in first and "await mcp.SERVER.TOOL(**arguments)" in first


async def test_policies_deny_and_ask(d: Driver, monkeypatch):
    servers = d.session.mcp.servers
    monkeypatch.setattr(servers["time"].config, "policy", "deny")
    out = await d.cell('try:\n    await mcp.time.get_current_time(timezone="UTC")\nexcept McpError as e:\n    print(e)')
    assert "calls to MCP server 'time' are denied by its policy" in out
    monkeypatch.setattr(servers["time"].config, "policy", "ask")
    out = await d.cell('try:\n    await mcp.time.get_current_time(timezone="UTC")\nexcept McpError as e:\n    print(e)')
    assert "was not approved: nobody can approve it in this session" in out
    monkeypatch.setattr(d.session.approvals, "can_ask", True)
    call = ('try:\n    print((await mcp.time.get_current_time(timezone="UTC"))["timezone"])\n'
            'except McpError as e:\n    print(e)')
    denied = "was not approved: the user denied it"
    for decision, expected in (("approve", "UTC"), ("deny", denied), ("always", "UTC")):
        d.model.outputs += [cells(call), "done"]
        start = len(d.events)
        turn = asyncio.ensure_future(d.session.prompt("go"))
        while not (asked := d.since(ev.ApprovalRequested, start)):
            assert not turn.done(), [e for e in d.events[start:]]
            await asyncio.sleep(0.02)
        r = asked[0]
        assert (r.kind, r.summary) == ("mcp", "time.get_current_time(timezone='UTC')")
        assert r.prefix == "time.get_current_time"
        assert (r.server, r.tool, r.arguments) == ("time", "get_current_time", {"timezone": "UTC"}) and r.cell_id
        d.session.approvals.decide(r.request_id, decision)
        await turn
        assert expected in d.since(ev.CellFinished, start)[0].result.stdout
        assert [(e.kind, e.decision, e.by) for e in d.since(ev.ApprovalDecided, start)] == [("mcp", decision, "user")]
    with pytest.raises(KeyError):
        d.session.approvals.decide(r.request_id, "approve")
    d.model.outputs += [cells(call), "done"]  # `always`: that tool's next call runs unasked
    start = len(d.events)
    await d.session.prompt("go")
    assert "UTC" in d.since(ev.CellFinished, start)[0].result.stdout
    assert [(e.decision, e.by) for e in d.since(ev.ApprovalDecided, start)] == [("always", "rule")]


async def test_a_prompt_section_within_its_budget_is_deterministic():
    tools = [ToolInfo(name=f"tool{i:02}", description=f"does thing {i}\nmore detail") for i in range(40)]
    servers = [ServerInfo(name="b", transport="stdio", policy="allow", state="stopped", tools=tools),
               ServerInfo(name="a", transport="http", policy="ask", state="stopped", tools=None),
               ServerInfo(name="c", transport="stdio", policy="deny", state="stopped", tools=tools)]
    section = prompt_section(servers, 700)
    assert len(section) <= 700
    lines = section.splitlines()
    assert lines[2] == "- a (http, each call needs approval): tools not listed yet (its first approved call starts it)"
    assert lines[3] == "- b (stdio)" and lines[4] == "  - tool00: does thing 0"
    assert any(line.startswith("  - ... ") and 'mcp.list("b")' in line for line in lines)
    assert prompt_section([], 700) == ""


async def test_a_server_that_cannot_start_is_reported_and_not_retried(tmp_path: Path, project: Path):
    from agent.config_models import McpConfig
    from agent.mcp import McpError

    config = McpConfig.model_validate({"servers": {
        "broken": {"command": sys.executable, "args": ["-c", "import sys; print('bad config', file=sys.stderr); sys.exit(3)"]},
        "unset": {"command": "${NO_SUCH_VARIABLE_HERE}"},
    }})
    servers = McpServers(config, project, tmp_path)
    with pytest.raises(McpError, match=r"'broken' could not start: .*\n?.*bad config"):
        await servers.call("broken", "x", {})
    with pytest.raises(McpError, match="failed and is not restarted in this session"):
        await servers.call("broken", "x", {})
    with pytest.raises(McpError, match=r"\$\{NO_SUCH_VARIABLE_HERE\} is not set"):
        await servers.call("unset", "x", {})
    [info] = await servers.list("broken")
    assert info.state == "failed" and "bad config" in info.error and cached_tools("broken", config.servers["broken"]) is None
    await servers.close()


async def test_a_subagents_call_under_policy_ask_is_decided_in_its_parents_session(root: Path):
    """A session of its own: the subagent's servers come from the config, with `time` under `ask`."""
    config = Config.model_validate({"mcp": {"servers": {"time": {"command": TIME, "policy": "ask"}}}})
    call = 'print((await mcp.time.get_current_time(timezone="UTC"))["timezone"])'

    def respond(messages):
        is_child = "You are `clock`, started by a parent agent" in messages[0].content
        if messages[-1].role == "tool":
            return messages[-1].content.strip() if is_child else "parent saw: " + messages[-1].content.strip()
        return cells(call) if is_child else cells("print(await (await rlm('what time is it in UTC?', name='clock')))")

    asked = []

    async def approve(request):
        asked.append(request)
        return "approve"

    events: list = []
    async with Session(config, ScriptedModel([respond] * 10), cwd=root, on_event=events.append) as s:
        s.approvals.ask = approve
        result = await s.prompt("ask a subagent the time")
    assert [(r.kind, r.summary, r.reason) for r in asked] == [
        ("mcp", "time.get_current_time(timezone='UTC')", "[subagent clock]")]
    decided = [(e.kind, e.decision, e.by) for e in events if isinstance(e, ev.ApprovalDecided)]
    assert decided == [("mcp", "approve", "user")]
    assert result.answer.startswith("parent saw: ") and "UTC" in result.answer, result


async def test_a_server_under_ask_starts_only_once_a_person_approved_a_call(root: Path, tmp_path_factory):
    """Under `ask` nothing of the server runs before a person decided: not for the kernel's listing,
    not to check the tool, not while the request waits; a denied call starts nothing."""
    marker = tmp_path_factory.mktemp("ask") / "started"
    config = Config.model_validate({"mcp": {"servers": {"clock": {
        "command": "sh", "args": ["-c", f"echo started > {marker}; exec {TIME}"], "policy": "ask"}}}})
    code = ("print(mcp.list())\nfor _ in range(2):\n    try:\n"
            "        print(await mcp.clock.get_current_time(timezone='UTC'))\n"
            "    except McpError as e:\n        print('McpError:', e)")
    asked, decisions = [], iter(["deny", "approve"])

    async def decide(request):
        asked.append((request.summary, marker.exists()))
        return next(decisions)

    events: list = []
    async with Session(config, ScriptedModel([cells(code), "done"]), cwd=root, on_event=events.append) as s:
        s.approvals.ask = decide
        await s.prompt("what time is it?")
    out = [e for e in events if isinstance(e, ev.CellFinished)][0].result.stdout
    assert out.startswith("clock (stdio, stopped, policy ask)\n"), out
    assert asked == [("clock.get_current_time(timezone='UTC')", False)] * 2  # asked twice, started by neither ask
    assert "McpError: the call clock.get_current_time was not approved" in out and "'timezone': 'UTC'" in out
    assert marker.read_text() == "started\n"  # the approved call started it


# --- what a server runs: never the workspace's, unless a person trusted those bytes ---------------

TIME_PYTHON = str(Path(TIME).parent / "python")
"""The time server's own interpreter: `python -m mcp_server_time` imports its installed package."""
SERVER_SCRIPT = "import sys\nfrom mcp_server_time import main\nsys.argv[1:] = ['--local-timezone', 'UTC']\nmain()\n"
"""tools/server.py as a person writes it: the time server, started from a script of the project."""


def leak(marker: Path) -> str:
    """A module or script as a cell plants it: on the host it writes the server's secret where the
    kernel cannot, then exits."""
    return f"import os\nopen({str(marker)!r}, 'w').write('ran ' + os.environ.get('LEAK', ''))\nraise SystemExit(3)\n"


def fresh(base: Path, servers: dict) -> Path:
    """A fresh project (no .git, no .prime-agent) whose .mcp.json a person wrote and trusted."""
    project = base / "fresh"
    project.mkdir()
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": servers}))
    trust(project, ".mcp.json")
    return project


async def cell_outputs(project: Path, *code: str) -> tuple[list[str], Session]:
    """One session whose model runs each of `code` as a cell: what each printed."""
    events: list = []
    async with Session(load_config(project), ScriptedModel([*(cells(c) for c in code), "done"]), cwd=project,
                       on_event=events.append) as s:
        await s.prompt("go")
    return [e.result.stdout + (e.result.error_value or "") for e in events if isinstance(e, ev.CellFinished)], s


CALL = ("try:\n    print((await mcp.clock.get_current_time(timezone='UTC'))['timezone'])\n"
        "except (McpError, AttributeError) as e:\n    print('refused:', e)")


async def test_a_module_a_cell_plants_beside_a_python_m_server_is_never_imported(tmp_path_factory, monkeypatch):
    """`python -m mcp_server_time` from a trusted .mcp.json, started after a cell wrote
    `mcp_server_time.py` into the project: the server imports its installed package (it starts in
    a neutral folder with PYTHONSAFEPATH=1), never the planted module, which would get its secrets."""
    base = tmp_path_factory.mktemp("planted")
    marker = base / "pwned"
    monkeypatch.setenv("MCP_TEST_SECRET", SECRET)
    project = fresh(base, {"clock": {"command": TIME_PYTHON, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                                     "env": {"LEAK": "${MCP_TEST_SECRET}"}}})
    out, _ = await cell_outputs(project, f"open('mcp_server_time.py', 'w').write({leak(marker)!r})", CALL)
    assert (project / "mcp_server_time.py").is_file()
    assert not marker.exists(), marker.read_text()
    assert out[1].strip() == "UTC"


async def test_a_server_script_changed_after_trust_does_not_start(tmp_path_factory, monkeypatch, prime_home: Path):
    """`python tools/server.py`, trusted with .mcp.json. A cell rewrites the script: the server does
    not start, in that session (the script is checked as the server starts) nor in the next (named
    at its start), and its secret reaches nothing. Restored, the script runs again, as the copy of
    the bytes trusted, in a neutral folder."""
    base = tmp_path_factory.mktemp("changed")
    marker = base / "pwned"
    monkeypatch.setenv("MCP_TEST_SECRET", SECRET)
    project = fresh(base, {"clock": {"command": TIME_PYTHON, "args": ["tools/server.py"],
                                     "env": {"LEAK": "${MCP_TEST_SECRET}"}}})
    (project / "tools").mkdir()
    (project / "tools" / "server.py").write_text(SERVER_SCRIPT)
    trust(project, "tools/server.py")

    out, _ = await cell_outputs(project, f"open('tools/server.py', 'w').write({leak(marker)!r})", CALL)
    assert not marker.exists(), marker.read_text()
    assert out[1].startswith("refused: ") and ("could not start: tools/server.py (run by MCP server 'clock') is "
                                               "changed since you trusted it, so it does not run until you trust "
                                               "it: prime-agent trust") in out[1], out
    out, s = await cell_outputs(project, CALL)
    assert s.ignored == ["tools/server.py (run by MCP server 'clock') is changed since you trusted it, so MCP server "
                         "'clock' does not start until you trust it: prime-agent trust"]
    assert out[0].startswith("refused: no MCP server 'clock'") and not marker.exists()

    (project / "tools" / "server.py").write_text(SERVER_SCRIPT)  # the person's `git checkout`
    events: list = []
    async with Session(load_config(project), ScriptedModel([cells(CALL), "done"]), cwd=project,
                       on_event=events.append) as s:
        await s.prompt("go")
        pid = s.mcp.servers["clock"].pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    assert [e.result.stdout for e in events if isinstance(e, ev.CellFinished)] == ["UTC\n"]
    assert Path(argv[1]).parents[1] == prime_home / "pinned" and Path(argv[1]).read_text() == SERVER_SCRIPT
    assert str(project) not in " ".join(argv) and project not in [cwd, *cwd.parents]
