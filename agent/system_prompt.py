"""A session's system prompt and what the model has been told of the harness since it was built.

The prompt prefix only grows (docs/architecture.md §3): the system prompt is built at the start, after a
compaction, or on request (`rebuild`); between those, harness changes reach the model as a notice
ahead of the next prompt, carrying the changed entries, so every request starts with the previous
one byte for byte and the provider's prompt cache keeps hitting. A person's own edits of the
harness are committed as they happen (harness_store.watch) and picked up the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agent import events as ev
from agent.context import Context, Sinks
from agent.harness import SessionHarness, changes, told
from agent.prompt import render
from agent.trajectory import Record, SessionRecord, SystemPromptRecord, TurnFinishedRecord
from agent.types import Message
from harness_store.store import Change, HarnessStore
from harness_store.watch import HarnessWatcher


class SystemPrompt:
    """`text()` builds the prompt's text from the harness and the session's settings as they are now;
    `tell` leaves a notice for the model's next turn."""

    def __init__(self, harness: SessionHarness, context: Context, sinks: Sinks, text: Callable[[], str],
                 tell: Callable[[str], None]):
        self.harness, self.context, self.sinks, self._text, self._tell = harness, context, sinks, text, tell
        self.harness_version: str | None = None
        """The harness in force (each scope's commit): in the system prompt, or told since in a notice."""
        self.rebuild = False
        """Rebuild the system prompt at the next turn boundary (`Session.rebuild_prompt`)."""
        self._told: dict[str, tuple[str, str, str, str]] = {}
        """The harness entries as the model was last told them (the system prompt, then notices)."""
        self._watcher: HarnessWatcher | None = None

    def build(self) -> str:
        """The system prompt built afresh, with the harness as it is now: from here on the model has
        been told every entry as it stands."""
        self._told = told(self.harness.view)
        self.harness_version = self.harness.view.version()
        return self._text()

    def replace(self, turn_id: str | None) -> None:
        """Build the system prompt afresh in place of the one in force; recorded where it changed."""
        content = self.build()
        if content != self.context.messages[0].content:
            self.context.messages[0] = Message(role="system", content=content)
            self.sinks.record(SystemPromptRecord(turn_id=turn_id, content=content,
                                                 harness_version=self.harness_version))

    def at_boundary(self, turn_id: str) -> None:
        """At a turn boundary: the harness changes since the model was last told, as a notice (or the
        prompt rebuilt, where asked)."""
        if self.rebuild:
            self.rebuild = False
            self.replace(turn_id)
            self.sinks.emit(ev.HarnessReloaded(turn_id=turn_id, harness_version=self.harness_version))
            return
        version = self.harness.view.version()
        if version == self.harness_version:
            return
        now = told(self.harness.view)
        changed = changes(self._told, now)
        self._told, self.harness_version = now, version
        if changed:
            self._tell(render("harness_changed", changes=changed))
        self.sinks.emit(ev.HarnessReloaded(turn_id=turn_id, harness_version=version))

    def resume(self, records: list[Record]) -> None:
        """Taken up from a trajectory: the harness in force as last recorded. What changed while the
        session was away is not known entry by entry: the prompt is rebuilt at the first turn."""
        self.harness_version = next(
            (r.harness_version for r in reversed(records)
             if isinstance(r, SystemPromptRecord | SessionRecord) or (isinstance(r, TurnFinishedRecord) and r.harness_version)),
            None,
        )
        self._told = told(self.harness.view)
        self.rebuild = (self.harness.view.version() or None) != (self.harness_version or None)

    def watch(self) -> None:
        """Commit a person's own edits of existing scopes as they happen (see harness_store.watch)."""
        existing = [s for s in self.harness.stores.values() if (s.root / ".git").is_dir()]
        if not existing:
            return
        loop = asyncio.get_running_loop()

        def on_edit(store: HarnessStore, change: Change | None, problems: list[str]) -> None:
            entries = change.entries if change else []
            source = "external" if change and change.trigger == "external-edit" else "user"
            loop.call_soon_threadsafe(lambda: self.sinks.emit(ev.HarnessEdited(
                turn_id=self.sinks.turn_id(), scope=store.scope, entries=entries, problems=problems, source=source)))

        self._watcher = HarnessWatcher(existing, on_edit)
        self._watcher.start()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
