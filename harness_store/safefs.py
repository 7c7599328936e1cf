"""The host's file access to paths the kernel can reach: never through a link, regular files only,
with a size cap.

Anything under a workspace (instruction files, skills, rewind restores, `rlm` context files,
snapshot manifests) may have been written, or replaced by a symlink or a FIFO, by code the model
wrote. The host opens such a path one component at a time from a directory it trusts (`root`),
each with `O_NOFOLLOW`, so a link anywhere on the way is refused rather than followed, and it reads
or writes only regular files, never blocking on a FIFO or a device. These calls block: from the
event loop, run them in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_SUFFIX = ".prime-agent-tmp"
"""A file being written is first a hidden file beside it, named `.<name>.<random><TMP_SUFFIX>`."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path the host will not act on: a link on the way, not a regular file, or over the cap."""


def _parts(root: Path, path: Path) -> list[str]:
    try:
        rel = Path(os.path.normpath(path)).relative_to(os.path.normpath(root)) if path.is_absolute() else path
    except ValueError:
        rel = Path("..")
    parts = list(rel.parts)
    if not parts or any(p in ("..", "") for p in parts):
        raise UnsafePath(f"{path}: not a path inside {root}")
    return parts


def _open_dir(root: Path, parts: list[str], create: bool = False, replace_links: bool = False) -> int:
    """A descriptor of the directory root/parts[0]/..., each component opened without following
    links (created, 0o755, where missing and `create`; a link on the way removed and made a real
    folder with `replace_links`)."""
    fd = os.open(root, _DIR)
    try:
        for name in parts:
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError as e:  # ELOOP (a link) or ENOTDIR (a file): nothing to follow
                if not (replace_links and stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)):
                    raise UnsafePath(f"{root.joinpath(*parts)}: {name!r} is a link or not a folder") from e
                os.unlink(name, dir_fd=fd)
                os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def _parent(root: Path, path: Path, create: bool = False, replace_links: bool = False) -> Iterator[tuple[int, str]]:
    """(a descriptor of the folder `path` is in, opened as `_open_dir` does; its last component)."""
    parts = _parts(root, path)
    dfd = _open_dir(root, parts[:-1], create, replace_links)
    try:
        yield dfd, parts[-1]
    finally:
        os.close(dfd)


@contextmanager
def _open_file(root: Path, path: Path, cap: int) -> Iterator[int]:
    """A descriptor of regular file `path`, at most `cap` bytes when opened."""
    with _parent(root, path) as (dfd, name):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise UnsafePath(f"{path}: a link, or not readable as a file") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path}: not a regular file")
        if st.st_size > cap:
            raise UnsafePath(f"{path}: {st.st_size:,} bytes, over the {cap:,} the host reads")
        yield fd
    finally:
        os.close(fd)


def _chunks(fd: int, path: Path, cap: int) -> Iterator[bytes]:
    total = 0
    while chunk := os.read(fd, min(1 << 20, cap + 1 - total)):
        total += len(chunk)
        if total > cap:
            raise UnsafePath(f"{path}: grew past the {cap:,} bytes the host reads")
        yield chunk


def read_bytes(root: Path, path: Path, cap: int) -> bytes:
    """The content of regular file `path` under `root` (absolute, or relative to root), at most `cap`
    bytes. Raises FileNotFoundError when it is absent and UnsafePath when it is reached through a
    link, is not a regular file, or is larger than `cap`."""
    with _open_file(root, path, cap) as fd:
        return b"".join(_chunks(fd, path, cap))


def read_text(root: Path, path: Path, cap: int) -> str:
    """`read_bytes` decoded as UTF-8, invalid bytes replaced."""
    return read_bytes(root, path, cap).decode("utf-8", errors="replace")


def copy_file(root: Path, path: Path, target: Path, cap: int) -> int:
    """Copy regular file `path` under `root` (read as `read_bytes` reads, never held whole in
    memory) to `target`, a new file of the host's (0o600; it must not exist, and a link there is not
    followed). Returns the bytes copied; on failure no `target` is left."""
    with _open_file(root, path, cap) as src:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        total = 0
        try:
            with os.fdopen(out, "wb") as f:
                for chunk in _chunks(src, path, cap):
                    f.write(chunk)
                    total += len(chunk)
        except BaseException:
            os.unlink(target)
            raise
    return total


def _replace(dfd: int, name: str, path: Path, make) -> None:
    """Make `name` in folder `dfd` whole: `make(tmp)` writes a temporary name, renamed over `name`."""
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
            raise UnsafePath(f"{path}: a folder is there")
    except FileNotFoundError:
        pass
    tmp = f".{name}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    try:
        make(tmp)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        raise


def write_bytes(root: Path, path: Path, data: bytes, mode: int = 0o644, replace_links: bool = False) -> None:
    """Write regular file `path` under `root` whole (a temporary file beside it, renamed over it),
    creating missing folders, never through a link: a link on the way raises UnsafePath (or, with
    `replace_links`, is replaced by a real folder), and a link or other non-file at `path` itself is
    replaced, not written through."""
    with _parent(root, path, create=True, replace_links=replace_links) as (dfd, name):
        def make(tmp: str) -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), mode)

        _replace(dfd, name, path, make)


def symlink(root: Path, path: Path, target: str, replace_links: bool = False) -> None:
    """Make `path` under `root` a symbolic link to `target` (the link is never followed here),
    replacing what is there as `write_bytes` does."""
    with _parent(root, path, create=True, replace_links=replace_links) as (dfd, name):
        _replace(dfd, name, path, lambda tmp: os.symlink(target, tmp, dir_fd=dfd))


def unlink(root: Path, path: Path) -> None:
    """Remove `path` under `root` (a link there is removed, never followed); absent is fine."""
    try:
        with _parent(root, path) as (dfd, name):
            os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def rmdir(root: Path, path: Path) -> None:
    """Remove the empty folder `path` under `root`, never through a link. Raises as os.rmdir does:
    FileNotFoundError when absent, NotADirectoryError for a link or a file, OSError when not empty."""
    with _parent(root, path) as (dfd, name):
        os.rmdir(name, dir_fd=dfd)


def through_link(root: Path, path: Path) -> str | None:
    """The first folder on the way from `root` to `path` that is a link (or not a folder), relative
    to root; None when every folder on the way is a real one (or absent)."""
    at = Path(root)
    for name in _parts(root, path)[:-1]:
        at = at / name
        try:
            st = os.lstat(at)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return str(at.relative_to(root))
    return None
