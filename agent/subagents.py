"""Recursive subagents: the host side of `rlm`, `llm` and `agent_message` in the kernel.

A child is a full session of its own (kernel, transcript, trajectory) in `sub-<name>/` under its
parent's directory. Spawning admits it at once; it runs when a slot is free (per session and per
process). The registry (`subagents.json`) is on disk, so a restarted kernel still lists its
children. A parent that closes cancels its children: none is ever orphaned.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from agent.config import Config
from agent.trajectory import ModelCall, SubagentRecord
from agent.types import Budget, Message, Usage

if TYPE_CHECKING:
    from agent.session import Session


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class SubagentLimit(Exception):
    """A depth or admission limit refused a child."""


@dataclass
class ChildInfo:
    """One child as the registry and `rlm.list()` show it."""

    id: str
    name: str
    dir: str
    model: str
    task: str
    status: str = "queued"
    """queued | running | completed | interrupted | budget_exhausted | timed_out | error | cancelled"""
    answer: str | None = None
    error: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None


class Subagents:
    """The children of one session, and the handlers behind `rlm`, `llm` and `agent_message`."""

    def __init__(self, session: Session, process_slots: dict[int, asyncio.Semaphore]):
        self.session = session
        self.config = session.config.subagents
        self.process_slots = process_slots
        """Per-process limits, one pool per depth: a child holding a slot while it waits for its own
        children never starves them (they draw from the next depth's pool)."""
        self.session_slots = asyncio.Semaphore(self.config.max_concurrent)
        self.registry = session.dir / "subagents.json"
        self.children: dict[str, ChildInfo] = {}
        if self.registry.is_file():  # a reused session directory: earlier children stay listed
            for c in json.loads(self.registry.read_text()):
                self.children[c["id"]] = ChildInfo(**c)
        self.sessions: dict[str, Session] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.closing = False

    def handlers(self) -> dict[str, Any]:
        return {
            "rlm.spawn": self.spawn, "rlm.wait": self.wait, "rlm.cancel": self.cancel, "rlm.list": self.list,
            "llm": self.llm, "agent_message.send": self.send, "agent_message.recv": self.recv,
        }

    # --- rlm -----------------------------------------------------------------------------------

    async def spawn(self, task: str, name: str | None = None, context_path: str | None = None,
                    context_about: str | None = None, model: str | None = None,
                    budget: dict[str, Any] | None = None) -> dict[str, Any]:
        """Admit a child now; it runs when a slot is free. `context_path` is a pickle the kernel
        wrote (loaded only in the child's kernel, never here); `context_about` describes it."""
        from agent.session import Session

        parent = self.session
        if self.closing:
            raise SubagentLimit("rlm refused: this session is closing")
        if name is not None and not NAME.match(name):
            raise SubagentLimit(f"rlm refused: name {name!r} must be 1-64 letters, digits, '-' or '_'")
        if parent.depth + 1 > self.config.max_depth:
            raise SubagentLimit(f"rlm refused: this agent is at depth {parent.depth}, and subagents.max_depth is "
                                f"{self.config.max_depth}; do the work here instead")
        live = [c for c in self.children.values() if c.status in ("queued", "running")]
        if len(live) >= self.config.max_children:
            raise SubagentLimit(f"rlm refused: {len(live)} children are already queued or running "
                                f"(subagents.max_children = {self.config.max_children}); await some first")
        child_id = secrets.token_hex(4)
        name = name or f"child-{len(self.children) + 1}"
        if any(c.name == name for c in self.children.values()):
            raise SubagentLimit(f"rlm refused: a child named {name!r} already exists; names must be unique")
        child_dir = parent.dir / f"sub-{name}"
        child_model = parent.model.variant(model) if model else parent.model
        config = self._child_config(budget)
        note = self._child_note(name, context_about if context_path else None)
        roots = {scope: store.root for scope, store in parent.harness.stores.items() if scope != "session"}
        child = Session(config, child_model, cwd=parent.cwd, session_dir=child_dir, session_id=f"{parent.id}.{name}",
                        parent=parent, instructions=note, on_event=None,
                        harness_roots={**roots, "session": child_dir / "harness"})
        if context_path:
            child.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            target = child.dir / "context.pkl"
            os.replace(context_path, target)
            child.kernel.setup.append(f"import pickle as _p\nwith open({str(target)!r}, 'rb') as _f:\n"
                                      "    context = _p.load(_f)\ndel _p, _f")
        info = ChildInfo(id=child_id, name=name, dir=str(child_dir), model=child_model.name, task=task)
        self.children[child_id] = info
        self.sessions[child_id] = child
        self._save()
        self.tasks[child_id] = asyncio.create_task(self._run(child_id, task))
        parent.emit("subagent.spawned", parent.turn.id if parent.turn else None, id=child_id, name=name, dir=str(child_dir))
        return asdict(info)

    def _child_config(self, budget: dict[str, Any] | None) -> Config:
        parent = self.session.config
        merged = {**parent.budget.model_dump(), **(budget or {})}
        return parent.model_copy(update={"budget": Budget.model_validate(merged)})

    @staticmethod
    def _child_note(name: str, context_about: str | None) -> str:
        lines = [f"# You are a subagent\nYou are `{name}`, started by a parent agent to do one task. Your final "
                 "answer is returned to the parent as a string: make it complete and self-contained. "
                 "`agent_message.send(text)` reaches your parent while you work."]
        if context_about:
            lines.append(f"The variable `context` in your kernel holds the data for your task: {context_about}. "
                         "Explore it with code (lengths, slices, searches) rather than printing it whole.")
        return "\n\n".join(lines)

    async def _run(self, child_id: str, task: str) -> None:
        info, child = self.children[child_id], self.sessions[child_id]
        outcome, answer, error = "error", None, None
        try:
            depth = self.session.depth + 1
            pool = self.process_slots.setdefault(depth, asyncio.Semaphore(self.config.max_concurrent_process))
            async with self.session_slots, pool:
                info.status, info.started = "running", time.time()
                self._save()
                async with child:
                    result = await child.prompt(task)
                outcome, answer, error = result.outcome, result.answer, result.error
        except asyncio.CancelledError:  # the parent cancelled it (or is closing): a result, not a crash
            outcome, error = "cancelled", "cancelled by the parent"
        except Exception as e:  # the child failed to start: a result for the parent, not a crash
            outcome, error = "error", f"{type(e).__name__}: {e}"
        finally:
            info.status, info.answer, info.error, info.finished = outcome, answer, error, time.time()
            info.usage = child.usage.model_dump()
            self._attribute(info, child.usage)
            self._save()

    def _attribute(self, info: ChildInfo, usage: Usage) -> None:
        """Child usage counts as the parent's, and the parent's trajectory links the child."""
        parent = self.session
        parent.usage += usage
        if parent.turn is not None:
            parent.turn.usage += usage
        parent.record(SubagentRecord(
            turn_id=parent.turn.id if parent.turn else None, child_id=info.id, name=info.name, dir=info.dir,
            outcome=info.status, usage=usage,
            duration=(info.finished or 0) - (info.started or info.finished or 0),
        ))
        parent.emit("subagent.finished", parent.turn.id if parent.turn else None, id=info.id, name=info.name,
                    outcome=info.status, answer=info.answer, error=info.error, usage=usage.model_dump())

    async def wait(self, id: str) -> dict[str, Any]:
        task = self.tasks.get(id)
        if task is None:
            raise KeyError(f"no child {id!r} of this session")
        await asyncio.shield(task)
        return asdict(self.children[id])

    async def cancel(self, id: str) -> dict[str, Any]:
        task = self.tasks.get(id)
        if task is None:
            raise KeyError(f"no child {id!r} of this session")
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return asdict(self.children[id])

    async def list(self) -> list[dict[str, Any]]:
        return [asdict(c) for c in self.children.values()]

    async def close(self) -> None:
        """Refuse new children, cancel every running one and wait for their kernels to stop."""
        self.closing = True
        while running := [t for t in self.tasks.values() if not t.done()]:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def interrupt_orphans(self, why: str) -> None:
        """Children the registry lists as queued or running when none can be (a new process)."""
        orphans = [c for c in self.children.values() if c.status in ("queued", "running")]
        for c in orphans:
            c.status, c.error, c.finished = "interrupted", why, time.time()
        if orphans:
            self._save()

    def _save(self) -> None:
        tmp = self.registry.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(c) for c in self.children.values()], indent=1))
        os.replace(tmp, self.registry)

    # --- llm -----------------------------------------------------------------------------------

    async def llm(self, prompt: str, model: str | None = None, system: str | None = None) -> str:
        s = self.session
        m = s.model.variant(model) if model else s.model
        messages = ([Message(role="system", content=system)] if system else []) + [Message(role="user", content=prompt)]
        completion = await m.complete(messages, tools=False)
        s.usage += completion.usage
        if s.turn is not None:
            s.turn.usage += completion.usage
        s.record(ModelCall(
            turn_id=s.turn.id if s.turn else "", purpose="llm", context_messages=len(messages), usage=completion.usage,
            duration=completion.duration, attempts=completion.attempts, finish_reason=completion.finish_reason,
            model=completion.model,
        ))
        return completion.message.content

    # --- agent_message -------------------------------------------------------------------------

    async def send(self, text: str, to: str = "parent") -> str:
        s = self.session
        if to == "parent":
            if s.parent is None:
                raise KeyError("this agent has no parent; it was started by a person")
            target, sender = s.parent, s.subagent_name
        else:
            target = next((self.sessions[i] for i, c in self.children.items() if c.name == to), None)
            if target is None:
                raise KeyError(f"no child named {to!r}; children: {[c.name for c in self.children.values()]}")
            sender = "parent"
        target.inbox.put_nowait((sender, text))
        return f"sent to {to}"

    async def recv(self, timeout: float | None = None) -> dict[str, str] | None:
        try:
            sender, text = await asyncio.wait_for(self.session.inbox.get(), timeout)
        except TimeoutError:
            return None
        return {"from": sender, "text": text}
