"""The event journal on disk: numbering, replay, and a line torn by a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import events as ev
from agent.events import Note
from agent.session import Session
from agent.testing.scripted import ScriptedModel
from daemon.journal import EventJournal
from tests.conftest import make_config


def line(seq: int) -> str:
    return Note(seq=seq, session_id="s", text=f"n{seq}").model_dump_json()


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
    big = Note(seq=0, session_id="s", text="x" * 100_000)
    for seq in range(1, 40):
        j.append(seq, big.model_copy(update={"seq": seq}).model_dump_json())
    j.close()
    assert EventJournal(path).last_seq == 39
    assert EventJournal(tmp_path / "absent.jsonl").last_seq == 0


async def test_a_journal_written_before_typed_events_is_migrated_and_replays_typed(project: Path, prime_home: Path):
    """Schema 1 (the daemon before typed events) nested each type's fields under `data`."""
    from daemon.meta import SCHEMA
    from tests.daemon.conftest import running_daemon

    directory = prime_home / "sessions" / "20261130-120000-abcdef"
    directory.mkdir(parents=True)
    (directory / "session.json").write_text(json.dumps({
        "schema_version": 1, "id": directory.name, "cwd": str(project), "model": "fake", "created": 1.0,
        "turns": 1, "assigned": 1}))
    old = [
        {"type": "session.started", "data": {"dir": str(directory), "cwd": str(project), "model": "fake"}},
        {"type": "turn.started", "turn_id": "t1", "data": {"prompt": "hi"}},
        {"type": "cell.finished", "turn_id": "t1", "data": {"cell_id": "c1", "attachments": [], "result": {
            "stdout": "42\n", "stderr": "", "result": None, "error_name": None, "error_value": None,
            "traceback": None, "truncated": {}, "kernel_events": [], "kernel_message": None, "duration": 0.5}}},
        {"type": "refinement.applied", "data": {"id": "r1", "summary": "s", "diff": None, "reason": None,
                                                "scopes": ["project"], "refused": []}},
        {"type": "turn.finished", "turn_id": "t1", "data": {
            "outcome": "completed", "answer": "42", "error": None, "steps": 1, "cells": 1, "duration": 1.0,
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "cost": 0.0}}},
    ]
    lines = [json.dumps({"seq": n, "session_id": directory.name, "turn_id": None, "ts": 1.0, **e},
                        separators=(",", ":")) for n, e in enumerate(old, 1)]
    (directory / "events.jsonl").write_text("\n".join(lines) + "\n" + lines[-1][:30])  # and a torn last line
    async with running_daemon() as client:
        events = [e async for e in _first(client.events(directory.name, 0), len(old))]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    started, turn, cell, applied, finished = events
    assert isinstance(started, ev.SessionStarted) and started.cwd == str(project)
    assert isinstance(turn, ev.TurnStarted) and turn.prompt == "hi"
    assert isinstance(cell, ev.CellFinished) and cell.result.stdout == "42\n" and cell.result.duration == 0.5
    assert isinstance(applied, ev.RefinementApplied) and (applied.diff, applied.scopes) == ("", ["project"])
    assert isinstance(finished, ev.TurnFinished) and finished.answer == "42" and finished.usage.prompt_tokens == 10
    saved = json.loads((directory / "session.json").read_text())
    assert saved["schema_version"] == SCHEMA and saved["session_id"] == directory.name and "id" not in saved


def test_session_json_written_before_its_facts_had_one_place_loads(project: Path, prime_home: Path):
    """Schema 2 kept the session's id as `id`, and its model and endpoint beside the overrides that set
    them: read as the trajectory's `session_id`, the model from the overrides (the configuration's)."""
    from agent.layout import SessionLayout
    from daemon.meta import SCHEMA, load
    from daemon.models import model_in_force

    layout = SessionLayout(prime_home / "sessions" / "20261201-090000-abcdef")
    layout.dir.mkdir(parents=True)
    layout.meta.write_text(json.dumps({
        "schema_version": 2, "id": layout.dir.name, "cwd": str(project), "model": "gpt-old",
        "base_url": "http://127.0.0.1:9/v1", "title": "kept", "created": 1.0, "turns": 3, "assigned": 4,
        "overrides": {"model": {"name": "gpt-old", "base_url": "http://127.0.0.1:9/v1", "api_key": None}},
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "cost": 0.5}, "host": "run", "closed": True}))
    meta = load(layout)
    assert (meta.session_id, meta.cwd, meta.title, meta.turns, meta.assigned, meta.usage.prompt_tokens) == \
        (layout.dir.name, str(project), "kept", 3, 4, 7)
    assert model_in_force(None, meta.overrides) == ("gpt-old", "http://127.0.0.1:9/v1")
    saved = json.loads(layout.meta.read_text())
    assert saved["schema_version"] == SCHEMA == 3 and saved["session_id"] == layout.dir.name
    assert not {"id", "model", "base_url"} & saved.keys() and load(layout) == meta


async def _first(stream, n: int):
    async for e in stream:
        yield e
        n -= 1
        if n == 0:
            return


def test_a_session_numbers_its_events_from_the_journals_sequence(project: Path):
    """One owner of seq: the journal takes a number once its line is written, and the session it is
    handed to only reads it; so an event the journal refused (a full disk) leaves its number to the
    next, the error event that says so."""
    j = EventJournal(project.parent / "events.jsonl")
    j.append(1, line(1))
    refused = {2}

    def journal(event: ev.Event) -> None:
        if event.seq in refused:
            refused.discard(event.seq)
            raise OSError(28, "No space left on device")
        j.append(event.seq, event.model_dump_json())

    session = Session(make_config(), ScriptedModel([]), cwd=project, on_event=journal, seq=j.seq)
    session.emit(ev.Note(text="lost"))
    session.emit(ev.Note(text="kept"))
    written = [json.loads(text) for _, text in j.read_after(1)]
    assert [(e["seq"], e["type"]) for e in written] == [(2, "error"), (3, "note")]
    assert "No space left on device" in written[0]["message"] and written[1]["text"] == "kept"
    assert session.seq is j.seq and j.last_seq == 3
