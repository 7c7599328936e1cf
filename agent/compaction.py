"""Compaction: fold older context into a summary when it nears the model's window.

Older turns go first (all but `compaction.keep_recent_turns`); a turn that alone fills the
window folds its own early steps, keeping its prompt and its most recent steps verbatim. The
summary is a model call (agent/prompts/compaction.md); the kernel and its variables are untouched.
"""

from __future__ import annotations

from agent.config_models import Config
from agent.context import Context, chars, transcript
from agent.prompt import render
from agent.types import Message


def needed(context: Context, config: Config) -> bool:
    c = config.compaction
    return c.enabled and context.estimate() > c.threshold * config.model.context_window


def split(context: Context, config: Config) -> tuple[list[Message], list[Message]] | None:
    """(folded, kept) after the system prompt; None when there is nothing old enough to fold."""
    starts, messages = context.turn_starts, context.messages
    current = starts[-1]
    keep_from = starts[max(0, len(starts) - 1 - config.compaction.keep_recent_turns)]
    if keep_from > 1:
        return messages[1:keep_from], messages[keep_from:]
    steps = [i for i in range(current + 1, len(messages)) if messages[i].role == "assistant"]
    if len(steps) < 2:
        return None
    # Keep as many recent steps as fit in half the compaction threshold (at least the last one),
    # so the folded context lands well below it instead of compacting again next step.
    room = config.compaction.threshold * config.model.context_window * 2  # characters
    cut = next((i for i in steps[1:] if chars(messages[i:]) <= room), steps[-1])
    return [*messages[1:current], *messages[current + 1 : cut]], [messages[current], *messages[cut:]]


def request(folded: list[Message], config: Config) -> list[Message]:
    """The summary call's messages: the folded part as a transcript of ~half the window."""
    budget = config.model.context_window * 2  # characters: ~half the window in tokens
    text = transcript(folded, per_message=max(500, budget // max(1, len(folded))))
    return [Message(role="system", content=render("compaction")), Message(role="user", content=text)]


def fold(context: Context, kept: list[Message], summary: str, system_prompt: str) -> None:
    """Replace the context with a fresh system prompt (the prefix starts over here anyway, so it takes
    up every harness change since), the summary and what was kept."""
    messages, starts = context.messages, context.turn_starts
    head = Message(role="user", content=render("compacted", summary=summary))
    context.messages = [Message(role="system", content=system_prompt), head, *kept]
    first_kept = len(messages) - len(kept)
    context.turn_starts = [2 + i - first_kept for i in starts if i >= first_kept] or [2]
    context.tokens, context.mark = 0, 0
    context.compactions += 1
