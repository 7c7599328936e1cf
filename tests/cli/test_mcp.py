"""`prime-agent mcp add|list|remove` against real servers: what `add` writes, a session loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.config import load_config
from tests.agent.test_mcp import EVERYTHING, TIME
from tests.conftest import trust

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def mcp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PRIME_AGENT, "mcp", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_add_list_and_remove_servers(project: Path, prime_home: Path):
    config = project / ".prime-agent" / "config.toml"
    config.parent.mkdir()
    config.write_text("# my settings\n[kernel]\ncell_timeout = 100.0\n")
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"everything": {"command": EVERYTHING, "args": ["stdio"]}}}))
    trust(project, ".prime-agent/config.toml", ".mcp.json")
    done = mcp("add", "time", "--policy", "ask", "--env", "TZ_HINT=${HOME}", "--", TIME, "--local-timezone", "UTC",
               cwd=project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"added MCP server 'time' in {config}"
    assert config.read_text().startswith("# my settings\n[kernel]\ncell_timeout = 100.0\n")  # kept as it was
    time = load_config(project).mcp.servers["time"]
    assert (time.command, time.args, time.policy, time.env) == (TIME, ["--local-timezone", "UTC"], "ask",
                                                                 {"TZ_HINT": "${HOME}"})
    done = mcp("add", "web", "--scope", "user", "--url", "http://127.0.0.1:9/mcp", "--header", "Authorization: Bearer ${T}",
               cwd=project)
    assert done.returncode == 0, done.stderr
    assert load_config(project).mcp.servers["web"].headers == {"Authorization": "Bearer ${T}"}

    done = mcp("list", cwd=project)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("everything  stdio  policy allow  ready  ") and "    get-sum: Returns the sum of two numbers" in lines
    assert "time  stdio  policy ask  ready  2 tools" in lines and "    convert_time: Convert time between timezones" in lines
    assert [line for line in lines if line.startswith("web  http  policy allow  failed  ? tools  (could not start")]
    done = mcp("list", "--no-start", cwd=project)  # the listing was cached
    assert "time  stdio  policy ask  stopped  2 tools" in done.stdout.splitlines()

    bad = mcp("add", "broken", "--url", "http://x", "--", "cmd", cwd=project)
    assert bad.returncode == 1 and "not both" in bad.stderr
    bad = mcp("add", "broken", "--env", "NOEQUALS", "--", "cmd", cwd=project)
    assert bad.returncode == 1 and "--env 'NOEQUALS': expected KEY=VALUE" in bad.stderr

    for name, where in (("time", str(config)), ("everything", str(project / ".mcp.json"))):
        done = mcp("remove", name, cwd=project)
        assert done.returncode == 0 and done.stdout.strip() == f"removed MCP server {name!r} from {where}", done.stderr
    assert list(load_config(project).mcp.servers) == ["web"]
    done = mcp("remove", "time", cwd=project)
    assert done.returncode == 1 and "no MCP server 'time' in the project scope; configured: web" in done.stderr
