"""`prime-agent doctor` (issue 52): what a first day trips on, each said with what to do. A real process,
the real sandbox check, the fake OpenAI-compatible server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent.testing.openai_server import OpenAIServer, Reply

BIN = Path(sys.executable).parent


def doctor(tmp_path: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PRIME_AGENT_MODEL", "OPENAI_BASE_URL")}
    return subprocess.run([str(BIN / "prime-agent"), "doctor"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**environ, "PATH": path, **env})


def lines(done: subprocess.CompletedProcess) -> dict[str, str]:
    """Each check's line, by what it checks."""
    return {line.split()[1]: line for line in done.stdout.splitlines()}


def test_doctor_says_what_is_wrong_and_what_to_do(tmp_path: Path, prime_home: Path):
    without_venv = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != BIN)
    with OpenAIServer(lambda r: Reply(content="hi"), models=[{"id": "fake", "object": "model"}]) as server:
        done = doctor(tmp_path, without_venv, PRIME_AGENT_MODEL="fake", OPENAI_BASE_URL=server.base_url)
        assert done.returncode == 0, done.stdout + done.stderr
        said = lines(done)
        assert said["command"].startswith("warn") and "is not on PATH" in said["command"]
        assert f'export PATH="{BIN}:$PATH"' in said["command"] and "pipx install ." in said["command"]
        assert said["sandbox"].startswith("ok") and "bubblewrap" in said["sandbox"]
        assert said["home"].startswith("ok") and str(prime_home) in said["home"]
        assert said["daemon"].startswith("ok") and "not running" in said["daemon"]
        assert said["model"] == f"ok    model     fake at {server.base_url}"
        assert not prime_home.exists()  # checking made nothing

        on_path = doctor(tmp_path, f"{BIN}{os.pathsep}{without_venv}", PRIME_AGENT_MODEL="other",
                         OPENAI_BASE_URL=server.base_url)
        said = lines(on_path)
        assert said["command"].startswith("ok") and on_path.returncode == 0
        assert said["model"].startswith("warn") and "the server lists fake, not other" in said["model"]

    down = doctor(tmp_path, without_venv, PRIME_AGENT_MODEL="fake", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    assert down.returncode == 1 and "FAIL  model     fake at http://127.0.0.1:9/v1: no answer" in down.stdout
    nothing = doctor(tmp_path, without_venv)
    assert nothing.returncode == 1 and "FAIL  model     no model configured" in nothing.stdout
