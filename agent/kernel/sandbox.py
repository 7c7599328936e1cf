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

Limits: a cgroup per kernel for memory and processes (cgroup v2 where its controllers are
delegated, else the v1 hierarchies where writable), joined before bubblewrap runs; rlimits
(`prlimit`) for open files, and for memory and processes where no cgroup can hold them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import fnmatch
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import stat as stat_module
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.config import SandboxConfig, SandboxMode, home
from agent.layout import SessionLayout
from agent.kernel.mounts import CLONE_NEWUSER, Mount, MountError, apply_mounts, mount_points
from agent.kernel.reaper import ProcessTree, collect_cgroups, host_tag, made_by_a_gone_host

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


# --- limits ---------------------------------------------------------------------------------------


@functools.cache
def _ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Limits:
    memory: int
    """Bytes."""
    processes: int
    open_files: int

    @classmethod
    def of(cls, config: SandboxConfig) -> Limits:
        memory = config.memory_mb * 2**20 if config.memory_mb else _ram() // 2
        return cls(memory, config.max_processes, config.max_open_files)

    def describe(self, what: str) -> str:
        if what == "memory":
            return f"the sandbox's memory limit ({self.memory // 2**20:,} MiB, sandbox.memory_mb)"
        return f"the sandbox's process limit ({self.processes:,} processes and threads, sandbox.max_processes)"


@functools.cache
def _v1_cgroup(controller: str) -> Path | None:
    """This process's cgroup in the v1 hierarchy of `controller`, where one is mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controller in controllers.split(","):
            path = Path("/sys/fs/cgroup") / controller / rel.lstrip("/")
            return path if (path / "cgroup.procs").is_file() else None
    return None


class LimitGroups:
    """The cgroups that hold one launch of a kernel to its memory and process limits, and what they
    counted: `hits()` names each limit reached since the last call."""

    def __init__(self, limits: Limits, tree_cgroup: Path | None, token: str):
        self.limits = limits
        self.groups: list[Path] = []
        self.memory: tuple[Path, str, str] | None = None
        """(file, counter key, ...) where the memory limit's kills are counted."""
        self.pids: tuple[Path, str, str] | None = None
        v2 = tree_cgroup
        enabled = set()
        if v2 is not None:
            with contextlib.suppress(OSError):
                enabled = set((v2.parent / "cgroup.subtree_control").read_text().split())
        for controller in ("memory", "pids"):
            if controller in enabled:
                assert v2 is not None
                limit = "memory.max" if controller == "memory" else "pids.max"
                value = limits.memory if controller == "memory" else limits.processes
                if self._write(v2 / limit, value):
                    events = (v2 / f"{controller}.events", "oom_kill" if controller == "memory" else "max", "")
                    setattr(self, controller, events)
                continue
            base = _v1_cgroup(controller)
            if base is None:
                continue
            collect_cgroups(base)
            group = base / f"prime-agent-{host_tag()}-{token}"
            try:
                group.mkdir(exist_ok=True)
            except OSError:
                continue
            self.groups.append(group)
            if controller == "memory":
                ok = self._write(group / "memory.limit_in_bytes", limits.memory)
                self._write(group / "memory.memsw.limit_in_bytes", limits.memory)  # no escape into swap
                events = (group / "memory.oom_control", "oom_kill", "")
            else:
                ok = self._write(group / "pids.max", limits.processes)
                events = (group / "pids.events", "max", "")
            if ok:
                setattr(self, controller, events)
        self._seen = {"memory": self._count(self.memory), "processes": self._count(self.pids)}

    @staticmethod
    def _write(path: Path, value: int) -> bool:
        try:
            path.write_text(str(value))
            return True
        except OSError:
            return False

    @staticmethod
    def _count(where: tuple[Path, str, str] | None) -> int:
        if where is None:
            return 0
        try:
            for line in where[0].read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == where[1]:
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    @property
    def procs_files(self) -> list[Path]:
        return [g / "cgroup.procs" for g in self.groups]

    def hits(self) -> list[str]:
        """The limits reached since the last call: "memory", "processes"."""
        out = []
        for name, where in (("memory", self.memory), ("processes", self.pids)):
            n = self._count(where)
            if n > self._seen[name]:
                out.append(name)
            self._seen[name] = n
        return out

    def members(self) -> set[int]:
        pids: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in f.read_text().split())
        return pids

    def remove(self) -> None:
        for g in self.groups:
            with contextlib.suppress(OSError):
                g.rmdir()
        self.groups = []


