"""Rollouts: environments sample groups of completions through the OpenAI-compatible policy
server, score them, and turn them into token-level training samples.

Each sample carries its prompt and completion token ids, a loss mask (sampled tokens only),
the inference logprob of every sampled token and the policy version that sampled it. The
trainer never re-scores rollouts before the loss: the loss sees these inference logprobs.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from evals.env import RLEnvironment
from rl.advantages import Excluded, group_advantages
from rl.config import TrainConfig
from rl.model import ByteTokenizer


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    inference_logprobs: list[float]
    advantage: float
    reward: float
    version: int
    completion_mask: list[bool] | None = None
    """Which completion tokens the policy sampled (None: all). A multi-turn sample's completion
    also holds what the harness inserted between its replies: masked, logprob 0."""


@dataclass
class Batch:
    step: int
    samples: list[Sample]
    rewards: list[float]
    """Every scored rollout's reward (including groups that train nothing)."""
    version: int
    counts: dict[str, int] = field(default_factory=dict)
    """rollouts, errored, zero_advantage_groups, stale (dropped for max_off_policy_steps); signal_rollouts
    (those with an advantage: their group's rewards differ) and unsampled_rollouts (of those, the ones that
    yielded no sample), whose ratio the trainer reports as `sampled_share`."""


def rollout_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s rollouts (which tasks, and the sampler's seed) in a run seeded `seed`:
    apart for every (seed, step) of a run, and from the warm start's tasks (rl.train.WARM_START_SEED + step)."""
    return seed * 1_000_003 + step


class Orchestrator:
    def __init__(self, base_url: str, env: RLEnvironment, config: TrainConfig, version: int = 0, tokenizer=None):
        import openai

        self.env, self.config = env, config
        self.version = version
        """The policy version the server was last given (the trainer sets it): stamped on rollouts whose
        reply names none. The policy server names the version that sampled; vLLM does not."""
        self.tok = tokenizer or ByteTokenizer()
        """Makes the prompts' token ids: the policy's own tokenizer (rl.hf.HFTokenizer for Hugging Face models)."""
        self.client = openai.OpenAI(base_url=base_url, api_key="local", max_retries=2, timeout=config.request_timeout)
        self._timeout = openai.APITimeoutError
        self._queue: queue.Queue[Batch | BaseException] | None = None

    # --- one batch -------------------------------------------------------------------------------

    def collect(self, step: int) -> Batch:
        c = self.config
        tasks = self.env.tasks(c.batch_size, seed=rollout_seed(c.seed, step))
        prompts = [self.tok.chat(([{"role": "system", "content": t.system}] if t.system else [])
                                 + [{"role": "user", "content": t.prompt}]) for t in tasks]
        counts = {"rollouts": len(tasks) * c.group_size, "errored": 0, "timed_out": 0, "zero_advantage_groups": 0,
                  "stale": 0, "signal_rollouts": 0, "unsampled_rollouts": 0}  # each choice with an advantage is a sample
        loaded = self.version  # read before sampling: weights that arrive meanwhile are newer than this
        # return_token_ids: vLLM then sends each choice's token_ids, as the policy server always does. top_p pinned
        # to 1: the trainer scores the whole distribution, and vLLM would otherwise sample (and, with processed
        # logprobs, report) under the model's generation_config.json defaults (SmolLM2's top_p 0.9)
        try:
            resp = self.client.completions.create(
                model=c.rollout_model, prompt=prompts, n=c.group_size, max_tokens=c.max_tokens, temperature=c.temperature,
                top_p=1.0, logprobs=1, seed=rollout_seed(c.seed, step), extra_body={"return_token_ids": True},
            )
        except Exception as e:  # a failed or timed-out request: its rollouts are excluded and counted
            counts["timed_out" if isinstance(e, self._timeout) else "errored"] = counts["rollouts"]
            return Batch(step, [], [], -1, counts)
        version = int((resp.model_extra or {}).get("policy_version", loaded))
        samples, rewards = [], []
        for g, task in enumerate(tasks):
            group = resp.choices[g * c.group_size : (g + 1) * c.group_size]
            tokens: list[tuple[list[int] | None, list[float] | None]] = []
            scored: list[float | Excluded] = []
            for choice in group:
                ids = (choice.model_extra or {}).get("token_ids")
                lps = choice.logprobs.token_logprobs if choice.logprobs else None
                usable = bool(ids) and lps is not None and len(ids) == len(lps)
                tokens.append((ids, lps))
                scored.append(self.env.reward(task, choice.text) if usable else "errored")  # no usable tokens
            rewards += [r for r in scored if not isinstance(r, str)]
            advantages = group_advantages(scored, counts, std_normalize=c.std_normalize)
            for (ids, lps), r, a in zip(tokens, scored, advantages):
                if a is not None:
                    samples.append(Sample(prompts[g], ids, lps, a, r, version))
                    counts["signal_rollouts"] += 1
        return Batch(step, samples, rewards, version, counts)

    # --- running ahead ---------------------------------------------------------------------------

    def batches(self, start: int, stop: int):
        """Batches for steps start..stop-1. With async_level > 0 a sampler thread runs that many
        batches ahead of training; rollouts older than max_off_policy_steps are dropped."""
        c = self.config
        if c.async_level <= 0:
            for step in range(start, stop):
                yield self.collect(step)
            return
        q: queue.Queue = queue.Queue()
        # Sampling for step s may start once step s - async_level - 1 is trained: the sampler then
        # uses weights at most async_level steps old.
        ahead = threading.Semaphore(c.async_level + 1)

        def run() -> None:
            try:
                for step in range(start, stop):
                    ahead.acquire()
                    q.put(self.collect(step))
            except BaseException as e:  # surfaced to the trainer, never lost in a thread
                q.put(e)

        threading.Thread(target=run, daemon=True, name="rollouts").start()
        for step in range(start, stop):
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            fresh = [s for s in item.samples if step - s.version <= c.max_off_policy_steps]
            item.counts["stale"] = len(item.samples) - len(fresh)
            item.samples, item.step = fresh, step
            yield item
            ahead.release()  # the trainer asked for the next batch: this step is trained


def reload(url: str, path: Path, timeout: float, name: str = "policy") -> None:
    """Make the rollout server behind `url` sample from the weights at `path`; returns once it does. By the
    route `url` names:
    - `.../collective_rpc`: vLLM's (with VLLM_SERVER_DEV_MODE=1) reloads the model directory in place
      (`reload_weights`), then drops its prefix cache (`/reset_prefix_cache`: blocks of the old weights);
    - `.../load_lora_adapter`: vLLM's (with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) loads
      the adapter at `path` as `name`, replacing the one of that name;
    - anything else (the policy server's `/v1/reload`, a route of your own): POST {"path": ...}."""
    route = url.rstrip("/").rsplit("/", 1)[-1]
    if route == "collective_rpc":
        _post(url, {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}, path, timeout)
        _post(url.rstrip("/").removesuffix("collective_rpc") + "reset_prefix_cache", None, path, timeout)
    elif route == "load_lora_adapter":
        _post(url, {"lora_name": name, "lora_path": str(path), "load_inplace": True}, path, timeout)
    else:
        _post(url, {"path": str(path)}, path, timeout)


def _post(url: str, body: dict | None, path: Path, timeout: float) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else b"", method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
    except urllib.error.HTTPError as e:  # the server keeps its old weights: rollouts would silently go stale
        detail = e.read().decode(errors="replace")[:500]
        raise RuntimeError(f"{url}: the rollout server did not load {path}: {e.code} {detail}") from None
