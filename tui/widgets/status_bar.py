"""One line at the bottom: the sandbox when it is not the default, model and its context window,
session, turn state, the goal's progress, tokens and cost, harness version, and whether the daemon is
reachable."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static


class StatusBar(Static):
    model = reactive("")
    session_id = reactive("")
    state = reactive("")
    tokens = reactive(0)
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
            f" · ctx {self.context_window:,}" if self.context_window else "", " · ",
            (self.state or "-", state_style), (" · " + self.goal, "bold magenta") if self.goal else "",
            " · ", f"{self.tokens:,} tok",
            f" ({self.cached_tokens / self.prompt_tokens:.0%} cached)" if self.cached_tokens and self.prompt_tokens else "",
            f" ${self.cost:.2f}" if self.cost else "", " · ",
            (self.session_id or "-", "dim"), f" · harness {_short(self.harness)}" if self.harness else "",
        )


def _short(version: str) -> str:
    """`user@abc123… project@def456…` -> `user@abc123 project@def456` (each scope's commit, short)."""
    return " ".join(part[: part.index("@") + 7] if "@" in part else part for part in version.split())
