"""GET /v1/sessions/{id}/events: a session's events as Server-Sent Events whose `id` is the event's
`seq`, replayed from the journal after `after` (or `Last-Event-ID`), then live."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from daemon.errors import Refused
from daemon.fanout import Subscriber
from daemon.managed import ManagedSession
from daemon.routes.common import Manager

KEEPALIVE = 15.0
"""Seconds between comments on a quiet event stream (proxies and dead peers notice)."""
REPLAY_CHUNK = 1000
"""Events per write when replaying the journal."""

router = APIRouter()


@router.get("/v1/sessions/{session_id}/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/Event"}}},
                             "description": "Server-Sent Events: `id` is the event's seq, `data` one Event "
                                            "(one schema per `type`)."}})
async def events(
    session_id: str,
    manager: Manager,
    after: Annotated[int | None, Query(ge=0, lt=10**18, description="Replay events after this seq, then stream.")] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    if after is None and last_event_id is not None:
        if not re.fullmatch(r"\s*[0-9]{1,18}\s*", last_event_id):
            raise Refused("bad_last_event_id", f"Last-Event-ID must be an event seq, not {last_event_id[:40]!r}")
        after = int(last_event_id)
    managed = manager.get(session_id)
    replay, sub = managed.subscribe(after or 0)
    return StreamingResponse(_stream(managed, replay, sub), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _stream(managed: ManagedSession, replay: list[tuple[int, str]], sub: Subscriber) -> AsyncIterator[str]:
    """The replayed events, then each one as it comes (batched while the client is behind), a
    keepalive comment when quiet; ends when the subscriber is ended."""
    try:
        for i in range(0, len(replay), REPLAY_CHUNK):
            yield "".join(_frame(seq, line) for seq, line in replay[i : i + REPLAY_CHUNK])
        while True:
            try:
                batch = [await asyncio.wait_for(sub.queue.get(), KEEPALIVE)]
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            while batch[-1] is not None and not sub.queue.empty():
                batch.append(sub.queue.get_nowait())
            frames = "".join(_frame(*item) for item in batch if item is not None)
            if frames:
                yield frames
            if batch[-1] is None:  # the session was deleted, the daemon stops, or this client fell behind
                if managed.stopping():  # said, so a client waits for it rather than starting another
                    yield "event: stopping\ndata: {}\n\n"
                return
    finally:
        managed.unsubscribe(sub)


def _frame(seq: int, line: str) -> str:
    return f"id: {seq}\ndata: {line}\n\n"
