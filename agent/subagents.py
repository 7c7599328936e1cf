"""Recursive subagents: the host side of `rlm`, `llm` and `agent_message` in the kernel.

A child is a full session of its own (kernel, transcript, trajectory) in `sub-<name>/` under its
parent's directory. Spawning admits it at once; it runs when a slot is free (per session and per
process). The registry (`subagents.json`) is on disk, so a restarted kernel still lists its
children. A parent that closes cancels its children: none is ever orphaned.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent import events as ev
from harness_store import safefs
from agent.config_models import Config
from agent.context import Current, Inbox, Sinks, capped
from agent.layout import SessionLayout
from agent.model import Model
from agent.prompt import render
from agent.trajectory import ModelCall, SubagentRecord
from agent.types import Budget, Message, TurnResult, Usage

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
ABOUT_CHARS = 200
"""The description of an `rlm` context the child's prompt carries ("a list of 3 items")."""


class Child(Protocol):
    """What the manager needs of a child session (agent.session.Session is one)."""

    usage: Usage
    inbox: Inbox

    def preload(self, code: str) -> None: ...
    async def prompt(self, text: str) -> TurnResult: ...
    async def __aenter__(self) -> Child: ...
    async def __aexit__(self, *exc: object) -> None: ...


ChildFactory = Callable[[Config, Model, str, SessionLayout, str], Child]
"""(config, model, name, layout, instructions) -> a new child session, not yet started."""


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
    turn_id: str | None = None
    """The parent's turn that spawned it: its spend is that turn's."""


