"""What one session's kernel sees: the view (workspace, harness scopes, records, what is hidden)
and the mounts that make it in the kernel's namespaces (agent/kernel/mounts.py makes them;
agent/kernel/sandbox.py decides when)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.config import home
from agent.config_models import SandboxConfig, SandboxMode
from agent.layout import SessionLayout
from agent.kernel.homes import default_homes, private_root, registered_homes, user_base
from agent.kernel.mounts import Mount


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
        hidden = [*stores, *other_homes(root, [workspace, project, root, *([session_dir] if session_dir else [])])]
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
        ops += covers(p for p in self.hidden if str(p) not in covered)
        if self.frozen:  # on top of all the rest, which the recursive bind keeps as it is beneath
            ops += [("bind", str(w), str(w)), ("remount", str(w), "ro")]
        return ops


def covers(paths: Iterable[Path]) -> list[Mount]:
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


def other_homes(root: Path, needed: list[Path]) -> list[Path]:
    """What of the other homes of this user (registered, or at a default place: `default_homes`), and
    of the kernels' directories of every home, a kernel under `root` must not see: a home whole, or
    where it holds what the kernel needs (`needed`: its workspace...), its run/, config.toml,
    checkpoints/ and sessions/."""
    # What holds a needed path is one of its ancestors: looked up in a set, not by walking `parents`
    # (with a thousand homes registered, that walk made a session's view take 0.4 s).
    holds = {str(a) for n in needed for a in (n, *n.parents)}
    own_tmp, out, registered = private_root(), [], registered_homes()
    for other in dict.fromkeys([*(h for h, _ in registered), *default_homes()]):
        if other != root:
            if str(other) in holds:
                out += [other / "run", other / "config.toml", other / "checkpoints", other / "sessions"]
            else:
                out.append(other)
    out += [tmp for _, tmp in registered]
    out.append(user_base())
    holds.update(str(a) for a in (own_tmp, *own_tmp.parents))
    return [p for p in dict.fromkeys(out) if str(p) not in holds]


def _within(path: Path, directory: Path) -> bool:
    """`path` is `directory` or lies under it (both absolute and resolved)."""
    p, d = str(path), str(directory)
    return p == d or p.startswith(d if d.endswith("/") else d + "/")
