"""The OS sandbox around every kernel, and what it starts: namespaces, a per-session view, limits.

Mechanism (measured and chosen in docs/sandbox.md): **bubblewrap** starts the kernel in new
user, mount, PID, IPC and UTS namespaces (and network, with `sandbox.network = false`), every
capability dropped, with the whole filesystem bound read-only and a fresh /proc that shows only the
sandbox's own processes. That part is the same for every kernel, so the daemon's pool starts
kernels in it ahead of time. The part that belongs to one session, its **view**, is applied from
outside once the kernel's namespaces exist and before any cell runs: a fork of the host enters them
as their owner (setns(2)) and binds (mount(2)) the workspace read-write, the harness scopes, `.git/`,
`$PRIME_AGENT_HOME` and the session's records back read-only on top of it, and covers the daemon's
`run/`, other sessions and the configured secret stores. Code in the kernel has no capability in
its namespaces: it cannot unmount, remount or enter anything, nor regain a capability by exec.

Limits: a cgroup per kernel for memory and processes (agent/kernel/limits.py), joined before
bubblewrap runs; rlimits (`prlimit`) for open files, and for memory and processes where no cgroup
can hold them.

This module launches and confines one kernel (its `Box`, the bubblewrap command, the environment
and the seccomp filter); what a session's kernel sees is planned in agent/kernel/view.py, and what
every host of this user shares (kernels' directories, the registry of homes, placeholders) is in
agent/kernel/homes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fnmatch
import functools
import logging
import os
import re
import secrets
import shlex
import shutil
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from agent.config import home
from agent.config_models import SandboxConfig, SandboxMode
from agent.kernel.homes import collect_dirs, hold_placeholder, private_root, register_home, release_placeholder
from agent.kernel.limits import LimitGroups, Limits
from agent.kernel.mounts import CLONE_NEWUSER, Mount, MountError, apply_mounts, mount_points
from agent.kernel.reaper import ProcessTree, host_tag
from agent.kernel.view import View, covers, other_homes

log = logging.getLogger(__name__)
TOOLS = ("bwrap",)
"""bubblewrap (Debian package `bubblewrap`); util-linux's `prlimit` sets rlimits where it is found."""


class SandboxError(RuntimeError):
    """The sandbox could not be set up (or is required where the OS cannot provide it)."""


