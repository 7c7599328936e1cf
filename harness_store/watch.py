"""Notice a person editing harness files with their own editor, and commit what validates.

A watchdog observer watches each scope's folder; a burst of file events (editors write in
several steps) is debounced, then `HarnessStore.commit_user_edits()` commits the valid edits as
`source: user` (`external` while an unsandboxed kernel runs: the store's `edits_by` says). A broken edit is reported through the callback and left uncommitted, so the
prompt view keeps the last good version until the person fixes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from harness_store.entries import HarnessError
from harness_store.store import Change, HarnessStore

OnEdit = Callable[[HarnessStore, "Change | None", list[str]], None]
"""on_edit(store, change or None, problems): after each settled burst of edits."""
DEBOUNCE = 0.15  # seconds of quiet before committing


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: HarnessWatcher, store: HarnessStore):
        self.watcher = watcher
        self.store = store

    def on_any_event(self, event: FileSystemEvent) -> None:
        path = str(event.src_path)
        rel = path[len(str(self.store.root)) + 1 :]
        if event.is_directory or rel.startswith(".git") or rel.endswith((".tmp", ".swp", "~", ".harness.lock")):
            return
        self.watcher.poke(self.store)


class HarnessWatcher:
    def __init__(self, stores: list[HarnessStore], on_edit: OnEdit):
        self.stores = stores
        self.on_edit = on_edit
        self._observer = Observer()
        self._timers: dict[str, threading.Timer] = {}
        self._reported: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        for store in self.stores:
            if store.problem() is not None:  # git is not run in a refused scope: nothing to commit there
                continue
            store.ensure()  # the folder and its repository must exist to be watched
            self._observer.schedule(_Handler(self, store), str(store.root), recursive=True)
        self._observer.start()

    def stop(self) -> None:
        with self._lock:
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
        self._observer.stop()
        self._observer.join(timeout=5)

    def poke(self, store: HarnessStore) -> None:
        with self._lock:
            old = self._timers.get(store.scope)
            if old is not None:
                old.cancel()
            timer = threading.Timer(DEBOUNCE, self._settle, args=(store,))
            timer.daemon = True
            self._timers[store.scope] = timer
            timer.start()

    def _settle(self, store: HarnessStore) -> None:
        try:
            change, problems = store.commit_user_edits()
        except HarnessError as e:
            change, problems = None, [str(e)]
        new = [p for p in problems if p not in self._reported.get(store.scope, set())]
        self._reported[store.scope] = set(problems)  # say each problem once, until it changes
        if change is not None or new:
            self.on_edit(store, change, new)