# --- what a session's kernel sees -----------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """What one session's kernel may read and write: applied to its namespaces before its first cell."""

    mode: SandboxMode
    workspace: Path
    session_dir: Path | None
    """Its own records (None: a kernel of no session's, such as the refiner's scratch kernel)."""
    read_only: tuple[Path, ...]
    """Inside the workspace, bound back read-only: $PRIME_AGENT_HOME, harness scopes, `.git/`,
    `.prime-agent/`, the records; each one absent at the start gets a placeholder (`placeholders`)."""
    hidden: tuple[Path, ...]
    """Covered: the secret stores, every other home of this user and its kernels' directories."""
    sessions: Path
    """The directory of sessions (or of a parent's children) covered, all but this session's own."""
    home: Path
    """$PRIME_AGENT_HOME, covered (its config.toml holds keys, checkpoints/ copies of hidden files,
    run/ the daemon's token) but for `keep`."""
    keep: tuple[Path, ...] = ()
    """The harness scopes: shown (read-only) through the home's cover."""
    writable: tuple[Path, ...] = ()
    """Inside the session's read-only records, bound back writable: the kernel's own namespace
    snapshots (`checkpoints/kernel/`, written by the kernel for `rewind`)."""
    store_dirs: tuple[Path, ...] = ()
    """The secret stores known to be directories (their entry ends in `/`): a placeholder of one is a directory."""
    frozen: bool = False
    """Plan mode: the workspace read-only on top of the rest, until `Box.thaw` makes it writable again
    in the same kernel (`sandbox.plan`)."""

    @classmethod
    def of(cls, config: SandboxConfig, workspace: Path, session_dir: Path | None, harness_roots: list[Path],
           project: Path) -> View:
        root, workspace, project = home().resolve(), workspace.resolve(), project.resolve()
        session_dir = session_dir.resolve() if session_dir is not None else None
        keep = tuple(dict.fromkeys(r.resolve() for r in harness_roots))
        islands = [root, *keep, project / ".prime-agent", project / ".git", workspace / ".prime-agent",
                   workspace / ".git", *([session_dir] if session_dir else [])]
        sessions = root / "sessions"
        if session_dir is not None and sessions not in session_dir.parents:
            sessions = session_dir.parent
        stores = [Path(p).expanduser().resolve() for p in config.hidden]  # a link: its target
        store_dirs = tuple(path for path, p in zip(stores, config.hidden) if p.endswith("/"))
        hidden = [*stores, *_others(root, [workspace, project, root, *([session_dir] if session_dir else [])])]
        writable = (SessionLayout(session_dir).kernel_snapshots,) if session_dir is not None else ()
        return cls(config.mode, workspace, session_dir, tuple(dict.fromkeys(islands)), tuple(dict.fromkeys(hidden)),
                   sessions, root, keep, writable, store_dirs, frozen=config.plan and config.mode == "workspace-write")

    def placeholders(self) -> list[tuple[Path, bool]]:
        """Where the protected paths inside a writable workspace need a placeholder, as (path, whether
        it is a directory): the first missing component of one absent now, and one there now, which
        may be another kernel's placeholder to share (`hold_placeholder` tells). Covered like the
        others once a placeholder stands there, they cannot be created, nor replaced by a link."""
        if self.mode != "workspace-write":
            return []
        w, out = self.workspace, {}
        # only paths inside the workspace need one, and only they and its ancestors can stand above them
        near = [p for p in (*self.read_only, *self.hidden) if _within(p, w) or _within(w, p)]
        there = [p for p in near if os.path.lexists(p)]
        for p in near:
            if p == w or not _within(p, w) or any(c != p and _within(p, c) for c in there):
                continue
            # the first absent component; none any more where another kernel's placeholder appeared
            # meanwhile (sessions starting at once): p, to share (a StopIteration here hung the start)
            first = next((a for a in (*reversed(p.parents), p) if w in a.parents and not os.path.lexists(a)), p) \
                if p not in there else p
            out[first] = first != p or p not in self.hidden or p in self.store_dirs
        return list(out.items())

    def mounts(self, stage: Path, covered: frozenset[str] = frozenset()) -> list[Mount]:
        """The mounts (made in the kernel's namespaces) that make this view; order matters: each
        later one lies on top of the earlier ones. `stage`: an empty directory the sandbox shows,
        where what shows through a cover waits while the cover is made. `covered`: hidden paths
        covered in these namespaces already (`Box.cover_others`); a recursive bind over one keeps it."""
        ops: list[Mount] = []
        w = self.workspace
        if self.mode == "workspace-write":
            ops += [("bind", str(w), str(w)), ("remount", str(w), "rw")]
            for p in self.read_only:
                if (p == w or w in p.parents) and p.exists():
                    ops += [("bind", str(p), str(p)), ("remount", str(p), "ro")]
        s, root = self.session_dir, self.home
        if root not in self.sessions.parents:  # covered with the home otherwise
            if s is None and self.sessions.is_dir():
                ops.append(("tmpfs", str(self.sessions), "ro"))
            elif s is not None and self.sessions in s.parents and s.is_dir():
                ops += _cover(self.sessions, [s], stage / "s")
        if root.is_dir():
            shown = [p for p in (*([s] if s else []), *self.keep) if root in p.parents and p.is_dir()]
            shown = [p for p in shown if not any(q in p.parents for q in shown)]
            ops += _cover(root, shown, stage / "h", rw=w if w == root or root in w.parents else None)
        if s is not None:
            for p in self.writable:
                if p.is_dir():
                    ops += [("bind", str(p), str(p)), ("remount", str(p), "rw")]
        ops += _covers(p for p in self.hidden if str(p) not in covered)
        if self.frozen:  # on top of all the rest, which the recursive bind keeps as it is beneath
            ops += [("bind", str(w), str(w)), ("remount", str(w), "ro")]
        return ops


