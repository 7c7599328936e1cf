"""A training step's samples as micro-batches of token rows (rl.train.backward runs the loss over them).

Padded (the default): one micro-batch, a row per sample, right-padded to the longest.
Packed (`train.pack_length = L`): samples placed whole into rows of exactly L tokens (first fit,
longest first), one row per micro-batch. Each token carries its position within its sample and
its segment (which sample it belongs to); attention stays within a segment, so a packed sample
sees exactly what it would see alone.

In a row, position t predicts token t + 1: the loss mask, inference logprobs and advantages sit at
the predicting position. A sample's last token predicts nothing of its own (next comes another
sample, or padding), so it is never on the loss mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.sample import Sample

PAD = 0
"""Token id of padding: never attended to by a sample's tokens, never on the loss mask."""


@dataclass
class MicroBatch:
    ids: torch.Tensor
    """[rows, L] token ids."""
    loss_mask: torch.Tensor
    """[rows, L - 1] bool: the token at t + 1 was sampled by the policy and is trained on."""
    inference: torch.Tensor
    """[rows, L - 1] the inference logprob of the token at t + 1."""
    advantages: torch.Tensor
    """[rows, L - 1]"""
    positions: torch.Tensor | None = None
    """[rows, L] position of each token within its sample (None: 0..L-1, one sample per row)."""
    segments: torch.Tensor | None = None
    """[rows, L] which sample each token belongs to, -1 for padding (None: one sample per row)."""

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(**{k: v.to(device) if v is not None else None for k, v in vars(self).items()})


def micro_batches(samples: list[Sample], pack_length: int | None) -> list[MicroBatch]:
    return packed(samples, pack_length) if pack_length else [padded(samples)]


def padded(samples: list[Sample]) -> MicroBatch:
    width = max(map(_len, samples))
    m = _empty(len(samples), width)
    for i, s in enumerate(samples):
        _place(m, i, 0, s)
    return m


def packed(samples: list[Sample], length: int) -> list[MicroBatch]:
    rows: list[list[int]] = []  # sample indices per row
    room: list[int] = []
    for i in sorted(range(len(samples)), key=lambda i: -_len(samples[i])):
        n = _len(samples[i])
        if n > length:
            raise ValueError(f"a sample of {n} tokens does not fit train.pack_length = {length}")
        r = next((r for r, free in enumerate(room) if free >= n), None)
        if r is None:
            rows.append([])
            room.append(length)
            r = len(rows) - 1
        rows[r].append(i)
        room[r] -= n
    out = []
    for row in rows:
        m = _empty(1, length)
        m.positions = torch.zeros(1, length, dtype=torch.long)
        m.segments = torch.full((1, length), -1, dtype=torch.long)
        offset = 0
        for i in row:
            n = _place(m, 0, offset, samples[i])
            m.positions[0, offset:offset + n] = torch.arange(n)
            m.segments[0, offset:offset + n] = i
            offset += n
        m.positions[0, offset:] = torch.arange(length - offset)  # padding: a segment of its own
        out.append(m)
    return out


def _len(s: Sample) -> int:
    return len(s.prompt_ids) + len(s.completion_ids)


def _empty(rows: int, width: int) -> MicroBatch:
    return MicroBatch(torch.full((rows, width), PAD, dtype=torch.long), torch.zeros(rows, width - 1, dtype=torch.bool),
                      torch.zeros(rows, width - 1), torch.zeros(rows, width - 1))


def _place(m: MicroBatch, row: int, offset: int, s: Sample) -> int:
    """Write sample `s` into `m` at (row, offset); returns its length in tokens."""
    if not s.prompt_ids:  # its first token would be predicted by whatever stands before it
        raise ValueError("a sample needs a prompt (at least the <bos> token)")
    n = _len(s)
    m.ids[row, offset:offset + n] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
    a = offset + len(s.prompt_ids) - 1  # predicts the first completion token
    b = a + len(s.completion_ids)
    # only tokens the policy sampled: the prompt, and what the harness inserted, are masked
    m.loss_mask[row, a:b] = torch.tensor(s.completion_mask) if s.completion_mask is not None else True
    m.inference[row, a:b] = torch.tensor(s.inference_logprobs)
    m.advantages[row, a:b] = s.advantage
    return n
