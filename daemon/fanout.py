"""Fan-out of a session's events to its event-stream clients, each with a bounded queue.

A client that falls this far behind is dropped, never waited for: it can resume from the last
event it saw (`Last-Event-ID`), so a stalled reader costs the session nothing.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class Subscriber:
    """One event-stream client: a bounded queue of (seq, JSON line); None ends the stream."""

    def __init__(self, limit: int):
        self.queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue(limit)
        self.dropped = False

    def end(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class Fanout:
    def __init__(self, name: str, limit: int):
        self.name, self.limit = name, limit
        self.subscribers: set[Subscriber] = set()

    def __bool__(self) -> bool:
        return bool(self.subscribers)

    def subscribe(self) -> Subscriber:
        sub = Subscriber(self.limit)
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def publish(self, seq: int, line: str) -> None:
        for sub in list(self.subscribers):
            try:
                sub.queue.put_nowait((seq, line))
            except asyncio.QueueFull:  # this far behind: dropped; it can resume from its last id
                log.warning("session %s: dropping an event-stream client %d events behind", self.name,
                            sub.queue.qsize())
                sub.dropped = True
                self.unsubscribe(sub)
                sub.end()

    def end_all(self) -> None:
        for sub in list(self.subscribers):
            sub.end()
        self.subscribers.clear()
