"""What a kernel starts dies with it, even when the process that owns the kernel is killed (`kill -9`
of the daemon): the next daemon reaps it at its start. Forks, `Popen` children and children that
call `setsid` (in a session of their own, outside the kernel's process group) alike."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.kernel.bridge import BridgeServer
from agent.config_models import KernelConfig, SandboxConfig
from agent.kernel import Kernel
from agent.kernel.reaper import reap_orphans
from agent.kernel.runtime import ENV_PATH, ENV_TOKEN
from agent.kernel.homes import private_root
from agent.kernel.limits import _v1_cgroup
from agent.types import Cell
from daemon.client import SyncClient, daemon_pid
from tests.agent.test_kernel import alive, spawn_tree, tree_mode  # noqa: F401 (a fixture)

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


UNSANDBOXED = {"sandbox": {"mode": "full-access"}}
"""The reaper's own work: a sandboxed kernel's tree dies with its PID namespace (and numbers its pids apart)."""


def dead_within(pids: list[int], timeout: float = 30) -> list[int]:
    """The pids still alive (zombies count as dead) after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def journal_entry(kernel: int, home: Path) -> Path:
    """The journal entry of the live kernel `kernel`'s process tree (its token is in its environment)."""
    env = Path(f"/proc/{kernel}/environ").read_bytes().split(b"\0")
    token = next(v for v in env if v.startswith(b"PRIME_AGENT_KERNEL=")).split(b"=", 1)[1].split(b",")[-1]
    entry = home / "run" / "kernels" / f"{token.decode()}.json"
    assert entry.is_file()
    return entry


def read_pids(report: Path, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while not (report.is_file() and report.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(p) for p in report.read_text().split()]


@pytest.fixture
def client(prime_home: Path, model_server):
    c = SyncClient()
    yield c
    c.close()


def _events_until_finished(client: SyncClient, sid: str) -> list:
    out = []
    for e in client.events(sid):
        out.append(e)
        if e.type == "turn.finished":
            return out
    raise AssertionError("unreachable")


def _start_tree(client: SyncClient, project: Path, model_server, report: Path) -> tuple[str, list[int]]:
    """A session whose cell started 50 forks, `Popen` and setsid children (and a daemon); their pids."""
    s = client.create_session(project, model="fake", base_url=model_server.base_url, config=UNSANDBOXED)
    client.send(s.id, "run: " + spawn_tree(forks=50, clean_env=False, report=report))
    finished = _events_until_finished(client, s.id)[-1]
    assert finished.outcome == "completed", finished
    pids = read_pids(report)
    assert len(pids) == 1 + 3 + 50 + 1 and all(map(alive, pids))
    return s.id, pids


@pytest.mark.slow
def test_kill_9_of_the_daemon_then_daemon_start_leaves_none_of_its_kernels_descendants(
        client: SyncClient, project: Path, model_server, prime_home: Path):
    _, pids = _start_tree(client, project, model_server, project / "pids")
    kernel, children = pids[0], pids[1:]
    entry = journal_entry(kernel, prime_home)
    daemon = daemon_pid()
    made = left_by(daemon)  # read while the daemon lives: once it is dead, any process making a box
    assert any(p.name.startswith("k-") for p in made), made  # (another test's) may collect them
    os.kill(daemon, signal.SIGKILL)  # the daemon only: nothing reaches its kernel's tree
    assert dead_within([daemon]) == []
    assert dead_within([kernel]) == []  # the kernel notices its parent died and exits on its own
    time.sleep(1)
    assert [p for p in children if not alive(p)] == []  # ... but what it started lives on: the issue

    start = subprocess.run([PRIME_AGENT, "daemon", "start"], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    assert dead_within(children) == []
    assert not entry.exists()  # the tree's journal entry went with it
    deadline = time.monotonic() + 30  # collected as the new daemon makes its first box
    while left_by(daemon) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left_by(daemon) == []


def left_by(host: int) -> list[Path]:
    """The kernels' private directories and limit cgroups (v1) that process `host` made."""
    bases = [private_root(), *(b for b in map(_v1_cgroup, ("memory", "pids")) if b is not None)]
    return [p for base in bases for p in [*base.glob(f"k-{host}-*"), *base.glob(f"prime-agent-{host}-*")]]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["daemon stop", "session delete"])
def test_a_clean_stop_leaves_none_of_a_kernels_descendants(client: SyncClient, project: Path, model_server,
                                                           prime_home: Path, how: str):
    sid, pids = _start_tree(client, project, model_server, project / "pids")
    entry = journal_entry(pids[0], prime_home)
    if how == "daemon stop":
        stop = subprocess.run([PRIME_AGENT, "daemon", "stop"], capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
    else:
        client.delete(sid)
    assert dead_within(pids) == []
    assert not entry.exists()


HOST = """\
import asyncio, sys
from pathlib import Path
from agent.kernel import reaper
from agent.kernel.bridge import BridgeServer
from agent.config_models import KernelConfig, SandboxConfig
from agent.kernel import Kernel
from agent.kernel.runtime import ENV_PATH, ENV_TOKEN
from agent.types import Cell

if sys.argv[1] == "no cgroup":
    reaper.cgroup_base = lambda: None

async def main():
    bridge = BridgeServer(Path(sys.argv[3]), {})
    await bridge.start()
    env = {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token}
    k = Kernel(Path(sys.argv[2]), KernelConfig(), env, sandbox=SandboxConfig(mode="full-access"))
    await k.start()
    r = await k.execute(Cell(id="c", code=sys.stdin.read()))
    print(r.stdout or r.error_value, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_the_tree_of_a_host_killed_with_sigkill_is_reaped_by_the_next(tree_mode: str, project: Path,
                                                                      tmp_path: Path, prime_home: Path):
    """A host (here a bare `Kernel` owner, as `prime-agent run` is one) dies without a word: every
    process its kernel started is found again from its journal entry, and killed."""
    host = subprocess.Popen([sys.executable, "-c", HOST, tree_mode, str(project), str(tmp_path / "host")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        host.stdin.write(spawn_tree(forks=3, clean_env=tree_mode == "cgroup"))
        host.stdin.close()
        pids = [int(p) for p in host.stdout.readline().split()]
        assert len(pids) == 1 + 3 + (tree_mode == "cgroup") + 3 + 1, pids
    finally:
        host.kill()
        host.wait()
    assert [p for p in pids[1:] if not alive(p)] == []
    assert reap_orphans(prime_home) >= len(pids) - 1
    assert dead_within(pids) == []
    assert list((prime_home / "run" / "kernels").iterdir()) == []


async def test_reaping_spares_the_kernels_of_a_live_host(project: Path, tmp_path: Path, prime_home: Path):
    """A daemon that starts while `prime-agent run` (another host) works on the same home kills
    nothing of it: only the trees of hosts that are gone are reaped."""
    bridge = BridgeServer(tmp_path / "run", {})
    await bridge.start()
    k = Kernel(project, KernelConfig(), {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token},
               sandbox=SandboxConfig(mode="full-access"))
    try:
        await k.start()
        pids = [int(p) for p in (await k.execute(Cell(id="c", code=spawn_tree(forks=1)))).stdout.split()]
        assert reap_orphans(prime_home) == 0
        await asyncio.sleep(0.2)
        assert all(map(alive, pids))
        assert (await k.execute(Cell(id="c", code="1 + 1"))).result == "2"
    finally:
        await k.shutdown()
        await bridge.close()
    assert dead_within(pids) == []
