"""ATIF trajectories → training samples (`prime-agent rl ingest --format atif FILE`): a document's
steps become trajectory records (agent/atif.py) and those become samples exactly as a session's do
(rl/data.py). Only steps that carry their token ids and logprobs train; the rest is masked history.

The token ids are the document's own model's, so no vocabulary is assumed (every reply with ids and
logprobs trains): train on them the model that sampled them. A document we exported gives the samples
of the session it came from. Its reward is `final_metrics.extra.reward` (our export writes the
session's rating there), else the rubric's, if one is given.
"""

from __future__ import annotations

from pathlib import Path

from atif import Trajectory as Document
from pydantic import ValidationError

from agent.atif import from_atif, reward_of
from rl.data import IngestCounts, Rubric, samples
from rl.sample import TokenSample


def read_document(path: Path) -> Document:
    """An ATIF document from a file; ValueError saying what is wrong with one that is not."""
    try:
        return Document.model_validate_json(path.read_bytes())
    except ValidationError as e:
        raise ValueError(f"{path}: not an ATIF trajectory: {str(e)[:500]}") from None


def ingest_atif(paths: list[Path], rubric: Rubric | None = None) -> tuple[list[TokenSample], IngestCounts]:
    """Samples from ATIF documents, each rewarded by its own reward, else by `rubric` (if given)."""
    counts = IngestCounts()
    out: list[TokenSample] = []
    for path in paths:
        doc = read_document(path)
        records = from_atif(doc)
        counts.sessions += 1
        reward = reward_of(doc)
        if reward is None and rubric is not None:
            reward = float(rubric(records))
        for s in samples(records, counts, vocab_size=None):
            s.reward = reward
            counts.unrewarded += reward is None
            out.append(s)
    return out, counts