@functools.cache
def unavailable() -> str | None:
    """Why this machine cannot sandbox kernels, or None when it can (checked once a process)."""
    if not sys.platform.startswith("linux"):
        return f"kernels cannot be sandboxed on {sys.platform}: the sandbox needs Linux namespaces"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"kernels cannot be sandboxed: {', '.join(missing)} not found (install bubblewrap)"
    try:
        probe = subprocess.run(["bwrap", *_BASE, "--ro-bind", "/", "/", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"kernels cannot be sandboxed: bwrap failed to run ({e})"
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip() or f"exit code {probe.returncode}"
        return f"kernels cannot be sandboxed: user namespaces are not available here ({why})"
    return None


_BASE = ["--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-ipc",
         "--unshare-uts", "--cap-drop", "ALL"]


# --- the environment ----------------------------------------------------------------------------


CREDENTIAL_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:[^\s/@]*@")
"""A URL with a password in it (`postgres://user:pass@host/db`), anywhere in a value."""


def kernel_env(environ: dict[str, str] | os._Environ, config: SandboxConfig) -> dict[str, str]:
    """The environment a kernel starts with: names matching `env_deny` (secret-looking ones) and
    values holding a URL with a password dropped, unless `env_allow` names them. Patterns are shell
    globs, matched case-insensitively."""

    def matches(name: str, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(name.upper(), p.upper()) for p in patterns)

    return {k: v for k, v in environ.items()
            if not (matches(k, config.env_deny) or CREDENTIAL_URL.search(v)) or matches(k, config.env_allow)}


# --- the seccomp filter ---------------------------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED = {  # name: (x86_64, aarch64); the new mount API (open_tree ... mount_setattr) has one number everywhere
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "keyctl": (250, 219),
    "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280), "userfaultfd": (323, 282),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "unshare": (272, 97), "setns": (308, 268),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442), "perf_event_open": (298, 241),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225),
    "open_by_handle_at": (304, 265),
}
"""Refused with EPERM: what a kernel never needs and an escape would (another process's memory, the
kernel keyring, eBPF, page-fault races, mounts, new or other namespaces, kernel modules)."""
CLONE, CLONE3 = {"x86_64": 56, "aarch64": 220}, 435
X32_BIT = 0x40000000
"""x86_64's x32 ABI: the same calls under other numbers; refused whole."""
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The classic-BPF seccomp filter bubblewrap installs (`--seccomp FD`) for this machine's
    architecture (None where it has none: another architecture than x86_64 and aarch64).

    It checks the architecture first (a call made through another ABI, i386's `int 0x80`, fails
    with ENOSYS), refuses the calls in DENIED and `clone` with CLONE_NEWUSER with EPERM, and
    `clone3` with ENOSYS: its flags are in memory a filter cannot read, and glibc falls back to
    `clone` on ENOSYS (as Docker's and Flatpak's filters do)."""
    machine = machine or os.uname().machine
    if machine not in AUDIT_ARCH:
        return None
    col = 0 if machine == "x86_64" else 1
    prog: list[tuple[int, int | str, int | str, int]] = [  # (code, jump if true, jump if false, k); str: a label
        (_LD, 0, 0, 4), (_JEQ, 1, 0, AUDIT_ARCH[machine]), (_RET, 0, 0, _ERRNO | errno.ENOSYS), (_LD, 0, 0, 0)]
    if machine == "x86_64":
        prog.append((_JGE, "enosys", 0, X32_BIT))
    prog += [(_JEQ, "eperm", 0, nrs[col]) for nrs in DENIED.values()]
    prog += [(_JEQ, "clone", 0, CLONE[machine]), (_JEQ, "enosys", 0, CLONE3), (_RET, 0, 0, _ALLOW)]
    labels = {"clone": len(prog), "eperm": len(prog) + 3, "enosys": len(prog) + 4}
    prog += [(_LD, 0, 0, 16), (_JSET, "eperm", 0, CLONE_NEWUSER), (_RET, 0, 0, _ALLOW),  # args[0]'s low word: flags
             (_RET, 0, 0, _ERRNO | errno.EPERM), (_RET, 0, 0, _ERRNO | errno.ENOSYS)]

    def jump(at: int, to: int | str) -> int:
        return labels[to] - at - 1 if isinstance(to, str) else to

    return b"".join(struct.pack("<HBBI", code, jump(i, jt), jump(i, jf), k) for i, (code, jt, jf, k) in enumerate(prog))


async def _mount(target: int, ops: list[Mount]) -> None:
    try:
        await apply_mounts(target, ops)
    except MountError as e:
        raise SandboxError(str(e)) from None


# --- one kernel's box -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """How a kernel process is started: a pooled kernel is handed only to a session that would have
    started its own the same way."""

    confined: bool
    network: bool
    limits: Limits
    env: tuple[tuple[str, str], ...]
    seccomp: bool = False
    """Confined with the seccomp filter too (`seccomp_program`)."""

    @classmethod
    def of(cls, config: SandboxConfig, environ: dict[str, str] | os._Environ | None = None) -> Launch:
        confined = config.mode != "full-access" and unavailable() is None
        env = kernel_env(os.environ if environ is None else environ, config)
        seccomp = confined and config.seccomp and seccomp_program() is not None
        return cls(confined, config.network, Limits.of(config), tuple(sorted(env.items())), seccomp)


UNCONFINED: set[Box] = set()
"""Boxes of this process whose kernel runs without the OS sandbox (full-access, or an OS that cannot):
while any runs, an edit of a harness file may be a kernel's, not a person's (harness_store.watch)."""


def unconfined_running() -> bool:
    return bool(UNCONFINED)


class Box:
    """One kernel's sandbox: its private directory (connection file, sockets: the same path inside
    and out; and `tmp/`, its TMPDIR), the command that launches it, its limits and its lifeline;
    `confine` applies a session's view."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.token = secrets.token_hex(4)
        register_home()
        collect_dirs()
        self.dir = private_root() / f"k-{host_tag()}-{self.token}"
        self.tmp = self.dir / "tmp"
        for d in (self.dir, self.tmp):  # whatever the umask: in the sandbox, no capability overrides modes
            d.mkdir(mode=0o700)
            os.chmod(d, 0o700)
        self.groups: LimitGroups | None = None
        self.placeholders: list[Path] = []
        """The placeholders this box holds (`hold_placeholder`), released when it closes."""
        self.target: int | None = None
        """The sandboxed process whose namespaces `confine` set up (the kernel's)."""
        self.covered: frozenset[str] = frozenset()
        """What `cover_others` covered in the namespaces of `target` before a session took the kernel."""
        self._seccomp: int | None = None
        """The read end of a pipe holding the seccomp filter, for bubblewrap's `--seccomp FD`."""
        self._lifeline: tuple[int, int] | None = None
        """The pipe whose write end only this process holds: the kernel exits when it closes
        (agent/kernel/runtime/lifeline.py), even if this process is killed outright."""
        if not launch.confined:
            UNCONFINED.add(self)

    def env(self) -> dict[str, str]:
        tmp = str(self.tmp)
        lifeline = {"PRIME_AGENT_LIFELINE": str(self._lifeline[0])} if self._lifeline else {}
        # matplotlib's config and font cache in the kernel's own temp folder (the home's is read-only in the
        # box: it would warn, and make a folder of its own at every import), unless the person named one
        return {"MPLCONFIGDIR": f"{tmp}/.matplotlib", **dict(self.launch.env), "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp,
                "IPYTHONDIR": f"{tmp}/.ipython", **lifeline}

    def pass_fds(self) -> tuple[int, ...]:
        return (*((self._lifeline[0],) if self._lifeline else ()), *((self._seccomp,) if self._seccomp else ()))

    def launched(self) -> None:
        """The kernel process has its end of the lifeline (and bubblewrap its filter): this process
        keeps only the other end."""
        if self._lifeline and self._lifeline[0] >= 0:
            os.close(self._lifeline[0])
            self._lifeline = (-1, self._lifeline[1])
        self._close_filter()

    def _close_filter(self) -> None:
        if self._seccomp is not None:
            with contextlib.suppress(OSError):
                os.close(self._seccomp)
            self._seccomp = None

    def _filter(self) -> list[str]:
        """bubblewrap's arguments that install the seccomp filter, read from a pipe made for this launch."""
        program = seccomp_program() if self.launch.seccomp else None
        if program is None:
            return []
        r, w = os.pipe()  # the filter (a few hundred bytes) fits in the pipe's buffer
        try:
            os.write(w, program)
        finally:
            os.close(w)
        self._seccomp = r
        return ["--seccomp", str(r)]

    def _cut_lifeline(self) -> None:
        for fd in self._lifeline or ():
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lifeline = None
        self._close_filter()

    def command(self, argv: list[str], tree_cgroup: Path | None) -> list[str]:
        """`argv` (the kernel) wrapped: joined to its limit cgroups, rlimits set, then bubblewrap."""
        if self.groups is not None:
            self.groups.remove()
        self.covered = frozenset()  # a restart: new namespaces, where `confine` applies the whole view
        self._cut_lifeline()  # a restart: the old kernel's
        self._lifeline = os.pipe()  # the launch passes the kernel `read` (pass_fds); `write` stays here
        limits = self.launch.limits
        self.groups = LimitGroups(limits, tree_cgroup, self.token)
        joins = [*([tree_cgroup / "cgroup.procs"] if tree_cgroup else []), *self.groups.procs_files]
        rlimits = [f"--nofile={limits.open_files}"]
        if self.groups.memory is None:
            rlimits.append(f"--as={limits.memory}")
        if self.groups.pids is None:
            rlimits.append(f"--nproc={limits.processes}")
        join = "".join(f"echo $$ > {shlex.quote(str(f))} 2>/dev/null || :; " for f in joins)
        prlimit = shutil.which("prlimit")  # util-linux; without it (not Linux), only cgroups limit
        prefix = ["/bin/sh", "-c", join + 'exec "$@"', "sh", *([prlimit, *rlimits, "--"] if prlimit else [])]
        if not self.launch.confined:
            return [*prefix, *argv]
        root = private_root()
        box = [
            "bwrap", *_BASE, *(["--unshare-net"] if not self.launch.network else []),
            "--ro-bind", "/", "/", "--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc",
            "--tmpfs", str(root), "--bind", str(self.dir), str(self.dir), "--chdir", str(self.dir),
            # ipykernel's parent poller would take bubblewrap's PID 1 for a dead host, and "1" turns
            # it off; the lifeline does its work.
            "--setenv", "JPY_PARENT_PID", "1", *self._filter(),
        ]
        return [*prefix, *box, "--", *argv]

    async def cover_others(self, pid: int) -> None:
        """Before any session takes this kernel (a pooled one): cover the other homes of this user
        (`other_homes`), what every session of this process hides unless its workspace lies in one. With
        a thousand homes registered (tests leave theirs) these covers took most of a session's start
        from the pool (~130 ms on two loaded cores); `confine` lifts the few its view keeps visible,
        and covers the homes registered since and any cover no longer standing (a home removed and
        made again)."""
        if not self.launch.confined:
            return
        target = self.target = await _sandboxed_child(pid)
        root = home().resolve()
        ops = await asyncio.get_running_loop().run_in_executor(None, lambda: covers(other_homes(root, [root])))
        await _mount(target, ops)
        self.covered = frozenset(b if op == "file" else a for op, a, b in ops)

    async def confine(self, pid: int, view: View) -> None:
        """Apply `view` to the namespaces of the kernel whose launcher is `pid` (the process
        jupyter_client started); before any of the session's code runs in it."""
        if not self.launch.confined:
            return
        target = self.target = await _sandboxed_child(pid)
        stage = self.dir / ".stage"
        try:
            ops = await asyncio.get_running_loop().run_in_executor(None, self._prepare, view, stage)
            await _mount(target, ops)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        self.covered = frozenset()

    async def thaw(self, view: View) -> None:
        """Make a frozen view's workspace writable again (plan mode approved), in the running kernel:
        its top read-only bind is remounted read-write; what lies beneath stays as it was."""
        if self.launch.confined and view.frozen and self.target is not None:
            await _mount(self.target, [("remount", str(view.workspace), "rw")])

    def _prepare(self, view: View, stage: Path) -> list[Mount]:
        """The placeholders `view` needs, held; then its mounts, after lifting the covers made ahead
        (`cover_others`) that it does not keep."""
        owner = f"{host_tag()}-{self.token}"
        for path, directory in view.placeholders():
            try:
                if path not in self.placeholders and hold_placeholder(path, directory, owner):
                    self.placeholders.append(path)
            except OSError as e:
                raise SandboxError(f"the kernel's sandbox could not cover {path}: {e.strerror or e}") from None
        try:
            covered = self.covered & mount_points(self.target) if self.covered and self.target else frozenset()
        except OSError as e:
            raise SandboxError(f"the kernel's mounts could not be read: {e.strerror or e}") from None
        hidden = {str(p) for p in view.hidden}
        return [*(("detach", p, "") for p in covered - hidden), *view.mounts(stage, covered & hidden)]

    def hits(self) -> list[str]:
        return self.groups.hits() if self.groups is not None else []

    def kill_strays(self, launcher: int) -> None:
        """After the process limit was hit: kill what the cell started (a fork bomb's copies), not
        the kernel (`launcher`, bubblewrap's PID 1 and the kernel process)."""
        if self.groups is None:
            return
        keep = {launcher, *_children(launcher)}
        for kid in list(keep - {launcher}):
            keep.update(_children(kid))
        if not self.launch.confined:
            keep = {launcher}
        for pid in self.groups.members() - keep:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)

    def close(self) -> None:
        self._cut_lifeline()
        UNCONFINED.discard(self)
        if self.groups is not None:
            self.groups.remove()
        for path in self.placeholders:
            with contextlib.suppress(OSError):
                release_placeholder(path, f"{host_tag()}-{self.token}")
        self.placeholders = []
        shutil.rmtree(self.dir, ignore_errors=True)