def _covers(paths: Iterable[Path]) -> list[Mount]:
    """Each of `paths` that exists covered: a directory by an empty read-only tmpfs, a file by /dev/null."""
    ops: list[Mount] = []
    for p in paths:
        if p.is_dir():
            ops.append(("tmpfs", str(p), "ro"))
        elif p.exists():
            ops.append(("file", "/dev/null", str(p)))
    return ops


def _cover(target: Path, shown: list[Path], stage: Path, rw: Path | None = None) -> list[Mount]:
    """`target` covered by an empty read-only tmpfs through which `shown` (paths under it) show,
    read-only, and the workspace `rw` if it lies under `target`, as it was."""
    shown = [*shown, *([rw] if rw is not None else [])]
    if not shown:
        return [("tmpfs", str(target), "ro")]
    ops: list[Mount] = [("mkdir", str(stage), "")]
    for i, p in enumerate(shown):
        ops += [("mkdir", f"{stage}/{i}", ""), ("bind", str(p), f"{stage}/{i}")]
        if p != rw:
            ops.append(("remount", f"{stage}/{i}", "ro"))
    ops.append(("tmpfs", str(target), "rw"))
    ops += [("move", f"{stage}/{i}", str(p)) for i, p in enumerate(shown)]
    return [*ops, ("remount", str(target), "ro")]


