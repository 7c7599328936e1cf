"""Scoring the policy cannot reach: a check runs on a copy of the rollout's workspace, with the task's
own check files written over it, in a sandbox of its own (docs/evals.md, "Scorers run confined").

    with Scratch(workspace, sandbox, restore={"test_lib.py": text}) as scratch:
        ran = asyncio.run(scratch.run(["python3", "test_lib.py"], timeout=120))

The copy is made without following a link (a link is copied as a link, which in the sandbox leads
where the kernel's would: never to a hidden store) and without bytecode caches (`__pycache__`: a
planted one would stand in for a restored test). Each command runs as a session's kernel does
(agent/kernel/sandbox.py: bubblewrap, the home and the secret stores hidden, limits, seccomp), on
this scratch folder alone writable, with the kernel's scrubbed environment (`kernel_env`) less the
relative entries of PATH and PYTHONPATH (they would resolve in the copy) and pytest's own variables.
The sandbox is used whatever the kernel's mode; where the OS cannot provide it the command runs
unconfined on the copy, with the same environment, and `unconfined` says why, unless
`sandbox.required` refuses (SandboxError).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import shlex
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.config_models import SandboxConfig
from agent.kernel import sandbox as box
from agent.kernel.sandbox import Launch, SandboxError
from agent.kernel.view import View
from harness_store import safefs

log = logging.getLogger(__name__)
MAX_COPY = 1 << 30
"""Bytes of a workspace a scorer copies at most: past it, the check fails (`TooLarge`)."""
OUTPUT_CAP = 1 << 20
"""Bytes of each of a command's streams kept (its head and its tail)."""
SKIPPED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EPERM, errno.ENXIO)
"""Why an entry of the workspace may be left out of the copy (the policy's doing, which only its check
can lose by)."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TooLarge(ValueError):
    """The workspace holds more than a scorer copies: the rollout fails its check."""


@dataclass
class Ran:
    """What a confined command did: its exit code (None: killed at its time limit), its output."""

    code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False


class Scratch:
    """A finished rollout's workspace copied into a fresh folder (`work`, inside `root`), the task's
    check files (`restore`: relative path -> text) written over whatever the copy holds there, and an
    empty `out` folder beside it for a check's reports; removed on leaving the `with` block."""

    def __init__(self, workspace: Path, sandbox: SandboxConfig | None = None, restore: Mapping[str, str] | None = None):
        config = self.config = (sandbox or SandboxConfig()).model_copy(update={"mode": "workspace-write", "plan": False})
        self.unconfined = box.unavailable()
        """Why commands run without the sandbox here (None: they run in it)."""
        if self.unconfined and config.required:
            raise SandboxError(f"scoring refused: {self.unconfined} (sandbox.required is set)")
        self.root = Path(tempfile.mkdtemp(prefix="pa-score-")).resolve()
        self.work, self.out = self.root / "work", self.root / "out"
        try:
            self.out.mkdir()
            copy_tree(Path(workspace), self.work)
            for rel, text in (restore or {}).items():
                put(self.work, rel, text.encode())
        except BaseException:
            self.close()
            raise
        if self.unconfined:
            warn_unconfined(self.unconfined)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def note(self, detail: str) -> str:
        """A check's detail, saying so where it ran without the sandbox."""
        return f"UNSANDBOXED ({self.unconfined}): {detail}" if self.unconfined else detail

    async def run(self, argv: list[str], timeout: float | None, env: Mapping[str, str] = {}) -> Ran:
        """`argv` in the copy, in a sandbox of its own, `env` added to the scrubbed environment (and
        scrubbed with it); killed with all it started past `timeout` seconds (None: never)."""
        launch = Launch.of(self.config, scoring_environ(os.environ, env))
        view = View.of(self.config, self.root, None, [], self.root)
        err = self.out / f".stderr-{os.urandom(4).hex()}"
        command = f"exec {shlex.join(argv)} 2>{shlex.quote(str(err))}"
        head, tail, cut, timed_out, code = bytearray(), bytearray(), 0, False, None
        async with box.shell(command, self.work, launch, view) as (proc, _):
            assert proc.stdout is not None

            async def read() -> int:  # memory stays bounded whatever it prints
                nonlocal cut
                while chunk := await proc.stdout.read(65536):
                    room = max(0, OUTPUT_CAP // 2 - len(head))
                    head.extend(chunk[:room])
                    tail.extend(chunk[room:])
                    if len(tail) > OUTPUT_CAP // 2:
                        cut += len(tail) - OUTPUT_CAP // 2
                        del tail[:len(tail) - OUTPUT_CAP // 2]
                return await proc.wait()

            try:
                code = await asyncio.wait_for(read(), timeout)
            except TimeoutError:
                timed_out = True
        try:
            stderr = safefs.read_bytes(self.out, err, OUTPUT_CAP)
        except OSError:  # gone, replaced by a link, or larger than kept: the command's doing
            stderr = b""
        stdout = bytes(head) + (f"\n[... {cut:,} bytes cut ...]\n".encode() if cut else b"") + bytes(tail)
        return Ran(code, stdout.decode(errors="replace"), stderr.decode(errors="replace"), timed_out)

    def read(self, path: Path, cap: int) -> bytes:
        """Regular file `path` (relative to the copy, or absolute inside the scratch folder), never
        through a link, at most `cap` bytes (safefs.read_bytes)."""
        return safefs.read_bytes(self.root, self.work / path, cap)

    def write(self, path: Path, data: bytes) -> None:
        """Write regular file `path` (relative to the copy) whole, a link on the way replaced by a
        folder, never followed (safefs.write_bytes)."""
        safefs.write_bytes(self.work, path, data, replace_links=True)


@functools.cache
def warn_unconfined(why: str) -> None:
    """Once a process: scorers run without the sandbox here."""
    log.warning("scorers run UNSANDBOXED: %s", why)


def scoring_environ(environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The environment a scorer's command starts from (`kernel_env` scrubs it next): pytest's own
    variables dropped (a host's PYTEST_ADDOPTS is not the task's), and PATH and PYTHONPATH without
    relative entries (an empty one means the working directory: the copy the policy wrote)."""
    env = {k: v for k, v in environ.items() if not k.startswith("PYTEST_")}
    for name in ("PATH", "PYTHONPATH"):
        if name in env:
            env[name] = os.pathsep.join(p for p in env[name].split(os.pathsep) if os.path.isabs(p))
    return {**env, **extra}


def copy_tree(src: Path, dst: Path) -> None:
    """Copy folder `src` to the new folder `dst`: folders, regular files (with their modes) and links
    as links, each opened without following a link, at most MAX_COPY bytes in all (TooLarge past it);
    `__pycache__` folders and anything else (FIFOs, sockets, devices) left out."""
    total = 0

    def walk(sfd: int, target: Path) -> None:
        nonlocal total
        target.mkdir(mode=0o755)
        for name in os.listdir(sfd):
            try:
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(name, dir_fd=sfd), target / name)
                elif stat.S_ISDIR(st.st_mode) and name != "__pycache__":
                    fd = os.open(name, _DIR, dir_fd=sfd)
                    try:
                        walk(fd, target / name)
                    finally:
                        os.close(fd)
                elif stat.S_ISREG(st.st_mode):
                    total += copy_file(sfd, name, target / name, MAX_COPY - total)
            except OSError as e:  # gone or swapped for a link meanwhile, unreadable, a socket: left out
                if e.errno not in SKIPPED:
                    raise

    fd = os.open(src, _DIR)
    try:
        walk(fd, dst)
    finally:
        os.close(fd)


def copy_file(sfd: int, name: str, target: Path, budget: int) -> int:
    """Copy regular file `name` of folder `sfd` (opened without following a link) to `target`, as
    long as it was when opened; the bytes copied (0 for anything but a regular file)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        if not stat.S_ISREG(st.st_mode):
            return 0
        if st.st_size > budget:
            raise TooLarge(f"the workspace holds more than the {MAX_COPY:,} bytes a scorer copies")
        with open(target, "xb") as out:
            left = st.st_size
            while left and (chunk := src.read(min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
            os.fchmod(out.fileno(), stat.S_IMODE(st.st_mode) & 0o755)
        return st.st_size


def put(root: Path, rel: str, data: bytes) -> None:
    """Write `root/rel` whole over whatever the copy holds: a link or a file where a folder goes is
    replaced by a folder, a folder where the file goes removed. Only before any command ran in the copy
    (paths are followed here: nothing may change them meanwhile)."""
    parts = Path(rel).parts
    if Path(rel).is_absolute() or not parts or ".." in parts:
        raise ValueError(f"check file {rel!r} is not a path inside the workspace")
    at = root
    for name in parts[:-1]:
        at = at / name
        if at.is_symlink() or (at.exists() and not at.is_dir()):
            at.unlink()
        at.mkdir(exist_ok=True)
    target = at / parts[-1]
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    safefs.write_bytes(root, Path(rel), data)
