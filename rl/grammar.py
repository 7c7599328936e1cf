"""Structured output for the policy server: what a request constrains, compiled by llguidance into a
grammar, and per sampled row a matcher whose token mask the sampler applies to the logits.

- `response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`: the reply is
  JSON valid under `schema` (always enforced: `strict` changes nothing).
- `response_format: {"type": "json_object"}`: the reply is one JSON object.
- `tool_choice` naming a function (`{"type": "function", "function": {"name": N}}`): the reply is N's
  arguments, valid under its `parameters`; `"required"`: a JSON array of one or more `{"name",
  "parameters"}` calls of the request's tools. Both are returned as `tool_calls` (vLLM's way, so no
  tool parser is needed and any model can be forced). `"auto"` (the default) and `"none"` constrain
  nothing: the model writes text, as it does without tools.

JSON is written compactly as `json.dumps` writes it (`", "` and `": "`, no other whitespace): a
small model given free whitespace can spend its whole budget on newlines.

A row's mask is applied before temperature, top-p and the log-softmax, so a constrained row's
logprobs are those of the distribution it was sampled from (the model's, restricted to the tokens
the grammar allows and renormalised): what RL trains on is what was sampled. The grammar ends a
row by allowing only the end-of-text tokens once its JSON is complete; that token is sampled (with
logprob 0) and kept, as any stop token is.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How JSON is written under a constraint (llguidance's compile options)."""


class GrammarError(ValueError):
    """The request asks for a constraint this server cannot serve; the message says why (a 400)."""


@dataclass(frozen=True)
class Constraint:
    """What a request's sampling is held to: an llguidance grammar, and how its output is read."""

    grammar: str
    tool_call: Literal["named", "required"] | None = None
    """A forced tool call: the output is one function's arguments (`named`), or an array of calls."""
    function: str | None = None
    """The named function."""


def constraint(response_format: Any, tools: Any, tool_choice: Any) -> Constraint | None:
    """The constraint a request's `response_format`, `tools` and `tool_choice` ask for, or None.
    Raises GrammarError for a malformed or contradictory request."""
    forced = tool_choice not in (None, "auto", "none")
    if forced and response_format not in (None, {"type": "text"}):
        raise GrammarError("response_format and a forced tool_choice cannot both constrain one reply")
    if forced:
        return _tool_constraint(tools, tool_choice)
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise GrammarError("response_format must be an object with a `type`")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(_json_grammar({"type": "object"}))
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise GrammarError("response_format.json_schema.schema must be a JSON schema (an object)")
        return Constraint(_json_grammar(schema))
    raise GrammarError(f"response_format.type {kind!r} is not supported: use text, json_object or json_schema")


def _tool_constraint(tools: Any, tool_choice: Any) -> Constraint:
    functions = {}
    for t in tools or []:
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise GrammarError("each tool must be {\"type\": \"function\", \"function\": {\"name\", \"parameters\"}}")
        parameters = f.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise GrammarError(f"tool {f['name']}: parameters must be a JSON schema (an object)")
        functions[f["name"]] = parameters
    if not functions:
        raise GrammarError("tool_choice forces a tool call, but the request has no tools")
    if tool_choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": name}, "parameters": parameters},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, parameters in functions.items()]
        return Constraint(_json_grammar({"type": "array", "minItems": 1, "items": {"anyOf": calls}}), "required")
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise GrammarError("tool_choice must be \"none\", \"auto\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": NAME}}")
    if name not in functions:
        raise GrammarError(f"tool_choice names {name!r}, which is not among the request's tools")
    return Constraint(_json_grammar(functions[name]), "named", name)


def _json_grammar(schema: dict) -> str:
    try:
        from llguidance import LLMatcher

        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"the JSON schema cannot be read: {e}") from None


def tool_calls(constraint: Constraint, text: str, make_id) -> list[dict[str, Any]]:
    """The OpenAI `tool_calls` of a forced tool call's output (`make_id()` names each call). Output
    cut short (by max_tokens) is returned as it is, in one call, as OpenAI returns truncated arguments."""
    def call(name: str, arguments: str) -> dict[str, Any]:
        return {"id": make_id(), "type": "function", "function": {"name": name, "arguments": arguments}}

    if constraint.tool_call == "named":
        return [call(constraint.function or "", text)]
    try:
        return [call(c["name"], json.dumps(c["parameters"])) for c in json.loads(text)]
    except (ValueError, TypeError, KeyError):
        return [call("", text)]


# --- compiled grammars and masks ------------------------------------------------------------------


