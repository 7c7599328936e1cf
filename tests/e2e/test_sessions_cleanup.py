"""Sessions a person can find and clean up (issue 52): `sessions --cwd`, `sessions delete`, `sessions
prune`, `last` wherever a session id goes, and `attach` on a closed session that returns. Real
processes, a real daemon, the fake OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer, Reply
from daemon.client import SyncClient

pytestmark = pytest.mark.slow
PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


@pytest.fixture
def server():
    with OpenAIServer(lambda request: Reply(content="done: " + request["messages"][-1]["content"][-20:])) as s:
        yield s


@pytest.fixture
def projects(tmp_path: Path):
    """Two projects; the daemon a command starts is stopped at the end."""
    a, b = tmp_path / "a", tmp_path / "b"
    for p in (a, b):
        (p / ".git").mkdir(parents=True)
    yield a, b
    subprocess.run([PRIME_AGENT, "daemon", "stop"], capture_output=True, timeout=60)


def cli(*args: str, cwd: Path, server: OpenAIServer | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if server is not None:
        env.update(OPENAI_BASE_URL=server.base_url, PRIME_AGENT_MODEL="fake-model")
    return subprocess.run([PRIME_AGENT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def ids(*args: str, cwd: Path) -> list[str]:
    r = cli("sessions", "--json", *args, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return [s["id"] for s in json.loads(r.stdout)]


def test_sessions_are_listed_by_directory_deleted_with_their_files_and_pruned(projects, server, prime_home: Path):
    a, b = projects
    assert cli("run", "--daemon", "in a", cwd=a, server=server).returncode == 0
    assert cli("run", "--daemon", "--keep", "in b", cwd=b, server=server).returncode == 0
    (in_a,), (in_b,) = ids("--cwd", cwd=a), ids("--cwd", str(b), cwd=a)
    assert set(ids(cwd=a)) == {in_a, in_b}

    client = SyncClient()
    try:
        empty = client.create_session(a).id  # opened and left without a word, as the app did
        client.sleep(empty)
        kept_files = client.create_session(b).id
        client.delete(kept_files)  # as the app's sessions screen deleted: its files stay
    finally:
        client.close()
    sessions = prime_home / "sessions"
    assert (sessions / kept_files).is_dir()

    r = cli("sessions", "delete", in_b, cwd=a)
    assert r.returncode == 0 and r.stdout.startswith(f"deleted {in_b}  in b"), r.stderr
    assert not (sessions / in_b).exists() and in_b not in ids(cwd=a)

    r = cli("sessions", "prune", "--dry-run", "--json", cwd=a)
    would = {s["id"]: s["why"] for s in json.loads(r.stdout)["sessions"]}
    assert would == {empty: "empty", kept_files: "deleted"}  # the closed one in a was used: it stays
    assert (sessions / empty).is_dir() and (sessions / kept_files).is_dir()  # a dry run removes nothing
    r = cli("sessions", "prune", cwd=a)
    assert r.returncode == 0 and "2 session(s) removed; freed" in r.stderr
    assert not (sessions / empty).exists() and not (sessions / kept_files).exists()
    assert ids(cwd=a) == [in_a]

    client = SyncClient()
    try:
        unused_for = time.time() - client.session(in_a).updated
    finally:
        client.close()
    time.sleep(max(0.0, 0.9 - unused_for))  # --older-than 0.00001 (days) is 0.86 s: long past, after the commands above
    r = cli("sessions", "prune", "--older-than", "0.00001", "--cwd", str(b), cwd=a)  # b has none left
    assert "0 session(s) removed" in r.stderr and ids(cwd=a) == [in_a]
    r = cli("sessions", "prune", "--older-than", "0.00001", cwd=a)  # 0.86 s unused
    assert r.returncode == 0 and in_a in r.stdout and "unused" in r.stdout
    assert ids(cwd=a) == [] and not (sessions / in_a).exists()


def test_attach_on_a_closed_session_shows_its_history_and_returns(projects, server, prime_home: Path):
    """And its figures: a notebook's plot (`run --daemon --notebook`, real matplotlib) named and saved."""
    import nbformat

    a, _ = projects
    plot = "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(plot)]), a / "plot.ipynb")
    assert cli("run", "--daemon", "--notebook", "plot.ipynb", "hello there", cwd=a, server=server).returncode == 0
    (closed,) = ids(cwd=a)
    r = cli("attach", closed, "--all", cwd=a, timeout=60)  # it never returned
    assert r.returncode == 0, r.stderr
    assert "done: " in r.stderr and "is closed: nothing runs in it" in r.stderr
    saved = re.search(r"└─ image \d+×\d+ — saved to (\S+)", r.stderr)  # not a terminal: no graphics, the line
    assert saved and Path(saved.group(1)).parent == prime_home / "images", r.stderr
    assert Path(saved.group(1)).read_bytes().startswith(b"\x89PNG")
    r = cli("attach", "last", cwd=a, timeout=60)  # nothing new: only the note
    assert r.returncode == 0 and "is closed" in r.stderr and "done: " not in r.stderr


def test_last_names_the_session_last_used_here_for_rewind_as_for_refine(projects, server):
    a, b = projects
    assert cli("run", "--daemon", "in a", cwd=a, server=server).returncode == 0
    assert cli("run", "--daemon", "in b", cwd=b, server=server).returncode == 0
    r = cli("rewind", "last", "--list", cwd=a)
    assert r.returncode == 0 and "in a" in r.stdout and "in b" not in r.stdout, r.stderr
    r = cli("rewind", "last", "1", "--dry-run", cwd=a)
    assert r.returncode == 0 and "would rewind" in r.stdout, r.stderr
