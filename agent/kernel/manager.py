"""One real ipykernel per session, driven through jupyter_client's asyncio API.

`Kernel.execute(cell)` always returns a `CellResult`: a timed-out cell is interrupted and, if
it does not stop within the grace period, the kernel is restarted; a kernel that dies mid-cell
(os._exit, a segfault, the OOM killer) is detected and restarted. Either way the result says
what happened, so the model is told and the session goes on.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import logging
import queue
import re
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import zmq
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import _ShutdownStatus

from agent.config import project_root
from agent.config_models import KernelConfig, SandboxConfig
from agent.kernel.reaper import ProcessTree
from agent.kernel.sandbox import Box, Launch, SandboxError
from agent.kernel.tables import as_markdown
from agent.kernel.view import View
from agent.types import Attachment, Cell, CellResult

OutputCallback = Callable[[str, str], None]
"""on_output(stream_name, text): live output while a cell runs (stdout, stderr)."""
Ready = Callable[[Path], Awaitable[dict[str, str]]]
"""ready(kernel_dir): once the kernel runs, before its bootstrap: the variables to set in it (the
session starts its host bridge in `kernel_dir`, the one directory the sandbox shows at the same path)."""

POLL = 0.2  # seconds between liveness checks while a cell is quiet
REAP = """import os as _os, time as _time
for _ in range(500):
    try:
        _os.waitpid(-1, _os.WNOHANG)
    except ChildProcessError:
        break
    _time.sleep(0.002)
del _os, _time"""
"""Run in the kernel once the processes a cell started are killed: their exit statuses are its to read."""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RULE = re.compile(r"^-{20,}\n", re.MULTILINE)  # IPython's banner line above a traceback
log = logging.getLogger(__name__)
LAUNCH = """\
import sys, zmq
sys.modules["debugpy"] = None  # ipykernel finds no debugger: it skips importing one
from ipykernel.kernelapp import IPKernelApp
del sys.path[0]  # the workspace ('' of -c), put back by IPython as ipykernel_launcher does
class App(IPKernelApp):
    def init_iopub(self, context):
        context.setsockopt(zmq.SNDHWM, 0)  # the sockets made from here on: IOPub's publisher first
        super().init_iopub(context)
    def init_kernel(self):
        super().init_kernel()
        del sys.modules["debugpy"]  # a cell may import it