_GATE = 'read -r _ && cd "$2" && exec /bin/sh -c "$1" </dev/null'
"""Waits (on stdin) until the view is mounted, then runs the command in its directory: a `cd`
before the mounts would leave it in the read-only directory beneath them."""


@contextlib.asynccontextmanager
async def shell(command: str, cwd: Path, launch: Launch, view: View,
                stderr: int = asyncio.subprocess.STDOUT) -> AsyncIterator[tuple[asyncio.subprocess.Process, Box]]:
    """`command` through /bin/sh in `cwd`, in a box of its own launched and confined as a session's
    kernel is (`launch`, `view`: the same namespaces, view, environment and limits), started only
    once its view is in place; its stdout and stderr together on `stdout` (or apart, with `stderr`
    = PIPE); the box says which
    limits it hit (`Box.hits`). On leaving, it and everything it started are killed
    (`ProcessTree`; the next daemon reaps them if this process dies)."""
    box, tree = Box(launch), ProcessTree()
    try:
        tree.prepare()
        argv = box.command(["/bin/sh", "-c", _GATE, "prime-agent-shell", command, str(cwd)], tree.cgroup)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=box.dir, env=tree.env(box.env()), pass_fds=box.pass_fds(), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, start_new_session=True)
        box.launched()
        tree.adopt(proc.pid)
        await box.confine(proc.pid, view)
        assert proc.stdin is not None
        proc.stdin.write(b"\n")
        proc.stdin.close()
        yield proc, box
    finally:
        await tree.kill()
        box.close()


