"""Recursive subagents from code: rlm, llm, agent_message, limits, failures, clean-up."""

from __future__ import annotations

import asyncio
import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path

from agent.model import ModelError
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import ModelCall, SubagentRecord, read_records
from agent.types import Message, ToolCall
from tests.conftest import make_config

Step = Callable[[str, int], "str | Message | Exception"]


def router(parent: list, child: Step) -> ScriptedModel:
    """One model for a parent and its children: the parent follows `parent` step by step; a child
    (recognised by its system prompt) answers `child(name, step)`; `llm()` calls get "LLM: <prompt>"."""

    def respond(messages: list[Message]):
        step = sum(m.role == "assistant" for m in messages)
        first = messages[0].content
        if messages[0].role != "system" or first == "be brief":
            return f"LLM: {messages[-1].content}"
        found = re.search(r"You are `([^`]+)`, started by a parent agent", first)
        out = child(found.group(1), step) if found else parent[step]
        if isinstance(out, Exception):
            raise out
        return out

    return ScriptedModel([respond] * 200)


def kernel_pids(s: Session) -> list[int]:
    sessions = [s, *s.subagents.sessions.values()]
    return [x.kernel._km.provisioner.pid for x in sessions if x.kernel._km.provisioner is not None]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state


GATHER = """
import asyncio
text = " ".join(f"w{i}" for i in range(90_000))
words = text.split()
parts = [" ".join(words[i::3]) for i in range(3)]
handles = [await rlm("Count the words in `context`.", name=f"part{i}", context=parts[i]) for i in range(3)]
answers = await asyncio.gather(*handles)
print(answers, sum(int(a) for a in answers))
"""


async def test_a_parent_fans_out_over_a_large_context_and_combines(project: Path):
    def child(name: str, step: int):
        return cells("final(str(len(context.split())))") if step == 0 else "unused"

    parent = [cells(GATHER), cells("import os; os._exit(1)"), cells("print(sorted(c['name'] for c in rlm.list()))"),
              "There are 90000 words."]
    async with Session(make_config(), router(parent, child), cwd=project) as s:
        r = await s.prompt("count the words, in parallel")
        pids = kernel_pids(s)
    assert r.answer == "There are 90000 words."
    outputs = [call[-1].content for call in s.model.calls if call[0].content.startswith("You are Prime Agent")]
    assert "['30000', '30000', '30000'] 90000" in outputs
    assert "['part0', 'part1', 'part2']" in outputs  # the registry outlives a kernel restart

    records = read_records(s.dir / "trajectory.jsonl")
    links = [rec for rec in records if isinstance(rec, SubagentRecord)]
    assert sorted(rec.name for rec in links) == ["part0", "part1", "part2"] and {rec.outcome for rec in links} == {"completed"}
    child_usage = 0
    for link in links:
        child_records = read_records(Path(link.dir) / "trajectory.jsonl")
        assert child_records[0].parent == s.id
        assert "The variable `context` in your kernel holds the data for your task: a str of" in \
            next(rec for rec in child_records if rec.kind == "message").message.content
        child_usage += link.usage.total_tokens
        assert Path(link.dir).parent == s.dir
    own = sum(rec.usage.total_tokens for rec in records if isinstance(rec, ModelCall))
    assert s.usage.total_tokens == own + child_usage and child_usage > 0
    assert not any(alive(pid) for pid in pids)


BEYOND = """
out = []
for name, budget in [("unbounded", {"max_cells": None, "max_tokens": None, "max_seconds": None}),
                     ("bigger", {"max_cells": 10_000, "max_steps": 10_000, "max_tokens": 10**12})]:
    try:
        await rlm.run("keep going", name=name, budget=budget)
    except SubagentError as e:
        out.append((e.name, e.outcome, e.error))
print(out)
"""


async def test_a_child_never_gets_more_budget_than_its_parent_has_left(project: Path):
    """E9: `rlm(..., budget={"max_cells": None})` gave a child no cell limit at all, and a larger
    number more than the parent's own. Now each limit is at most what the parent's turn has left: a
    child that runs a cell at every step stops after the parent's two cells left (three, one used)."""

    def child(name: str, step: int):
        return cells(f"print({step})")  # never an answer: only a budget ends it

    config = make_config(budget={"max_cells": 3, "max_steps": 50, "max_tokens": 10**9, "max_seconds": 3600,
                                 "max_repeats": None})  # a limit on no quantity used: the child's is the parent's
    async with Session(config, router([cells(BEYOND), "done"], child), cwd=project) as s:
        await s.prompt("spawn")
        budgets = {s.subagents.children[i].name: c.config.budget for i, c in s.subagents.sessions.items()}
    printed = [call[-1].content for call in s.model.calls if call[0].content.startswith("You are Prime Agent")][-1]
    exhausted = "'budget_exhausted', 'the turn ran its 2 cells (budget.max_cells)')"
    assert f"('unbounded', {exhausted}" in printed and f"('bigger', {exhausted}" in printed, printed
    for b in budgets.values():
        assert b.max_cells == 2 and b.max_steps <= 49 and b.max_tokens <= 10**9 and b.max_seconds <= 3600, b
        assert b.max_repeats is None, b


