"""A session's files on disk, and removing them: `DELETE /v1/sessions/{id}?files=true` and
`POST /v1/sessions/prune` (`prime-agent sessions delete | prune`).

A session's files are its directory under `$PRIME_AGENT_HOME/sessions/` (children included) and its
index in its workspace's checkpoint store (`$PRIME_AGENT_HOME/checkpoints/`, shared by the sessions
of one workspace); a store no session has an index in any more goes too. None of it is reachable by
a kernel, and the removal follows no link (`shutil.rmtree` works through file descriptors here).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agent.checkpoints import WorkspaceStore
from agent.config_models import CheckpointConfig
from agent.layout import SessionLayout


def size(path: Path) -> int:
    """Bytes of the files under `path` (links counted as themselves, not followed)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                pass
    return total


def bytes_of(layout: SessionLayout, cwd: str, config: CheckpointConfig) -> int:
    """What the session's files take: its directory and its index in its workspace's store."""
    try:
        index = os.lstat(WorkspaceStore(Path(cwd), layout.dir.name, config).index).st_blocks * 512
    except OSError:
        index = 0
    return size(layout.dir) + index


def remove(layout: SessionLayout, cwd: str, config: CheckpointConfig, store_shared: bool) -> None:
    """The session's directory and its index in its workspace's store; the store too when no other
    index is left in it and no session of the registry works in that workspace (`store_shared`)."""
    shutil.rmtree(layout.dir, ignore_errors=True)
    store = WorkspaceStore(Path(cwd), layout.dir.name, config)
    try:
        store.index.unlink()
    except OSError:
        return
    indexes = store.index.parent
    if not store_shared and indexes.is_dir() and not any(indexes.iterdir()):
        shutil.rmtree(store.git_dir, ignore_errors=True)


def left_behind(layout: SessionLayout) -> dict | None:
    """What `session.json` says of a session deleted with its files left on disk; None for any other."""
    try:
        meta = json.loads(layout.meta.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("deleted") is True and isinstance(meta.get("cwd"), str) else None
