"""Training environments, by name (they implement evals' Environment protocol)."""

from __future__ import annotations

from evals.env import RLEnvironment


def load(name: str, **options) -> RLEnvironment:
    if name == "reverse_text":
        from evals.tasksets.reverse_text import ReverseText

        return ReverseText(**options)
    if name == "kernel_tasks":  # solved by running code: with env.harness = true
        from evals.tasksets.kernel_tasks import KernelTasks

        return KernelTasks(**options)
    if name.partition(":")[0] in ("rg", "vf"):  # the ecosystem's: reasoning-gym datasets, verifiers tasksets
        from evals.tasksets import load_taskset

        return load_taskset(name, **options)
    raise ValueError(f"unknown environment {name!r}; known: reverse_text, kernel_tasks, rg:DATASET, vf:TASKSET_ID")