class Subagents:
    """The children of one session, and the handlers behind `rlm`, `llm` and `agent_message`."""

    def __init__(self, current: Current, layout: SessionLayout, session_id: str, depth: int,
                 process_slots: dict[int, asyncio.Semaphore], sinks: Sinks, new_child: ChildFactory, inbox: Inbox, *,
                 left: Callable[[], Budget], parent_inbox: Inbox | None = None, name: str | None = None):
        """The session's model and configuration in force (`current`), `layout`, id, depth (0 for a person's session) and
        `inbox`; `left()`: what its running turn has left of its budget (a child gets no more);
        `parent_inbox` and `name` when the session is itself a child."""
        self.current, self.layout, self.left = current, layout, left
        self.session_id, self.depth = session_id, depth
        self.config = current.config.subagents
        self.sinks, self.new_child, self.inbox = sinks, new_child, inbox
        self.parent_inbox, self.name = parent_inbox, name
        self.process_slots = process_slots
        """Per-process limits, one pool per depth: a child holding a slot while it waits for its own
        children never starves them (they draw from the next depth's pool)."""
        self.session_slots = asyncio.Semaphore(self.config.max_concurrent)
        self._admitting = asyncio.Lock()
        self.children: dict[str, ChildInfo] = read_registry(layout)
        """A reused session directory: earlier children stay listed."""
        self.sessions: dict[str, Child] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.closing = False
        self.kernel_dir: Path | None = None
        """The kernel's own directory (set once it runs): its TMPDIR is `tmp/` there, where
        `rlm(context=...)` writes its pickles, in `contexts/`."""

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
        async with self._admitting:  # one at a time: the checks hold while a context is copied
            if self.closing:
                raise SubagentLimit("rlm refused: this session is closing")
            if name is not None and not NAME.match(name):
                raise SubagentLimit(f"rlm refused: name {name!r} must be 1-64 letters, digits, '-' or '_'")
            if self.depth + 1 > self.config.max_depth:
                raise SubagentLimit(f"rlm refused: this agent is at depth {self.depth}, and subagents.max_depth is "
                                    f"{self.config.max_depth}; do the work here instead")
            live = [c for c in self.children.values() if c.status in ("queued", "running")]
            if len(live) >= self.config.max_children:
                raise SubagentLimit(f"rlm refused: {len(live)} children are already queued or running "
                                    f"(subagents.max_children = {self.config.max_children}); await some first")
            child_id = secrets.token_hex(4)
            name = name or f"child-{len(self.children) + 1}"
            if any(c.name == name for c in self.children.values()):
                raise SubagentLimit(f"rlm refused: a child named {name!r} already exists; names must be unique")
            child_layout = self.layout.child(name)
            child_model = self.current.model.variant(model) if model else self.current.model
            note = render("subagent", name=name)
            if context_about is not None:
                capped(context_about, ABOUT_CHARS, "a context's description")
            if context_path and context_about:
                note += "\n\n" + render("subagent_context", about=context_about)
            child = self.new_child(self._child_config(budget), child_model, name, child_layout, note)
            if context_path:
                await self._take_context(Path(context_path), child_layout)
                child.preload(f"import pickle as _p\nwith open({str(child_layout.context)!r}, 'rb') as _f:\n"
                              "    context = _p.load(_f)\ndel _p, _f")
            info = ChildInfo(id=child_id, name=name, dir=str(child_layout.dir), model=child_model.name, task=task,
                             turn_id=self.sinks.turn_id())
            self.children[child_id] = info
            self.sessions[child_id] = child
            self._save()
            self.tasks[child_id] = asyncio.create_task(self._run(child_id, task))
            self.sinks.emit(ev.SubagentSpawned(turn_id=self.sinks.turn_id(), id=child_id, name=name,
                                               dir=str(child_layout.dir)))
            return asdict(info)

    async def _take_context(self, source: Path, child: SessionLayout) -> None:
        """Copy the pickle the kernel wrote (`source`, in its $TMPDIR/contexts) to the child's
        `context.pkl`, then remove the kernel's. Everything on the way is the kernel's to replace: it
        is opened without following links, as a regular file within subagents.max_context_bytes,
        off the event loop; the host never moves a file it did not create."""
        cap = self.config.max_context_bytes
        why = (f"a context is a regular file of at most subagents.max_context_bytes ({cap:,} bytes) that "
               "this session's kernel wrote in its $TMPDIR/contexts")
        root = self.kernel_dir
        if root is None or source.parent != root / "tmp" / "contexts":
            raise SubagentLimit(f"rlm refused: {str(source)!r} is not a context this session's kernel wrote ({why})")

        def take() -> None:
            child.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            child.context.unlink(missing_ok=True)
            try:
                safefs.copy_file(root, source, child.context, cap)
            except BaseException:
                with contextlib.suppress(OSError):
                    child.dir.rmdir()
                raise
            safefs.unlink(root, source)

        try:
            await asyncio.to_thread(take)
        except (safefs.UnsafePath, FileNotFoundError) as e:
            raise SubagentLimit(f"rlm refused: {e} ({why})") from e

    def _child_config(self, budget: dict[str, Any] | None) -> Config:
        """The session's config with the child's budget: each limit what the child asks within what
        this session's turn has left of its own; one it leaves out or sets to None is that, never more."""
        if not isinstance(budget, dict | None):
            raise SubagentLimit(f"rlm refused: budget is a dict of limits ({', '.join(Budget.model_fields)}), "
                                f"not {type(budget).__name__}")
        left = self.left()
        asked = Budget.model_validate({**left.model_dump(), **{k: v for k, v in (budget or {}).items() if v is not None}})
        return self.current.config.model_copy(update={"budget": asked.within(left)})

    async def _run(self, child_id: str, task: str) -> None:
        info, child = self.children[child_id], self.sessions[child_id]
        outcome, answer, error = "error", None, None
        try:
            depth = self.depth + 1
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
        turn_id = self.sinks.turn_id()
        self.sinks.charge(usage, "subagent", info.turn_id)
        self.sinks.record(SubagentRecord(
            turn_id=turn_id, child_id=info.id, name=info.name, dir=info.dir, outcome=info.status, usage=usage,
            duration=(info.finished or 0) - (info.started or info.finished or 0),
        ))
        self.sinks.emit(ev.SubagentFinished(turn_id=turn_id, id=info.id, name=info.name, outcome=info.status,
                                            answer=info.answer, error=info.error, usage=usage))

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
        return [asdict(c) for c in self.list_children()]

    def list_children(self) -> builtins.list[ChildInfo]:  # `list` here is the handler above
        return list(self.children.values())

    def running(self) -> bool:
        """Some child is queued or running in this process."""
        return not all(t.done() for t in self.tasks.values())

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
        tmp = self.layout.subagents.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(c) for c in self.children.values()], indent=1))
        os.replace(tmp, self.layout.subagents)

    # --- llm -----------------------------------------------------------------------------------

    async def llm(self, prompt: str, model: str | None = None, system: str | None = None) -> str:
        m = self.current.model.variant(model) if model else self.current.model
        messages = ([Message(role="system", content=system)] if system else []) + [Message(role="user", content=prompt)]
        turn_id = self.sinks.turn_id()  # the cell that asked runs in this turn: the spend is its
        completion = await m.complete(messages, tools=False)
        self.sinks.charge(completion.usage, "llm", turn_id)
        self.sinks.record(ModelCall(
            turn_id=turn_id or "", purpose="llm", context_messages=len(messages), usage=completion.usage,
            duration=completion.duration, attempts=completion.attempts, finish_reason=completion.finish_reason,
            model=completion.model,
        ))
        return completion.message.content

    # --- agent_message -------------------------------------------------------------------------

    async def send(self, text: str, to: str = "parent") -> str:
        capped(text, self.current.config.kernel.output_limit, "a message")
        if to == "parent":
            if self.parent_inbox is None:
                raise KeyError("this agent has no parent; it was started by a person")
            target, sender = self.parent_inbox, self.name
        else:
            child = next((self.sessions[i] for i, c in self.children.items() if c.name == to and i in self.sessions),
                         None)
            if child is None:
                raise KeyError(f"no child named {to!r}; children: {[c.name for c in self.children.values()]}")
            target, sender = child.inbox, "parent"
        target.put(sender, text)
        return f"sent to {to}"

    async def recv(self, timeout: float | None = None) -> dict[str, str] | None:
        try:
            sender, text = await asyncio.wait_for(self.inbox.agents.get(), timeout)
        except TimeoutError:
            return None
        return {"from": sender, "text": text}


def read_registry(layout: SessionLayout) -> dict[str, ChildInfo]:
    """The children a session's registry (`subagents.json`) lists, by id."""
    if not layout.subagents.is_file():
        return {}
    return {c["id"]: ChildInfo(**c) for c in json.loads(layout.subagents.read_text())}