App.launch_instance()"""
"""The kernel's entry point, in place of ipykernel_launcher: ipykernel's own app, with no debugger for
Jupyter frontends (importing debugpy and pydevd was a fifth to a quarter of a start's CPU: bench/kernel_start.py),
whose IOPub socket never drops a message. IOPub is a publisher, and a publisher drops what is past its
high-water mark (1,000 messages by default) when its subscriber reads slower than a cell prints: once,
in a full test run, 5,000 flushed prints lost 1,205 characters from the middle of a cell's output. The
host's end holds all it is sent (RCVHWM 0, `_open_client`); with SNDHWM 0 here too, what a cell prints
waits in the kernel until the host reads it (a cell's output per stream is bounded anyway:
`kernel.output_spill`). Inline, not a module of ours: a broken install of this package still starts the
kernel, and bootstrap says why."""
KERNEL_ARGS = [
    "--HistoryManager.enabled=False",  # no sqlite write per cell
    "--InteractiveShell.colors=nocolor",
    "--IPKernelApp.exec_lines=['import agent.kernel.runtime.lifeline as _pa; del _pa']",  # it dies with its host
]


class KernelState(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    RESTARTING = "restarting"
    STOPPED = "stopped"


class KernelError(RuntimeError):
    """The kernel could not be started or bootstrapped."""


class _Manager(AsyncKernelManager):
    """Launch kernels with the running interpreter, never whatever kernel spec is installed, each in
    a process tree of its own (agent/kernel/reaper.py: a cgroup where the host can make one, else its
    process group and an environment variable); ask them to shut down where ipykernel cannot hang on it."""

    def __init__(self, box: Box):
        super().__init__(transport="ipc", ip=str(box.dir / "kernel"), connection_file=str(box.dir / "kernel.json"))
        self.box = box
        self.idle = False
        """No cell runs: a shutdown need not interrupt one (in the kernel, an interrupt message with
        nothing to interrupt is logged as an error)."""
        self._killing = False
        self.tree = ProcessTree()
        """Everything this manager's kernel starts: killed with it, or by the next daemon if the host dies."""

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        await self.tree.kill()  # a restart: what the old kernel started (nothing at the first launch)
        self.tree.prepare()
        kernel_cmd = self.box.command(kernel_cmd, self.tree.cgroup)
        kw["env"] = self.tree.env(self.box.env())
        kw["cwd"] = str(self.box.dir)
        kw["pass_fds"] = self.box.pass_fds()
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            self.box.launched()
            if self.provisioner is not None and self.provisioner.has_process:
                self.tree.adopt(self.provisioner.process.pid)

    @property
    def kernel_spec(self) -> KernelSpec:
        argv = [sys.executable, "-c", LAUNCH, "-f", "{connection_file}", *KERNEL_ARGS]
        # An interrupt is a message: the kernel signals itself from inside its sandbox (a signal to
        # the launcher outside would stop bubblewrap, not the cell).
        return KernelSpec(argv=argv, display_name="Prime Agent", language="python", interrupt_mode="message")

    async def _async_shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        self._killing = now
        try:
            await super()._async_shutdown_kernel(now=now, restart=restart)
        finally:
            self._killing = False

    async def _async_interrupt_kernel(self) -> None:
        """Not as part of a shutdown of an idle kernel, nor of a kill: the kernel is killed anyway,
        and an interrupt message it never read waits in the control socket for the next kernel on
        the same channels (a restart's), which it interrupts as it starts: its bootstrap then
        never finished."""
        if not (self.shutting_down and (self.idle or self._killing)):
            await super()._async_interrupt_kernel()

    async def _async_request_shutdown(self, restart: bool = False) -> None:
        """Ask on the shell channel, not control. ipykernel 7.4 handles a control request in its
        control thread and then flushes stdout through the IOPub thread, which the main thread may
        have stopped by then: here one shutdown in twenty hung until it was killed, some before
        their atexit handlers ran (posit-dev/positron#7142 reports the same hang). On shell, the
        main thread handles the request before it stops IOPub; none of 240 hung. A running cell is
        interrupted first (shutdown_kernel does that): only one that ignores it keeps the request
        waiting, and then SIGTERM and SIGKILL follow on time."""
        shell = self.connect_shell()
        self.session.send(shell, self.session.msg("shutdown_request", content={"restart": restart}))
        shell.close(linger=1000)  # the request still goes out
        await self.provisioner.shutdown_requested(restart=restart)
        self._shutdown_status = _ShutdownStatus.ShutdownRequest

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        """Notice the kernel's exit within 10 ms, not jupyter_client's 100: a session's close waits on it."""
        await super()._async_wait(pollinterval=0.01)


async def _shut_down(km: _Manager, wait: float) -> None:
    """Stop a kernel the way jupyter_client escalates: a shutdown request (the kernel exits and runs
    its atexit handlers), SIGTERM to its process group after `wait / 2` seconds, SIGKILL after
    `wait`; `wait=0` kills at once. Then SIGKILL whatever is left of its process tree: a job `%%bash`
    put in the background, a child in a session of its own (`setsid`), a daemon it forked. Nothing
    else stops them once the kernel has exited on its own."""
    if km.has_kernel:
        km.shutdown_wait_time = wait
        await km.shutdown_kernel(now=wait == 0)
    await km.tree.kill()
    km.box.close()


class CappedText:
    """Keeps the first and last `limit // 2` characters of a stream and counts what it cut."""

    def __init__(self, limit: int):
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head: list[str] = []
        self.head_len = 0
        self.tail = ""
        self.total = 0

    def add(self, text: str) -> str:
        """Append `text`; return the part of it that landed in the head (worth showing live)."""
        self.total += len(text)
        shown = ""
        room = self.head_limit - self.head_len
        if room > 0:
            shown = text[:room]
            self.head.append(shown)
            self.head_len += len(shown)
            text = text[room:]
        if text:
            self.tail = (self.tail + text)[-self.tail_limit :]
        return shown

    @property
    def cut(self) -> int:
        return self.total - self.head_len - len(self.tail)

    def text(self) -> str:
        head = "".join(self.head)
        if not self.cut:
            return head + self.tail
        return f"{head}\n[... {self.cut:,} of {self.total:,} characters cut from the middle ...]\n{self.tail}"


_Started = tuple[_Manager, Any]
"""A launched kernel and a client of it whose channels are open and connected."""


class KernelPool:
    """Kernels started ahead of time, so that a new session does not wait for a kernel to boot.

    A pooled kernel is a bare ipykernel in the sandbox every kernel starts in (agent/kernel/sandbox.py),
    the other homes of this user already covered (`Box.cover_others`); `Kernel.start` makes it a
    session's own (its sandbox's view, working directory, environment, runtime bootstrap) before the
    session's first cell, in ~25 ms instead of ~0.6 s. It goes only to a session that would have
    launched its own the same way (`launch`: mode, network, limits, environment).
    """

    def __init__(self, size: int, config: KernelConfig, launch: Launch):
        self.size = size
        self.config = config
        self.launch = launch
        self._starting: deque[asyncio.Task[_Manager]] = deque()
        self._closed = False

    def fill(self) -> None:
        while len(self._starting) < self.size and not self._closed:
            self._starting.append(asyncio.ensure_future(self._launch()))

    @property
    def ready(self) -> int:
        return sum(1 for t in self._starting if t.done() and not t.exception())

    async def _launch(self) -> _Started:
        km = _Manager(Box(self.launch))
        kc = None
        try:
            await km.start_kernel()
            kc = _open_client(km)
            await asyncio.gather(_handshake(km, kc, self.config.startup_timeout),
                                 km.box.cover_others(km.provisioner.process.pid))
            await _warm_up(kc, self.config.startup_timeout)
        except BaseException:
            await _stop((km, kc), wait=0)  # it failed to start: nothing in it to shut down cleanly
            raise
        return km, kc

    async def take(self, launch: Launch) -> _Started | None:
        """A started kernel: a ready one, else the one that began first; None when the pool is empty,
        its kernels are launched otherwise than `launch`, or its kernel failed (the caller starts its own).
        The caller refills the pool (`fill`) once it has started: a launch holds the event loop ~10 ms,
        which a session starting should not wait behind."""
        if not self._starting or launch != self.launch:
            return None
        task = next((t for t in self._starting if t.done()), self._starting[0])
        self._starting.remove(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._starting.appendleft(task)  # the caller gave up: the next one (or close) gets it
            raise
        except Exception:
            log.exception("a pooled kernel failed to start")
            return None

    async def close(self) -> None:
        self._closed = True
        while self._starting:
            tasks = list(self._starting)
            self._starting.clear()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            wait = self.config.shutdown_wait
            await asyncio.gather(*(_stop(started, wait) for started in results if isinstance(started, tuple)))


def _open_client(km: _Manager):
    kc = km.client()
    kc.context.setsockopt(zmq.RCVHWM, 0)  # never drop a cell's output: IOPub's default queue holds 1,000 messages
    kc.start_channels()
    return kc


async def _handshake(km: _Manager, kc, timeout: float) -> None:
    """Until the kernel answers on shell and IOPub. Subscriptions connect asynchronously, and a
    message published before IOPub is connected is lost (a cell's final `idle` with it). Unlike
    jupyter_client's wait_for_ready, no 0.2 s drain of IOPub afterwards: cells filter by msg_id."""
    deadline = time.monotonic() + timeout
    while True:
        kc.kernel_info()
        try:
            reply = await kc.get_shell_msg(timeout=1.0)
            if reply["msg_type"] == "kernel_info_reply":
                await kc.get_iopub_msg(timeout=0.2)
                break
        except queue.Empty:
            pass
        if not await km.is_alive():
            raise KernelError("the kernel died while starting")
        if time.monotonic() > deadline:
            raise KernelError(f"the kernel did not answer within {timeout:g}s")
    shell = kc.shell_channel.socket
    while await shell.poll(0):  # replies to repeated kernel_info requests: not a cell's
        await shell.recv_multipart(copy=False)


async def _warm_up(kc, timeout: float) -> None:
    """A pooled kernel's first execution, ahead of time: the runtime imported and IPython's first-cell costs
    paid (~5 ms off a session's bootstrap, measured). Silent, no history: the session's cells count from 1."""
    msg_id = kc.execute("import agent.kernel.runtime", silent=True, store_history=False, allow_stdin=False)
    deadline = time.monotonic() + timeout
    while (await kc.get_shell_msg(timeout=max(0.0, deadline - time.monotonic())))["parent_header"].get("msg_id") != msg_id:
        pass


async def _stop(started: tuple[_Manager, Any], wait: float) -> None:
    """Shut down a pooled kernel nobody took (its directory goes with it)."""
    km, kc = started
    if kc is not None:
        kc.stop_channels()
    km.idle = True
    await _shut_down(km, wait)


class Kernel:
    def __init__(self, cwd: Path, config: KernelConfig, env: dict[str, str] | None = None, *,
                 sandbox: SandboxConfig | None = None, view: View | None = None):
        """A kernel working in `cwd`, confined as `sandbox` says (default: `workspace-write`), seeing
        `view` (default: `cwd` as its workspace, no session's records)."""
        self.cwd = cwd
        self.config = config
        self.env = dict(env or {})
        """This session's variables, set by code in every new or restarted kernel before the bootstrap."""
        sandbox = sandbox or SandboxConfig()
        self.mode = sandbox.mode
        self.launch = Launch.of(sandbox)
        self.view = view or View.of(sandbox, cwd, None, [], project_root(cwd))
        self.state = KernelState.NEW
        self.cell_id: str | None = None
        """The cell running now, if any (what the host bridge's calls are attributed to)."""
        self.executions = 0
        """Cells executed so far: what the host bridge's allowance counts afresh for each."""
        self._km: _Manager | None = None
        self._kc = None
        self._user_interrupt = False
        self._grace_end: float | None = None
        """Once an interrupt is sent: when the cell must have stopped, or the kernel is restarted."""
        self.setup: list[str] = []
        """Code run after the bootstrap in every new or restarted kernel (e.g. loading `context`)."""

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def connection_file(self) -> Path:
        """The live kernel's connection file: any Jupyter client can attach with it."""
        assert self._km is not None, "kernel not started"
        return Path(self._km.connection_file)

    @property
    def dir(self) -> Path:
        """The kernel's private directory: its connection file and sockets, and `tmp/` (its TMPDIR)."""
        assert self._km is not None, "kernel not started"
        return self._km.box.dir

    @property
    def confined(self) -> bool:
        return self.launch.confined

    async def start(self, pool: KernelPool | None = None, ready: Ready | None = None) -> None:
        """Launch (or take from `pool`) the kernel, apply this session's sandbox view, call `ready`,
        bootstrap the runtime: code the model writes runs only after all of them."""
        self.state = KernelState.STARTING
        started = await pool.take(self.launch) if pool is not None else None
        if started is not None:  # already answering, with a client connected
            self._km, self._kc = started
            await self._confine()
        else:
            self._km = _Manager(Box(self.launch))
            await self._km.start_kernel()
            self._kc = _open_client(self._km)
            await asyncio.gather(self._handshake(), self._confine())
        if ready is not None:
            self.env.update(await ready(self.dir))
        await self._bootstrap()

    async def _confine(self) -> None:
        km = self._km
        assert km is not None and km.provisioner is not None
        try:
            await km.box.confine(km.provisioner.process.pid, self.view)
        except SandboxError as e:
            raise KernelError(str(e)) from None

    def freeze(self, on: bool) -> None:
        """Plan mode on or off from the next start: the workspace read-only (where the sandbox is
        workspace-write, the one mode plan mode runs in) until `thaw`."""
        self.view = dataclasses.replace(self.view, frozen=on and self.mode == "workspace-write")

    async def thaw(self) -> None:
        """Plan mode approved: the workspace becomes writable in this same kernel (its variables
        stay), and stays so across a restart."""
        if self.view.frozen:
            self.view = dataclasses.replace(self.view, frozen=False)  # what a restart applies from now on
            if self._km is not None and await self.is_alive():
                try:
                    await self._km.box.thaw(dataclasses.replace(self.view, frozen=True))
                except (SandboxError, OSError) as e:
                    raise KernelError(f"the workspace could not be made writable: {e}") from None

    async def restart(self) -> None:
        """Replace the kernel process (same connection); the namespace is lost.

        The old kernel is killed at once, with its process group: a restart follows a kernel that
        died, or one stuck in a cell that ignored an interrupt, which would not act on a shutdown
        request either; asking would only keep the model waiting `shutdown_wait / 2` or more."""
        self.state = KernelState.RESTARTING
        await self._km.restart_kernel(now=True)
        await asyncio.gather(self._handshake(), self._confine())
        await self._bootstrap()

    async def shutdown(self) -> None:
        if self.state is KernelState.STOPPED:
            return
        idle, self.state = self.state is not KernelState.BUSY, KernelState.STOPPED
        if self._kc is not None:
            self._kc.stop_channels()
        if self._km is not None:
            self._km.idle = idle
            await _shut_down(self._km, self.config.shutdown_wait)

    async def interrupt(self) -> None:
        """Interrupt the running cell on the user's behalf (KeyboardInterrupt in the kernel)."""
        if self.state is KernelState.BUSY and self._grace_end is None:
            self._user_interrupt = True
            self._grace_end = time.monotonic() + self.config.interrupt_grace
            await self._km.interrupt_kernel()

    async def is_alive(self) -> bool:
        return self._km is not None and await self._km.is_alive()

    async def _handshake(self) -> None:
        await _handshake(self._km, self._kc, self.config.startup_timeout)

    async def _bootstrap(self) -> None:
        prelude = (f"import os as _os; _os.chdir({str(self.cwd)!r}); _os.environ.update({self.env!r}); del _os\n"
                   f"import agent.kernel.runtime as _pa; _pa.bootstrap(globals(), {self.config.output_spill}); del _pa")
        for code in [prelude, *self.setup]:  # one round trip, and one for each piece of setup
            boot = await self._run(code, None, None)
            if boot.error_name:
                raise KernelError(f"kernel bootstrap failed: {boot.error_name}: {boot.error_value}\n{boot.traceback}")
        self.state = KernelState.IDLE

    # --- execution -------------------------------------------------------------------------

    async def execute(self, cell: Cell, on_output: OutputCallback | None = None) -> CellResult:
        timeout = cell.timeout if cell.timeout is not None else self.config.cell_timeout
        self.state = KernelState.BUSY
        self.cell_id = cell.id
        self.executions += 1
        self._user_interrupt = False
        try:
            res = await self._run(cell.code, timeout, on_output)
            hits = self._limits_hit(res)
            if "processes" in hits and "restarted" not in res.kernel_events:
                await self._stop_strays()
            self._report_limits(res, hits)
            return res
        except asyncio.CancelledError:
            await self._km.interrupt_kernel()  # do not leave the cell running behind our back
            raise
        finally:
            self.cell_id = None
            if self.state is KernelState.BUSY:
                self.state = KernelState.IDLE

    async def _run(self, code: str, timeout: float | None, on_output: OutputCallback | None) -> CellResult:
        kc = self._kc
        limit = self.config.output_limit
        streams = {"stdout": CappedText(limit), "stderr": CappedText(limit)}
        res = CellResult()
        started = time.monotonic()
        deadline = started + timeout if timeout is not None else None
        self._grace_end = None
        msg_id = kc.execute(code, allow_stdin=False)
        next_check = started + POLL
        while True:
            # Deadlines and liveness are checked on a clock, not only when the cell is quiet:
            # a cell that prints forever must still time out, and a dead kernel be noticed.
            now = time.monotonic()
            if now >= next_check or (deadline is not None and self._grace_end is None and now >= deadline):
                next_check = now + POLL
                if await self._check(res, timeout, deadline, now):
                    break
            wait = next_check - now
            if deadline is not None and self._grace_end is None:
                wait = min(wait, max(0.0, deadline - now))
            try:
                msg = await kc.get_iopub_msg(timeout=wait)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                shown = streams[content["name"]].add(ANSI.sub("", content["text"]))
                if shown and on_output:
                    on_output(content["name"], shown)
            elif kind == "execute_result":
                if (table := as_markdown(content["data"])) is not None:  # a DataFrame: read as a table
                    res.attachments.append(Attachment(mime="text/markdown", data=table))
                else:
                    res.result = content["data"].get("text/plain")
            elif kind == "display_data":
                self._display(content["data"], res, streams["stdout"], on_output)
            elif kind == "error":
                res.error_name, res.error_value = content["ename"], content["evalue"]
                tb = CappedText(limit)
                tb.add(RULE.sub("", ANSI.sub("", "\n".join(content["traceback"]))))
                res.traceback = tb.text()
            elif kind == "status" and content["execution_state"] == "idle":
                break
        shell = kc.shell_channel.socket
        while await shell.poll(0):  # the execute reply: iopub told us everything, so skip decoding it
            await shell.recv_multipart(copy=False)
        for name, s in streams.items():
            setattr(res, name, s.text())
            if s.cut:
                res.truncated[name] = s.cut
        if "timed_out" in res.kernel_events and "restarted" not in res.kernel_events:
            res.kernel_message = (
                f"The cell exceeded its {timeout:g}s timeout and was interrupted (KeyboardInterrupt); "
                "the kernel and its variables are intact."
            )
        elif self._user_interrupt and "restarted" not in res.kernel_events:
            res.kernel_events.append("interrupted")
            res.kernel_message = "The user interrupted this cell; the kernel and its variables are intact."
        self._grace_end = None
        res.duration = time.monotonic() - started
        return res

    async def _check(self, res: CellResult, timeout: float | None, deadline: float | None, now: float) -> bool:
        """Enforce the timeout and the interrupt grace, and notice a dead kernel; True ends the cell."""
        if not await self._km.is_alive():
            exit_code = await self._km.provisioner.poll() if self._km.provisioner else None
            res.kernel_events.append("died")
            why = f"The kernel died while running this cell (exit code {exit_code})"
            if "memory" in self._limits_hit(res):  # counted in the cgroups that the restart replaces
                why = f"The cell exceeded {self.launch.limits.describe('memory')}: the kernel was killed"
            await self._recover(res, why)
            return True
        if self._grace_end is not None and now >= self._grace_end:
            why = f"exceeded its {timeout:g}s timeout" if res.kernel_events else "was interrupted by the user"
            await self._recover(res, f"The cell {why} and did not stop within {self.config.interrupt_grace:g}s of an interrupt")
            return True
        if deadline is not None and self._grace_end is None and now >= deadline:
            res.kernel_events.append("timed_out")
            self._grace_end = now + self.config.interrupt_grace
            await self._km.interrupt_kernel()
        return False

    def _limits_hit(self, res: CellResult) -> list[str]:
        """The sandbox's limits this cell reached (its cgroups count them; without a memory cgroup,
        a MemoryError is the address-space rlimit)."""
        box = self._km.box
        hits = box.hits()
        if res.error_name == "MemoryError" and box.groups is not None and box.groups.memory is None:
            hits.append("memory")
        return hits

    async def _stop_strays(self) -> None:
        """Past the process limit: kill what the cell started (a fork bomb's copies), and have the
        kernel reap its dead children, which hold their place under the limit until it does."""
        self._km.box.kill_strays(self._km.provisioner.process.pid)
        await self._run(REAP, 10, None)

    def _report_limits(self, res: CellResult, hits: list[str]) -> None:
        """Name each limit the cell reached."""
        if not hits or "restarted" in res.kernel_events:
            return
        said = " and ".join(self.launch.limits.describe(h) for h in hits)
        extra = " Every process the cell started was stopped." if "processes" in hits else ""
        message = f"The cell reached {said}; the kernel and its variables are intact.{extra}"
        res.kernel_events.append("limit")
        res.kernel_message = f"{res.kernel_message} {message}" if res.kernel_message else message

    async def _recover(self, res: CellResult, why: str) -> None:
        await self.restart()
        res.kernel_events.append("restarted")
        res.kernel_message = f"{why}. The kernel was restarted: all variables and imports are lost."

    @staticmethod
    def _display(data: dict, res: CellResult, stdout: CappedText, on_output: OutputCallback | None) -> None:
        images = [m for m in data if m.startswith("image/")]
        for mime in images:
            raw = data[mime]
            if mime == "image/svg+xml":
                raw = base64.b64encode(raw.encode()).decode()
            res.attachments.append(Attachment(mime=mime, data=raw))
        if not images and (table := as_markdown(data)) is not None:
            res.attachments.append(Attachment(mime="text/markdown", data=table))
        elif not images and "text/plain" in data:
            shown = stdout.add(data["text/plain"] + "\n")
            if shown and on_output:
                on_output("stdout", shown)
