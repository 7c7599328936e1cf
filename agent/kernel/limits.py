"""A kernel's limits: memory and processes held by a cgroup per launch (cgroup v2 where its
controllers are delegated, else the v1 hierarchies where writable), and what each cgroup counted.
Where no cgroup can hold a limit, agent/kernel/sandbox.py sets an rlimit (`prlimit`) instead."""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from agent.config_models import SandboxConfig
from agent.kernel.reaper import collect_cgroups, host_tag


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
