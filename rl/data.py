"""Session trajectories → token-level training samples.

A sample is the token sequence the policy saw, with a loss mask that is True exactly on the
tokens the policy sampled (with their inference logprobs) and False on everything the harness
inserted: system prompt, user text, tool and cell output, and the chat template's own tokens.

One sample spans as many model calls as extend each other: call k+1's request is call k's
request plus its sampled tokens plus what the harness appended. The chain is cut (a new sample
begins, its history masked) where that stops being true: a compaction, a rebuilt system prompt,
a rewind of the conversation (samples follow the context as the model saw it), a truncated prompt,
or a reply whose tokens differ from how the template renders it back (a stop string, a length cut,
bytes that were not valid UTF-8). Replies recorded without token ids and
logprobs are never guessed: they stay in the history as masked text and are counted.

A request's tokens are the server's own when it said what they were (`ModelCall.prompt_token_ids`,
recorded with `model.record_logprobs`; `prime-agent rl serve` says): exactly what the sampled
tokens were conditioned on, truncation included. Otherwise they are rendered with the byte-level
policy's chat template (`rl.policy.tokenizer.ByteTokenizer.chat`).
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.layout import SessionLayout
from agent.trajectory import (
    CompactionRecord,
    MessageRecord,
    ModelCall,
    Record,
    RewindRecord,
    SessionRecord,
    SystemPromptRecord,
    read_records,
)
from agent.types import Message
from rl.policy.tokenizer import ByteTokenizer
from rl.sample import TokenSample

Rubric = Callable[[list[Record]], float]


@dataclass
class IngestCounts:
    sessions: int = 0
    samples: int = 0
    trainable_tokens: int = 0
    replies: int = 0
    """Assistant replies seen in the sessions' contexts."""
    skipped_no_logprobs: int = 0
    splits: int = 0
    """Chains cut: compaction, a rebuilt system prompt, or a reply the template does not render back."""
    unrewarded: int = 0
    foreign: int = 0
    """Replies whose token ids are not this policy's (another model served the session then): masked text."""


