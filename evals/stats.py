"""95% intervals of what evaluations report: `prime-agent eval`'s summary, RL's evaluation during training and
the refine loop's held-out comparison."""

from __future__ import annotations

import math

Z = 1.96
"""The normal quantile of a two-sided 95% interval."""


def wilson(passed: int, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson's score interval of a pass rate: `passed` of `n` independent trials (sound at 0 and n passed,
    where the normal approximation collapses to a point)."""
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_ci(xs: list[float], z: float = Z, lo: float = 0.0, hi: float = 1.0) -> tuple[float, float]:
    """The normal approximation's interval of a mean reward: mean ± z·s/√n (s the sample standard deviation),
    clipped to [lo, hi], where the values live (rewards: [0, 1]); one value gives a point."""
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return (m, m)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    half = z * sd / math.sqrt(len(xs))
    return (max(lo, m - half), min(hi, m + half))


def interval(xs: list[float]) -> tuple[float, float]:
    """A mean score's interval: Wilson's where every score is 0 or 1 (a pass rate), else `mean_ci`."""
    if all(x in (0.0, 1.0) for x in xs):
        return wilson(round(sum(xs)), len(xs))
    return mean_ci(xs)


def paired(before: list[float], after: list[float]) -> tuple[float, tuple[float, float]]:
    """The mean difference after − before of paired scores (one pair a task: the task is the unit) and
    its interval by the normal approximation over the differences, clipped to [-1, 1]."""
    diffs = [b - a for a, b in zip(before, after, strict=True)]
    return sum(diffs) / len(diffs), mean_ci(diffs, lo=-1.0, hi=1.0)
