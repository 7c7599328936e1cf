"""Schedules and heartbeats: prompts the daemon fires into sessions, every so often or on a cron line.

The store is one file, `$PRIME_AGENT_HOME/schedules.json`, written atomically under a lock; the
daemon reads it at start and writes it at every change, and `prime-agent schedule pause --all`
edits it while the daemon is stopped, so nothing fires when it starts. Every fire (and every fire
skipped, deferred or missed) is an event in the session and a line of `schedules.jsonl`.

- A fire while the session is busy queues once: a fire whose previous prompt still waits in the
  queue is skipped, never piled up.
- Fires missed while the daemon was down are reported (a `schedule.fired` event with outcome
  `missed` and their count), not replayed: the schedule goes on from the next time due.
- A heartbeat (`heartbeat: true`) that woke a dormant session puts it back to sleep after its turn.
- `daemon start --no-schedules` and `[daemon] schedules = false` pause every schedule before anything fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import re
import secrets
import time
from collections import deque
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent import events as ev
from agent.config import shorten
from agent.config_models import Config
from agent.types import Text
from daemon.errors import Refused
from daemon.meta import write_atomically
from daemon.schemas import CreateSession

log = logging.getLogger(__name__)
HEARTBEAT = ("[Heartbeat] A scheduled check-in: look over the state of your work and say briefly whether "
             "anything needs attention. Do not start new work unless something is broken.")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`90`, `2s`, `5m`, `1h30m`, `1d` -> seconds (ValueError for anything else, or zero)."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"{text!r} is not a duration (e.g. 30s, 5m, 1h30m, 1d)")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"a duration must be more than zero, not {text!r}")
    return seconds


class Cron:
    """A five-field cron line (`m h dom mon dow`): numbers, `*`, `*/n`, `a-b`, `a-b/n` and lists.
    As in cron, a day matches when day-of-month or day-of-week does (if both are restricted)."""

    RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))

    def __init__(self, line: str):
        fields = line.split()
        if len(fields) != 5:
            raise ValueError(f"a cron line has five fields (m h dom mon dow), not {len(fields)}: {line!r}")
        self.sets = [self._field(f, lo, hi, i) for i, (f, (lo, hi)) in enumerate(zip(fields, self.RANGES))]
        self.any_dom, self.any_dow = fields[2] == "*", fields[4] == "*"

    @staticmethod
    def _field(text: str, lo: int, hi: int, index: int) -> set[int]:
        out: set[int] = set()
        for part in text.split(","):
            m = re.fullmatch(r"(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?", part)
            if not m:
                raise ValueError(f"cron field {index + 1} has {part!r}, which is not a number, range, * or step")
            start, end = (lo, hi) if m.group(1) == "*" else (int(m.group(2)), int(m.group(3) or m.group(2)))
            if index == 4 and end == 7:  # Sunday is 0 or 7
                end = 6 if start < 7 else 0
                start = min(start, end)
            step = int(m.group(4) or 1)
            if not (lo <= start <= end <= hi) or step < 1:
                raise ValueError(f"cron field {index + 1}: {part!r} is outside {lo}-{hi}")
            out.update(range(start, end + 1, step))
        return out


    def next_after(self, ts: float) -> float:
        """The first matching minute after `ts` (a day or hour that cannot match is skipped whole)."""
        minute, hour, _, month, _ = self.sets
        t = datetime.fromtimestamp(ts).replace(second=0, microsecond=0) + timedelta(minutes=1)
        end = t + timedelta(days=366 * 5)  # Feb 29 on a given weekday can take years
        while t < end:
            if t.month not in month or not self._day(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
            elif t.hour not in hour:
                t = t.replace(minute=0) + timedelta(hours=1)
            elif t.minute not in minute:
                t += timedelta(minutes=1)
            else:
                return t.timestamp()
        raise ValueError("this cron line never fires (no date matches it)")

    def _day(self, t: datetime) -> bool:
        _, _, dom, _, dow = self.sets
        day_dom, day_dow = t.day in dom, (t.isoweekday() % 7) in dow
        return (day_dom and day_dow) if (self.any_dom or self.any_dow) else (day_dom or day_dow)


class NewSchedule(BaseModel):
    """`POST /v1/schedules`: what to fire, where, and when."""

    model_config = ConfigDict(extra="forbid")

    prompt: Text = ""
    """The prompt fired; empty for a heartbeat (a short check-in)."""
    every: float | None = Field(None, gt=0)
    """Seconds between fires (the CLI takes 30s, 5m, 1h30m)."""
    cron: str | None = None
    """Or a cron line: `m h dom mon dow`, local time."""
    session: str | None = None
    """The session to fire into; or `cwd`, a directory whose session is created at the first fire."""
    cwd: str | None = None
    model: str | None = None
    base_url: str | None = None
    """For a session the schedule creates (default: the daemon's configuration)."""
    count: int | None = Field(None, ge=1)
    """Fires in all; then the schedule is done. None: no end."""
    heartbeat: bool = False

    @model_validator(mode="after")
    def _check(self) -> NewSchedule:
        if (self.every is None) == (self.cron is None):
            raise ValueError("give exactly one of `every` (seconds) and `cron` (a cron line)")
        if (self.session is None) == (self.cwd is None):
            raise ValueError("give exactly one of `session` (an id) and `cwd` (a directory)")
        if self.cron is not None:
            Cron(self.cron).next_after(time.time())  # a line no date matches (Feb 30) is refused here
        if not self.prompt.strip():
            if not self.heartbeat:
                raise ValueError("a schedule needs a prompt (or `heartbeat: true` for a check-in)")
            self.prompt = HEARTBEAT
        return self


class Schedule(NewSchedule):
    id: str
    created: float = Field(default_factory=time.time)
    paused: bool = False
    paused_why: str | None = None
    done: bool = False
    fired: int = 0
    skipped: int = 0
    missed: int = 0
    """Fires that fell while the daemon was down (reported, never replayed)."""
    next_fire: float | None = None
    last_fire: float | None = None
    last_turn: str | None = None

    def next_after(self, ts: float) -> float:
        return ts + self.every if self.every is not None else Cron(self.cron or "").next_after(ts)

    def following(self, now: float) -> float:
        """Once due (`next_fire <= now`): the first time due after `now`, on the schedule's own grid:
        an `every` schedule's fires stay `every` apart however late one of them ran."""
        if self.every is None or self.next_fire is None:
            return self.next_after(now)
        return self.next_fire + (math.floor((now - self.next_fire) / self.every) + 1) * self.every

    def due_between(self, start: float, end: float, limit: int = 100_000) -> int:
        """How many fires fall in [start, end)."""
        n, t = 0, start
        while t < end and n < limit:
            n += 1
            t = self.next_after(t)
        return n


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_absolute() and Path(path).is_dir()
    except (OSError, ValueError):  # a NUL, a name too long: not a directory
        return False


class Store(BaseModel):
    schema_version: int = 1
    schedules: list[Schedule] = Field(default_factory=list)


class ScheduleStore:
    """`schedules.json` (atomic writes under `schedules.lock`) and the fire log `schedules.jsonl`."""

    def __init__(self, root: Path):
        self.path, self.lock, self.log = root / "schedules.json", root / "schedules.lock", root / "schedules.jsonl"

    @contextlib.contextmanager
    def edit(self) -> Iterator[Store]:
        """Read, change and write back, holding the lock (the CLI and a starting daemon exclude each other)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            store = self.read()
            yield store
            write_atomically(self.path, store.model_dump_json(indent=1))

    def read(self) -> Store:
        if not self.path.is_file():
            return Store()
        try:
            return Store.model_validate_json(self.path.read_text())
        except ValidationError as e:
            raise ValueError(f"{self.path} is damaged: {e}") from None

    def write(self, store: Store) -> None:
        with self.edit() as current:
            current.schedules = store.schedules

    def note(self, entry: dict) -> None:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"ts": time.time(), **entry}) + "\n")


def pause_all(store: ScheduleStore, why: str) -> list[str]:
    """Pause every schedule in the store (what a stopped daemon reads at its start); the ids paused."""
    with store.edit() as s:
        paused = [x.id for x in s.schedules if not x.paused and not x.done]
        for x in s.schedules:
            if x.id in paused:
                x.paused, x.paused_why = True, why
    return paused


class Sessions(Protocol):
    """What the scheduler needs of the daemon (daemon.manager.SessionManager)."""

    config: Config
    stopping: bool
    sessions: dict

    def get(self, session_id: str): ...
    async def create(self, req: CreateSession): ...


class Scheduler:
    """The daemon's clock: fires due schedules, at most `daemon.max_fires_per_minute` a minute."""

    def __init__(self, sessions: Sessions, root: Path):
        self.sessions = sessions
        self.store = ScheduleStore(root)
        self.schedules: dict[str, Schedule] = {}
        self._task: asyncio.Task | None = None
        self._fires: deque[float] = deque()
        self._pending: set[asyncio.Task] = set()

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the store; pause everything when schedules are off; report what fell while it was down."""
        try:
            if not self.sessions.config.daemon.schedules:
                pause_all(self.store, "the daemon started with schedules off ([daemon] schedules = false, "
                          "or --no-schedules)")
            store = self.store.read()
        except (OSError, ValueError) as e:
            log.error("schedules not loaded: %s", e)
            return
        now = time.time()
        for s in store.schedules:
            self.schedules[s.id] = s
            if s.done or s.next_fire is None or s.next_fire > now:
                continue
            missed = s.due_between(s.next_fire, now)
            s.missed += missed
            s.next_fire = s.following(now)  # never a burst: the next time due from now on
            self._report(s, "missed", missed=missed,
                         why=f"{missed} fire(s) fell while the daemon was down; not replayed")
        self._save()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        for task in [self._task, *self._pending]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in [self._task, *self._pending] if t is not None), return_exceptions=True)

    # --- what the API does ---------------------------------------------------------------------

    def add(self, req: NewSchedule) -> Schedule:
        if req.session is not None:
            self.sessions.get(req.session)  # a 404 now, not at the first fire
        elif not _is_dir(req.cwd or ""):
            raise Refused("bad_cwd", f"cwd must be an absolute path to a directory, not {shorten(req.cwd)!r}")
        s = Schedule(id="s-" + secrets.token_hex(4), **req.model_dump())
        s.next_fire = s.next_after(time.time())
        self.schedules[s.id] = s
        self._save()
        return s

    def get(self, schedule_id: str) -> Schedule:
        s = self.schedules.get(schedule_id)
        if s is None:
            raise Refused("not_found", f"no schedule {schedule_id!r}")
        return s

    def pause(self, schedule_id: str | None, paused: bool, why: str | None = None) -> list[Schedule]:
        """Pause (or resume) one schedule, or every one when `schedule_id` is None."""
        chosen = [self.get(schedule_id)] if schedule_id else [s for s in self.schedules.values() if not s.done]
        now = time.time()
        for s in chosen:
            if not paused and s.paused and s.next_fire is not None and s.next_fire <= now:
                s.next_fire = s.following(now)  # what fell due while paused is not fired in a burst
            s.paused, s.paused_why = paused, why if paused else None
        self._save()
        return chosen

    def remove(self, schedule_id: str) -> None:
        self.get(schedule_id)
        del self.schedules[schedule_id]
        self._save()

    # --- firing --------------------------------------------------------------------------------

    async def _run(self) -> None:
        """Fire what is due; sleep until the next one is (a quarter second at most: what the API adds
        or resumes is seen within it, and a fire held by the per-minute cap is tried again)."""
        while not self.sessions.stopping:
            now = time.time()
            for s in list(self.schedules.values()):
                if not s.paused and not s.done and s.next_fire is not None and s.next_fire <= now:
                    await self._fire(s, now)
            now = time.time()
            ahead = [s.next_fire - now for s in self.schedules.values()
                     if not s.paused and not s.done and s.next_fire is not None and s.next_fire > now]
            await asyncio.sleep(min([0.25, *ahead]))

    async def _fire(self, s: Schedule, now: float) -> None:
        if s.session is not None and s.session not in self.sessions.sessions:  # deleted: it would fail every time
            s.paused, s.paused_why = True, f"its session {s.session} was deleted"
            self._report(s, "failed", why=s.paused_why)
            self._save()
            return
        while self._fires and self._fires[0] < now - 60:
            self._fires.popleft()
        limit = self.sessions.config.daemon.max_fires_per_minute
        if len(self._fires) >= limit:  # it stays due; the next tick with room fires it
            return
        s.next_fire = s.following(now)
        try:
            managed = await self._session(s)
        except Refused as e:
            s.skipped += 1
            self._report(s, "failed", why=e.message)
            self._save()
            return
        if s.last_turn is not None and any(q.turn_id == s.last_turn for q in managed.meta.queued):
            s.skipped += 1  # its last fire still waits in the queue: queued once, never piled up
            self._report(s, "skipped", managed=managed, why=f"its previous prompt ({s.last_turn}) is still queued")
            self._save()
            return
        self._fires.append(now)
        dormant = not managed.awake()
        accepted = managed.send(s.prompt, "prompt")
        s.fired += 1
        s.last_fire, s.last_turn = now, accepted.turn_id
        if s.count is not None and s.fired >= s.count:
            s.done, s.next_fire = True, None
        self._report(s, "queued" if accepted.queued else "sent", managed=managed, turn_id=accepted.turn_id)
        self._save()
        if s.heartbeat and dormant:
            task = managed.sleep_after(accepted.turn_id)  # before any await: the turn may end at once
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _session(self, s: Schedule):
        if s.session is not None:
            return self.sessions.get(s.session)
        managed = await self.sessions.create(CreateSession(cwd=s.cwd or "", model=s.model, base_url=s.base_url,
                                                           title=f"schedule {s.id}"))
        s.session, s.cwd = managed.id, None  # from now on it fires into this session
        return managed

    def _report(self, s: Schedule, outcome: str, managed=None, turn_id: str | None = None, missed: int = 0,
                why: str | None = None) -> None:
        entry = {"schedule_id": s.id, "outcome": outcome, "turn_id": turn_id, "missed": missed, "why": why,
                 "session": s.session}
        try:
            self.store.note(entry)
        except OSError as e:
            log.error("the schedule log could not be written: %s", e)
        if managed is None and s.session is not None:
            try:
                managed = self.sessions.get(s.session)
            except Refused:
                managed = None
        if managed is not None:
            managed.emit(ev.ScheduleFired(turn_id=turn_id, schedule_id=s.id, outcome=outcome, missed=missed,
                                          heartbeat=s.heartbeat, reason=why))

    def _save(self) -> None:
        try:
            self.store.write(Store(schedules=list(self.schedules.values())))
        except OSError as e:
            log.error("schedules could not be saved: %s", e)