def _others(root: Path, needed: list[Path]) -> list[Path]:
    """What of the other homes of this user (and the kernels' directories of every home) a kernel
    under `root` must not see: a home whole, or where it holds what the kernel needs (`needed`: its
    workspace...), its run/, config.toml, checkpoints/ and sessions/."""
    # What holds a needed path is one of its ancestors: looked up in a set, not by walking `parents`
    # (with a thousand homes registered, that walk made a session's view take 0.4 s).
    holds = {str(a) for n in needed for a in (n, *n.parents)}
    own_tmp, out = private_root(), []
    for other, tmp in registered_homes():
        if other != root:
            if str(other) in holds:
                out += [other / "run", other / "config.toml", other / "checkpoints", other / "sessions"]
            else:
                out.append(other)
        out.append(tmp)
    out.append(user_base())
    holds.update(str(a) for a in (own_tmp, *own_tmp.parents))
    return [p for p in dict.fromkeys(out) if str(p) not in holds]


def _within(path: Path, directory: Path) -> bool:
    """`path` is `directory` or lies under it (both absolute and resolved)."""
    p, d = str(path), str(directory)
    return p == d or p.startswith(d if d.endswith("/") else d + "/")


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


def private_root() -> Path:
    """A short private directory for kernels' sockets and temporary files (socket paths are short)."""
    return _private(Path(tempfile.gettempdir()) / f"prime-agent-{os.getuid()}")


def user_base() -> Path:
    """`/tmp/prime-agent-<uid>` whatever TMPDIR says: where every host of this user, whatever its
    home, registers its home (`register_home`) and its placeholders (`hold_placeholder`)."""
    return _private(Path("/tmp") / f"prime-agent-{os.getuid()}")


def _private(base: Path) -> Path:
    base.mkdir(mode=0o700, exist_ok=True)
    st = base.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or base.is_symlink():
        raise PermissionError(f"{base} is not a private directory of this user; remove it")
    return base


# --- what every host of this user shares ------------------------------------------------------------


def register_home() -> None:
    """Enter $PRIME_AGENT_HOME and this process's kernels' directory in the user's registry of homes:
    every sandbox started after it hides them from its kernel (a kernel under one home must not
    reach another's daemon token, keys or checkpoints). A daemon registers at its start, any other
    host with its first kernel; an entry whose home is gone is dropped by the next reader."""
    _register(str(home().resolve()), str(private_root()))


@functools.cache
def _register(root: str, tmp: str) -> None:
    with contextlib.suppress(OSError):  # a registry that cannot be written (a read-only /tmp) hides less, says nothing
        registry = user_base() / "homes"
        registry.mkdir(mode=0o700, exist_ok=True)
        entry = registry / hashlib.sha256(f"{root}\0{tmp}".encode()).hexdigest()[:16]
        if not entry.is_file():
            part = registry / f".{entry.name}.{secrets.token_hex(4)}"
            part.write_text(json.dumps({"home": root, "tmp": tmp}))
            part.replace(entry)


def forget_home(root: Path) -> None:
    """Take `root` out of the user's registry of homes (a home being removed, or a test's at its end:
    every kernel started later covers each registered home, so a registry that only grows makes every
    start slower)."""
    root = root.resolve()
    registered_homes()  # every entry read (and kept in _ENTRIES)
    for name, (other, _tmp) in list(_ENTRIES.items()):
        if other == root:
            with contextlib.suppress(OSError):
                (user_base() / "homes" / name).unlink(missing_ok=True)
            del _ENTRIES[name]
    _register.cache_clear()


_ENTRIES: dict[str, tuple[Path, Path]] = {}
"""The registry's entries read so far, by name: an entry is named by its content's hash and put in
place whole (a rename), so a name always holds the same (home, kernels' directory)."""


