"""Trajectory files: typed records, torn-line tolerance, export for fine-tuning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.trajectory import (
    SCHEMA,
    CompactionRecord,
    MessageRecord,
    SessionRecord,
    TrajectoryError,
    TrajectoryWriter,
    TurnStartedRecord,
    export_openai_chat,
    read_records,
)
from agent.types import Message, ToolCall, Usage


def write(path: Path, *records) -> None:
    w = TrajectoryWriter(path)
    for r in records:
        w.append(r)
    w.close()


def msg(role: str, content: str = "", **kw) -> MessageRecord:
    return MessageRecord(turn_id="t1", message=Message(role=role, content=content, **kw))


def test_a_torn_last_line_is_dropped_but_corruption_elsewhere_is_an_error(tmp_path: Path):
    path = tmp_path / "trajectory.jsonl"
    write(path, SessionRecord(session_id="s", cwd="/", model="m", action_format="tools"), TurnStartedRecord(turn_id="t1", prompt="p"))
    with open(path, "a") as f:
        f.write('{"kind": "message", "message": {"role": "us')  # the process died mid-write
    assert [r.kind for r in read_records(path)] == ["session", "turn_started"]

    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "garbage", lines[1]]) + "\n")
    with pytest.raises(TrajectoryError, match=r"trajectory.jsonl:2: not a trajectory record"):
        read_records(path)


def test_a_trajectory_from_a_newer_schema_is_refused_not_misread(tmp_path: Path):
    path = tmp_path / "trajectory.jsonl"
    write(path, SessionRecord(session_id="s", cwd="/", model="m", action_format="tools", schema_version=SCHEMA + 1))
    with pytest.raises(TrajectoryError, match=rf"newer Prime Agent \(trajectory schema {SCHEMA + 1}"):
        read_records(path)


def test_export_gives_one_conversation_per_stretch_between_compactions(tmp_path: Path):
    path = tmp_path / "trajectory.jsonl"
    call = ToolCall(id="c1", name="ipython", arguments='{"code": "1+1"}')
    write(
        path,
        SessionRecord(session_id="s", cwd="/", model="m", action_format="tools"),
        msg("system", "sys"), msg("user", "add"), msg("assistant", tool_calls=[call], logprobs=[-0.1]),
        msg("tool", "2", tool_call_id="c1"), msg("assistant", "2"),
        CompactionRecord(turn_id="t2", summary="S", usage=Usage(),
                         messages=[Message(role="system", content="sys"), Message(role="user", content="S")]),
        msg("user", "again"), msg("assistant", "sure"),
    )
    examples = list(export_openai_chat(read_records(path)))
    assert len(examples) == 2
    first = examples[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert first["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"code": "1+1"}'
    assert first["tools"][0]["function"]["name"] == "ipython"
    assert [m["content"] for m in examples[1]["messages"]] == ["sys", "S", "again", "sure"]
    json.dumps(examples)  # plain JSON all the way down


def test_turn_starts_follow_compactions():
    from agent.trajectory import CompactionRecord, MessageRecord, turn_starts
    from agent.types import Message, Usage

    def m(turn, role="user"):
        return MessageRecord(turn_id=turn, message=Message(role=role, content=f"{turn} {role}"))

    records = [MessageRecord(message=Message(role="system", content="s")), m("t1"), m("t1", "assistant"), m("t2"),
               m("t3")]
    assert turn_starts(records) == [1, 3, 4]
    kept = [Message(role="system", content="s"), Message(role="user", content="summary"),
            Message(role="user", content="t2"), Message(role="user", content="t3")]
    records += [CompactionRecord(turn_id="t3", summary="x", messages=kept, usage=Usage(), turn_starts=[2, 3]),
                m("t3", "assistant"), m("t4")]
    assert turn_starts(records) == [2, 3, 5]