class _Chain:
    """The sample being built: the request so far, and what in it was sampled. It is built from
    the server's prompt ids (`server_ids`) or by rendering messages, never a mix."""

    def __init__(self, tok: ByteTokenizer, messages: list[Message], session_id: str, version: str | None,
                 prompt_ids: list[int] | None = None):
        self.tok = tok
        self.server_ids = prompt_ids is not None
        if prompt_ids is not None:
            self.sample = TokenSample(session_id, list(prompt_ids), [False] * len(prompt_ids), [0.0] * len(prompt_ids),
                                      version)
            return
        self.sample = TokenSample(session_id, [tok.BOS], [False], [0.0], version)
        for m in messages:
            self.add_inserted(m)

    def extends(self, prompt_ids: list[int]) -> bool:
        """The server's next prompt begins with everything so far: it extends this chain."""
        n = len(self.sample.ids)
        return self.server_ids and len(prompt_ids) >= n and prompt_ids[:n] == self.sample.ids

    def add_prompt(self, prompt_ids: list[int]) -> None:
        """What the harness added since the last reply, as the server tokenized it (masked)."""
        self._extend(prompt_ids[len(self.sample.ids):], sampled=False)

    def add_sampled_ids(self, m: Message, turn: str | None) -> None:
        self._extend(list(m.token_ids), sampled=True, logprobs=list(m.logprobs))
        if turn and turn not in self.sample.turns:
            self.sample.turns.append(turn)

    def _extend(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.sample.ids += ids
        self.sample.mask += [sampled] * len(ids)
        self.sample.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def add_inserted(self, m: Message) -> None:
        role = m.role if m.role in self.tok.ROLES else "user"  # tool results read as user text
        self._extend([self.tok.ROLES[role], *self.tok.encode(_text(m)), self.tok.END], sampled=False)

    def add_sampled(self, m: Message, turn: str | None) -> bool:
        """Append a reply as sampled; True when the template renders it back to the same tokens
        (so the next request extends this one)."""
        assert m.token_ids is not None and m.logprobs is not None
        self._extend([self.tok.ASSISTANT], sampled=False)
        self._extend(list(m.token_ids), sampled=True, logprobs=list(m.logprobs))
        if turn and turn not in self.sample.turns:
            self.sample.turns.append(turn)
        return list(m.token_ids) == [*self.tok.encode(_text(m)), self.tok.END]


def _text(m: Message) -> str:
    return m.content  # text mode: cells are fenced in the content; tool calls do not reach this policy


def samples(records: list[Record], counts: IngestCounts | None = None,
            vocab_size: int | None = ByteTokenizer.vocab_size) -> Iterator[TokenSample]:
    """The training samples of one session's trajectory; replies with token ids past `vocab_size`
    (another model's) are kept as masked text (None: keep every reply)."""
    counts = counts if counts is not None else IngestCounts()
    tok = ByteTokenizer()
    start = next((r for r in records if isinstance(r, SessionRecord)), None)
    session_id = start.session_id if start else "?"
    version = start.harness_version if start else None
    messages: list[Message] = []
    chain: _Chain | None = None
    call: ModelCall | None = None
    """The model call whose reply the next assistant message is."""

    def cut() -> Iterator[TokenSample]:
        nonlocal chain
        if chain is not None and chain.sample.trainable:
            counts.samples += 1
            counts.trainable_tokens += chain.sample.trainable
            yield chain.sample
        chain = None

    for r in records:
        rewound = isinstance(r, RewindRecord) and r.messages is not None
        if isinstance(r, CompactionRecord | SystemPromptRecord) or rewound:
            if chain is not None:
                counts.splits += 1
            yield from cut()
            if isinstance(r, CompactionRecord | RewindRecord):  # the context the model sees from here
                messages = list(r.messages or [])
            else:
                version = r.harness_version
                messages[:1] = [Message(role="system", content=r.content)]
            continue
        if isinstance(r, ModelCall) and r.purpose == "turn":
            call = r
            continue
        if not isinstance(r, MessageRecord):
            continue
        m = r.message
        if m.role == "assistant":
            counts.replies += 1
            prompt_ids, call = (call.prompt_token_ids if call else None), None
            if m.token_ids and vocab_size is not None and max(m.token_ids) >= vocab_size:  # another model's
                counts.foreign += 1
            elif m.token_ids and m.logprobs and len(m.token_ids) == len(m.logprobs):
                if prompt_ids is not None:  # the server's own view of the request
                    if chain is not None and chain.extends(prompt_ids):
                        chain.add_prompt(prompt_ids)
                    else:
                        if chain is not None:
                            counts.splits += 1
                        yield from cut()
                        chain = _Chain(tok, messages, session_id, version, prompt_ids)
                    chain.add_sampled_ids(m, r.turn_id)
                else:
                    if chain is not None and chain.server_ids:
                        counts.splits += 1
                        yield from cut()
                    if chain is None:
                        chain = _Chain(tok, messages, session_id, version)
                    if not chain.add_sampled(m, r.turn_id):
                        counts.splits += 1
                        yield from cut()
                messages.append(m)
                continue
            else:
                counts.skipped_no_logprobs += 1
        if chain is not None and not chain.server_ids:
            chain.add_inserted(m)  # (a chain of server ids gets these from the next prompt)
        messages.append(m)
    yield from cut()


# --- rewards --------------------------------------------------------------------------------------


def rate(session_dir: Path, score: float, note: str = "") -> None:
    """A person's rating of a session, 0..1: its samples' reward."""
    if not 0.0 <= score <= 1.0 or math.isnan(score):
        raise ValueError(f"a rating is between 0 and 1, not {score}")
    path = SessionLayout(session_dir).rating
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"score": score, "note": note}))
    tmp.replace(path)


def rating(session_dir: Path) -> float | None:
    try:
        return float(json.loads(SessionLayout(session_dir).rating.read_text())["score"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return None


def load_rubric(spec: str) -> Rubric:
    """`path/to/file.py:function` or `package.module:function`: a function of a session's records
    returning its reward."""
    where, sep, name = spec.rpartition(":")
    if not sep or not name:
        raise ValueError(f"a rubric is FILE.py:FUNCTION or MODULE:FUNCTION, not {spec!r}")
    if where.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("prime_agent_rubric", where)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load {where}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{spec}: no function {name!r}")
    return fn


def ingest(session_dirs: list[Path], rubric: Rubric | None = None) -> tuple[list[TokenSample], IngestCounts]:
    """Samples from sessions, each rewarded by its rating (if rated), else by `rubric` (if given)."""
    counts = IngestCounts()
    out: list[TokenSample] = []
    for d in session_dirs:
        records = read_records(SessionLayout(d).trajectory)
        counts.sessions += 1
        reward = rating(d)
        if reward is None and rubric is not None:
            reward = float(rubric(records))
        for s in samples(records, counts):
            s.reward = reward
            counts.unrewarded += reward is None
            out.append(s)
    return out, counts


def write(samples_: list[TokenSample], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for s in samples_:
            f.write(json.dumps(asdict(s)) + "\n")
