"""The daemon as its own process: clients that die, a daemon killed with SIGKILL, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.client import SyncClient, daemon_pid, spawn
from tests.e2e.test_run import _kernels_of

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")
SLOW_CELL = "run: x = 41 + 1\nimport time\nfor i in range(40):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"


@pytest.fixture
def client(prime_home: Path, model_server):
    """A client of a daemon running as a separate process (started by the client, as users get it)."""
    c = SyncClient()
    yield c
    c.close()
    pid = daemon_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid)


def _wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return  # exited; only its parent (this test process, which spawned it) has not reaped it
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive")


def _events_until(client: SyncClient, sid: str, stop, after: int | None = None):
    out = []
    for e in client.events(sid, after):
        out.append(e)
        if stop(e):
            return out
    raise AssertionError("unreachable")


@pytest.mark.slow
def test_a_killed_client_loses_nothing_a_new_one_sees_the_turn_finish(client: SyncClient, project: Path, model_server):
    s = client.create_session(project, model="fake", base_url=model_server.base_url)
    attach = subprocess.Popen([PRIME_AGENT, "attach", s.id, "--all", "--json"], stdout=subprocess.PIPE, text=True)
    client.send(s.id, SLOW_CELL)
    seen = []
    for line in attach.stdout:
        seen.append(json.loads(line))
        if seen[-1]["type"] == "cell.output":
            break
    attach.kill()  # mid-turn, SIGKILL: no goodbye
    attach.wait()
    rest = _events_until(client, s.id, lambda e: e.type == "turn.finished", after=seen[-1]["seq"])
    seqs = [e["seq"] for e in seen] + [e.seq for e in rest]
    assert seqs == list(range(1, len(seqs) + 1))  # nothing lost, nothing twice
    assert rest[-1].outcome == "completed" and rest[-1].answer.startswith("ran: tick 0")


@pytest.mark.slow
def test_kill_9_mid_turn_then_restart_recovers_every_session(client: SyncClient, project: Path, model_server,
                                                              prime_home: Path):
    idle = client.create_session(project, model="fake", base_url=model_server.base_url, title="idle one")
    busy = client.create_session(project, model="fake", base_url=model_server.base_url)
    client.send(idle.id, "hello")
    _events_until(client, idle.id, lambda e: e.type == "turn.finished")
    client.send(busy.id, SLOW_CELL)
    before = _events_until(client, busy.id, lambda e: e.type == "cell.output")
    pid = daemon_pid()
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    deadline = time.monotonic() + 15  # its kernels notice their parent died and exit
    while _kernels_of(prime_home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _kernels_of(prime_home) == []

    # A client resumes its stream from its last id: the daemon comes back (the client starts it).
    after_restart = _events_until(client, busy.id, lambda e: e.type == "turn.finished", after=before[-1].seq)
    assert daemon_pid() not in (None, pid)
    seqs = [e.seq for e in before + after_restart]
    assert seqs == list(range(1, len(seqs) + 1))
    cut = after_restart[-1]
    assert (cut.turn_id, cut.outcome) == ("t1", "interrupted") and "restarted" in cut.error

    listed = {x.id: x for x in client.sessions()}
    assert set(listed) == {idle.id, busy.id}
    assert listed[idle.id].state == "dormant" and listed[idle.id].title == "idle one"
    assert listed[busy.id].turns == 1 and listed[busy.id].last_seq == cut.seq
    history = list(_events_until(client, busy.id, lambda e: e.seq == cut.seq))
    assert [e.seq for e in history] == list(range(1, cut.seq + 1))

    # The session takes a new prompt on a new kernel, and the model is told its namespace is gone.
    turn = client.send(busy.id, "run: print(x)")
    events = _events_until(client, busy.id, lambda e: e.type == "turn.finished", after=cut.seq)
    assert turn.turn_id == "t2" and events[0].type == "session.resumed"
    assert "NameError" in events[-1].answer
    prompt = next(m for m in reversed(model_server.requests[-2]["messages"]) if m["role"] == "user")["content"]
    assert "new kernel" in prompt and "ended early (interrupted)" in prompt
    records = client.transcript(busy.id).records
    assert [r.kind for r in records].count("resumed") == 1


@pytest.mark.slow
def test_cli_daemon_start_status_stop_and_run_through_it(prime_home: Path, project: Path, model_server):
    env = {**os.environ, "OPENAI_BASE_URL": model_server.base_url, "PRIME_AGENT_MODEL": "fake"}

    def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([PRIME_AGENT, *args], cwd=project, env=env, text=True, capture_output=True,
                              timeout=timeout)

    assert cli("daemon", "status").returncode == 1
    started = cli("daemon", "start")
    assert started.returncode == 0 and "daemon running" in started.stdout, started.stderr
    status = json.loads(cli("daemon", "status", "--json").stdout)
    assert status["running"] and status["sessions"] == 0 and status["pid"] == daemon_pid()
    run = cli("run", "--daemon", "run: print(6 * 7)")
    assert run.returncode == 0 and run.stdout.strip() == "ran: 42", run.stderr
    (row,) = json.loads(cli("sessions", "--json").stdout)
    sent = cli("send", row["id"], "again", "--wait")
    assert sent.returncode == 0 and sent.stdout.strip() == "echo: again"
    kernel = cli("kernel", row["id"]).stdout.strip()
    assert json.loads(Path(kernel).read_text())["transport"] == "ipc"
    assert cli("send", "no-such-session", "hi").returncode == 2
    stopped = cli("daemon", "stop")
    assert stopped.returncode == 0 and daemon_pid() is None
    assert not Path(kernel).exists()


def test_spawned_daemon_refuses_a_second_instance(prime_home: Path):
    first = spawn()
    deadline = time.monotonic() + 30
    while daemon_pid() != first.pid:  # the pid file is written once it serves
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    c = SyncClient(autostart=False)
    try:
        second = subprocess.run([sys.executable, "-m", "cli", "daemon", "start", "--foreground"], capture_output=True,
                                text=True, timeout=60)
        assert "already runs" in second.stderr
        assert c.status().pid == first.pid
    finally:
        c.close()
        first.send_signal(signal.SIGTERM)
        first.wait(30)


def _peak_rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmHWM:")[1].split()[0]) / 1024


@pytest.mark.slow
def test_a_cell_printing_200_mb_leaves_the_daemon_small_and_answering(client: SyncClient, project: Path, model_server):
    """Finding 17 of the sandbox review: a 200 MB print took the daemon from 72 to 702 MB. The output
    past kernel.output_spill goes to a file in the kernel's temp folder; the model is told where, with
    the tail; the daemon answers throughout and its peak stays under 300 MB."""
    import threading

    s = client.create_session(project, model="fake", base_url=model_server.base_url)
    pid = daemon_pid()
    assert pid is not None
    slowest, done = [0.0], threading.Event()

    def poll() -> None:
        other = SyncClient(autostart=False)
        try:
            while not done.is_set():
                began = time.monotonic()
                other.status()
                slowest[0] = max(slowest[0], time.monotonic() - began)
                time.sleep(0.2)
        finally:
            other.close()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        client.send(s.id, "run: print('x' * 200_000_000 + 'THE END')")
        finished = _events_until(client, s.id, lambda e: e.type == "turn.finished")[-1]
    finally:
        done.set()
        poller.join()
    assert _peak_rss_mb(pid) < 300
    assert slowest[0] < 10
    assert finished.outcome == "completed"
    assert "more characters of this output are not shown" in finished.answer and "THE END" in finished.answer
    spilled = Path(finished.answer.split(" characters is in ")[1].split(" ...]")[0])
    assert spilled.stat().st_size == 200_000_000 + len("THE END\n") - 4 * 1024 * 1024
