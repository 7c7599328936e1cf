"""One line at the bottom: the sandbox when it is not the default, model and how full its context
window is, session, turn state (with a spinner, the seconds and the streamed tokens while the model
answers), the goal's progress, tokens and cost, harness version, and whether the daemon is reachable."""

from __future__ import annotations

import time

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static


class StatusBar(Static):
    model = reactive("")
    session_id = reactive("")
    state = reactive("")
    tokens = reactive(0)
    turn_tokens = reactive(0)
    """The running turn's model calls so far: shown in the total until its turn.finished counts the turn."""
    prompt_tokens = reactive(0)
    cached_tokens = reactive(0)
    """Of `prompt_tokens`, read from the provider's prompt cache."""
    cost = reactive(0.0)
    harness = reactive("")
    connected = reactive(True)
    sandbox = reactive("")
    """The sandbox in force; shown unless it is the default (workspace-write), loudly without one."""
    context_window = reactive(0)
    """Tokens the model accepts, as the session uses it (0: not known yet)."""
    goal = reactive("")
    """The goal's line: state, continuation n of N, budget left (empty without a goal)."""
    context_used = reactive(0)
    """Tokens the last model call had in its context (prompt and answer; 0: no call yet)."""
    model_since = reactive(0.0)
    """When the model call under way began (epoch seconds; 0: none under way)."""
    streamed = reactive(0)
    """Fragments (about a token each) the call under way has streamed so far."""

    SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def on_mount(self) -> None:
        self.set_interval(0.25, self._tick)

    def _tick(self) -> None:
        if self.model_since:
            self.refresh()

    def render(self) -> Text:
        link = ("● daemon", "green") if self.connected else ("○ daemon lost: reconnecting…", "bold red")
        state_style = {"running": "bold yellow", "queued": "yellow", "idle": "green"}.get(self.state, "")
        sandbox: tuple[str, str] | str = ""
        if self.sandbox and not self.sandbox.startswith("workspace-write"):
            loud = not self.sandbox.startswith("read-only")
            sandbox = ((f"⚠ {self.sandbox.split(':')[0].upper()}: NO SANDBOX", "bold white on red") if loud
                       else (self.sandbox, "yellow"))
        return Text.assemble(
            *((sandbox, " · ") if sandbox else ()), link, " · ", (self.model or "-", "bold"),
            self._fill(), " · ", *self._activity(state_style),
            (" · " + self.goal, "bold magenta") if self.goal else "",
            " · ", f"{self.tokens + self.turn_tokens:,} tok",
            f" ({self.cached_tokens / self.prompt_tokens:.0%} cached)" if self.cached_tokens and self.prompt_tokens else "",
            f" ${self.cost:.2f}" if self.cost else "", " · ",
            (self.session_id or "-", "dim"), f" · harness {_short(self.harness)}" if self.harness else "",
        )


    def _fill(self) -> Text | str:
        """` · ctx 2.9k/128k`: tokens in the context of the last call, of the window; the share past half
        (yellow, red past 80%)."""
        if not self.context_window:
            return ""
        if not self.context_used:  # not known until a model call ends (the prompt alone is not nothing)
            return f" · ctx -/{_k(self.context_window)}"
        share = self.context_used / self.context_window
        style = "bold red" if share > 0.8 else "yellow" if share > 0.5 else ""
        loud = f" {share:.0%}" if share > 0.5 else ""
        return Text.assemble(" · ", (f"ctx {_k(self.context_used)}/{_k(self.context_window)}{loud}", style))

    def _activity(self, style: str) -> tuple:
        """The turn's state; while the model answers, a spinner, its seconds and what it streamed."""
        if not self.model_since or self.state != "running":
            return ((self.state or "-", style),)
        elapsed = max(0.0, time.time() - self.model_since)
        frame = self.SPINNER[int(elapsed * 4) % len(self.SPINNER)]
        streamed = f" ↓ {self.streamed:,} tok" if self.streamed else ""
        return ((f"{frame} model {elapsed:.0f}s{streamed}", style),)


def _k(n: int) -> str:
    """2910 -> 2.9k, 128000 -> 128k, 1048576 -> 1M (as a window is spoken of)."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}".removesuffix(".0") + "k" if n < 10_000 else f"{n // 1000}k"
    return f"{n / 1_000_000:.1f}".removesuffix(".0") + "M"


def _short(version: str) -> str:
    """`user@abc123… project@def456…` -> `user@abc123 project@def456` (each scope's commit, short)."""
    return " ".join(part[: part.index("@") + 7] if "@" in part else part for part in version.split())
