"""A completion that repeats itself: the way a small model runs away.

Greedy or low-temperature decoding can fall into a loop (the same line, the same paragraph, the
same few tokens) and stay in it until the token limit: SmolLM2-135M wrote one such completion for
ten minutes. `Repetition` watches the text of a completion as it streams (answer, reasoning and
tool-call arguments alike) and says when its tail is one piece of text repeated back to back, so
the client can stop the stream there instead of paying for the rest. A loop that counts (the same
lines but for a number going up: `f.write("Line 12")`, `f.write("Line 13")`, ...) is one too, once
it is twice as long: its numbers are read as one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_REPEATS = 5
"""Back-to-back copies of a piece of text before it counts as a loop (with at least `chars` of them)."""
WINDOW = 4096
"""Characters of the tail looked at: a loop's piece may be up to WINDOW / MIN_REPEATS characters long."""
STRIDE = 128
"""New characters between two looks (each costs O(WINDOW))."""


@dataclass
class Loop:
    piece: str
    """The text repeated."""
    times: int
    """Back-to-back copies of it at the end of the completion."""
    counting: bool = False
    """The copies differ in their numbers (the piece is the last of them)."""

    def describe(self) -> str:
        shown = self.piece if len(self.piece) <= 60 else self.piece[:57] + "..."
        return f"{shown!r} {self.times} times in a row" + (" but for its numbers" if self.counting else "")


class Repetition:
    """Fed a completion's text piece by piece; `feed` returns the `Loop` its tail has fallen into,
    once `chars` characters or more are copies of one piece repeated `MIN_REPEATS` times or more."""

    def __init__(self, chars: int):
        self.chars = chars
        self.tail = ""
        self.unseen = 0

    def feed(self, piece: str) -> Loop | None:
        self.tail = (self.tail + piece)[-WINDOW:]
        self.unseen += len(piece)
        if self.unseen < STRIDE:
            return None
        self.unseen = 0
        return repeated_tail(self.tail, self.chars)


NUMBER = re.compile(r"\d+")


def repeated_tail(text: str, chars: int) -> Loop | None:
    """The shortest piece whose copies, back to back, make up the last `chars` characters (or more) of
    `text`, `MIN_REPEATS` times or more; else copies that differ only in their numbers, with a letter
    in them (rows of numbers alone are data: a table, a CSV), making up `2 * chars` or more; else None."""
    if found := _period(text, chars):
        p, run = found
        return Loop(piece=_from_line_start(text[len(text) - p:]), times=run // p)
    if not NUMBER.search(text):
        return None
    counted = NUMBER.sub("0", text)  # each number one "0"
    if not (found := _period(counted, 2 * chars)):
        return None
    p, run = found
    piece = counted[len(counted) - p:]
    if "0" not in piece or not any(c.isalpha() for c in piece):
        return None
    last = re.search(NUMBER.pattern.join(map(re.escape, piece.split("0"))) + r"\Z", text)  # the copy as written
    return Loop(piece=_from_line_start(last.group()), times=run // p, counting=True)


def _period(text: str, chars: int) -> tuple[int, int] | None:
    """The shortest period `p` of a run at the end of `text` that is `chars` characters long or more and
    holds `MIN_REPEATS` copies or more, and the run's length; None if there is none.

    With `z[p]` the length of the longest common prefix of the reversed text and itself shifted by
    `p` (the Z-function), the text ends in a run of period `p` that is `z[p] + p` characters long."""
    r = text[::-1]
    n = len(r)
    if n < chars:
        return None
    z = [0] * n
    left = right = 0
    for i in range(1, n):
        if i < right:
            z[i] = min(right - i, z[i - left])
        while i + z[i] < n and r[z[i]] == r[i + z[i]]:
            z[i] += 1
        if i + z[i] > right:
            left, right = i, i + z[i]
    for p in range(1, n // MIN_REPEATS + 1):
        run = z[p] + p
        if run >= chars and run >= MIN_REPEATS * p:
            return p, run
    return None


def _from_line_start(piece: str) -> str:
    """A loop's piece, rotated to be shown from a line's start where it holds one."""
    if "\n" in piece[:-1]:
        k = piece.index("\n") + 1
        piece = piece[k:] + piece[:k]
    return piece
