"""A daemon whose home is deleted (or replaced) under it stops, with its kernels: it never lives on
unreachable, and never runs beside a second daemon for the same home."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from daemon.client import SyncClient, daemon_pid, spawn

LONG_CELL = "run: print('sleeping', flush=True)\nimport time\ntime.sleep(60)"


def _alive(pid: int) -> bool:
    """Running, not a zombie (an exited child its parent has not reaped yet)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _descendants(pid: int) -> set[int]:
    """Every process below `pid`, from each process's parent in /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # the command may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(proc.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _daemons_of(home: Path) -> list[int]:
    """Live daemon processes (`prime-agent daemon start --foreground`) whose PRIME_AGENT_HOME is `home`. A
    daemon's forks (the kernel's mount helper, for a moment) have its command line and environment: not counted."""
    want = f"PRIME_AGENT_HOME={home}".encode()
    found: dict[int, int] = {}  # pid: its parent's
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"daemon" in argv and b"--foreground" in argv and want in (proc / "environ").read_bytes().split(b"\0"):
                if _alive(int(proc.name)):
                    status = (proc / "status").read_text()
                    found[int(proc.name)] = int(re.search(r"^PPid:\s+(\d+)", status, re.M)[1])
        except (OSError, TypeError):
            continue
    return sorted(pid for pid, parent in found.items() if parent not in found)


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def _start_daemon() -> subprocess.Popen:
    p = spawn()
    _wait_until(lambda: daemon_pid() == p.pid or p.poll() is not None, 60, "the daemon serves")
    assert p.poll() is None, "the daemon exited while starting"
    return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def _busy_session(model_server, project: Path) -> tuple[SyncClient, str]:
    """A session whose turn is in a 60-second cell (it has printed its first line)."""
    c = SyncClient(autostart=False)
    s = c.create_session(project, model="fake", base_url=model_server.base_url)
    c.send(s.id, LONG_CELL)
    for e in c.events(s.id):
        if e.type == "cell.output":
            break
    return c, s.id


@pytest.mark.slow
def test_deleting_the_home_mid_turn_stops_the_daemon_and_its_kernels(prime_home: Path, project: Path, model_server):
    first = _start_daemon()
    try:
        c, sid = _busy_session(model_server, project)
        assert c.send(sid, "queued behind it").queued  # dropping it on the way out writes to the gone home too
        c.close()
        kernels = _descendants(first.pid)
        assert kernels  # the session's kernel and the pool's

        shutil.rmtree(prime_home)
        first.wait(30)  # generous for a loaded machine; it takes about 1-3 s
        _wait_until(lambda: not any(_alive(k) for k in kernels), 15, f"kernels {kernels} are gone")

        # The recreated home gets a daemon of its own, and it is the only one.
        second = _start_daemon()
        try:
            assert _daemons_of(prime_home) == [second.pid]
            c = SyncClient(autostart=False)
            try:
                assert c.status().pid == second.pid and c.sessions() == []
            finally:
                c.close()
        finally:
            _stop(second)
    finally:
        _stop(first)


@pytest.mark.slow
def test_a_daemon_whose_home_is_replaced_leaves_the_new_daemon_alone(prime_home: Path, project: Path, model_server):
    """`rm -rf` and at once a new daemon on the same path, before the first has noticed: the first
    stops, and takes neither the new one's socket nor its pid file with it."""
    first = _start_daemon()
    try:
        c, _ = _busy_session(model_server, project)
        c.close()
        kernels = _descendants(first.pid)
        shutil.rmtree(prime_home)
        second = _start_daemon()  # a fresh lock: nothing stops it
        try:
            first.wait(30)
            _wait_until(lambda: not any(_alive(k) for k in kernels), 15, f"kernels {kernels} are gone")
            assert _daemons_of(prime_home) == [second.pid]
            assert daemon_pid() == second.pid  # its pid file is still there
            c = SyncClient(autostart=False)  # and so is its socket
            try:
                assert c.status().pid == second.pid
                s = c.create_session(project, model="fake", base_url=model_server.base_url)
                turn = c.send(s.id, "hello")
                assert c.wait_turn(s.id, turn.turn_id).answer == "echo: hello"
            finally:
                c.close()
        finally:
            _stop(second)
    finally:
        _stop(first)


def test_deleting_only_the_run_directory_stops_the_daemon(prime_home: Path):
    """Its lock and socket are gone, so nothing can find it: it stops rather than live on unseen."""
    first = _start_daemon()
    try:
        kernels = _descendants(first.pid)
        assert kernels  # the pool's
        shutil.rmtree(prime_home / "run")
        first.wait(30)
        _wait_until(lambda: not any(_alive(k) for k in kernels), 15, f"kernels {kernels} are gone")
        assert _daemons_of(prime_home) == []
    finally:
        _stop(first)


def test_the_daemon_stops_when_its_lock_file_is_replaced(prime_home: Path):
    """Another inode at `run/daemon.lock` (a second daemon could flock it): the first stops."""
    first = _start_daemon()
    try:
        lock = prime_home / "run" / "daemon.lock"
        lock.unlink()
        lock.touch()
        first.wait(30)
        assert _daemons_of(prime_home) == []
    finally:
        _stop(first)
