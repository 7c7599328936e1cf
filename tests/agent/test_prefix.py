"""The prompt prefix only grows: within a session every request starts with the previous request's
messages byte for byte (what a provider's prompt cache keys on), except across a compaction. Harness
changes arrive as a notice; the system prompt is rebuilt at the start, after compaction, on request."""

from __future__ import annotations

import json
from pathlib import Path

from agent import events as ev
from agent.wire import to_wire
from agent.prompt import system_prompt
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import SystemPromptRecord, read_records
from agent.types import Message
from harness_store.store import Edit, HarnessStore
from tests.conftest import make_config


def wire(messages: list[Message]) -> bytes:
    return json.dumps([to_wire(m) for m in messages]).encode()


def grows(calls: list[list[Message]]) -> bool:
    """Each request's bytes start with the previous one's, but for its closing bracket."""
    return all(wire(b).startswith(wire(a)[:-1]) for a, b in zip(calls, calls[1:]))


def person_edits(root: Path, id: str, body: str) -> None:
    """A commit to a scope from outside the session (a person's edit, or another session's refinement)."""
    store = HarnessStore(root, "user")
    action = "update" if any(e.id == id for e in store.entries()) else "create"
    store.apply([Edit(action, id, kind="prompt", title=id.title(), body=body)], summary=f"{action} {id}",
                trigger="test", source="user")


async def test_every_request_starts_with_the_previous_one_across_harness_changes(project: Path, prime_home: Path):
    person_edits(prime_home / "harness", "style", "Use tabs.")
    script = [
        cells("print(harness.create('memory', 'uses-uv', 'This project installs with uv.', title='Installs with uv'))"),
        "noted", "two", "three", "four",
    ]
    events: list[ev.Event] = []
    async with Session(make_config(), ScriptedModel(script), cwd=project, on_event=events.append) as s:
        await s.prompt("one")  # the agent's own edit, mid-turn
        await s.prompt("two")
        person_edits(prime_home / "harness", "style", "Use four spaces.")
        person_edits(prime_home / "harness", "tests", "Run pytest -q.")
        await s.prompt("three")
        await s.prompt("four")  # nothing changed: no notice
    calls = s.model.calls
    assert len(calls) == 5 and grows(calls)
    assert all(c[0] == calls[0][0] for c in calls) and "Use tabs." in calls[0][0].content
    prompts = [c[-1].content for c in calls[2:]]
    assert prompts[0].startswith("[The harness changed") and "added memory 'Installs with uv' [uses-uv]" in prompts[0]
    assert "- updated prompt note 'Style' [style] (user scope):\nUse four spaces." in prompts[1]
    assert "- added prompt note 'Tests' [tests] (user scope):\nRun pytest -q." in prompts[1]
    assert prompts[2] == "four"
    assert [e.type for e in events].count("harness.reloaded") == 2
    assert not any(isinstance(r, SystemPromptRecord) for r in read_records(s.dir / "trajectory.jsonl"))


async def test_the_system_prompt_is_rebuilt_when_the_person_asks(project: Path, prime_home: Path):
    async with Session(make_config(), ScriptedModel(["one", "two", "three"]), cwd=project) as s:
        await s.prompt("one")
        person_edits(prime_home / "harness", "style", "Use tabs.")
        s.rebuild_prompt()
        await s.prompt("two")
        await s.prompt("three")
    first, second, third = s.model.calls
    assert "Use tabs." not in first[0].content and "### Style [style]\nUse tabs." in second[0].content
    assert second[-1].content == "two"  # in the prompt itself, so no notice
    assert grows([second, third])
    (rebuilt,) = [r for r in read_records(s.dir / "trajectory.jsonl") if isinstance(r, SystemPromptRecord)]
    assert rebuilt.content == second[0].content and rebuilt.turn_id == "t2"


async def test_a_compaction_starts_over_from_a_fresh_system_prompt(project: Path, prime_home: Path):
    script = [cells("print('x' * 4000)"), "one done", "SUMMARY of one", "two done", "three done"]
    base = len(system_prompt(make_config(), project)) // 4
    config = make_config(model={"context_window": (base + 800) * 2, "base_prompt": "full"},
                         compaction={"keep_recent_turns": 0, "threshold": 0.5})
    async with Session(config, ScriptedModel(script), cwd=project) as s:
        await s.prompt("one")
        person_edits(prime_home / "harness", "style", "Use tabs.")
        await s.prompt("two")  # compacts first: the new prefix takes the change in, so no notice is needed
        await s.prompt("three")
    # the turns' own calls: not compaction's, nor the review a compaction may start in the background
    turn_calls = [c for c in s.model.calls if c[0].content.startswith("You are Prime Agent")]
    before, after, later = turn_calls[1], turn_calls[2], turn_calls[3]
    assert "Use tabs." not in before[0].content and "### Style [style]\nUse tabs." in after[0].content
    assert not grows([before, after]) and grows([after, later])
    assert later[-1].content == "three"  # the change is in the fresh prompt: nothing more to tell


async def test_the_benchmarks_scripted_session_never_breaks_the_prefix_outside_compactions():
    # bench/prefix.py's session, shortened: refinements land between turns, one compaction starts over.
    from bench.prefix import measure, scenario

    run = await scenario(turns=16, refinements=3, context_window=4000)
    figures = measure(run)
    assert (figures["refinements"], figures["compactions"]) == (3, 1)
    assert figures["prefix_breaks_outside_compactions"] == 0
    assert figures["share_outside_compactions"] > 0.9


async def test_a_resumed_session_keeps_its_prefix_unless_the_harness_moved_while_it_was_away(project: Path,
                                                                                          prime_home: Path):
    model = ScriptedModel(["one", "two", "three"])
    async with Session(make_config(), model, cwd=project) as s:
        await s.prompt("one")

    async def resumed(prompt: str) -> None:
        again = Session(make_config(), model, cwd=project, session_dir=s.dir, session_id=s.id)
        again.resume(read_records(s.dir / "trajectory.jsonl"), "the daemon restarted")
        async with again:
            await again.prompt(prompt)

    await resumed("two")  # nothing changed: the new process goes on from the same prefix
    person_edits(prime_home / "harness", "style", "Use tabs.")
    await resumed("three")  # changed while away, entry by entry unknown: the prompt starts afresh
    first, second, third = model.calls
    assert grows([first, second]) and "the daemon restarted" in second[-1].content
    assert "### Style [style]\nUse tabs." in third[0].content and not grows([second, third])