FAILURES = """
import asyncio
out = []
for name, budget in [("boom", None), ("spender", {"max_steps": 1})]:
    try:
        await rlm.run("do it", name=name, budget=budget)
    except SubagentError as e:
        out.append((e.name, e.outcome))
h = await rlm("sleep", name="sleeper")
while h.status != "running":
    await asyncio.sleep(0.05)
await asyncio.sleep(0.5)
await rlm.cancel(h)
try:
    await h
except SubagentError as e:
    out.append((e.name, e.outcome))
print(out)
"""


async def test_failing_children_give_the_parent_typed_errors(project: Path):
    def child(name: str, step: int):
        if name == "boom":
            return ModelError("HTTP 400: the child's request was refused")
        if name == "spender":
            return cells("1")
        return cells("import time; time.sleep(60)")

    async with Session(make_config(), router([cells(FAILURES), "carried on"], child), cwd=project) as s:
        r = await s.prompt("try some children")
        pids = kernel_pids(s)
    assert r.answer == "carried on"
    assert s.model.calls[-1][-1].content == \
        "[('boom', 'error'), ('spender', 'budget_exhausted'), ('sleeper', 'cancelled')]"
    assert not any(alive(pid) for pid in pids)


async def test_depth_and_admission_limits_refuse_clearly(project: Path):
    def child(name: str, step: int):
        if step == 0:
            return cells("try:\n    await rlm('deeper')\nexcept HostError as e:\n    final(str(e))")
        return "unused"

    parent = [cells("print(await rlm.run('go deeper', name='kid'))",
                    "hs = [await rlm('x', name=f'n{i}') for i in range(3)]"), "ok"]
    config = make_config(subagents={"max_depth": 1, "max_children": 2})
    async with Session(config, router(parent, child), cwd=project) as s:
        await s.prompt("nest")
    deep, many = s.model.calls[-1][-2].content, s.model.calls[-1][-1].content
    assert "rlm refused: this agent is at depth 1, and subagents.max_depth is 1" in deep
    assert "rlm refused: 2 children are already queued or running (subagents.max_children = 2)" in many


async def test_no_more_than_the_configured_children_run_at_once(project: Path):
    def child(name: str, step: int):
        return cells("import time; time.sleep(0.4)") if step == 0 else "done"

    parent = [cells("import asyncio\nprint(await asyncio.gather(*[await rlm('nap', name=f'c{i}') for i in range(5)]))"), "ok"]
    async with Session(make_config(subagents={"max_concurrent": 2}), router(parent, child), cwd=project) as s:
        await s.prompt("nap in parallel")
        spans = [(c.started, c.finished) for c in s.subagents.children.values()]
    assert len(spans) == 5
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert most == 2


async def test_messages_between_parent_and_child_and_plain_llm_calls(project: Path):
    def child(name: str, step: int):
        if step == 0:
            return cells("agent_message.send('halfway there')")
        if step == 1:
            return "child done"
        return "unused"

    parent = [cells("h = await rlm('work', name='worker')\nprint(await agent_message.recv(timeout=30))\nprint(await h)",
                    "print(await llm('say hi', system='be brief'))"), "ok"]
    async with Session(make_config(), router(parent, child), cwd=project) as s:
        await s.prompt("coordinate")
    got, said = s.model.calls[-1][-2].content, s.model.calls[-1][-1].content
    assert got == "{'from': 'worker', 'text': 'halfway there'}\nchild done"
    assert said == "LLM: say hi"
    records = read_records(s.dir / "trajectory.jsonl")
    assert [rec.purpose for rec in records if isinstance(rec, ModelCall)].count("llm") == 1


