"""`rlm`, `llm` and `agent_message` in the kernel: delegate by writing code.

    h = await rlm("summarise this chapter", context=chapter)   # admitted at once
    answers = await asyncio.gather(*(rlm(f"part {i}", context=p) for i, p in enumerate(parts)))  # parallel
    answer = await h                                             # the child's final answer
"""

from __future__ import annotations

import os
import pickle
import secrets

from agent.kernel.runtime.bridge import Host


class SubagentError(RuntimeError):
    """A child did not complete; `outcome` says how (error, budget_exhausted, timed_out, cancelled, ...)."""

    def __init__(self, name: str, outcome: str, error: str | None):
        super().__init__(f"subagent {name!r} ended {outcome}: {error}")
        self.name, self.outcome, self.error = name, outcome, error


class Handle:
    """A child agent. `await handle` returns its final answer or raises SubagentError."""

    def __init__(self, host: Host, info: dict):
        self._host = host
        self.info = info
        self.id, self.name, self.dir, self.model = info["id"], info["name"], info["dir"], info["model"]

    @property
    def status(self) -> str:
        return next((c["status"] for c in self._host.call("rlm.list") if c["id"] == self.id), "unknown")

    async def result(self) -> str:
        info = await self._host.acall("rlm.wait", id=self.id)
        self.info = info
        if info["status"] != "completed":
            raise SubagentError(self.name, info["status"], info["error"])
        return info["answer"]

    def __await__(self):
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"<subagent {self.name} id={self.id} model={self.model} dir={self.dir}>"


class RLM:
    """Spawn child agents: `await rlm(task, name=None, context=None, model=None, budget=None)`."""

    def __init__(self, host: Host, scratch: str):
        self._host = host
        self._scratch = scratch

    def __call__(self, task: str, *, name: str | None = None, context=None, model: str | None = None,
                 budget: dict | None = None):
        return self._spawn(task, name, context, model, budget)

    async def _spawn(self, task, name, context, model, budget) -> Handle:
        path = about = None
        if context is not None:
            os.makedirs(self._scratch, exist_ok=True)
            path = os.path.join(self._scratch, f"context-{secrets.token_hex(6)}.pkl")
            with open(path, "wb") as f:
                pickle.dump(context, f, protocol=pickle.HIGHEST_PROTOCOL)
            about = _describe(context)
        info = await self._host.acall("rlm.spawn", task=task, name=name, context_path=path, context_about=about,
                                      model=model, budget=budget)
        return Handle(self._host, info)

    async def run(self, task: str, **kwargs) -> str:
        """Spawn a child and wait for its answer."""
        return await (await self(task, **kwargs))

    def list(self) -> list[dict]:
        """This agent's children (from the registry on disk, so it survives kernel restarts)."""
        return self._host.call("rlm.list")

    async def cancel(self, handle: Handle) -> None:
        await self._host.acall("rlm.cancel", id=handle.id)

    def __repr__(self) -> str:
        return "rlm(task, *, name=None, context=None, model=None, budget=None) -> awaitable Handle; rlm.run, rlm.list, rlm.cancel"


class LLM:
    """`await llm(prompt, *, model=None, system=None)`: one plain model call, no tools."""

    def __init__(self, host: Host):
        self._host = host

    async def __call__(self, prompt: str, *, model: str | None = None, system: str | None = None) -> str:
        return await self._host.acall("llm", prompt=prompt, model=model, system=system)


class AgentMessage:
    """Messages between a running parent and its children."""

    def __init__(self, host: Host):
        self._host = host

    def send(self, text: str, to: str = "parent") -> str:
        """To "parent" or a child's name; it reaches the receiver at its next model call."""
        return self._host.call("agent_message.send", text=str(text), to=to)

    async def recv(self, timeout: float | None = None) -> dict | None:
        """The next message ({"from", "text"}), or None after `timeout` seconds."""
        return await self._host.acall("agent_message.recv", timeout=timeout)


def _describe(value) -> str:
    kind = type(value).__name__
    if isinstance(value, (str, bytes)):
        return f"a {kind} of {len(value):,} characters" if isinstance(value, str) else f"{kind} of {len(value):,} bytes"
    if hasattr(value, "__len__"):
        return f"a {kind} of {len(value):,} items"
    return f"a {kind}"
