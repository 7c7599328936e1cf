"""Sampled tokens to text, a token at a time, for the policy server's streams and stop strings."""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    """A sampled row's text, a token at a time: `push(token)` returns the text it completes. A token
    that ends inside a character (a byte of UTF-8, part of a byte-level BPE symbol) gives nothing
    until the character is whole."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self._head = 0  # tokens before it are settled; decoding restarts there (a few tokens of context)
        self._read = 0  # tokens up to here have been returned as text

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.decode(self.ids[self._head : self._read])
        after = self.decode(self.ids[self._head :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._head, self._read = self._read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """The text still held at the end of the row (a character never completed: U+FFFD)."""
        held = self.decode(self.ids[self._head:])[len(self.decode(self.ids[self._head : self._read])):]
        self._head = self._read = len(self.ids)
        return held
