"""One session model, as a person meets it: a session `prime-agent run` made is in the same registry
as the daemon's (`sessions`, `rewind`, `harness rollback --session`, `trajectory export` find it), under
a relative PRIME_AGENT_HOME too; sessions are closed (`sessions close`, the end of `run --daemon`) and
titled by their first prompt. Real processes, a real daemon, the fake OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer, Reply
from agent.trajectory import RewindRecord, TurnFinishedRecord, read_records

pytestmark = pytest.mark.slow
PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A project directory whose PRIME_AGENT_HOME is `home`, relative, as a person may export it; the
    daemon a command starts there is stopped at the end."""
    root = tmp_path / "work"
    root.mkdir()
    (root / ".git").mkdir()
    monkeypatch.setenv("PRIME_AGENT_HOME", "home")
    yield root
    subprocess.run([PRIME_AGENT, "daemon", "stop"], cwd=root, capture_output=True, timeout=60)


def cli(*args: str, cwd: Path, server: OpenAIServer | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if server is not None:
        env.update(OPENAI_BASE_URL=server.base_url, PRIME_AGENT_MODEL="fake-model")
    return subprocess.run([PRIME_AGENT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def listed(cwd: Path) -> dict[str, dict]:
    r = cli("sessions", "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return {s["id"]: s for s in json.loads(r.stdout)}


def test_a_run_session_is_listed_rewound_rolled_back_and_exported_under_a_relative_home(work: Path):
    script = [Reply(content="Writing it.", code=["open('a.txt', 'w').write('one')\n"
                                                 "harness.create('memory', 'tabs', 'The project uses tabs.')"]),
              Reply(content="Wrote a.txt and noted the tabs."), Reply(content="It says one.")]
    with OpenAIServer(script) as server:
        r = cli("run", "write one to a.txt\nand remember that we use tabs", cwd=work, server=server)
        _test_the_run_session(work, r, server)


def _test_the_run_session(work: Path, r: subprocess.CompletedProcess, server: OpenAIServer) -> None:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "not a git repository" not in r.stderr, r.stderr
    assert (work / "a.txt").read_text() == "one"
    (session_dir,) = (work / "home" / "sessions").iterdir()  # the relative home, under the directory it was set in
    sid = session_dir.name

    row = listed(work)[sid]
    assert (row["state"], row["turns"], row["title"], row["cwd"]) == ("closed", 1, "write one to a.txt", str(work))
    text = cli("sessions", cwd=work).stdout
    assert sid in text and "write one to a.txt" in text

    turns = cli("rewind", sid, "--list", cwd=work)
    assert turns.returncode == 0, turns.stderr
    assert "write one to a.txt" in turns.stdout and "a.txt" in turns.stdout
    back = cli("rewind", sid, "1", "--code", cwd=work)
    assert back.returncode == 0, back.stderr
    assert "deleted   a.txt" in back.stdout and not (work / "a.txt").exists()
    assert (session_dir / "trajectory.jsonl").is_file()  # the home inside the workspace is not the workspace's
    forward = cli("rewind", sid, "2", "--code", cwd=work)  # the end of turn 1: run kept its last checkpoint
    assert forward.returncode == 0, forward.stderr
    assert (work / "a.txt").read_text() == "one"

    log = cli("harness", "log", "--scope", "session", "--session", sid, "--json", cwd=work)
    assert log.returncode == 0, log.stderr
    (change,) = [c for c in json.loads(log.stdout) if c["entries"] == ["tabs"]]
    assert "The project uses tabs." in (session_dir / "harness" / "memory" / "tabs.md").read_text()
    undone = cli("harness", "rollback", change["commit"], "--scope", "session", "--session", sid, cwd=work)
    assert undone.returncode == 0, undone.stderr
    assert not (session_dir / "harness" / "memory" / "tabs.md").exists()

    exported = cli("trajectory", "export", sid, cwd=work)
    assert exported.returncode == 0, exported.stderr
    (example,) = [json.loads(line) for line in exported.stdout.splitlines()]
    assert example["messages"][1] == {"role": "user", "content": "write one to a.txt\nand remember that we use tabs"}
    rewinds = [(r.turn, r.after) for r in read_records(session_dir / "trajectory.jsonl") if isinstance(r, RewindRecord)]
    assert rewinds == [(1, False), (1, True)]

    more = cli("send", sid, "--wait", "what does a.txt say?", cwd=work, server=server)  # the daemon resumes it
    assert more.returncode == 0 and more.stdout.endswith("It says one.\n"), more.stderr
    assert [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "user"][:1] == [
        "write one to a.txt\nand remember that we use tabs"]  # with the run's conversation
    assert listed(work)[sid]["turns"] == 2


def test_a_run_is_listed_while_it_runs_and_left_alone_until_it_ends(work: Path):
    with OpenAIServer([Reply(hang=True)]) as server:
        env = dict(os.environ, OPENAI_BASE_URL=server.base_url, PRIME_AGENT_MODEL="fake-model")
        p = subprocess.Popen([PRIME_AGENT, "run", "think for a long while"], cwd=work, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while not server.requests:  # the turn is under way: the model was asked
                assert p.poll() is None and time.monotonic() < deadline, p.communicate()
                time.sleep(0.1)
            (sid,) = [d.name for d in (work / "home" / "sessions").iterdir()]
            row = listed(work)[sid]
            assert (row["state"], row["elsewhere"], row["title"]) == ("running", p.pid, "think for a long while")
            assert f"[in prime-agent run, pid {p.pid}]" in cli("sessions", cwd=work).stdout
            refused = cli("rewind", sid, "1", cwd=work)
            assert refused.returncode == 2
            assert f"session {sid} is running in another process (pid {p.pid})" in refused.stderr
            closing = cli("sessions", "close", sid, cwd=work)
            assert closing.returncode == 2 and "running in another process" in closing.stderr
        finally:
            p.send_signal(signal.SIGINT)  # the turn is interrupted; the run ends
            out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    row = listed(work)[sid]
    assert (row["state"], row["elsewhere"], row["turns"]) == ("closed", None, 1)
    assert cli("rewind", sid, "--list", cwd=work).returncode == 0


def test_run_daemon_closes_its_session_unless_kept_and_sessions_close(work: Path):
    replies = [Reply(content="done once"), Reply(content="done twice"), Reply(content="done again")]
    with OpenAIServer(replies) as server:
        first = cli("run", "--daemon", "first task", cwd=work, server=server)
        assert first.returncode == 0 and first.stdout == "done once\n", first.stderr
        kept = cli("run", "--daemon", "--keep", "second task", cwd=work, server=server)
        assert kept.returncode == 0 and kept.stdout == "done twice\n", kept.stderr
        rows = sorted(listed(work).values(), key=lambda s: s["created"])
        assert [(s["title"], s["state"]) for s in rows] == [("first task", "closed"), ("second task", "idle")]
        assert f"session {rows[0]['id']} closed" in first.stderr
        assert f"sessions close {rows[1]['id']}" in kept.stderr

        idle = cli("sessions", "close", "--idle", cwd=work)
        assert idle.returncode == 0, idle.stderr
        assert idle.stdout == f"closed {rows[1]['id']}  second task\n"
        assert {s["state"] for s in listed(work).values()} == {"closed"}
        assert cli("sessions", "close", "--idle", cwd=work).stderr == "(no idle sessions to close)\n"

        again = cli("send", rows[1]["id"], "--wait", "once more", cwd=work, server=server)  # a prompt opens it again
        assert again.returncode == 0 and again.stdout.endswith("done again\n"), again.stderr
        assert listed(work)[rows[1]["id"]]["state"] == "idle"
        closed = cli("sessions", "close", rows[1]["id"], cwd=work)
        assert closed.returncode == 0 and closed.stdout == f"closed {rows[1]['id']}  second task\n"
        assert listed(work)[rows[1]["id"]]["state"] == "closed"
    missing = cli("sessions", "close", "no-such-session", cwd=work)
    assert missing.returncode == 2 and "no session 'no-such-session'" in missing.stderr


def test_a_run_killed_mid_turn_is_taken_up_with_its_cut_turn_closed_and_said_why(work: Path):
    with OpenAIServer([Reply(hang=True)]) as server:
        env = dict(os.environ, OPENAI_BASE_URL=server.base_url, PRIME_AGENT_MODEL="fake-model")
        p = subprocess.Popen([PRIME_AGENT, "run", "a turn that never ends"], cwd=work, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not server.requests:
                assert p.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            os.killpg(p.pid, signal.SIGKILL)  # the run and its kernel, with no chance to record anything
            p.wait(timeout=30)
    (session_dir,) = (work / "home" / "sessions").iterdir()
    row = listed(work)[session_dir.name]
    assert (row["state"], row["elsewhere"], row["turns"], row["title"]) == ("dormant", None, 1, "a turn that never ends")
    (finished,) = [r for r in read_records(session_dir / "trajectory.jsonl") if isinstance(r, TurnFinishedRecord)]
    assert finished.outcome == "interrupted"
    assert finished.error.startswith("The `prime-agent run` that hosted this session ended while this turn ran")
