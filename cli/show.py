"""How the command line shows a session's events: one JSON object per line, or for people."""

from __future__ import annotations

import functools
import os
import stat
import sys
from typing import TYPE_CHECKING

from agent import events as ev
from agent.actions import fenced_cells
from agent.event_text import describe, spent
from agent.events import Event
from agent.types import Attachment, FilesChanged, visible

if TYPE_CHECKING:
    from pygments.lexer import Lexer

SHOWN = (ev.ModelDelta | ev.SessionStarted | ev.SessionResumed | ev.CellStarted | ev.CellOutput | ev.CellFinished
         | ev.Note | ev.SteerReturned | ev.HookRan | ev.ModelRetry | ev.ModelFallback | ev.TurnFinished | ev.UsageCharged
         | ev.Compaction | ev.Error | ev.GoalCheck | ev.GoalContinued | ev.GoalFinished)
"""The events a person is shown (the others, a model call starting or its whole reply, only end a streamed line)."""
DIFF_STYLES = {"hunk": "cyan", "added": "green", "removed": "red", "context": "", "cut": "dim"}


def print_json(event: Event) -> None:
    sys.stdout.write(event.model_dump_json() + "\n")
    sys.stdout.flush()


class Printer:
    """Human-readable progress on stderr; the final answer alone goes to stdout."""

    MAX_LINES = 20
    MAX_DIFF_LINES = 40
    """Diff lines shown under a cell, all its files together; the rest are counted."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.streaming = False
        self.said = ""
        """The text the model's latest call streamed (its answer, when it answered in text), a retry's
        rest of a dropped stream included: what the person read."""
        self.fresh = True
        """The next streamed text is a new model call's (not the rest of one a retry picks up)."""
        self.lines = 0
        """Output lines of the running cell so far (past MAX_LINES they are counted, not shown)."""

    def _output(self, text: str, style: str) -> None:
        """`text`'s lines while the running cell has shown fewer than MAX_LINES, in one print (a print a
        line cost 0.1 ms each); the rest are counted."""
        from rich.text import Text

        lines = text.splitlines()
        shown = lines[:max(self.MAX_LINES - self.lines, 0)]
        self.lines += len(lines)
        if shown:
            self.console.print(Text("\n".join(shown), style=style))

    def _files(self, files: FilesChanged) -> None:
        """The files a cell changed, each with its coloured diff; past MAX_DIFF_LINES, counted."""
        from rich.text import Text

        left = self.MAX_DIFF_LINES
        for f in files.files:
            self.console.print(Text(f"~ {f.headline()}", style="bold"))
            lines = f.lines()
            shown = lines[:max(left, 0)]
            for kind, line in shown:
                self.console.print(Text(line, style=DIFF_STYLES[kind]))
            if len(lines) > len(shown):
                self.console.print(Text(f"... {len(lines) - len(shown)} more lines of diff", style="dim"))
            left -= len(shown)
        if files.more:
            self.console.print(Text(f"... and {files.more} more files changed", style="dim"))

    def figures(self, attachments: list[Attachment], name: str, graphics: type | None = None) -> None:
        """A cell's figures: each drawn with the terminal's graphics (`graphics`, tui/images.py) where
        it has them, and a line saying what it is and where it was saved (to open it with a viewer)."""
        from rich.text import Text

        from tui.images import Figure

        for n, attachment in enumerate(attachments, 1):
            figure = Figure.of(attachment)
            if figure is None:
                continue
            if graphics is not None and (image := figure.pil()) is not None:
                self.console.print(graphics(image, width="auto", height=16))
            try:
                where = f"saved to {figure.save(f'{name}-{n}')}"
            except OSError as e:
                where = f"could not be saved: {e.strerror or e}"
            self.console.print(Text.assemble("└─ ", (figure.describe(), "bold"), (f" — {where}", "dim")),
                               soft_wrap=True)  # a path to copy, whole

    def unseen(self, answer: str | None) -> bool:
        """Whether `answer` is still to be printed on stdout: not when it was just streamed to the
        terminal stdout writes to as well (a person would read it twice)."""
        return not (answer and answer.strip() == self.said.strip() and _same_terminal())

    def show(self, e: Event) -> None:
        from rich.markdown import Markdown
        from rich.syntax import Syntax
        from rich.text import Text

        c = self.console
        if isinstance(e, SHOWN):  # a terminal shows the text, never acts on it
            data = e.model_dump(mode="json")
            if (seen := _visible(data)) != data:
                e = type(e).model_validate(seen)
        if isinstance(e, ev.ModelDelta):
            if self.fresh:
                self.said, self.fresh = "", False
            self.streaming = True
            if not e.reasoning:
                self.said += e.text
            c.print(Text(e.text, style="dim italic" if e.reasoning else "dim"), end="")
            return
        if self.streaming:
            c.print()
            self.streaming = False
        if not isinstance(e, ev.ModelRetry | ev.ModelFallback):  # a retry streams only what was not shown
            self.fresh = True
        if not isinstance(e, SHOWN):
            return
        match e:  # each case's event is in SHOWN
            case ev.SessionStarted() | ev.SessionResumed():
                if e.context_window:  # the window in force: the user's, else what the server said, else the default
                    c.print(Text(f"{e.model + ' · ' if isinstance(e, ev.SessionStarted) else ''}"
                                 f"ctx {e.context_window:,}", style="dim"))
                if e.sandbox and e.sandbox != "workspace-write":
                    loud = not e.sandbox.startswith(("read-only", "workspace-write"))
                    c.print(Text(f"sandbox: {e.sandbox}", style="bold red" if loud else "dim"))
                for line in e.ignored:
                    c.print(Text(f"project: {line}", style="bold yellow"))
            case ev.CellStarted():
                self.lines = 0
                if not any(code == e.code for code in fenced_cells(self.said)):  # text mode streamed it already
                    if c.color_system is None:  # its colours would be dropped: the highlighting's 1 ms a cell too
                        c.print(Text(e.code.expandtabs(4)))
                    else:
                        c.print(Syntax(e.code, _python(), theme="ansi_dark", line_numbers=False,
                                       background_color="default"))
            case ev.CellOutput():
                self._output(e.text, "red" if e.stream == "stderr" else "cyan")
            case ev.CellFinished(result=r):
                if r.result is not None:
                    self._output(r.result + "\n", "cyan")
                for a in r.attachments:  # a table (a DataFrame) or Markdown the cell displayed
                    if a.is_text:
                        c.print(Markdown(a.data))
                if r.traceback:
                    self._output(r.traceback + "\n", "red")
                if self.lines > self.MAX_LINES:
                    c.print(Text(f"... {self.lines - self.MAX_LINES} more lines", style="dim"))
                if r.kernel_message:
                    c.print(Text("kernel: " + r.kernel_message, style="yellow"))
                c.print(Text(f"({r.duration:.2f}s)", style="dim"))
                if e.files is not None:
                    self._files(e.files)
            case ev.Note():
                c.print(Text(describe(e), style="bold"))
            case ev.SteerReturned():
                c.print(Text(f"not sent (the turn was interrupted first), yours to send again: {e.text}",
                             style="yellow"))
            case ev.HookRan():
                c.print(Text(e.run.line(), style="yellow" if e.run.error or e.run.blocks else "dim"))
            case ev.ModelRetry():
                c.print(Text(describe(e), style="yellow"))
            case ev.ModelFallback():
                c.print(Text(describe(e), style="bold yellow"))
            case ev.TurnFinished():
                if e.files is not None:
                    c.print(Text(f"[{e.turn_id}: {e.files.summary()}: " + ", ".join(f.path for f in e.files.files)
                                 + (f" and {e.files.more} more" if e.files.more else "") + "]", style="bold"))
                if e.usage.total_tokens or e.usage.cost:
                    c.print(Text(f"[{spent(e)}]", style="dim"))
            case ev.UsageCharged():
                c.print(Text(f"[{describe(e)}]", style="dim"))
            case ev.Compaction():
                c.print(Text(describe(e), style="dim"))
            case ev.Error():
                c.print(Text(e.message, style="red"))
            case ev.GoalCheck():
                verdict = "passed" if e.passed else f"failed (exit {e.exit_code})"
                c.print(Text(f"goal check {verdict} in {e.duration:.1f}s", style="green" if e.passed else "yellow"))
                if not e.passed and e.output:
                    self.lines = 0
                    self._output(e.output[-2000:], "yellow")
            case ev.GoalContinued():
                c.print(Text(describe(e), style="bold"))
            case ev.GoalFinished():
                c.print(Text(describe(e), style="bold green" if e.state == "achieved" else "bold red"))


@functools.cache
def _python() -> Lexer:
    """Python's lexer, made once a process (rich looks one up by name for every cell: 0.5 ms)."""
    from pygments.lexers import get_lexer_by_name

    return get_lexer_by_name("python", stripnl=False, ensurenl=True, tabsize=4)  # as rich makes it


def _visible(value: object) -> object:
    """Every string in `value` (an event as JSON data) with its control characters as escapes
    (`visible`), carriage returns dropped (a progress bar's: rich dropped them before)."""
    if isinstance(value, str):
        return visible(value.replace("\r", ""))
    if isinstance(value, list):
        return [_visible(v) for v in value]
    if isinstance(value, dict):
        return {k: _visible(v) for k, v in value.items()}
    return value


def _same_terminal() -> bool:
    """stdout and stderr are one terminal."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(out.st_mode) and sys.stdout.isatty() and out.st_rdev == err.st_rdev
