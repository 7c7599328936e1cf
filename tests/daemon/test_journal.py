"""The event journal on disk: numbering, replay, and a line torn by a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.types import Event
from daemon.journal import EventJournal


def line(seq: int) -> str:
    return Event(seq=seq, type="note", session_id="s", data={"text": f"n{seq}"}).model_dump_json()


def test_replays_after_a_seq_and_refuses_gaps(tmp_path: Path):
    j = EventJournal(tmp_path / "events.jsonl")
    lines = {seq: line(seq) for seq in range(1, 6)}
    for seq, text in lines.items():
        j.append(seq, text)
    assert j.read_after(3) == [(4, lines[4]), (5, lines[5])]
    with pytest.raises(ValueError, match="does not follow"):
        j.append(7, line(7))
    j.close()
    assert EventJournal(tmp_path / "events.jsonl").last_seq == 5


def test_a_torn_last_line_is_cut_and_numbering_goes_on(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    j = EventJournal(path)
    for seq in (1, 2):
        j.append(seq, line(seq))
    j.close()
    with open(path, "a") as f:
        f.write(line(3)[:25])  # the process died mid-write
    j = EventJournal(path)
    assert j.last_seq == 2
    j.append(3, line(3))
    assert [s for s, _ in j.read_after(0)] == [1, 2, 3]
    assert path.read_text().count("\n") == 3


def test_the_last_seq_comes_from_the_tail_of_a_long_journal(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    j = EventJournal(path)
    big = Event(seq=0, type="note", session_id="s", data={"text": "x" * 100_000})
    for seq in range(1, 40):
        j.append(seq, big.model_copy(update={"seq": seq}).model_dump_json())
    j.close()
    assert EventJournal(path).last_seq == 39
    assert EventJournal(tmp_path / "absent.jsonl").last_seq == 0
