"""What every host of this user shares, whatever its home: the private directories kernels live
in, the registry of homes every sandbox hides from its kernel, and the placeholders that cover
protected paths absent from a workspace (counted, since removing one would lift the cover of every
kernel mounted on it)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import pwd
import secrets
import stat as stat_module
import tempfile
from collections.abc import Iterator
from pathlib import Path

from agent.config import home
from agent.kernel.reaper import made_by_a_gone_host, remove_gone_hosts_dirs


def private_root() -> Path:
    """A short private directory for kernels' sockets and temporary files: `$TMPDIR/prime-agent-<uid>`,
    or `user_base()` where that path is too long for the sockets below it (`SOCKET_ROOM`)."""
    base = Path(tempfile.gettempdir()) / f"prime-agent-{os.getuid()}"
    return _private(base) if len(os.fsencode(base)) <= SOCKET_ROOM else user_base()


SOCKET_ROOM = 64
"""The most bytes `private_root()` may take: a kernel's sockets lie up to 40 below it
(`/k-<pid>-<start>-<token>/kernel-N`), and a socket's path holds 107. Under a longer TMPDIR no kernel
started ("File name too long")."""


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


def default_homes() -> list[Path]:
    """The homes a host of this user has by default (`~/.prime-agent`, for `$HOME` and for the user's
    home in the password database), where they exist: hidden like registered ones, since a host whose
    home is elsewhere never registered them (its key and daemon token)."""
    homes = [Path.home()]
    with contextlib.suppress(KeyError):  # a user the password database does not list
        homes.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    return [p for p in dict.fromkeys((h / ".prime-agent").resolve() for h in homes) if p.is_dir()]


def _placeholder_key(path: Path) -> tuple[Path, str]:
    return user_base() / "placeholders", hashlib.sha256(str(path).encode()).hexdigest()[:24]


@contextlib.contextmanager
def _placeholder_lock(path: Path) -> Iterator[tuple[Path, str]]:
    """The registry's lock for the placeholder at `path`, removed once no placeholder is made there: each
    fresh workspace, a test's or an eval task's, left a lock file behind for good (8,064 in a day of test
    runs here, every release listing them all). A lock file removed while another host waited on it is
    not the lock any more: that host opens the new one and waits again."""
    registry, key = _placeholder_key(path)
    registry.mkdir(mode=0o700, exist_ok=True)
    lock = registry / f"{key}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(lock)):
                    break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield registry, key
    finally:
        if not (registry / f"{key}.made").exists():  # no placeholder, so no user: nothing for the lock to guard
            lock.unlink(missing_ok=True)
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
def collect_dirs() -> None:
    """Once a process, before its first box: remove the kernels' private directories whose host is
    gone (killed: a closed box removes its own)."""
    remove_gone_hosts_dirs(private_root().glob("k-*-*-*"))
