"""A session's event journal: `events.jsonl`, one event per line, numbered by `seq` from 1.

Every event is flushed as it is written, and the file is fsynced at turn boundaries. A torn last
line (a crash mid-write) is cut when the journal is opened again, so nothing after it is glued to
half a line. Lines are kept as the JSON text they were written as: a replay sends them unchanged.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.trajectory import open_append

_SEQ = re.compile(rb'^\{"seq":(\d+),')


class EventJournal:
    def __init__(self, path: Path):
        self.path = path
        self._file = open_append(path)  # cuts a torn last line first
        self.last_seq = 0
        for seq, _ in self._scan(0):
            self.last_seq = seq

    def append(self, seq: int, line: str) -> None:
        """`line` is the event's JSON (no newline); `seq` must be the next number."""
        if seq != self.last_seq + 1:
            raise ValueError(f"event {seq} does not follow {self.last_seq} in {self.path}")
        self._file.write(line + "\n")
        self._file.flush()
        self.last_seq = seq

    def sync(self) -> None:
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()

    def read_after(self, after: int) -> list[tuple[int, str]]:
        """(seq, JSON line) of every event after `after`, in order."""
        return list(self._scan(after))

    def _scan(self, after: int):
        with open(self.path, "rb") as f:
            data = f.read()
        for raw in data.split(b"\n"):
            m = _SEQ.match(raw)
            if m is None:
                continue  # an empty last piece, or a torn line cut at the next open
            seq = int(m.group(1))
            if seq > after:
                yield seq, raw.decode()
