"""The byte policy's tokenizer: UTF-8 bytes, then the special tokens of its chat template."""

from __future__ import annotations

from rl.textstream import TextStream


class ByteTokenizer:
    """UTF-8 bytes are tokens 0-255; then the special tokens of the chat template."""

    BOS, EOS, PAD, SYSTEM, USER, ASSISTANT, END = range(256, 263)
    vocab_size = 264
    bos: int | None = BOS
    """Kept at the head of a prompt cut to its tail (rl.serve.keep_tail)."""
    end: int = END
    """Ends the assistant's turn (a warm start's demonstrations end with it)."""
    ROLES = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
    NAMES = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>", SYSTEM: "<|system|>", USER: "<|user|>",
             ASSISTANT: "<|assistant|>", END: "<|end|>"}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_str(self, i: int) -> str:
        if i < 256:
            return bytes([i]).decode("utf-8", errors="replace")
        return self.NAMES.get(i, f"<{i}>")

    def detokenizer(self) -> TextStream:
        return TextStream(lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"))

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """<bos> then <|role|> text <|end|> per message, then <|assistant|> to generate."""
        ids = [self.BOS]
        for m in messages:
            role = m["role"] if m["role"] in self.ROLES else "user"  # tool results read as user text
            ids += [self.ROLES[role], *self.encode(m.get("content") or ""), self.END]
        if add_generation_prompt:
            ids.append(self.ASSISTANT)
        return ids
