"""A session's event journal: `events.jsonl`, one event per line, numbered by `seq` from 1.

Every event is flushed as it is written, and the file is fsynced at turn boundaries. A torn last
line (a crash mid-write) is cut when the journal is opened again, so nothing after it is glued to
half a line. Lines are kept as the JSON text they were written as: a replay sends them unchanged.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.events import Sequence
from agent.trajectory import AppendFile

_SEQ = re.compile(rb'^\{"seq":(\d+),')


class EventJournal:
    """Opened for appending only on the first append, so a daemon with a thousand dormant sessions
    holds no file of theirs open; the last seq is read from the file's tail."""

    def __init__(self, path: Path):
        self.path = path
        self._file: AppendFile | None = None
        self.seq = Sequence(_last_seq(path))
        """The session's event numbers, owned here: a number is taken once its event is written (a
        session the daemon runs numbers its events from this, `Session(seq=...)`)."""

    @property
    def last_seq(self) -> int:
        return self.seq.last

    def append(self, seq: int, line: str) -> None:
        """`line` is the event's JSON (no newline); `seq` must be the next number. A line the disk
        refuses is not written at all (WriteFailed), and the last seq stays."""
        if seq != self.seq.last + 1:
            raise ValueError(f"event {seq} does not follow {self.seq.last} in {self.path}")
        if self._file is None:
            self._file = AppendFile(self.path)  # cuts a torn last line first
        self._file.append(line)
        self.seq.take(seq)

    def sync(self) -> None:
        if self._file is not None:
            self._file.sync()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = None

    def read_after(self, after: int) -> list[tuple[int, str]]:
        """(seq, JSON line) of every event after `after`, in order."""
        return list(self._scan(after))

    def _scan(self, after: int):
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        *whole, _torn = data.split(b"\n")  # after the last newline: nothing, or a line a crash cut
        for raw in whole:
            m = _SEQ.match(raw)
            if m is not None and int(m.group(1)) > after:
                yield int(m.group(1)), raw.decode()


def _last_seq(path: Path) -> int:
    """The seq of the last whole line, read from the end of the file."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return 0
    with f:
        pos = f.seek(0, os.SEEK_END)
        tail = b""
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            lines = tail[: tail.rfind(b"\n") + 1].split(b"\n")[:-1]  # whole lines; a torn last one dropped
            if pos > 0:
                lines = lines[1:]  # may have begun before this chunk
            for raw in reversed(lines):
                if m := _SEQ.match(raw):
                    return int(m.group(1))
        return 0
