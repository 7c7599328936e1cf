"""What a session hands its collaborators (the turn loop, compaction, the refiner, subagents) so
none of them needs the session itself: the model and configuration in force, the model's context
(the messages as they will be sent), the inbox of messages waiting for it, and the sinks for what
they report.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

from agent.config_models import Config
from agent.events import Event
from agent.model import Model
from agent.trajectory import MessageRecord, Record
from agent.types import Message, Usage


def capped(text: str, limit: int, what: str) -> str:
    """Text from the kernel that the host keeps for a person or a model to read (a note, a message
    to another agent), refused past `limit` characters (kernel.output_limit: what a cell's output keeps)."""
    if not isinstance(text, str):
        raise TypeError(f"{what} is text, not {type(text).__name__}")
    if len(text) > limit:
        raise ValueError(f"{what} is at most {limit:,} characters (kernel.output_limit; this one: {len(text):,}); "
                         "write long text to a file and pass its path")
    return text


@dataclass
class Current:
    """The session's model and configuration in force. A switch (`Session.use_model`) or a fit to the
    model's server (agent/fit.py) replaces them here; the turn loop, subagents and the refiner read
    them on each call, so none keeps a copy that could go stale."""

    model: Model
    config: Config


@dataclass(frozen=True)
class Sinks:
    """Where a session's collaborators report."""

    emit: Callable[[Event], None]
    """An event for the session's clients (numbered by the session)."""
    record: Callable[[Record], None]
    """A record appended to the trajectory."""
    charge: Callable[[Usage, str, str | None], None]
    """Model spend, what it was for (turn, compaction, refine, llm, subagent) and the turn that caused
    it (None: the running one, if any): the session's, and that turn's."""
    turn_id: Callable[[], str | None]
    """The running turn, if any."""

    def log(self, record: Record, event: Event) -> None:
        """A fact written once: its trajectory record, then its event (built from the same payload,
        e.g. `McpCall`, `HookCall`, `TurnBegun`). The record first: a fact that could not be
        recorded is never shown as if it had been."""
        self.record(record)
        self.emit(event)


class Context:
    """Every message appended is recorded in the trajectory as it happens."""

    def __init__(self, record: Callable[[Record], None]):
        self._record = record
        self.messages: list[Message] = []
        self.turn_starts: list[int] = []
        """Index in `messages` where each turn's prompt stands."""
        self.tokens = 0
        """Prompt plus completion tokens of the last model call (the server's count)."""
        self.mark = 0
        """len(messages) when `tokens` was measured."""
        self.compact_requested = False
        """Compact at the next model call, whatever the context's size (a user's `/compact`)."""
        self.compactions = 0
        """How many times older context was folded into a summary (in this process)."""

    def append(self, message: Message, turn_id: str | None) -> None:
        self._record(MessageRecord(turn_id=turn_id, message=message))  # first: a record that fails adds nothing
        self.messages.append(message)

    def begin_turn(self, prompt: Message, turn_id: str) -> None:
        self.turn_starts.append(len(self.messages))
        self.append(prompt, turn_id)

    def close_open_tool_calls(self) -> None:
        """Answer tool calls an old process never answered (a resumed session's): a model API refuses a
        context without."""
        answered = {m.tool_call_id for m in self.messages if m.role == "tool"}
        last = next((m for m in reversed(self.messages) if m.role == "assistant"), None)
        for call in last.tool_calls if last else []:
            if call.id not in answered:
                self.append(Message(role="tool", tool_call_id=call.id,
                                    content="[lost: the session's process stopped while this cell ran]"), None)

    def measured(self, tokens: int) -> None:
        """The server counted `tokens` for everything up to now."""
        self.tokens, self.mark = tokens, len(self.messages)

    def estimate(self) -> int:
        """Tokens in the context: the server's last count plus ~4 characters a token for what came after."""
        since = self.messages[self.mark :] if self.tokens else self.messages
        return self.tokens + chars(since) // 4


def chars(messages: list[Message]) -> int:
    return sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)


class Inbox:
    """Messages for a running agent: the user's steering, and other agents' (`agent_message`).
    Delivered at the next model call, steering first; `recv` from the kernel takes agents' ones."""

    def __init__(self) -> None:
        self.steering: list[str] = []
        self.agents: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def steer(self, text: str) -> None:
        self.steering.append(text)

    def put(self, sender: str, text: str) -> None:
        self.agents.put_nowait((sender, text))

    def empty(self) -> bool:
        return not self.steering and self.agents.empty()

    def take_steering(self) -> list[str]:
        taken, self.steering = self.steering, []
        return taken

    def take_agents(self) -> list[tuple[str, str]]:
        taken = []
        while not self.agents.empty():
            taken.append(self.agents.get_nowait())
        return taken


# --- as text, for a reader (a summariser, the refiner's planner, a person) -------------------------


def message_text(m: Message, limit: int | None = None) -> str:
    """`[role] content`, each tool call's code after it; past `limit` characters the middle is cut."""
    text = m.content + "".join(f"\n[code]\n{_code(c.arguments)}" for c in m.tool_calls)
    if limit is not None and len(text) > limit:
        text = text[: limit // 2] + f"\n[... {len(text) - limit:,} characters cut ...]\n" + text[-(limit // 2) :]
    return f"[{m.role}] {text}"


def transcript(messages: list[Message], per_message: int, total: int | None = None) -> str:
    """The messages as text, each bounded by `per_message`; with `total`, only the newest that fit."""
    blocks = [message_text(m, per_message) for m in messages]
    if total is not None:
        kept, used = [], 0
        for block in reversed(blocks):
            if used + len(block) > total:
                break
            kept.append(block)
            used += len(block)
        blocks = kept[::-1]
    return "\n\n".join(blocks)


def _code(arguments: str) -> str:
    """A tool call's code (its arguments are JSON), or the arguments as written when they are not."""
    try:
        return json.loads(arguments).get("code", arguments)
    except (ValueError, AttributeError):
        return arguments
