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
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path the host will not act on: a link on the way, not a regular file, or over the cap."""


def _parts(root: Path, path: Path) -> list[str]:
    rel = Path(os.path.normpath(path)).relative_to(os.path.normpath(root)) if path.is_absolute() else path
    parts = list(rel.parts)
    if not parts or any(p in ("..", "") for p in parts):
        raise UnsafePath(f"{path}: not a path inside {root}")
    return parts


def _open_dir(root: Path, parts: list[str], create: bool = False) -> int:
    """A descriptor of the directory root/parts[0]/..., each component opened without following
    links (created, 0o755, where missing and `create`)."""
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
                raise UnsafePath(f"{root.joinpath(*parts)}: {name!r} is a link or not a folder") from e
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_bytes(root: Path, path: Path, cap: int) -> bytes:
    """The content of regular file `path` under `root` (absolute, or relative to root), at most `cap`
    bytes. Raises FileNotFoundError when it is absent and UnsafePath when it is reached through a
    link, is not a regular file, or is larger than `cap`."""
    parts = _parts(root, path)
    dfd = _open_dir(root, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise UnsafePath(f"{path}: a link, or not readable as a file") from e
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path}: not a regular file")
        if st.st_size > cap:
            raise UnsafePath(f"{path}: {st.st_size:,} bytes, over the {cap:,} the host reads")
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, cap + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                raise UnsafePath(f"{path}: grew past the {cap:,} bytes the host reads")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(root: Path, path: Path, cap: int) -> str:
    """`read_bytes` decoded as UTF-8, invalid bytes replaced."""
    return read_bytes(root, path, cap).decode("utf-8", errors="replace")


def write_bytes(root: Path, path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write regular file `path` under `root` whole (a temporary file beside it, renamed over it),
    creating missing folders, never through a link: a link on the way raises UnsafePath, and a link
    or other non-file at `path` itself is replaced, not written through."""
    parts = _parts(root, path)
    dfd = _open_dir(root, parts[:-1], create=True)
    try:
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise UnsafePath(f"{path}: a folder is there")
        except FileNotFoundError:
            pass
        tmp = f".{parts[-1]}.{secrets.token_hex(4)}.prime-agent-tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)


def unlink(root: Path, path: Path) -> None:
    """Remove `path` under `root` (a link there is removed, never followed); absent is fine."""
    parts = _parts(root, path)
    try:
        dfd = _open_dir(root, parts[:-1])
    except FileNotFoundError:
        return
    try:
        os.unlink(parts[-1], dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


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
