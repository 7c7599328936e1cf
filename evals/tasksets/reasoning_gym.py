"""`rg:DATASET[?key=value&...]`: reasoning-gym's procedural datasets, scored by their own scorers.

    rg:spell_backward                       one family, its default config
    rg:chain_sum?min_terms=2&max_terms=3    with config fields (values read as JSON literals)
    rg:spell_backward,chain_sum             a mix, equal weights (reasoning-gym's CompositeDataset)
    rg:composite?spell_backward=2&chain_sum=1&chain_sum.max_terms=3
                                            a mix by weight, each family's config under its name
    rg:spell_backward?curriculum=0.8        reasoning-gym's curriculum for the family: the next level
                                            is dealt once the last `curriculum_window` (32) scored
                                            answers average 0.8 or more (for RL)

A selection's size and seed make the dataset: `tasks(n, seed)` builds it with `size=n` and
`seed=dataset_seed(seed)`, and deals its items in order; reasoning-gym generates item i from the seed and
i alone, so the same seed gives the same tasks whatever the run. The seed is spread because
reasoning-gym draws item i with `Random(seed + i)`: under seeds s and s + 1 the items would be the same
but one, and RL deals step k's tasks with a seed one past step k - 1's. The answer is the rollout's final answer, or what its last `<answer>` tags hold;
the dataset's `score_answer` gives the reward, and passed means full marks. A scorer that raises (some
do on odd answers) makes a failed rollout with its error kept, never an error of the run. Everything is
generated locally: no downloads.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections import deque
from pathlib import Path
from typing import Any

from evals.env import Check, MissingPackage, Task

INSTALL = "pip install 'prime-agent[reasoning-gym]' (in a clone: pip install -e '.[reasoning-gym]')"
SYSTEM = "Answer with the final answer alone: no explanation. You may put it between <answer> and </answer> tags."
DEFAULT_SIZE = 50
"""Tasks a selection without n deals (the `size` option changes it)."""
SPREAD = 2654435761
"""Knuth's multiplicative hash: odd, so seeds map one to one onto [0, 2**32)."""
ANSWER_TAGS = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def reasoning_gym():
    """The reasoning_gym package, or a MissingPackage naming its install command."""
    try:
        import reasoning_gym
    except ImportError:
        raise MissingPackage(f"rg: task sets need reasoning-gym: {INSTALL}") from None
    return reasoning_gym


def dataset_seed(seed: int) -> int:
    """reasoning-gym's seed for a selection's: 0 stays 0; neighbours land far apart."""
    return seed * SPREAD % 2**32


def extract_answer(answer: str) -> str:
    """The answer a scorer reads: the last `<answer>...</answer>`'s content, else the whole answer, stripped."""
    tagged = ANSWER_TAGS.findall(answer)
    return (tagged[-1] if tagged else answer).strip()


class ReasoningGym:
    def __init__(self, name: str, options: dict[str, Any], spec: str | None = None):
        rg = reasoning_gym()
        self.name = spec or f"rg:{name}"
        options = dict(options)
        if "seed" in options:
            raise ValueError(f"{self.name}: the seed is the selection's (--seed, gate_seed, the RL step's)")
        self.default_size = int(options.pop("size", DEFAULT_SIZE))
        if self.default_size < 1:
            raise ValueError(f"{self.name}: size must be at least 1")
        known = rg.factory.DATASETS
        names = [n for n in name.split(",") if n]
        if not names:
            raise ValueError(f"{self.name}: name a reasoning-gym dataset, e.g. rg:spell_backward")
        self.curriculum: Curriculum | None = None
        if names == ["composite"] or len(names) > 1:
            if "curriculum" in options:
                raise ValueError(f"{self.name}: a curriculum is for one dataset, not a mix")
            self.mix = _mix(self.name, [n for n in names if n != "composite"], options, known)
            self.dataset, self.config = "composite", {}
        else:
            if names[0] not in known:
                raise ValueError(f"{self.name}: reasoning-gym has no dataset {names[0]!r} "
                                 f"(it has {len(known)}: {', '.join(sorted(known)[:8])}, ...)")
            threshold, window = options.pop("curriculum", None), int(options.pop("curriculum_window", 32))
            self.mix, self.dataset, self.config = None, names[0], options
            self.curriculum = Curriculum(self.name, names[0], float(threshold), window) if threshold else None
        self._built: dict[tuple[int, int, int], Any] = {}
        self._make(1, 0)  # a bad config fails here, naming the task set, not in the first rollout

    @property
    def level(self) -> int:
        """The curriculum's level tasks are dealt at now (0 without a curriculum)."""
        return self.curriculum.level if self.curriculum else 0

    def _make(self, size: int, seed: int, level: int = 0):
        """The dataset of `size` items under `seed` at curriculum `level` (built once: scoring rebuilds the
        selection's)."""
        key = (size, seed, level)
        dataset = self._built.get(key)
        if dataset is None:  # answers are scored from several threads: never read back what another may clear
            rg = reasoning_gym()
            seed = dataset_seed(seed)
            config = {**self.curriculum.config(level), **self.config} if self.curriculum else self.config
            try:
                if self.mix is None:
                    dataset = rg.create_dataset(self.dataset, size=size, seed=seed, **config)
                else:
                    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

                    specs = [DatasetSpec(n, w, dict(c)) for n, (w, c) in self.mix.items()]
                    dataset = CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))
            except (TypeError, ValueError, AssertionError, KeyError) as e:
                raise ValueError(f"{self.name}: reasoning-gym refused the config: {type(e).__name__}: {e}") from None
            if len(self._built) >= 64:  # RL deals a new seed every step
                self._built.clear()
            self._built[key] = dataset
        return dataset

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        if n is not None and n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        size = n if n is not None else self.default_size
        level = self.level
        dataset = self._make(size, seed, level)
        out = []
        for i in range(size):
            entry = dataset[i]
            source = entry.get("metadata", {}).get("source_dataset", self.dataset)
            out.append(Task(id=f"{source}-{seed}-{i}", prompt=str(entry["question"]), system=SYSTEM,
                            data={"dataset": source, "seed": seed, "size": size, "index": i,
                                  "answer": str(entry["answer"]), **({"level": level} if self.curriculum else {})}))
        return out

    def score(self, task: Task, answer: str) -> Check:
        """The dataset's own scorer on the answer, guarded: a scorer that raises or gives no number in
        [0, 1] is a failed rollout with the error kept."""
        d = task.data
        dataset = self._make(d["size"], d["seed"], d.get("level", 0))
        entry = dataset[d["index"]]
        given = extract_answer(answer)
        check = self._score(dataset, entry, given, d)
        if self.curriculum:
            self.curriculum.record(check.reward)
        return check

    @staticmethod
    def _score(dataset, entry: dict, given: str, d: dict) -> Check:
        try:
            score = float(dataset.score_answer(given, entry))
        except Exception as e:  # the scorer's failure is the rollout's, judged as wrong
            return Check(False, 0.0, f"{d['dataset']}: the scorer raised", error=f"{type(e).__name__}: {e}")
        if not math.isfinite(score) or not 0.0 <= score <= 1.0:
            return Check(False, 0.0, f"{d['dataset']}: the scorer gave {score!r}",
                         error=f"the scorer gave {score!r}, not a number in [0, 1]")
        return Check(score >= 1.0, score, f"{d['dataset']}: score {score:.3f}")

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        return self.score(task, answer)

    def reward(self, task: Task, answer: str) -> float:
        return self.score(task, answer).reward

    def demonstration(self, task: Task) -> str:
        """The dataset's answer, for SFT warm starts."""
        return task.data["answer"]