async def test_a_message_to_a_child_reaches_its_next_model_call(project: Path):
    def child(name: str, step: int):
        return cells("import time; time.sleep(1)") if step == 0 else "got it"

    parent = [cells("h = await rlm('wait for word', name='kid')\nimport asyncio\nwhile h.status != 'running':\n"
                    "    await asyncio.sleep(0.05)\nagent_message.send('use the fast path', to='kid')\nprint(await h)"), "ok"]
    async with Session(make_config(), router(parent, child), cwd=project) as s:
        await s.prompt("steer a child")
        kid = next(iter(s.subagents.sessions.values()))
    delivered = [m.content for m in kid.messages if m.content.startswith("[Message from parent]")]
    assert delivered == ["[Message from parent]\nuse the fast path"]


async def test_bad_names_are_refused_and_nested_children_never_deadlock(project: Path):
    def child(name: str, step: int):
        if name.startswith("mid"):
            return cells("final(await rlm.run('leaf work', name='leaf'))") if step == 0 else "unused"
        return "leaf done"

    parent = [cells("try:\n    await rlm('x', name='x/..')\nexcept HostError as e:\n    print(e)",
                    "import asyncio\nprint(await asyncio.gather(rlm.run('a', name='mid1'), rlm.run('b', name='mid2')))"),
              "ok"]
    config = make_config(subagents={"max_concurrent_process": 1})
    async with Session(config, router(parent, child), cwd=project) as s:
        await asyncio.wait_for(s.prompt("nest under a tight limit"), 60)
    refused, gathered = s.model.calls[-1][-2].content, s.model.calls[-1][-1].content
    assert "name 'x/..' must be 1-64 letters" in refused
    assert gathered == "['leaf done', 'leaf done']"


async def test_a_recv_interrupted_by_a_timeout_loses_no_message(project: Path):
    def child(name: str, step: int):
        return cells("import time; time.sleep(2.5)\nagent_message.send('late news')") if step == 0 else "sent"

    parent = [
        cells("h = await rlm('talk later', name='talker')"),
        Message(role="assistant", tool_calls=[ToolCall(id="r", name="ipython",
                arguments=json.dumps({"code": "await agent_message.recv()", "timeout": 1}))]),
        cells("print(await agent_message.recv(timeout=20))\nprint(await h)"),
        "ok",
    ]
    async with Session(make_config(), router(parent, child), cwd=project) as s:
        await s.prompt("listen")
    assert s.model.calls[-1][-1].content == "{'from': 'talker', 'text': 'late news'}\nsent"


STEAL = """
import os, tempfile
tmp = tempfile.gettempdir()
os.makedirs(os.path.join(tmp, "contexts"), exist_ok=True)
os.rename(os.path.join(tmp, "contexts"), os.path.join(tmp, "contexts.old"))
os.symlink({outside!r}, os.path.join(tmp, "contexts"))
try:
    h = await rlm._host.acall("rlm.spawn", task="say what context holds", name="thief",
                              context_path=os.path.join(tmp, "contexts", "id_rsa"))
    print("spawned", await rlm._host.acall("rlm.wait", id=h["id"]))
except HostError as e:
    print("refused:", e)
"""


async def test_a_linked_contexts_folder_cannot_hand_a_child_a_file_from_outside(project: Path, tmp_path: Path):
    outside = tmp_path / "keys"  # a secret store the kernel cannot see: the host can
    outside.mkdir()
    secret = pickle.dumps("-----BEGIN OPENSSH PRIVATE KEY----- s3cr3t")
    (outside / "id_rsa").write_bytes(secret)

    def child(name: str, step: int):
        return cells("final(repr(context))") if step == 0 else "unused"

    parent = [cells(STEAL.format(outside=str(outside))), "ok"]
    config = make_config(sandbox={"hidden": [str(outside)]})
    async with Session(config, router(parent, child), cwd=project) as s:
        await s.prompt("take the key")
    said = s.model.calls[-1][-1].content
    assert said.startswith("refused:") and "contexts" in said, said
    assert (outside / "id_rsa").read_bytes() == secret  # still in place: nothing was moved
    assert not list(s.dir.glob("sub-*/context.pkl"))
    assert not any("s3cr3t" in (m.content or "") for call in s.model.calls for m in call)


async def test_a_context_over_the_cap_is_refused_and_left_alone(project: Path):
    parent = [cells("try:\n    await rlm('x', name='big', context='y' * 5000)\nexcept HostError as e:\n    print(e)"),
              "ok"]
    async with Session(make_config(subagents={"max_context_bytes": 1000}), router(parent, lambda n, s: "unused"),
                       cwd=project) as s:
        await s.prompt("too much")
    said = s.model.calls[-1][-1].content
    assert "rlm refused" in said and "subagents.max_context_bytes" in said, said
    assert not list(s.dir.glob("sub-*/context.pkl"))
