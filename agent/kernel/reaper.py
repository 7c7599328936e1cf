"""Every process a kernel starts is found again and killed: when the kernel shuts down or restarts,
and, when the process that owned the kernel (the daemon, `prime-agent run`) was killed outright, by
the next daemon at its start. Forks, `Popen` children and children that call `setsid` alike.

Each launch of a kernel is a *process tree* with a random token, tracked three ways:

- **A cgroup v2 of its own**, `<the host's cgroup>/prime-agent-<host pid>-<host start>-<token>`,
  where the host can make one (on our machines, as root: the unified hierarchy at
  /sys/fs/cgroup/unified is writable). Every descendant is born in it whatever it does with
  sessions, process groups or its environment; `cgroup.kill` (Linux 5.14) kills them all at once,
  else each pid in the subtree's `cgroup.procs` is killed.
- **The environment**: `PRIME_AGENT_KERNEL=<token>` (tokens of enclosing trees first, comma-separated,
  when the host itself runs in a kernel), which every descendant inherits unless it replaces its
  environment; /proc/PID/environ shows it. The token is random and names nothing: no secret.
- **The kernel's process group**, which every descendant that does not leave it shares.

Where no cgroup can be made (no cgroup v2, a read-only one, or no write access to the host's cgroup:
an unprivileged user outside a delegated subtree), the last two remain: a descendant that both
leaves the process group and execs with an environment of its own is then missed.

The journal: `$PRIME_AGENT_HOME/run/kernels/<token>.json` names the token, the cgroup, the kernel's
pid and start time, and the host's pid and start time. It is written before the kernel is launched
and removed once its tree is gone; `reap_orphans` kills the trees whose host is no longer alive,
and spares those of a host that is (a `prime-agent run` beside the daemon). Start times (from
/proc/PID/stat) keep a reused pid from being taken for the kernel or the host.

Not used: PR_SET_CHILD_SUBREAPER on the host would make the orphans its children (and its zombies to
reap), but dies with the host, which is the case that matters.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import logging
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.config import home

log = logging.getLogger(__name__)

ENV_MARKER = "PRIME_AGENT_KERNEL"
SCHEMA = 1
KILL_WAIT = 5.0
"""Seconds a kill waits for the tree to be gone (SIGKILL is not instant: a process in the D state
dies when its I/O ends); what outlives it keeps its journal entry, for a later reap."""


def journal_dir(root: Path) -> Path:
    return root / "run" / "kernels"


# --- /proc ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    state: str
    ppid: int
    pgrp: int
    start: int
    """In clock ticks since boot: with the pid, it names one process for as long as the machine runs."""


def stat(pid: int | str) -> Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return Stat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))


def _is(pid: int, start: int) -> bool:
    """Whether process `pid` is alive and is the one that started at `start`."""
    s = stat(pid)
    return s is not None and s.start == start and s.state not in "ZX"


def _tokens(pid: str) -> set[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = b"\0" + f.read()
    except OSError:  # gone, or not ours to read
        return set()
    at = env.find(b"\0" + ENV_MARKER.encode() + b"=")
    if at < 0:
        return set()
    value = env[at + len(ENV_MARKER) + 2:].split(b"\0", 1)[0]
    return set(value.split(b","))


# --- cgroup v2 -----------------------------------------------------------------------------------


@functools.cache
def _own_cgroup() -> Path | None:
    """This process's cgroup v2 directory, or None without a cgroup v2 hierarchy."""
    try:
        rel = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration):
        return None
    for line in mounts:
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] != "cgroup2":
            continue
        root, point = (re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), f) for f in before.split()[3:5])
        if rel == root or rel.startswith(root.rstrip("/") + "/"):
            return Path(point) / rel[len(root.rstrip("/")):].lstrip("/")
    return None


def cgroup_base() -> Path | None:
    """Where a kernel's cgroup is made: under the host's own (a systemd unit's, a container's), so
    that it stays inside whatever contains the host; None where there is no cgroup v2."""
    own = _own_cgroup()
    return own if own is not None and (own / "cgroup.procs").is_file() else None


def _cgroup_members(path: Path) -> set[int]:
    """The pids in the cgroup and in any made inside it."""
    pids: set[int] = set()
    for procs in path.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


def _cgroup_kill(path: Path) -> None:
    """SIGKILL the whole cgroup at once, forks in flight included (Linux 5.14); not where the caller
    is inside it (a daemon started from a kernel of the daemon that was killed), nor before 5.14:
    there the caller's kills, one pid at a time and repeated until none is left, do it."""
    mine = _own_cgroup()
    if mine is not None and (mine == path or path in mine.parents):
        return
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")


def _remove_cgroup(path: Path) -> bool:
    """rmdir the cgroup and any made inside it (by a host running in the kernel), deepest first. One
    that another host removes meanwhile (two collecting the same gone host's cgroup) counts as removed."""
    for d, _, _ in os.walk(path, topdown=False):  # a directory that vanishes mid-walk is skipped
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return True


