"""Rollouts: environments sample groups of completions through OpenAI-compatible servers (the policy
server, vLLM; one or several: rl/fleet.py), score them, and turn them into token-level training samples.

Each sample carries its prompt and completion token ids, a loss mask (sampled tokens only),
the inference logprob of every sampled token and the policy version that sampled it. The
trainer never re-scores rollouts before the loss: the loss sees these inference logprobs.

Batch discipline (INTELLECT-2), both off by default: `train.skip_zero_advantage` drops groups whose
rollouts all score alike, and `train.difficulty` leaves out tasks the policy solves too often or too
rarely; more rounds of tasks then fill the batch (`Orchestrator.collect`).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from evals.env import RLEnvironment, Task
from rl.advantages import Excluded, group_advantages
from rl.config import TrainConfig
from rl.fleet import Fleet, NoServerLeft, reload  # noqa: F401  (reload: rl.orchestrator.reload, as before)
from rl.policy.tokenizer import ByteTokenizer
from rl.sample import Batch, Sample


COUNTS = ("rollouts", "errored", "timed_out", "zero_advantage_groups", "stale", "signal_rollouts",
          "unsampled_rollouts", "groups", "useful_groups", "extra_rounds")
DIFFICULTY_COUNTS = ("tasks_measured", "tasks_too_easy", "tasks_too_hard", "tasks_unmeasured")


def rollout_seed(seed: int, step: int, *draw: object) -> int:
    """The seed of step `step`'s rollouts (which tasks, and the sampler's seed) in a run seeded `seed`:
    apart for every (seed, step) of a run, and from the warm start's tasks (rl.train.WARM_START_SEED + step).
    `draw` names another draw of the same step (a round refilling its batch, a difficulty estimate, a server's
    share of a request): its seed is a hash, apart from every other."""
    base = seed * 1_000_003 + step
    if not draw:
        return base
    return int.from_bytes(hashlib.blake2b(repr((base, *draw)).encode(), digest_size=6).digest(), "big")


@dataclass
class Rollout:
    """One sampled completion: its prompt and tokens, their logprobs, its text, the policy version that sampled it."""

    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    text: str
    version: int


class Orchestrator:
    def __init__(self, servers: Fleet | str, env: RLEnvironment, config: TrainConfig, version: int = 0,
                 tokenizer=None):
        import openai

        self.env, self.config = env, config
        self.servers = servers if isinstance(servers, Fleet) else Fleet(
            [servers], version=version, timeout=config.request_timeout, model=config.rollout_model)
        """Where rollouts are sampled (rl/fleet.py). A server's `version` is stamped on rollouts whose reply
        names none: the policy server names the version that sampled, vLLM does not."""
        self.tok = tokenizer or ByteTokenizer()
        """Makes the prompts' token ids: the policy's own tokenizer (rl.hf.HFTokenizer for Hugging Face models)."""
        self._timeout = openai.APITimeoutError

    # --- one batch -------------------------------------------------------------------------------

    def collect(self, step: int) -> Batch:
        """Step `step`'s batch: the groups of batch_size tasks. With train.skip_zero_advantage, groups whose
        rollouts all score alike are dropped, and with train.difficulty, tasks solved too often or too
        rarely are left out; more rounds of tasks, each as many as the batch still lacks (at most
        train.max_rounds more), then fill it (INTELLECT-2)."""
        c = self.config
        counts = dict.fromkeys(COUNTS + (DIFFICULTY_COUNTS if c.difficulty else ()), 0)
        batch = Batch(step, [], [], -1, counts)
        rounds = c.max_rounds if c.skip_zero_advantage or c.difficulty else 0
        for r in range(rounds + 1):
            held = counts["useful_groups"] if c.skip_zero_advantage else counts["groups"]
            if held >= c.batch_size:
                break
            counts["extra_rounds"] = r
            seed = rollout_seed(c.seed, step, "round", r) if r else rollout_seed(c.seed, step)
            tasks = self.env.tasks(c.batch_size - held, seed=seed)
            if c.difficulty is not None:
                tasks = self.in_range(tasks, rollout_seed(c.seed, step, "difficulty", r), counts)
            if tasks:
                self.add_groups(batch, tasks, seed)
        return batch

    def add_groups(self, batch: Batch, tasks: list[Task], seed: int) -> None:
        """Each task's group of group_size rollouts, scored, with its advantages (rl.advantages), into `batch`;
        with train.skip_zero_advantage a group without signal is counted and dropped."""
        c, counts = self.config, batch.counts
        counts["rollouts"] += len(tasks) * c.group_size
        for task, group in zip(tasks, self.rollouts(tasks, c.group_size, seed)):
            scored = [r if isinstance(r, str) else self.env.reward(task, r.text) for r in group]
            batch.rewards += [x for x in scored if not isinstance(x, str)]
            versions = [r.version for r in group if not isinstance(r, str)]
            if versions:
                batch.version = min(versions) if batch.version < 0 else min(batch.version, *versions)
            advantages = group_advantages(scored, counts, std_normalize=c.std_normalize)
            useful = any(a is not None for a in advantages)
            if c.skip_zero_advantage and not useful:
                continue  # dropped: its rewards stay in the step's reward, its place goes to another task
            counts["groups"] += 1
            counts["useful_groups"] += useful
            for rollout, reward, a in zip(group, scored, advantages):
                if a is not None:  # each rollout with an advantage is a sample
                    batch.samples.append(Sample(rollout.prompt_ids, rollout.ids, rollout.logprobs, a, reward,
                                                rollout.version))
                    counts["signal_rollouts"] += 1

    def in_range(self, tasks: list[Task], seed: int, counts: dict[str, int]) -> list[Task]:
        """The tasks whose solve rate, from difficulty.samples rollouts each (which only measure: none trains),
        lies in [min_solve_rate, max_solve_rate]; the others are counted as too easy or too hard."""
        d = self.config.difficulty
        kept = []
        for task, group in zip(tasks, self.rollouts(tasks, d.samples, seed)):
            counts["tasks_measured"] += 1
            scored = [self.env.reward(task, r.text) for r in group if not isinstance(r, str)]
            if not scored:
                counts["tasks_unmeasured"] += 1
                continue
            rate = sum(x >= d.solved_at for x in scored) / len(scored)
            if rate > d.max_solve_rate:
                counts["tasks_too_easy"] += 1
            elif rate < d.min_solve_rate:
                counts["tasks_too_hard"] += 1
            else:
                kept.append(task)
        return kept

    def rollouts(self, tasks: list[Task], n: int, seed: int) -> list[list[Rollout | Excluded]]:
        """`n` completions of each task, or why each has none. The prompts are split into one share per live
        server, each share one request (a seed of its own) to the least-loaded server (rl/fleet.py): with one
        server, one request for the whole batch, which the policy server samples as one."""
        c = self.config
        prompts = [self.tok.chat(([{"role": "system", "content": t.system}] if t.system else [])
                                 + [{"role": "user", "content": t.prompt}]) for t in tasks]
        shares = max(1, min(len(self.servers.live), len(prompts)))
        bounds = [(len(prompts) * i // shares, len(prompts) * (i + 1) // shares) for i in range(shares)]

        def share(i: int) -> list[list[Rollout | Excluded]]:
            lo, hi = bounds[i]

            def request(client, server):
                loaded = server.version  # read before sampling: weights that arrive meanwhile are newer
                # return_token_ids: vLLM then sends each choice's token_ids, as the policy server always does.
                # top_p pinned to 1: the trainer scores the whole distribution, and vLLM would otherwise sample
                # (and, with processed logprobs, report) under the model's generation_config.json defaults
                # (SmolLM2's top_p 0.9)
                return client.completions.create(
                    model=c.rollout_model, prompt=prompts[lo:hi], n=n, max_tokens=c.max_tokens,
                    temperature=c.temperature, top_p=1.0, logprobs=1,
                    seed=seed if i == 0 else rollout_seed(seed, 0, "share", i),
                    extra_body={"return_token_ids": True}), loaded

            try:
                (resp, loaded), _ = self.servers.call(request)
            except NoServerLeft:
                raise
            except Exception as e:  # a failed or timed-out request: its rollouts are excluded and counted
                why: Excluded = "timed_out" if isinstance(e, self._timeout) else "errored"
                return [[why] * n for _ in range(lo, hi)]
            version = int((resp.model_extra or {}).get("policy_version", loaded))
            groups: list[list[Rollout | Excluded]] = []
            for g in range(hi - lo):
                group: list[Rollout | Excluded] = []
                for choice in resp.choices[g * n : (g + 1) * n]:
                    ids = (choice.model_extra or {}).get("token_ids")
                    lps = choice.logprobs.token_logprobs if choice.logprobs else None
                    usable = bool(ids) and lps is not None and len(ids) == len(lps)  # else nothing to train on
                    group.append(Rollout(prompts[lo + g], ids, lps, choice.text, version) if usable else "errored")
                groups.append(group)
            return groups

        if shares == 1:
            return share(0)
        with ThreadPoolExecutor(shares, thread_name_prefix="rollouts") as pool:
            return [g for part in pool.map(share, range(shares)) for g in part]

    # --- running ahead ---------------------------------------------------------------------------

    def batches(self, start: int, stop: int):
        """Batches for steps start..stop-1, each without its rollouts sampled by weights more than
        max_off_policy_steps steps older than the step's (dropped and counted as `stale`), however they came to
        be old: sampling ahead (async_level), a lagged sampler (policy_lag), a server behind on its reloads."""
        c = self.config
        for step, batch in zip(range(start, stop), self._sampled(start, stop)):
            fresh = [s for s in batch.samples if step - s.version <= c.max_off_policy_steps]
            batch.counts["stale"] = len(batch.samples) - len(fresh)
            batch.samples, batch.step = fresh, step
            yield batch

    def _sampled(self, start: int, stop: int):
        """The batches as sampled. With async_level > 0 a sampler thread runs that many batches ahead of
        training."""
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
        for _ in range(start, stop):
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            ahead.release()  # the trainer asked for the next batch: this step is trained