def registered_homes() -> list[tuple[Path, Path]]:
    """Every (home, kernels' directory) some host of this user registered, but those whose home is gone."""
    out, registry = [], user_base() / "homes"
    with contextlib.suppress(OSError):
        for name in os.listdir(registry):
            if name.startswith("."):  # one being written
                continue
            if name not in _ENTRIES:
                try:
                    data = json.loads((registry / name).read_text())
                    _ENTRIES[name] = Path(data["home"]), Path(data["tmp"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            root, tmp = _ENTRIES[name]
            if os.path.isdir(root):
                out.append((root, tmp))
            else:
                (registry / name).unlink(missing_ok=True)
    return out


def _placeholder_key(path: Path) -> tuple[Path, str]:
    return user_base() / "placeholders", hashlib.sha256(str(path).encode()).hexdigest()[:24]


@contextlib.contextmanager
def _placeholder_lock(path: Path) -> Iterator[tuple[Path, str]]:
    registry, key = _placeholder_key(path)
    registry.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(registry / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield registry, key
    finally:
        os.close(fd)


def hold_placeholder(path: Path, directory: bool, owner: str) -> bool:
    """Make the absent `path` an empty placeholder (a directory, or a file), or join the users of the
    one a host of this user made there before; False where `path` is a person's (nothing is held).

    Placeholders are counted (`<key>-<owner>` in the registry) because removing one on the host
    would lift the cover of every other kernel mounted on it (Linux detaches mounts from a removed
    directory in every namespace): the last user removes it (`release_placeholder`)."""
    registry, key = _placeholder_key(path)
    if os.path.lexists(path) and not (registry / f"{key}.made").is_file():
        return False  # a person's: no lock needed to know it (a placeholder is marked before it is made)
    with _placeholder_lock(path) as (registry, key):
        made = registry / f"{key}.made"
        if not os.path.lexists(path):
            made.write_text(str(path))
            try:
                if directory:
                    path.mkdir(mode=0o755)
                else:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
            except OSError:
                made.unlink(missing_ok=True)
                raise
        elif not made.is_file():
            return False
        (registry / f"{key}-{owner}").touch()
        return True


def release_placeholder(path: Path, owner: str) -> None:
    """`owner` is done with the placeholder at `path`: the last user (of a live host) removes it
    where it is still empty, and it is gone from the host as if never made."""
    with _placeholder_lock(path) as (registry, key):
        (registry / f"{key}-{owner}").unlink(missing_ok=True)
        for user in registry.glob(f"{key}-*"):
            if not made_by_a_gone_host(user.name):
                return
            user.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            st = path.lstat()
            if stat_module.S_ISDIR(st.st_mode):
                path.rmdir()  # fails where the host has put something in it since
            elif stat_module.S_ISREG(st.st_mode) and st.st_size == 0:
                path.unlink()
        (registry / f"{key}.made").unlink(missing_ok=True)


@functools.cache
def _collect_dirs() -> None:
    """Once a process, before its first box: remove the kernels' private directories whose host is
    gone (killed: a closed box removes its own)."""
    for d in private_root().glob("k-*-*-*"):
        if made_by_a_gone_host(d.name):
            shutil.rmtree(d, ignore_errors=True)

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
        _collect_dirs()
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
        return {**dict(self.launch.env), "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp, "IPYTHONDIR": f"{tmp}/.ipython",
                **lifeline}

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
        (`_others`), what every session of this process hides unless its workspace lies in one. With
        a thousand homes registered (tests leave theirs) these covers took most of a session's start
        from the pool (~130 ms on two loaded cores); `confine` lifts the few its view keeps visible,
        and covers the homes registered since and any cover no longer standing (a home removed and
        made again)."""
        if not self.launch.confined:
            return
        target = self.target = await _sandboxed_child(pid)
        root = home().resolve()
        ops = await asyncio.get_running_loop().run_in_executor(None, lambda: _covers(_others(root, [root])))
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
async def shell(command: str, cwd: Path, launch: Launch,
                view: View) -> AsyncIterator[tuple[asyncio.subprocess.Process, Box]]:
    """`command` through /bin/sh in `cwd`, in a box of its own launched and confined as a session's
    kernel is (`launch`, `view`: the same namespaces, view, environment and limits), started only
    once its view is in place; its stdout and stderr together on `stdout`; the box says which
    limits it hit (`Box.hits`). On leaving, it and everything it started are killed
    (`ProcessTree`; the next daemon reaps them if this process dies)."""
    box, tree = Box(launch), ProcessTree()
    try:
        tree.prepare()
        argv = box.command(["/bin/sh", "-c", _GATE, "prime-agent-shell", command, str(cwd)], tree.cgroup)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=box.dir, env=tree.env(box.env()), pass_fds=box.pass_fds(), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
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