# --- one tree ------------------------------------------------------------------------------------


@dataclass
class Entry:
    """A tree's journal entry."""

    token: str
    host: tuple[int, int]
    """(pid, start time) of the process that launched the kernel."""
    cgroup: str | None = None
    kernel: tuple[int, int] | None = None
    """(pid, start time) of the kernel: the leader of its process group."""
    schema: int = SCHEMA

    @classmethod
    def load(cls, data: dict) -> Entry:
        kernel = data.get("kernel")
        return cls(token=str(data["token"]), host=(int(data["host"][0]), int(data["host"][1])),
                   cgroup=data.get("cgroup"), kernel=(int(kernel[0]), int(kernel[1])) if kernel else None)

    def save(self, path: Path) -> None:
        """Atomically (a reader never sees half an entry). No fsync: what a lost page cache would
        lose (a power cut) ended every process it names too."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)

    def sweep(self) -> int:
        """SIGKILL every process of the tree still alive; how many there were (0: the tree is gone).
        Zombies are dead: they wait only for a parent to read their exit status."""
        me = os.getpid()
        members = _cgroup_members(Path(self.cgroup)) if self.cgroup is not None else set()
        groups = set()
        if self.kernel is not None:
            pid, start = self.kernel
            leader = stat(pid)
            # The group is the kernel's while its leader is, or while no process has its pid (a pid
            # is never reused while a group still bears it); a new process with that pid is not ours.
            if leader is None or leader.start == start:
                groups.add(pid)
        token = self.token.encode()
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in members:
                s = stat(name)
                if s is not None and (s.pgrp in groups or token in _tokens(name)):
                    members.add(int(name))
        members = {p for p in members - {me} if (s := stat(p)) is not None and s.state not in "ZX"}
        if members and self.cgroup is not None:
            _cgroup_kill(Path(self.cgroup))
        signalled = 0
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
                signalled += 1
            except ProcessLookupError:
                pass
            except PermissionError:  # another user's (a setuid program): not ours to kill, nor to wait for
                log.warning("process %d of kernel tree %s belongs to another user: left running", pid, self.token)
        return signalled

    def finish(self, path: Path | None) -> bool:
        """Once the tree is gone: remove its cgroup and then its journal entry; False if its cgroup
        cannot be removed yet (the entry stays, for a later reap)."""
        if self.cgroup is not None and not _remove_cgroup(Path(self.cgroup)):
            return False
        if path is not None:
            path.unlink(missing_ok=True)
            path.with_suffix(".tmp").unlink(missing_ok=True)  # left by a host killed while it saved
        return True


def _host() -> tuple[int, int]:
    s = stat("self")
    assert s is not None
    return os.getpid(), s.start


def _reap(entry: Entry, path: Path | None, wait: float) -> int:
    """`ProcessTree.kill` for code without an event loop: how many processes were alive in the tree."""
    deadline = time.monotonic() + wait
    found = more = entry.sweep()
    while more and time.monotonic() < deadline:
        time.sleep(0.005)
        more = entry.sweep()
    while not entry.finish(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return found


@functools.cache
def _unfinished() -> set[ProcessTree]:
    """This process's trees not yet killed: killed when it exits (a `prime-agent run` that fails
    without shutting its kernel down), not when a child forked from it does."""
    trees: set[ProcessTree] = set()
    pid = os.getpid()

    def kill_all() -> None:
        if os.getpid() == pid:
            for tree in list(trees):
                if tree.entry is not None:
                    _reap(tree.entry, tree.path, wait=1.0)

    atexit.register(kill_all)
    return trees


def host_tag() -> str:
    """`<pid>-<start time>` of this process, in the names of what it makes outside its home (cgroups,
    kernels' private directories): whoever finds one can tell whether its maker is gone."""
    return "-".join(map(str, _host()))


def made_by_a_gone_host(name: str) -> bool:
    """Whether `name` (`<prefix>-<pid>-<start>-<token>`, with a `host_tag()`) was made by a process
    no longer alive; False for a name without one."""
    parts = name.rsplit("-", 3)
    return len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit() and not _is(int(parts[1]), int(parts[2]))


def remove_gone_hosts_dirs(dirs: Iterable[Path]) -> None:
    """Remove the directories among `dirs` (named with a `host_tag()`) that a process no longer alive
    made and this user owns; a link is not followed (rmtree refuses it)."""
    for d in dirs:
        with contextlib.suppress(OSError):
            if made_by_a_gone_host(d.name) and d.lstat().st_uid == os.getuid():
                shutil.rmtree(d, ignore_errors=True)


@functools.cache
def collect_cgroups(base: Path) -> None:
    """Once a process: rmdir the empty cgroups of hosts gone without removing them (killed), from
    any home: a cgroup's name says whose it is. A populated one is left alone (rmdir fails): its
    host's home says whether to kill it."""
    for d in base.glob("prime-agent-*-*-*"):
        if made_by_a_gone_host(d.name):
            _remove_cgroup(d)


class ProcessTree:
    """One kernel's process tree, for the `KernelManager` that launches it: `env` marks the
    environment, `prepare` before a launch, `adopt` right after it, `kill` at shutdown (and before a
    relaunch: a restart). Nothing is written until `prepare`."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.entry: Entry | None = None
        self.path: Path | None = None

    @property
    def cgroup(self) -> Path | None:
        return Path(self.entry.cgroup) if self.entry is not None and self.entry.cgroup else None

    def env(self, env: dict[str, str]) -> dict[str, str]:
        outer = env.get(ENV_MARKER)
        return {**env, ENV_MARKER: f"{outer},{self.token}" if outer else self.token}

    def prepare(self) -> None:
        """Journal the tree before its kernel exists (a host killed during the launch leaves an entry
        that names it), and make its cgroup. A journal that cannot be written (a full disk, a
        read-only home) costs only the reap after a crash: the kernel still starts."""
        self.entry = Entry(token=self.token, host=_host())
        self.path = journal_dir(home()) / f"{self.token}.json"
        base = cgroup_base()
        if base is not None:
            collect_cgroups(base)
            cgroup = base / f"prime-agent-{self.entry.host[0]}-{self.entry.host[1]}-{self.token}"
            try:
                cgroup.mkdir(exist_ok=True)
                self.entry.cgroup = str(cgroup)
            except OSError as e:
                log.debug("no cgroup for kernels (%s): process group and environment only", e)
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.entry.save(self.path)
        except OSError as e:
            log.warning("kernel journal %s not written (%s): a crash of this process would leave its "
                        "kernel's children running", self.path, e)
            self.path = None
        _unfinished().add(self)

    def adopt(self, pid: int) -> None:
        """Move the just-launched kernel into the tree's cgroup, before it can run a cell (it is still
        importing ipykernel), and journal it."""
        assert self.entry is not None
        if self.entry.cgroup is not None:
            try:
                (Path(self.entry.cgroup) / "cgroup.procs").write_text(str(pid))
            except OSError as e:  # e.g. no write access to the common ancestor's cgroup.procs
                log.debug("kernel %d stays out of %s (%s): process group and environment only",
                          pid, self.entry.cgroup, e)
                _remove_cgroup(Path(self.entry.cgroup))
                self.entry.cgroup = None
        s = stat(pid)
        if s is not None:
            self.entry.kernel = (pid, s.start)
        if self.path is not None:
            try:
                self.entry.save(self.path)
            except OSError as e:  # the entry written before the launch still names its token and cgroup
                log.warning("kernel journal %s not updated (%s)", self.path, e)

    def adopt_child(self) -> int | None:
        """`adopt` the child of this process that was launched in the tree, for a launcher that does
        not say its pid (the MCP SDK's stdio client); its pid, or None when it is already gone."""
        me, token = os.getpid(), self.token.encode()
        for name in os.listdir("/proc"):
            if name.isdigit() and (s := stat(name)) is not None and s.ppid == me and token in _tokens(name):
                self.adopt(int(name))
                return int(name)
        return None

    async def kill(self) -> None:
        """Kill everything in the tree, wait (up to KILL_WAIT) for it to be gone, and forget it."""
        entry, path = self.entry, self.path
        if entry is None:
            return
        deadline = time.monotonic() + KILL_WAIT
        while entry.sweep() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        while not entry.finish(path) and time.monotonic() < deadline:  # the cgroup empties a moment later
            await asyncio.sleep(0.005)
        self.entry = self.path = None
        _unfinished().discard(self)


# --- a new host's reap ---------------------------------------------------------------------------


def reap_orphans(root: Path) -> int:
    """Kill the process trees in `root`'s journal whose host is gone (a daemon or `prime-agent run`
    killed outright); return how many processes were alive in them. For a starting daemon: it blocks
    for as long as the kills take (milliseconds; up to KILL_WAIT per tree that will not die)."""
    directory = journal_dir(root)
    if not directory.is_dir():
        return 0
    killed = 0
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            if data.get("schema") != SCHEMA:  # a newer host's: this one cannot tell what it names
                log.error("kernel journal %s has schema %r, not %d: left alone", path, data.get("schema"), SCHEMA)
                continue
            entry = Entry.load(data)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:  # never written half (see save)
            log.error("kernel journal %s unreadable (%s): removed", path, e)
            path.unlink(missing_ok=True)
            continue
        if _is(*entry.host):
            continue  # its host runs, and shuts its kernel down itself
        found = _reap(entry, path, KILL_WAIT)
        if found:
            log.warning("reaped %d process(es) of kernel tree %s: its host (pid %d) was gone", found, entry.token,
                        entry.host[0])
        killed += found
    return killed
