"""The names and paths of a session directory, written once for every layer.

    $PRIME_AGENT_HOME/sessions/<id>/
        trajectory.jsonl    the append-only record of the session (agent/trajectory.py)
        harness/            the session's harness scope (a git repository once written)
        subagents.json      the registry of its children; each child in sub-<name>/, a session directory too
        refinements/        plans waiting for review, <refinement id>.json
        session.json        the registry's record of the session (daemon/meta.py), whichever front made it
        session.lock        held (flock, with the pid in it) by a process other than the daemon hosting it
                            (`prime-agent run`), for as long as it does (daemon/registry.py)
        events.jsonl        the daemon's event journal (daemon/journal.py)
        rating.json         a person's rating, the reward its training samples carry (rl/data.py)
        context.pkl         a child's `context` variable, pickled by its parent's kernel
        checkpoints/kernel/ namespace snapshots: a manifest per snapshot, variables in blobs/ (agent/checkpoints.py)
        rewind.json         a rewind under way (removed last; a crash leaves it for the next start to finish)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.config import home


@dataclass(frozen=True)
class SessionLayout:
    dir: Path

    @classmethod
    def of(cls, session_id: str, root: Path | None = None) -> SessionLayout:
        """Where a session lives: `<root>/sessions/<id>`, the root being $PRIME_AGENT_HOME unless given
        (an eval run's directory keeps its rollouts' sessions the same way)."""
        return cls(sessions_dir(root) / session_id)

    @property
    def trajectory(self) -> Path:
        return self.dir / "trajectory.jsonl"

    @property
    def harness(self) -> Path:
        return self.dir / "harness"

    @property
    def subagents(self) -> Path:
        return self.dir / "subagents.json"

    @property
    def refinements(self) -> Path:
        return self.dir / "refinements"

    def pending(self, refinement_id: str) -> Path:
        """A refinement plan waiting for review."""
        return self.refinements / f"{refinement_id}.json"

    @property
    def meta(self) -> Path:
        return self.dir / "session.json"

    @property
    def lock(self) -> Path:
        return self.dir / "session.lock"

    @property
    def events(self) -> Path:
        return self.dir / "events.jsonl"

    @property
    def rating(self) -> Path:
        return self.dir / "rating.json"

    @property
    def context(self) -> Path:
        return self.dir / "context.pkl"

    @property
    def kernel_snapshots(self) -> Path:
        return self.dir / "checkpoints" / "kernel"

    @property
    def rewind_intent(self) -> Path:
        return self.dir / "rewind.json"

    def child(self, name: str) -> SessionLayout:
        return SessionLayout(self.dir / f"sub-{name}")


def sessions_dir(root: Path | None = None) -> Path:
    return (root or home()) / "sessions"


def session_layouts(root: Path | None = None, having: str = "trajectory") -> list[SessionLayout]:
    """Every session under `root` (default $PRIME_AGENT_HOME) whose file `having` exists, by name."""
    base = sessions_dir(root)
    dirs = sorted(d for d in base.iterdir() if d.is_dir()) if base.is_dir() else []
    return [layout for layout in map(SessionLayout, dirs) if getattr(layout, having).is_file()]