class Grammars:
    """One sampler's grammar compiler: its tokenizer as llguidance reads it (made on the first
    constrained request: 2 s for SmolLM2's 49k tokens here) and the grammars compiled last (a refiner
    sends the same schema every time)."""

    def __init__(self, tok, vocab_size: int, eos: Iterable[int], keep: int = 32):
        self._tok, self.vocab_size, self.eos, self.keep = tok, vocab_size, sorted(eos), keep
        self._ll: Any = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: Any = None

    def tokenizer(self):
        """The tokenizer as llguidance reads it (made once)."""
        if self._ll is None:
            self._ll = _lltokenizer(self._tok, self.vocab_size, self.eos)
        return self._ll

    def compile(self, grammar: str):
        """A matcher for `grammar` in its start state (copy it per row: `start`). Raises GrammarError
        naming what the grammar uses that llguidance does not implement."""
        from llguidance import LLMatcher, LLParserLimits

        with self._lock:
            if grammar in self._compiled:
                self._compiled.move_to_end(grammar)
                return self._compiled[grammar]
            tok = self.tokenizer()
            failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tok)
            if failed:
                raise GrammarError(f"the schema cannot be enforced: {'; '.join(messages)}")
            matcher = LLMatcher(tok, grammar, log_level=0, limits=LLParserLimits(verbose_errors=False))
            if matcher.is_error():
                raise GrammarError(f"the schema cannot be enforced: {matcher.get_error()}")
            self._compiled[grammar] = matcher
            while len(self._compiled) > self.keep:
                self._compiled.popitem(last=False)
            return matcher

    def executor(self):
        """Computes the masks of a batch's rows in parallel (llguidance's threads, without the GIL)."""
        if self._executor is None:
            from llguidance import LLExecutor

            self._executor = LLExecutor(num_threads=max(1, torch.get_num_threads()))
        return self._executor


def start(compiled) -> Any:
    """A row's own matcher, in the grammar's start state."""
    return compiled.deep_copy()


def mask_logits(logits: torch.Tensor, matchers: Sequence[Any], executor=None) -> None:
    """Set to -inf, in place, each row's logits [rows, vocab] (fp32, on the CPU) of the tokens its matcher
    does not allow next (rows whose matcher is None are free).

    In numpy, one thread: torch's elementwise ops over [rows, vocab] cost 30x as much here on 2 loaded
    cores (each waiting on its OpenMP threads), more than the whole mask is worth."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    vocab = logits.shape[1]
    bits = np.zeros((len(rows), (vocab + 31) // 32), dtype=np.int32)
    if executor is not None and len(rows) > 1:
        executor.unsafe_compute_mask_ptr([(matchers[i], k) for k, i in enumerate(rows)], bits.ctypes.data,
                                         bits.shape[1] * 4, len(rows))
    else:
        for k, i in enumerate(rows):
            matchers[i].unsafe_compute_mask_ptr(bits[k].ctypes.data, bits.shape[1] * 4)
    # bit j of word w allows token 32w + j: little-endian, so bit j of byte b is token 8b + j
    banned = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab] == 0
    out = logits.numpy()
    for k, i in enumerate(rows):
        np.copyto(out[i], -np.inf, where=banned[k])


def advance(matcher, token: int) -> None:
    """The row sampled `token`: its matcher moves on (one sampled from its mask is always accepted)."""
    matcher.consume_token(token)


def _lltokenizer(tok, vocab_size: int, eos: list[int]):
    """llguidance's view of a sampler's tokenizer: a Hugging Face fast tokenizer (rl.hf.HFTokenizer), or
    the byte policy's (rl.policy.tokenizer.ByteTokenizer)."""
    from llguidance import LLTokenizer, TokenizerWrapper

    inner = getattr(tok, "tok", None)
    if inner is not None:
        from llguidance.hf import from_tokenizer

        try:
            return from_tokenizer(inner, n_vocab=vocab_size, eos_token=eos)
        except ValueError as e:  # a slow (Python) tokenizer
            raise GrammarError(f"structured output needs a fast tokenizer: {e}") from None
    return LLTokenizer(TokenizerWrapper(_Bytes(tok, vocab_size, eos)), n_vocab=vocab_size, eos_token=eos)


class _Bytes:
    """The byte tokenizer as llguidance's TokenizerWrapper reads one: tokens 0-255 are the bytes, the
    rest special."""

    def __init__(self, tok, vocab_size: int, eos: list[int]):
        self.eos_token_id, self.bos_token_id = eos[0], getattr(tok, "bos", None)
        self.tokens = [bytes([i]) for i in range(256)] + [tok.token_str(i).encode() for i in range(256, vocab_size)]
        self.special_token_ids = list(range(256, vocab_size))

    def __call__(self, text: bytes) -> list[int]:
        return list(text)
