"""The kernel runtime against real ipykernel processes: output, faults, limits, recovery."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.kernel.bridge import BridgeServer
from agent.config_models import KernelConfig, SandboxConfig
from agent.kernel.manager import CappedText, Kernel, KernelState
from agent.kernel.runtime import ENV_PATH, ENV_TOKEN
from agent.types import Cell


@pytest.fixture
async def kernel(make_kernel) -> Kernel:
    return await make_kernel()


async def run(k: Kernel, code: str, timeout: float | None = None):
    return await k.execute(Cell(id="c", code=code, timeout=timeout))


async def test_streams_result_and_error(kernel: Kernel):
    r = await run(kernel, "import sys\nprint('out'); print('err', file=sys.stderr)\n6*7")
    assert (r.stdout, r.stderr, r.result) == ("out\n", "err\n", "42")
    assert r.ok and r.duration > 0
    r = await run(kernel, "1/0")
    assert r.error_name == "ZeroDivisionError"
    assert "division by zero" in r.traceback and "\x1b[" not in r.traceback
    assert "ZeroDivisionError: division by zero" in r.render()


async def test_namespace_persists_and_cwd_is_the_project(kernel: Kernel, project: Path):
    await run(kernel, "x = 41")
    assert (await run(kernel, "x + 1")).result == "42"
    assert (await run(kernel, "import os; os.getcwd()")).result == repr(str(project))
    helpers = await run(kernel, "[callable(f) for f in (read, write, edit, grep, glob, final, note)]")
    assert helpers.result == "[True, True, True, True, True, True, True]"


async def test_a_kernel_starts_without_ipykernels_debugger_and_a_cell_may_still_import_debugpy(kernel: Kernel):
    """manager.LAUNCH: importing debugpy for Jupyter's debugger was a fifth of a start's CPU or more."""
    r = await run(kernel, "import sys\nloaded = 'debugpy' in sys.modules\nimport debugpy\nloaded, debugpy.__name__")
    assert r.result == "(False, 'debugpy')", r.render()


async def test_huge_output_keeps_head_and_tail(kernel: Kernel):
    r = await run(kernel, "print('HEAD' + 'x' * 10_000_000 + 'TAIL')")
    assert r.stdout.startswith("HEAD") and r.stdout.rstrip().endswith("TAIL")
    assert len(r.stdout) < 4096 + 200
    assert r.truncated["stdout"] > 4_000_000  # of what reached the host: past kernel.output_spill it stays in a file
    assert "characters cut from the middle" in r.stdout
    assert (await run(kernel, "'alive'")).result == "'alive'"


async def test_timeout_interrupts_and_keeps_state(kernel: Kernel):
    await run(kernel, "kept = 'yes'")
    r = await run(kernel, "while True: pass", timeout=2)
    assert r.kernel_events == ["timed_out"]
    assert r.error_name == "KeyboardInterrupt"
    assert "2s timeout" in r.kernel_message and "intact" in r.kernel_message
    assert (await run(kernel, "kept")).result == "'yes'"


async def test_a_cell_blocked_in_await_is_interrupted_with_state_intact(kernel: Kernel):
    await run(kernel, "kept = 'still here'")
    r = await run(kernel, "import asyncio\nawait asyncio.sleep(60)", timeout=1)
    assert r.kernel_events == ["timed_out"] and r.error_name == "CancelledError"
    assert (await run(kernel, "kept")).result == "'still here'"


async def test_cell_that_ignores_interrupts_gets_a_restart(kernel: Kernel):
    await run(kernel, "lost = 1")
    code = "import time\nwhile True:\n    try:\n        time.sleep(5)\n    except KeyboardInterrupt:\n        pass"
    r = await run(kernel, code, timeout=1)
    assert r.kernel_events == ["timed_out", "restarted"]
    assert "restarted" in r.kernel_message and "lost" in r.kernel_message
    assert (await run(kernel, "lost")).error_name == "NameError"
    assert (await run(kernel, "callable(final)")).result == "True"  # bootstrapped again


@pytest.mark.parametrize("code", ["import os; os._exit(1)", "import ctypes; ctypes.string_at(0)"])
async def test_kernel_death_is_detected_and_restarted(kernel: Kernel, code: str):
    r = await run(kernel, code)
    assert r.kernel_events == ["died", "restarted"]
    assert "kernel died" in r.kernel_message
    assert kernel.state is KernelState.IDLE
    assert (await run(kernel, "1 + 1")).result == "2"


async def test_bash_magic_runs_in_the_project(kernel: Kernel, project: Path):
    r = await run(kernel, "%%bash\necho hello; pwd; echo oops >&2")
    assert r.stdout == f"hello\n{project}\n"
    assert r.stderr == "oops\n"


async def test_images_become_attachments(kernel: Kernel):
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    r = await run(kernel, f"import base64\nfrom IPython.display import Image, display\ndisplay(Image(base64.b64decode('{png}')))")
    assert [a.mime for a in r.attachments] == ["image/png"]
    assert "[display: image/png" in r.render()


async def test_live_output_callback(kernel: Kernel):
    seen: list[tuple[str, str]] = []
    await kernel.execute(Cell(id="c", code="print('a'); import sys; print('b', file=sys.stderr)"),
                         on_output=lambda name, text: seen.append((name, text)))
    assert ("stdout", "a\n") in seen and ("stderr", "b\n") in seen


def test_capped_text_counts_what_it_cuts():
    c = CappedText(10)
    for chunk in ["abc", "defgh", "ijklmnop", "qrst"]:
        c.add(chunk)
    assert c.total == 20 and c.cut == 10
    assert c.text().startswith("abcde\n[... 10 of 20 characters cut") and c.text().endswith("\npqrst")
    small = CappedText(10)
    small.add("0123456789")
    assert small.text() == "0123456789" and small.cut == 0


async def test_a_cell_that_prints_forever_still_times_out(kernel: Kernel):
    r = await run(kernel, "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.02)", timeout=1)
    assert r.kernel_events == ["timed_out"] and r.error_name == "KeyboardInterrupt"
    assert r.duration < 5 and r.stdout.startswith("tick\n")


async def test_a_pooled_kernel_becomes_the_sessions_own(project: Path, monkeypatch):
    from agent.kernel import KernelPool
    from agent.kernel.sandbox import Launch

    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    pool = KernelPool(1, KernelConfig(), Launch.of(SandboxConfig()))
    pool.fill()
    bridge = BridgeServer(project, {})

    async def ready(kernel_dir: Path) -> dict[str, str]:
        await bridge.start(kernel_dir)
        return {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token}

    k = Kernel(project, KernelConfig(interrupt_grace=1.0), {"MINE": "1"})
    try:
        await k.start(pool, ready=ready)
        assert pool.launch == k.launch and k.dir.name.startswith("k-")  # it was started ahead, by the pool
        code = "import os; print(os.getcwd(), os.environ.get('MINE'), 'OPENAI_API_KEY' in os.environ, callable(final))"
        assert (await run(k, code)).stdout == f"{project} 1 False True\n"
        assert (await run(k, "open('mine.txt', 'w').write('x')")).ok  # its workspace, writable: the session's view
        await k.restart()  # a new process: its working directory, environment and view are set again
        assert (await run(k, code)).stdout == f"{project} 1 False True\n"
        assert (await run(k, "open('.git/x', 'w')")).error_name == "OSError"
    finally:
        await k.shutdown()
        await pool.close()
        await bridge.close()
    assert not k.dir.exists()


async def test_a_session_takes_a_warmed_kernel_and_the_pool_refills_once_the_session_has_started(project: Path):
    from agent.kernel import KernelPool
    from agent.kernel.sandbox import Launch
    from agent.session import Session
    from agent.testing.scripted import ScriptedModel
    from tests.conftest import make_config

    config = make_config()
    pool = KernelPool(1, config.kernel, Launch.of(config.sandbox))
    pool.fill()
    try:
        pooled, = [km for km, _ in await asyncio.gather(*pool._starting)]
        async with Session(config, ScriptedModel([]), cwd=project, kernel_pool=pool) as s:
            assert s.kernel._km is pooled and pool.ready == 0  # taken; the next one launches after the start
            deadline = time.monotonic() + 60
            while pool.ready < 1:
                assert time.monotonic() < deadline, "the pool was not refilled"
                await asyncio.sleep(0.05)
            counted = (await s.kernel.execute(Cell(id="c", code="get_ipython().execution_count"))).result
    finally:
        await pool.close()
    async with Session(config, ScriptedModel([]), cwd=project) as unpooled:  # its own kernel, never warmed up
        # the warm-up ran silently, out of the history: a pooled kernel counts a session's cells as its own does
        assert (await unpooled.kernel.execute(Cell(id="c", code="get_ipython().execution_count"))).result == counted


async def test_a_flood_of_output_read_slowly_loses_nothing_and_ends(kernel: Kernel):
    import asyncio
    import time

    async def hog() -> None:  # a busy host: the loop reads IOPub in bursts, while the kernel prints on
        while True:
            time.sleep(0.3)
            await asyncio.sleep(0.1)

    busy = asyncio.create_task(hog())
    try:
        r = await asyncio.wait_for(run(kernel, "for i in range(5000): print(i, flush=True)"), 60)
    finally:
        busy.cancel()
    total = sum(len(f"{i}\n") for i in range(5000))
    assert r.ok and r.stdout.endswith("4999\n")
    assert r.truncated["stdout"] + 4096 == total  # every character counted: none dropped on the way


async def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process `pid` is dead (or a zombie nobody reaped) within `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)


# A job `%%bash` leaves running: bash exits, so the sleep is nobody's child but still in the kernel's
# process group. Only a kill of the whole group reaches it (ipykernel's own cleanup misses it).
BACKGROUND_SLEEP = "%%bash\n{trap}sleep 600 >/dev/null 2>&1 &\necho $!"


async def test_shutdown_runs_atexit_handlers_and_leaves_no_process_behind(make_kernel, tmp_path: Path):
    k = await make_kernel(shutdown_wait=30, sandbox="full-access")  # generous for a loaded machine: a clean exit needs no signal
    ran = tmp_path / "atexit-ran"
    code = f"import atexit, os\natexit.register(lambda: open({str(ran)!r}, 'w').write('ran'))\nos.getpid()"
    kernel_pid = int((await run(k, code)).result)
    sleep_pid = int((await run(k, BACKGROUND_SLEEP.format(trap=""))).stdout)
    started = time.monotonic()
    await k.shutdown()
    assert time.monotonic() - started < 15  # it exited on its own, before SIGTERM (at half of shutdown_wait)
    assert ran.read_text() == "ran"
    assert await gone(kernel_pid) and await gone(sleep_pid)


async def test_a_kernel_that_will_not_exit_is_killed_with_its_children(make_kernel):
    k = await make_kernel(shutdown_wait=2, sandbox="full-access")
    code = "import atexit, os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" \
           "atexit.register(time.sleep, 60)\nos.getpid()"
    kernel_pid = int((await run(k, code)).result)  # it ignores SIGTERM, and its atexit handler hangs
    sleep_pid = int((await run(k, BACKGROUND_SLEEP.format(trap="trap '' TERM\n"))).stdout)
    started = time.monotonic()
    await k.shutdown()
    assert time.monotonic() - started < 2 + 10  # shutdown_wait, then SIGKILL: far short of the 60 s hang
    assert await gone(kernel_pid) and await gone(sleep_pid)


# --- the kernel's descendants ------------------------------------------------------------------

def spawn_tree(forks: int = 5, clean_env: bool = True, report: Path | None = None) -> str:
    """A cell that starts what a model's code might leave running, and prints (and, with `report`,
    writes to that file) the kernel's pid then every descendant's: `forks` forked children, a
    `Popen` child, two in sessions of their own (`setsid`, `start_new_session`), a daemon (setsid,
    fork, the parent exits: the grandchild is nobody's child) and, with `clean_env`, a setsid child
    with an empty environment (only a cgroup still knows it is the kernel's)."""
    target = str(report) if report else None
    return f"""\
import os, subprocess, time
_kids = [subprocess.Popen(['sleep', '120']).pid,
         subprocess.Popen(['setsid', 'sleep', '120']).pid,
         subprocess.Popen(['sleep', '120'], start_new_session=True).pid]
if {clean_env}:
    _kids.append(subprocess.Popen(['/bin/sleep', '120'], start_new_session=True, env={{}}).pid)
for _ in range({forks}):
    _pid = os.fork()
    if _pid == 0:
        try:
            time.sleep(120)
        finally:
            os._exit(0)
    _kids.append(_pid)
_r, _w = os.pipe()
_pid = os.fork()
if _pid == 0:
    try:
        os.setsid()
        if os.fork() == 0:
            os.write(_w, str(os.getpid()).encode())
            time.sleep(120)
    finally:
        os._exit(0)
os.close(_w)
os.waitpid(_pid, 0)
_kids.append(int(os.read(_r, 32)))
os.close(_r)
_line = ' '.join(map(str, [os.getpid(), *_kids]))
if {target!r}:
    open({target!r}, 'w').write(_line)
print(_line)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.fixture(params=["cgroup", "no cgroup"])
def tree_mode(request, monkeypatch) -> str:
    """Both ways a kernel's descendants are tracked: a cgroup of its own (where this machine lets the
    test make one), and without (its process group and the environment variable they inherit)."""
    from agent.kernel import reaper

    if request.param == "cgroup" and reaper.cgroup_base() is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    if request.param == "no cgroup":
        monkeypatch.setattr(reaper, "cgroup_base", lambda: None)
    return request.param


@pytest.mark.parametrize("where", ["cgroup", "directory"])
def test_a_gone_hosts_cgroup_removed_by_two_hosts_at_once_is_removed_not_an_error(where: str, tmp_path: Path):
    """Two hosts starting kernels at once both collect a killed host's cgroups: the one that finds a
    directory gone between listing and removing it started no kernel (FileNotFoundError out of
    `prime-agent run`). Here four threads remove the same trees at once: real cgroups where this machine
    lets the test make them, plain directories everywhere."""
    import secrets
    from concurrent.futures import ThreadPoolExecutor

    from agent.kernel.reaper import _remove_cgroup, cgroup_base

    base = cgroup_base() if where == "cgroup" else tmp_path
    if base is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    token = secrets.token_hex(6)  # a host that never lived: the next collection removes what a failure leaves
    cgroups = [base / f"prime-agent-1-1-{token}{i:04x}" for i in range(40)]
    for cgroup in cgroups:
        for a in range(4):
            for b in range(4):
                (cgroup / f"a{a}" / f"b{b}").mkdir(parents=True)
    with ThreadPoolExecutor(4) as pool:
        for cgroup in cgroups:
            assert all(pool.map(_remove_cgroup, [cgroup] * 4)), cgroup
    assert not any(cgroup.exists() for cgroup in cgroups)
    if where == "directory":
        (cgroups[0] / "inner").mkdir(parents=True)
        (cgroups[0] / "inner" / "cgroup.procs").write_text("")  # as a populated cgroup, its rmdir fails
        assert not _remove_cgroup(cgroups[0]) and cgroups[0].exists()


async def test_shutdown_leaves_no_descendant_alive_not_even_a_setsid_one(make_kernel, tree_mode: str,
                                                                         prime_home: Path):
    k = await make_kernel(sandbox="full-access")
    pids = [int(p) for p in (await run(k, spawn_tree(clean_env=tree_mode == "cgroup"))).stdout.split()]
    assert len(pids) == 1 + 4 + (tree_mode == "cgroup") + 5 and all(map(alive, pids))
    cgroup = k._km.tree.cgroup
    assert (cgroup is not None) == (tree_mode == "cgroup")
    await k.shutdown()
    assert [p for p in pids if not await gone(p)] == []
    assert cgroup is None or not cgroup.exists()
    assert list((prime_home / "run" / "kernels").iterdir()) == []  # its journal entry goes with it


async def test_a_restart_kills_what_the_old_kernel_started(make_kernel, tree_mode: str):
    k = await make_kernel(sandbox="full-access")
    pids = [int(p) for p in (await run(k, spawn_tree(forks=1, clean_env=False))).stdout.split()]
    await k.restart()
    assert [p for p in pids if not await gone(p)] == []
    again = [int(p) for p in (await run(k, spawn_tree(forks=1, clean_env=False))).stdout.split()]
    assert all(map(alive, again))  # the new kernel and its tree are tracked as the old one was
    await k.shutdown()
    assert [p for p in again if not await gone(p)] == []


async def test_a_kernel_starts_and_its_tree_dies_with_it_when_the_journal_cannot_be_written(make_kernel,
                                                                                           prime_home: Path):
    (prime_home / "run").mkdir(parents=True)
    (prime_home / "run" / "kernels").write_text("not a directory")  # as a full disk or a read-only home would
    k = await make_kernel(sandbox="full-access")
    pids = [int(p) for p in (await run(k, spawn_tree(forks=1, clean_env=False))).stdout.split()]
    await k.shutdown()
    assert [p for p in pids if not await gone(p)] == []
