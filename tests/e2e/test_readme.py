"""The README's commands as a newcomer pastes them (issue 52): `PRIME_AGENT_HOME` not set, `prime-agent`
on PATH the way the README says to put it there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def test_the_readmes_curl_snippet_reaches_the_daemon_without_prime_agent_home(tmp_path: Path):
    """It used `$PRIME_AGENT_HOME/run/daemon.sock`: unset by default, so `/run/daemon.sock`, and curl
    exited 7 without a word."""
    block = re.search(r"```bash\n(prime-agent daemon start.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert block, "the README's API snippet"
    first = block.group(1).split("\ncurl")[0] + "\ncurl" + block.group(1).split("\ncurl")[1]  # up to the first curl
    home, project = tmp_path / "user", tmp_path / "project"
    home.mkdir()
    (project / ".git").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PRIME_AGENT_HOME"}
    env.update(HOME=str(home), PATH=f"{VENV_BIN}:{env['PATH']}")
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", first], cwd=project, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        session = json.loads(done.stdout.splitlines()[-1])
        assert session["cwd"] == str(project) and session["model"] == "qwen2.5-coder"
        assert (home / ".prime-agent" / "sessions" / session["id"]).is_dir()
    finally:
        subprocess.run([str(VENV_BIN / "prime-agent"), "daemon", "stop"], env=env, capture_output=True, timeout=60)
