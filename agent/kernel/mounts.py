"""Mounts made in a sandboxed kernel's namespaces from outside (agent/kernel/view.py says which).

A fork of the host enters the kernel's user and mount namespaces as their owner (setns(2)), with every
capability there, calls mount(2) for each operation and exits; the kernel itself has no capability
in them. `mount_points` reads which mounts stand in a process's namespace.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
log = logging.getLogger(__name__)


class MountError(RuntimeError):
    """The mounts could not be made (the message says which, and why)."""


Mount = tuple[str, str, str]
"""(bind, source, target) | (remount, target, ro|rw) | (tmpfs, target, ro|rw) | (move, source, target)
| (file, source, target): a bind of one file | (mkdir, path, ""): a mount point in a cover being made
| (detach, target, ""): the mount at target lifted."""
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MNT_DETACH = 1, 32, 4096, 8192, 16384, 2


def _mount_all(target: int, ops: list[Mount]) -> str:
    """In a forked child of the host: enter the user and mount namespaces of process `target` (as
    their owner, with every capability there) and make `ops`; what failed, or "". The namespaces are
    opened here, where no other thread can close the descriptors."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    def cover(rc: int, what: str) -> None:  # a path gone since it was listed leaves nothing to hide
        if rc != 0 and ctypes.get_errno() != errno.ENOENT:
            check(rc, what)

    try:
        user_ns, mount_ns = (os.open(f"/proc/{target}/ns/{ns}", os.O_RDONLY) for ns in ("user", "mnt"))
        if libc.setns(user_ns, CLONE_NEWUSER) != 0:
            raise OSError(ctypes.get_errno(), f"{ENTERING}: {os.strerror(ctypes.get_errno())} ({_why_not(target)})")
        check(libc.setns(mount_ns, CLONE_NEWNS), "entering the kernel's mount namespace")
        for op, a, b in ops:
            if op == "bind":
                check(libc.mount(a.encode(), b.encode(), None, MS_BIND | MS_REC, None), f"bind {a} on {b}")
            elif op == "file":
                cover(libc.mount(a.encode(), b.encode(), None, MS_BIND, None), f"cover {b}")
            elif op == "remount":
                flags = MS_REMOUNT | MS_BIND | (MS_RDONLY if b == "ro" else 0)
                check(libc.mount(None, a.encode(), None, flags, None), f"remount {a} {b}")
            elif op == "tmpfs":
                flags = MS_RDONLY if b == "ro" else 0
                rc = libc.mount(b"prime-agent", a.encode(), b"tmpfs", flags, b"mode=0755,size=1m")
                (cover if b == "ro" else check)(rc, f"cover {a}")
            elif op == "move":
                os.makedirs(b, exist_ok=True)
                check(libc.mount(a.encode(), b.encode(), None, MS_MOVE, None), f"move {a} to {b}")
            elif op == "mkdir":
                os.makedirs(a, exist_ok=True)
            elif op == "detach":
                check(libc.umount2(a.encode(), MNT_DETACH), f"lift the cover of {a}")
    except OSError as e:
        return str(e.strerror or e)
    return ""


ENTERING = "entering the kernel's user namespace"


def _why_not(target: int) -> str:
    """What setns(2) into `target`'s user namespace depends on, for the message when it failed
    (EINVAL: the same namespace as the caller's, or a caller of more than one thread)."""
    def read(path: str) -> str:
        try:
            return os.readlink(path)
        except OSError as e:
            return e.strerror or str(e)
    with open("/proc/self/status") as f:
        threads = next((line.split()[1] for line in f if line.startswith("Threads:")), "?")
    return f"helper threads {threads}, its {read('/proc/self/ns/user')}, the kernel's {read(f'/proc/{target}/ns/user')}"


async def apply_mounts(target: int, ops: list[Mount]) -> None:
    """Make `ops` in the namespaces of process `target`. A fork of this process does it, which
    needs no exec (util-linux's nsenter and mount took 8 ms idle and 20-60 ms on a loaded machine,
    a fork ~1 ms): the child only enters the namespaces, calls mount(2) and exits. A helper that
    could not enter the user namespace has made no mount: the fork of a process that imported torch
    could not (EINVAL: an at-fork handler had started a thread in it), and a fresh interpreter does it."""
    out = await _helper(target, ops)
    if out.startswith(ENTERING):
        log.info("the mount helper of kernel process %d could not fork: %s; a fresh interpreter does it", target, out)
        out = await _spawned(target, ops)
    if out != "ok":
        raise MountError(f"the kernel's sandbox could not be set up: {out or 'its helper died'}")


async def _spawned(target: int, ops: list[Mount]) -> str:
    """`_mount_all` in a new interpreter (this module alone, single-threaded): tens of ms, not one."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-m", "agent.kernel.mounts", str(target), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate(json.dumps(ops).encode())
    return out.decode(errors="replace").strip()


async def _helper(target: int, ops: list[Mount]) -> str:
    r, w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the child: nothing here may touch what the parent's other threads hold
            try:
                os.write(w, _mount_all(target, ops).encode() or b"ok")
            finally:
                os._exit(0)
    finally:
        os.close(w)

    def finish() -> str:  # one thread for both (a hop to a thread costs most on a loaded machine)
        try:
            return _read_to_end(r)
        finally:
            os.close(r)
            os.waitpid(pid, 0)

    return await asyncio.get_running_loop().run_in_executor(None, finish)


def mount_points(pid: int) -> set[str]:
    """Where something is mounted in the mount namespace of process `pid` (its mountinfo's fifth
    field, whose space, tab, newline and backslash are octal escapes)."""
    with open(f"/proc/{pid}/mountinfo", "rb") as f:
        points = [line.split(b" ", 5)[4] for line in f]
    return {os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m[1], 8)]), p) if b"\\" in p else p) for p in points}


_OCTAL = re.compile(rb"\\([0-7]{3})")


def _read_to_end(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


if __name__ == "__main__":  # `_spawned`: the target's pid as the argument, the mounts as JSON on stdin
    print(_mount_all(int(sys.argv[1]), [tuple(op) for op in json.loads(sys.stdin.read())]) or "ok")
