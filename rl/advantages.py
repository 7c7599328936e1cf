"""Group advantages: how much better each rollout did than the others of its task.

One function for both orchestrators (rl.orchestrator's bare completions and rl.envs.harness's agent
sessions). An advantage is the rollout's reward minus the mean reward of its group, as in prime-rl:
no division by the group's std unless the run asks for it (`train.std_normalize`). Timed-out and
errored rollouts have no reward: they are left out of the mean and of training, and counted apart.
A rollout whose advantage is zero has nothing to teach and is not trained on (it would only dilute
the step's per-token normalisation); a group whose advantages are all zero (every scored rollout
alike, or only one scored) contributes nothing and is counted as `zero_advantage_groups`.
"""

from __future__ import annotations

import statistics
from collections.abc import MutableMapping, Sequence
from typing import Literal

Excluded = Literal["errored", "timed_out"]
"""Why a rollout has no reward: it failed to run (or gave nothing to train on), or ran past its time."""

ZERO = 1e-9
"""Advantages this close to zero count as zero: a group of equal rewards whose float mean is off by an ulp
still trains nothing."""


def group_advantages(rewards: Sequence[float | Excluded], counts: MutableMapping[str, int], *,
                     std_normalize: bool = False) -> list[float | None]:
    """One advantage per rollout of a group, in order; None for a rollout that trains nothing (excluded,
    or an advantage of zero).

    `rewards` holds each rollout's reward, or why it has none (`"errored"`, `"timed_out"`): those are
    excluded from the mean and from training, and counted in `counts` under their name. A group whose
    scored rollouts all have (near) zero advantage returns all None and adds one to
    `counts["zero_advantage_groups"]`; a group with nothing scored is not one of those. With `std_normalize`,
    advantages are divided by the population std of the group's scored rewards."""
    scored = [r for r in rewards if not isinstance(r, str)]
    for r in rewards:
        if isinstance(r, str):
            counts[r] = counts.get(r, 0) + 1
    if not scored:  # every rollout already counted as errored or timed out
        return [None] * len(rewards)
    mean = statistics.fmean(scored)
    if all(abs(r - mean) <= ZERO for r in scored):
        counts["zero_advantage_groups"] = counts.get("zero_advantage_groups", 0) + 1
        return [None] * len(rewards)
    scale = statistics.pstdev(scored) if std_normalize else 1.0  # > 0: the rewards differ
    return [None if isinstance(r, str) or abs(r - mean) <= ZERO else (r - mean) / scale for r in rewards]
