"""95% intervals of what evaluations report: `prime-agent eval`'s summary and RL's evaluation during training."""

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


def mean_ci(xs: list[float], z: float = Z) -> tuple[float, float]:
    """The normal approximation's interval of a mean reward: mean ± z·s/√n (s the sample standard deviation),
    clipped to [0, 1], where rewards live; one value gives a point."""
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return (m, m)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    half = z * sd / math.sqrt(len(xs))
    return (max(0.0, m - half), min(1.0, m + half))