def _mix(label: str, names: list[str], options: dict[str, Any], known) -> dict[str, tuple[float, dict]]:
    """A composite's datasets: name -> (weight, config), from the names listed (weight 1) and the
    options: `NAME=WEIGHT`, `NAME.FIELD=VALUE`, or `datasets` as reasoning-gym's own list of
    {name, weight, config} (an RL config's `[env] options`)."""
    mix: dict[str, tuple[float, dict]] = {n: (1.0, {}) for n in names}
    for item in options.pop("datasets", []):
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"{label}: each of `datasets` is {{name, weight?, config?}}, not {item!r}")
        mix[item["name"]] = (float(item.get("weight", 1.0)), dict(item.get("config", {})))
    for key, value in options.items():
        dataset, dot, field = key.partition(".")
        weight, config = mix.get(dataset, (1.0, {}))
        if dot:
            config = {**config, field: value}
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            weight = float(value)
        else:
            raise ValueError(f"{label}: {key}={value!r}: in a mix, NAME=WEIGHT or NAME.FIELD=VALUE")
        mix[dataset] = (weight, config)
    if not mix:
        raise ValueError(f"{label}: a mix names its datasets, e.g. rg:composite?spell_backward=1&chain_sum=1")
    unknown = [n for n in mix if n not in known]
    if unknown:
        raise ValueError(f"{label}: reasoning-gym has no dataset {', '.join(map(repr, unknown))}")
    if any(w <= 0 for w, _ in mix.values()):
        raise ValueError(f"{label}: weights must be positive")
    return mix


class Curriculum:
    """reasoning-gym's curriculum for one family (`create_curriculum`), raised a level once the mean of the
    last `window` scores reaches `threshold`. Scores come from every answer scored (RL's rewards)."""

    def __init__(self, label: str, dataset: str, threshold: float, window: int):
        from reasoning_gym.factory import CURRICULA, create_curriculum

        if dataset not in CURRICULA:
            raise ValueError(f"{label}: reasoning-gym has no curriculum for {dataset!r}")
        if not 0.0 < threshold <= 1.0 or window < 1:
            raise ValueError(f"{label}: curriculum is a threshold in (0, 1] and curriculum_window at least 1")
        self.curriculum, self.threshold = create_curriculum(dataset), threshold
        self.scores: deque[float] = deque(maxlen=window)
        self.level = 0
        self._configs = {0: self._current()}
        self._lock = threading.Lock()  # answers are scored from several threads at once

    def _current(self) -> dict[str, Any]:
        config = dataclasses.asdict(self.curriculum.generate_configuration({}))
        return {k: v for k, v in config.items() if k not in ("seed", "size")}

    def config(self, level: int) -> dict[str, Any]:
        return self._configs[level]

    def record(self, score: float) -> None:
        with self._lock:
            self.scores.append(score)
            full = len(self.scores) == self.scores.maxlen
            if full and sum(self.scores) / len(self.scores) >= self.threshold and self.curriculum.increment_global_level():
                self.level += 1
                self._configs[self.level] = self._current()
                self.scores.clear()