async def _sandboxed_child(pid: int, timeout: float = 10.0) -> int:
    """The process bubblewrap runs in the sandbox once its setup is done: a child of its PID 1 that
    is in namespaces of its own and no longer bubblewrap. Mounts meant for the kernel are never made
    through a process that could still be in the host's namespaces."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    host = _namespaces(os.getpid())
    bwrap = os.path.realpath(shutil.which("bwrap") or "bwrap")
    while True:
        for kid in _children(pid):
            for grand in _children(kid):
                ns = _namespaces(grand)
                if ns and all(a != b for a, b in zip(ns, host)) and _exe(grand) not in (None, bwrap):
                    return grand
        if loop.time() > deadline:
            raise SandboxError(f"the sandbox of kernel launcher {pid} did not start within {timeout:g}s")
        await asyncio.sleep(0.002)


def _namespaces(pid: int) -> tuple[str, str] | None:
    """Process `pid`'s user and mount namespaces, or None if it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/user"), os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def describe(launch: Launch, mode: SandboxMode) -> str:
    """The sandbox in force, as the status line and `prime-agent run` show it."""
    if mode == "full-access":
        return "full-access: NO SANDBOX (the agent's code runs with your rights)"
    if not launch.confined:
        return f"UNSANDBOXED: {unavailable()}"
    return f"{mode}{'' if launch.network else ', no network'}{'' if launch.seccomp else ', no seccomp filter'}"
