"""The app's slash commands (each one's method and help, in one place), what /help says about keys,
and the goal commands' parsing and status line. The methods themselves are in tui/slash.py."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

KEYS = [
    "Enter sends; Ctrl+J adds a line; Up/Down walk your history; Ctrl-R searches it. A message sent while a "
    "turn runs steers it.",
    "Esc interrupts the turn. Ctrl-C interrupts; on a prompt you typed, clears it; on an idle session, twice, "
    "detaches. Ctrl-D on an empty prompt (or /exit, /quit) leaves. Either way the session goes on "
    "(prime-agent --resume ID).",
    "/ opens the command menu: Enter runs the highlighted command, Tab completes it. @ offers the project's "
    "files: Tab or Enter puts the highlighted path in. !COMMAND runs a command of yours in the workspace (Esc "
    "stops it); the model hears its output with your next message.",
    "Tab on an empty prompt moves the focus to cells, diffs and cards, Shift+Tab to the newest first (typing "
    "always goes back to the prompt): Enter on a cell shows all its output, on a diff expands it; on a "
    "figure o opens it (or saves it, saying where); on a refinement card r rolls back, a/x approve/reject. "
    "Ctrl+O: sessions. PgUp/PgDn scroll.",
]
"""What /help says about keys, before the list of commands."""


@dataclass(frozen=True)
class SlashCommand:
    method: str
    """The method that runs it (`SlashCommands.<method>(arg)`, tui/slash.py), given the text after the name."""
    help: str
    """Its line in the menu and in /help."""
    needs_session: bool = False
    """Without a session it says so instead of running."""


COMMANDS = {  # the menu and /help list them in this order
    "/new": SlashCommand("new_command", "start a new session here"),
    "/plan": SlashCommand("plan_command", "[TASK] plan mode for this session (a new one if none): read-only "
                          "until you approve its plan (y on the card; n rejects, with the prompt's text as your note)"),
    "/resume": SlashCommand("resume_command", "[ID] attach to a session (without ID: choose one)"),
    "/sessions": SlashCommand("sessions_command", "sessions in this project: attach, delete"),
    "/model": SlashCommand("model_command", "[NAME] show the model and those the server offers, or switch (from "
                           "the next turn)"),
    "/status": SlashCommand("status_command", "the session, model and server, sandbox, context, harness, daemon",
                            needs_session=True),
    "/cost": SlashCommand("cost_command", "what this session has spent: tokens and dollars", needs_session=True),
    "/diff": SlashCommand("diff_command", "what changed in the workspace since this session began",
                          needs_session=True),
    "/load": SlashCommand("load_command", "FILE.ipynb run a notebook's code cells in this session's kernel (a new "
                          "session if none), each approved as the agent's cells are: their state is its starting point"),
    "/init": SlashCommand("init_command", "[NOTES] have the agent write AGENTS.md for this project (trust it "
                          "after reading it)", needs_session=True),
    "/refine": SlashCommand("refine_command", "[instructions] refine the harness from this session",
                            needs_session=True),
    "/harness": SlashCommand("harness_command", "browse the harness: notes, memories, skills, subagents",
                             needs_session=True),
    "/rollback": SlashCommand("rollback_command", "[ID] roll back a refinement (default: the last applied)",
                              needs_session=True),
    "/rewind": SlashCommand("rewind_command", "go back to before a turn: files, conversation, harness, kernel",
                            needs_session=True),
    "/compact": SlashCommand("compact_command", "summarise older context at the next model call",
                             needs_session=True),
    "/reprompt": SlashCommand("reprompt_command", "rebuild the system prompt with the harness as it is "
                              "(next turn; the prompt cache starts over)", needs_session=True),
    "/goal": SlashCommand("goal_command", "TEXT --until CMD [--max-continuations N] [--max-seconds S] "
                          "[--max-tokens T]: keep going until CMD passes", needs_session=True),
    "/autonomous": SlashCommand("autonomous_command", "TEXT [--max-continuations N] [--max-seconds S] "
                                "[--max-tokens T]: work until final(), within the budget", needs_session=True),
    "/mcp": SlashCommand("mcp_command", "this session's MCP servers and their tools (starts them)",
                        needs_session=True),
    "/interrupt": SlashCommand("interrupt_command", "stop the running turn (and a goal)"),
    "/clear": SlashCommand("clear_command", "clear the screen (the session and its context go on)"),
    "/help": SlashCommand("help_command", "commands and keys"),
    "/exit": SlashCommand("exit_command", "leave the app (Ctrl-D); the session goes on in the daemon"),
    "/quit": SlashCommand("exit_command", "leave the app, as /exit does"),
}
"""The slash commands: each one's handler and help, in one place."""


@dataclass
class GoalLine:
    """A goal's progress as the status bar shows it (the session's own tokens are beside it)."""

    max_continuations: int | None
    max_tokens: int | None = None
    continuation: int = 0
    state: str = "running"
    tokens: int = 0
    left: dict[str, float] = field(default_factory=dict)
    """What the budget had left at the last continuation: its seconds, turns and cost are shown."""

    def line(self) -> str:
        of = f" of {self.max_continuations}" if self.max_continuations is not None else ""
        tokens = f" · {self.tokens:,} of {self.max_tokens:,} tok" if self.max_tokens is not None else ""
        left = ", ".join(f"{v:g} {k}" for k, v in self.left.items() if k not in ("continuations", "tokens"))
        return f"goal {self.state} · continuation {self.continuation}{of}{tokens}" + (f" ({left} left)" if left else "")


GOAL_FLAGS = {"--until": str, "--max-continuations": int, "--max-seconds": float, "--max-tokens": int}


def parse_goal(arg: str, autonomous: bool) -> tuple[str, str | None, dict]:
    """`fix the tests --until "pytest -q" --max-continuations 5` -> (text, check, budget). The text is
    kept as typed; the flags after it are read as a shell would."""
    first = re.search(r"(^|\s)(" + "|".join(GOAL_FLAGS) + r")(\s|$)", arg)
    text = (arg[: first.start()] if first else arg).strip()
    try:
        words = shlex.split(arg[first.start():]) if first else []
    except ValueError as e:
        raise ValueError(f"cannot read the flags: {e}") from None
    values: dict[str, object] = {}
    while words:
        word = words.pop(0)
        if word not in GOAL_FLAGS:
            raise ValueError(f"{word!r}: the flags come after the text, and are {', '.join(GOAL_FLAGS)}")
        if not words:
            raise ValueError(f"{word} needs a value")
        try:
            values[word] = GOAL_FLAGS[word](words.pop(0))
        except ValueError:
            raise ValueError(f"{word} takes a {GOAL_FLAGS[word].__name__}") from None
    check = values.pop("--until", None)
    if not text:
        raise ValueError("say what the goal is: TEXT " + ("[budget flags]" if autonomous else "--until CMD"))
    if autonomous and check is not None:
        raise ValueError("autonomous mode has no check; use /goal TEXT --until CMD")
    if not autonomous and check is None:
        raise ValueError("--until CMD is the check that says the goal is reached (or use /autonomous)")
    return text, check, {k[2:].replace("-", "_"): v for k, v in values.items()}
