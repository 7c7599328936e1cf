"""The sampler for Hugging Face causal LMs behind the policy server: continuous batching over a
key/value cache written in place, and a prefix cache of shared prompt heads.

- **Continuous batching.** Rows decode together one token per step. A request that arrives
  while others decode is prefilled and joins the running batch at the next step; a row that
  finishes leaves it at once. Every row ends at the same cache column (left-padded), so a step
  is one forward pass of the model as transformers defines it, with our cache (`Slots`) instead
  of its growing one: new keys and values are written in place, nothing is copied per step.
- **Prefix caching.** A prompt's keys and values are kept in blocks of `BLOCK` tokens, keyed by
  the whole prefix up to the block, and reused by the next prompt with the same head: the
  agent's system prompt is computed once per weights, not once per rollout. Identical prompts
  arriving together (a group's `n` rollouts) are prefilled once. New weights empty the cache.
- **Weights** swap in once the running rows have finished (new requests wait meanwhile), so a
  request finishes on the weights it started with and its reply names their version. A llama-shaped
  model runs on rl/decoder.py (fused, oneDNN-packed projections: the only copy of its weights); any
  other through transformers' own modules, over the same cache.
- **Memory follows the work.** The key/value slots hold the running rows' columns and no more: they
  grow as rows join and lengthen, shrink once half of them is unused, and are freed (and the C heap
  trimmed) when the batch empties; `rl serve` trims after each prefill too, and between its passes
  (`serving_heap`: a prefill's activations come from the heap, not each from a mapping of its own).
  The prefix cache keeps at most one full context of blocks by default (`--max-model-len` tokens of
  keys and values); `memory()` reports the breakdown (`GET /v1/models`: weights, kv_cache,
  prefix_cache, other; the process's PSS).

Each row samples with its own temperature and top-p, and a seeded request with its own
generator: what it samples does not depend on what else is in the batch. Logprobs are of each
sampled token under the temperature-scaled distribution (the trainer computes the same); at
temperature 0 (greedy), under the model's own. A row under a grammar (structured output,
rl/grammar.py) has its own matcher, and its logits masked before all of that: its logprobs are of
the masked, renormalised distribution it sampled from.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import queue
import statistics
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rl.decoder import Decoder, Slots, supports
from rl.grammar import Grammars, advance, mask_logits, start
from rl.hf import HFPolicy, HFTokenizer, load_hf, merged
from rl.policy.checkpoint import latest_checkpoint
from rl.policy.sampler import Job, Sampled

BLOCK = 16
"""Tokens per prefix-cache block: a prompt's head is reused in whole blocks."""
SHARED_HEAD = 8 * BLOCK
"""The fewest tokens that the running rows' prompts have in common for their keys and values to be held once."""


# --- the prefix cache ----------------------------------------------------------------------------


class PrefixCache:
    """Blocks of prompt keys and values ([layers, 2, kv_heads, BLOCK, head_dim]), least recently used
    first out once they hold more than `max_bytes`. A block is found by the exact tokens before it."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._blocks: OrderedDict[int, tuple[int, tuple[int, ...], torch.Tensor]] = OrderedDict()

    def _keys(self, ids: list[int], blocks: int):
        key = 0
        for b in range(blocks):
            chunk = tuple(ids[b * BLOCK : (b + 1) * BLOCK])
            parent, key = key, hash((key, chunk))
            yield parent, chunk, key

    def lookup(self, ids: list[int], most: int) -> list[torch.Tensor]:
        """The cached blocks that begin `ids`, at most `most` tokens of them."""
        found = []
        for parent, chunk, key in self._keys(ids, most // BLOCK):
            entry = self._blocks.get(key)
            if entry is None or entry[0] != parent or entry[1] != chunk:
                break
            self._blocks.move_to_end(key)
            found.append(entry[2])
        return found

    def store(self, ids: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Keep the whole blocks of a prompt whose keys and values (per layer [kv_heads, len, dim]) are given."""
        if self.max_bytes <= 0:
            return
        for b, (parent, chunk, key) in enumerate(self._keys(ids, len(ids) // BLOCK)):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            lo, hi = b * BLOCK, (b + 1) * BLOCK
            block = torch.stack([torch.stack([k[:, lo:hi] for k in keys]), torch.stack([v[:, lo:hi] for v in values])], 1)
            self._blocks[key] = (parent, chunk, block)
            self.bytes += block.numel() * block.element_size()
        while self.bytes > self.max_bytes and self._blocks:
            _, (_, _, old) = self._blocks.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()

    def clear(self) -> None:
        self._blocks.clear()
        self.bytes = 0


# --- the engine ----------------------------------------------------------------------------------


def sampling_defaults(generation_config) -> dict[str, float]:
    """`temperature` and `top_p` where the model's generation_config.json sets them apart from
    transformers' defaults (as vLLM's `--generation-config auto` reads them); empty where it says nothing."""
    given = generation_config.to_diff_dict() if generation_config is not None else {}
    return {k: float(given[k]) for k in ("temperature", "top_p") if isinstance(given.get(k), int | float)}


def _pss() -> int:
    """This process's proportional set size in bytes (0 where /proc does not say)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


def serving_heap() -> None:
    """glibc's heap set for a process that only serves (`prime-agent rl serve`), whose engine hands the
    free pages back itself, after each prefill and once no row runs (`HFEngine(trim=True)`): blocks under
    64 MB come from the heap and are reused, and the heap is not trimmed at each free. Before, blocks of
    1 MB and more were each mmapped, so that a freed one left at once (the slots a batch of long prompts
    left behind had stayed resident: 1.1 GB after a group of 16 1.3k-token prompts); but then every
    activation of a prefill was a fresh mapping, its pages faulted in: 494k page faults for a 1k-token
    prompt of SmolLM2 against 10-12k, 1.64-1.73 s against 0.88-0.91 (`bench/prefill.py --heap mmap-1mb`
    against `--heap serving`). Not for a trainer's process: its activations and gradients, trimmed away
    after each sampling step, would fault in again the same way."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD (set, it no longer rises on its own)
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD (else the heap's top went back at every free of 128 kB)
    except (OSError, AttributeError):  # not glibc
        pass


def _trim(collect: bool = False) -> None:
    """Hand the C heap's free pages back to the system (glibc keeps freed activations and cache
    buffers below its mmap threshold, which rises to 32 MB as large blocks are freed); `collect`
    first frees what only reference cycles held (a transformers model's modules)."""
    if collect:
        gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class _Threads:
    """How many of torch's threads a decode step (and a prefill) uses, chosen by the time steps take:
    every `period` steps each choice (one thread, all of them) runs `trial` steps and the faster is
    kept until the next trial (a choice that wins again doubles the period, up to `longest`). On a
    quiet CPU all threads win; on a loaded one (more runnable threads than cores) one thread was
    1.8-6x as fast here (53-180 vs 145-538 ms a step at batch 16, load 7.5 on 2 cores), as each of a
    step's ~600 parallel regions waits for a thread the system has descheduled.

    A prefill (a prompt's tokens at once: work for every thread) takes all threads unless one thread won
    the last trial by half again (`prefill`): a loaded machine. A near tie of small decode steps says
    nothing about a prefill: quiet, one thread prefilled 1k tokens of SmolLM2 in 1.68 s, two in 0.88, and
    a server whose decode trial had picked one thread took 1.56 s to a cold first token, not 1.07."""

    DECISIVE = 1.5

    def __init__(self, most: int, period: int = 64, trial: int = 3, longest: int = 1024):
        self.choices = sorted({1, most})
        self.period, self.trial, self.shortest, self.longest = period, trial, period, longest
        self.best, self.steps, self.prefill = most, 0, most
        self.times: dict[int, list[float]] = {}

    def next(self) -> int:
        """The thread count for the next step."""
        phase = self.steps % self.period
        return self.choices[phase // self.trial] if phase < self.trial * len(self.choices) else self.best

    def took(self, threads: int, seconds: float) -> None:
        phase = self.steps % self.period
        self.steps = phase + 1  # steps since the last trial began
        if phase < self.trial * len(self.choices):
            self.times.setdefault(threads, []).append(seconds)
            if phase == self.trial * len(self.choices) - 1:  # a choice that keeps winning is tried less often
                median = {n: statistics.median(t) for n, t in self.times.items()}
                best, most = min(median, key=median.__getitem__), self.choices[-1]
                self.period = min(2 * self.period, self.longest) if best == self.best else self.shortest
                self.prefill = best if median[most] >= self.DECISIVE * median[best] else most
                self.best, self.times = best, {}


@dataclass
class _Row:
    job: Job
    index: int
    prompt: list[int]
    limit: int
    generator: torch.Generator | None
    matcher: Any = None
    """Its grammar's state (rl/grammar.py), when its job is constrained."""
    last: int = 0
    """The token sampled last, not yet in the cache: the next step's input."""
    out: Sampled = field(default_factory=lambda: Sampled([], [], "length"))


class HFEngine:
    """A Hugging Face causal LM and a worker thread that samples the queued jobs (see the module doc).

    `max_rows` rows decode at once (requests beyond wait); a prefill pass computes at most
    `max_batched_tokens` new tokens; `context` is the longest sequence
    (`--max-model-len`, default the model's); `prefix_cache_mb` caps the prefix cache (default: the
    keys and values of one full context)."""

    def __init__(self, policy: HFPolicy, name: str = "prime-policy", version: int = 0, truncate: bool = False,
                 dtype: torch.dtype = torch.float32, prefix_cache_mb: int | None = None, max_rows: int = 64,
                 context: int | None = None, thread: bool = True, base: dict[str, torch.Tensor] | None = None,
                 max_batched_tokens: int = 2048, trim: bool = False):
        if policy.tokenizer is None:
            raise ValueError("the model has no tokenizer: serve a model directory with its tokenizer files")
        config = policy.inner.config
        if getattr(config, "sliding_window", None) or any(t != "full_attention" for t in
                                                          getattr(config, "layer_types", None) or ()):
            raise ValueError(f"{config.model_type}: sliding-window or hybrid attention layers are not supported")
        self.model = policy.to(dtype).eval()
        self.tok: HFTokenizer = policy.tokenizer
        self.name, self.version, self.truncate = name, version, truncate
        self.dtype = dtype
        self.context = context or policy.context
        self.vocab_size = int(config.vocab_size)
        self.max_rows = max_rows
        self.max_batched_tokens = max(BLOCK, max_batched_tokens)
        """New tokens per prefill pass, at most (`--max-num-batched-tokens`): bounds the activations."""
        self.sampling = sampling_defaults(policy.inner.generation_config)
        """The model's own sampling defaults, advertised in /v1/models (`sampling_defaults`)."""
        self.tools = self.tok.renders_tools
        """Whether its chat template renders a request's tools (advertised in /v1/models: `tools`)."""
        eos = policy.inner.generation_config.eos_token_id if policy.inner.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos = set(eos) | ({self.tok.tok.eos_token_id} if self.tok.tok.eos_token_id is not None else set())
        self.grammars = Grammars(self.tok, self.vocab_size, self.eos)
        """Structured output (rl/grammar.py): a constrained row's logits are masked before it samples."""
        heads = config.num_key_value_heads or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._layout = (config.num_hidden_layers, heads, dim)
        self.token_bytes = 2 * config.num_hidden_layers * heads * dim * dtype.itemsize
        """Bytes of keys and values per token."""
        self._shapes = {k: v.shape for k, v in self.model.inner.state_dict().items()}
        self.parameters = policy.num_params()
        self.base = base
        """The weights a LoRA adapter is merged into (`load`): the base model's, when the served model is
        base + adapter; else those served when the first adapter arrives."""
        self.decoder = Decoder(self.model.inner, batch=min(max_rows, 16)) if supports(self.model.inner) else None
        """The forward pass of a llama-shaped model (rl/decoder.py), which then holds its weights; None:
        transformers' own modules run."""
        if prefix_cache_mb is None:
            prefix_cache_mb = -(-self.context * self.token_bytes >> 20)
        self.prefix = PrefixCache(prefix_cache_mb << 20)
        self.slots = Slots(*self._layout, dtype)
        self.rows: list[_Row] = []
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0, "steps": 0}
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._waiting: list[Job] = []
        self._starting: list[Job] = []
        """The jobs whose rows are being prefilled (in neither `_waiting` nor the rows)."""
        self._pending: tuple[dict, int] | None = None
        self._unstored: list[tuple[list[int], list[torch.Tensor], list[torch.Tensor]]] = []
        """Prompts prefilled whose blocks the prefix cache does not hold yet (`_store`)."""
        self._lock = threading.Lock()
        self._rng = torch.Generator().manual_seed(0)
        self._threads = _Threads(torch.get_num_threads())
        self.trim = trim
        """Hand the C heap's free pages back after each prefill (its activations: `serving_heap`), not only
        once no row runs."""
        self._prefilled = False
        _trim(collect=True)  # the model as loaded, before its weights were fused and packed
        self._stopping = False
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self.run, daemon=True, name="hf-sampler")
            self._thread.start()

    def memory(self) -> dict[str, int]:
        """Bytes: the weights held, the key/value slots, the prefix cache, the rest of the process
        (`other`: Python, torch, the tokenizer, activations, the C heap) and its PSS (all of it)."""
        weights = self.decoder.nbytes if self.decoder else sum(
            t.numel() * t.element_size() for t in {id(t): t for t in self.model.state_dict().values()}.values())
        parts = {"weights": weights, "kv_cache": self.slots.nbytes, "prefix_cache": self.prefix.bytes}
        pss = _pss()
        return {**parts, "other": max(0, pss - sum(parts.values())), "pss": pss}

    # --- weights -------------------------------------------------------------------------------

    def update(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """New weights, swapped in once the running rows finish. Raises ValueError, and keeps the
        current weights, when they do not fit this model."""
        current = self._shapes
        wrong = sorted(k for k in current.keys() | state_dict.keys()
                       if k not in state_dict or k not in current or state_dict[k].shape != current[k])
        if wrong:
            raise ValueError(f"the weights do not fit this model (e.g. {', '.join(wrong[:3])})")
        with self._lock:
            self._pending = ({k: v.detach().to(self.dtype, copy=True) for k, v in state_dict.items()}, version)
        self._jobs.put(None)  # wake the worker if it is idle

    def load(self, path: Path) -> int:
        """Hot-reload a model directory, or a LoRA adapter's (only the adapter is read: merged into `base`);
        returns its version (from its COMPLETE marker, or one more)."""
        path = latest_checkpoint(path) or path
        version = int((path / "COMPLETE").read_text()) if (path / "COMPLETE").is_file() else self.version + 1
        if (path / "adapter_config.json").is_file():
            from safetensors.torch import load_file

            if self.base is None:
                weights = self.decoder.state_dict() if self.decoder else self.model.inner.state_dict()
                self.base = {k: v.to(torch.float32, copy=True) for k, v in weights.items()}
            config = json.loads((path / "adapter_config.json").read_text())
            self.update(merged(self.base, load_file(str(path / "adapter_model.safetensors")), config), version)
        else:
            self.update(load_hf(path).inner.state_dict(), version)
        return version

    def _swap(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        try:
            if self.decoder:
                self.decoder.load(pending[0])
            else:
                self.model.inner.load_state_dict(pending[0])
            self.version = pending[1]
            self.prefix.clear()  # its keys and values came from the old weights
            self._unstored = []
        except (RuntimeError, ValueError) as e:  # keep serving the weights it has
            print(f"policy server: could not load new weights: {e}", flush=True)
        del pending
        _trim(collect=True)  # the old weights and the new ones as they came

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] fp32 from final hidden states [rows, dim]."""
        return self.decoder.logits(h) if self.decoder else (h @ self.model.output_weight.T).float()

    # --- sampling ------------------------------------------------------------------------------

    def submit(self, job: Job) -> Job:
        self._jobs.put(job)
        return job

    def run(self) -> None:
        """Sample queued jobs, forever: in a thread of its own unless the engine was made with
        `thread=False`, to run here. On the CPU the main thread is the faster place: once it has
        used torch's OpenMP threads, a step from another thread takes ~1.5x as long (46 vs 68 ms at
        batch 16 here), so `prime-agent rl serve` samples in its main thread and answers HTTP in another."""
        with torch.inference_mode():
            while not self._stopping:
                self._admit(block=not self.rows)
                ran = bool(self.rows)
                if ran:
                    try:
                        self._step()
                    except Exception as e:  # a failed step fails its requests, not the server
                        self._fail(e)
                if (ran and not self.rows) or (self.trim and self._prefilled):  # its first tokens went out before
                    _trim()
                    self._prefilled = False

    def stop(self) -> None:
        """End the sampling thread (after the step it is in) and fail what was still to sample: a process
        must not exit while that thread runs a step in torch's C++ (it aborted: "terminate called without
        an active exception", seen at the end of training with rollouts for a next step in flight)."""
        self._stopping = True
        self._jobs.put(None)  # wake it if it is idle
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.close()

    def close(self) -> None:
        """Fail every job not finished (the server is stopping), so no one waits on them. Call it once
        `run` has returned (or from its thread)."""
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            if job is not None:
                self._waiting.append(job)
        error = RuntimeError("the server is shutting down")
        if self.rows:
            self._fail(error)
        for job in self._waiting + self._starting:
            if not job.done.is_set():
                job.error = error
                job.done.set()
        self._waiting, self._starting = [], []

    def _admit(self, block: bool) -> None:
        """Take the queued jobs; start their rows unless new weights wait for the running ones to end."""
        try:
            while True:
                job = self._jobs.get(block=block and not self._waiting)
                block = False
                if job is not None:
                    self._waiting.append(job)
        except queue.Empty:
            pass
        if self._pending is not None:
            if self.rows:
                return
            self._swap()
        for job in (j for j in self._waiting if j.cancelled):  # hung up before it started
            job.done.set()
        self._waiting = [j for j in self._waiting if not j.cancelled]
        jobs = []
        while self._waiting and (not (self.rows or jobs) or
                                 len(self.rows) + sum(len(j.prompts) for j in jobs + self._waiting[:1]) <= self.max_rows):
            jobs.append(self._waiting.pop(0))
        if jobs:
            self._starting = jobs  # left set if a signal stops the server meanwhile: `close` fails them too
            try:
                self._start(jobs)
            except Exception as e:
                for job in jobs:
                    self._fail(e, job)
            self._starting = []

    def _start(self, jobs: list[Job]) -> None:
        """Prefill the jobs' rows (each distinct prompt once, in batches) and add them to the running batch."""
        rows: list[_Row] = []
        for job in jobs:
            job.version, job.cached, job.result = self.version, [0] * len(job.prompts), [None] * len(job.prompts)
            gen = torch.Generator().manual_seed(job.seed) if job.seed is not None else None
            for i, prompt in enumerate(job.prompts):
                row = _Row(job, i, prompt, max(0, min(job.max_tokens, self.context - len(prompt))), gen,
                           start(job.grammar) if job.grammar is not None else None)
                if row.limit == 0:
                    job.result[i] = row.out
                else:
                    rows.append(row)
            if not any(r.job is job for r in rows):
                job.done.set()
        head = self._shared_head([r.prompt for r in rows])
        distinct = list(dict.fromkeys(tuple(r.prompt) for r in rows))
        share = bool(head) and not self.slots.head
        results, head_kv = self._prefill([list(p) for p in distinct], head, keep_head=share)
        prefilled = dict(zip(distinct, results))
        if share:  # the running rows' columns of it are dropped (`share` moves them out)
            self.slots.share(list(distinct[0][:head]), *head_kv)
        seen: set[tuple[int, ...]] = set()
        for r in rows:
            key = tuple(r.prompt)
            r.job.cached[r.index] = len(r.prompt) - (prefilled[key][3] if key not in seen else 0)
            seen.add(key)
            self.stats["prompt_tokens"] += len(r.prompt)
            self.stats["cached_tokens"] += r.job.cached[r.index]
        # the first tokens go out before the rows' keys and values are copied into the slots and the cache
        ended = self._emit(rows, torch.stack([prefilled[tuple(r.prompt)][2] for r in rows])) if rows else []
        self._store()
        for r in rows:
            self.slots.add(*prefilled[tuple(r.prompt)][:2])
            self.rows.append(r)
        for r in ended:
            self._finish(r)
        self._prefilled = True

    def _shared_head(self, prompts: list[list[int]]) -> int:
        """How many tokens the rows' keys and values leave out, as the slots hold them once for every row
        (`Slots.share`): the head they hold already, where every new prompt begins with it (else they
        write it back into each row), or the whole blocks that the running and the new prompts all begin
        with, where those are at least `SHARED_HEAD` tokens (an RL group's prompt); 0 for none."""
        s = self.slots
        if s.head and all(len(p) > len(s.head) and p[: len(s.head)] == s.head for p in prompts):
            return len(s.head)
        s.unshare()
        every = [r.prompt for r in self.rows] + prompts
        if self.decoder is None or len(every) < 2:
            return 0
        common = len(os.path.commonprefix(every))
        head = min(common, min(map(len, every)) - 1) // BLOCK * BLOCK
        return head if head >= SHARED_HEAD else 0

    def _prefill(self, prompts: list[list[int]], skip: int = 0,
                 keep_head: bool = False) -> tuple[list[tuple], tuple | None]:
        """Per prompt: its keys and values (per layer [kv_heads, length, head_dim]) from token `skip` on,
        its last position's logits, and how many of its tokens were computed (the rest came from the
        prefix cache); with `keep_head`, also the first prompt's keys and values of its first `skip` tokens,
        for the slots to hold as their shared head (`Slots.share`): views of its pass's own buffers where
        it was the pass's only row and its tail after the head is at most an eighth of the head (a group's
        one prompt: 60 MB of SmolLM2's 1.3k-token one not copied, nor freed while the group runs), else a
        copy (the views would hold the whole pass).

        A pass covers at most `max_batched_tokens` new tokens, as vLLM's chunked prefill does, so the
        activations are bounded whatever arrives at once. Prompts are taken shortest uncached tail first,
        and the cache is looked up again before each pass: of a wave of prompts that share a head (an RL
        group's system prompt), the first computes the head and the others start after it. Prompts whose
        tails are of about the same length share a pass: each is left-padded to end at the same column, and
        the pass covers the longest tail (a shorter one recomputes a few cached tokens before its own); the
        pass's keys and values, cached heads included, are at most `max_batched_tokens` columns over its
        rows (16 rollouts of a 1.3k-token prompt in one pass held 0.9 GB of them in fp32). A
        tail longer than the budget is computed a chunk at a time, each chunk kept in the prefix cache for
        the next."""
        torch.set_num_threads(self._threads.prefill)  # one thread only where it clearly won (2.7x at load 6 here)
        budget, out, head = self.max_batched_tokens, {}, []
        computed = [0] * len(prompts)
        todo = list(range(len(prompts)))
        passes = 0
        while todo:
            self._store()  # what the last pass computed, before looking the cache up again
            if passes and self.trim:  # and its buffers' pages back (else the next pass's grew the heap: 60 MB at times)
                _trim()
            passes += 1
            tails = {}
            for i in todo:
                p = prompts[i]
                blocks = self.prefix.lookup(p, ((len(p) - 1) // BLOCK) * BLOCK)  # >= 1 token computed: its logits
                tails[i] = (p, blocks, len(p) - len(blocks) * BLOCK)
            todo.sort(key=lambda i: tails[i][2])
            first = todo[0]
            p, blocks, tail = tails[first]
            end = len(blocks) * BLOCK + budget // BLOCK * BLOCK
            if tail > budget and end < len(p) and self.prefix.max_bytes >= end * self.token_bytes:
                self._prefill_batch([(p[:end], blocks, end - len(blocks) * BLOCK)])  # a chunk, into the cache
                computed[first] += end - len(blocks) * BLOCK
                continue
            batch = [todo.pop(0)]
            while todo and tails[todo[0]][2] <= 2 * tail + BLOCK and (len(batch) + 1) * tails[todo[0]][2] <= budget \
                    and (len(batch) + 1) * max(len(prompts[i]) for i in (*batch, todo[0])) <= budget:
                batch.append(todo.pop(0))
            for i, (keys, values, logits, n) in zip(batch, self._prefill_batch([tails[i] for i in batch])):
                if keep_head and i == 0:  # its pass's buffers, where they hold little more than the head
                    held = len(batch) == 1 and (len(prompts[0]) - skip) * 8 <= skip
                    head = [[k[:, :skip] if held else k[:, :skip].clone() for k in x] for x in (keys, values)]
                if skip:  # copied out, so that the pass's buffers go with it
                    keys, values = ([k[:, skip:].clone() for k in x] for x in (keys, values))
                out[i] = (keys, values, logits, computed[i] + n)
        return [out[i] for i in range(len(prompts))], tuple(head) or None

    def _prefill_batch(self, tails: list[tuple[list[int], list[torch.Tensor], int]]) -> list[tuple]:
        new = max(t for _, _, t in tails)
        end = max(len(p) for p, _, _ in tails)
        pre = Slots(*self._layout, self.dtype, rows=len(tails), cols=end)
        pre.n, pre.t, pre.start = len(tails), end - new, [end - len(p) for p, _, _ in tails]
        ids = torch.zeros(len(tails), new, dtype=torch.long)
        positions = torch.zeros(len(tails), new, dtype=torch.long)
        for r, (p, blocks, _) in enumerate(tails):
            if (pad := min(pre.start[r], pre.t)) > 0:  # the columns before a shorter prompt, which the pass
                for layer in range(len(pre.k)):  # does not write: zeros (attention reads them, masked)
                    pre.k[layer][r, :, :pad] = 0
                    pre.v[layer][r, :, :pad] = 0
            if blocks:  # the cached head, in place before the pass (what the pass covers it recomputes)
                kv = torch.cat(blocks, dim=3)  # [layers, 2, heads, cached, dim]
                lo = pre.start[r]
                for layer in range(len(pre.k)):
                    pre.k[layer][r, :, lo : lo + kv.shape[3]] = kv[layer, 0]
                    pre.v[layer][r, :, lo : lo + kv.shape[3]] = kv[layer, 1]
            first = len(p) - new  # the prompt index at the pass's first column (< 0: padding)
            ids[r, max(0, -first):] = torch.tensor(p[max(0, first):])
            positions[r] = (torch.arange(new) + first).clamp(min=0)
        h = self._forward(pre, ids, positions)
        pre.t += new
        logits = self._logits(h)
        results = []
        for r, (p, _, _) in enumerate(tails):
            keys, values = pre.row(r)
            self._unstored.append((p, keys, values))
            results.append((keys, values, logits[r], min(new, len(p))))
        return results

    def _store(self) -> None:
        """Keep the prompts prefilled last in the prefix cache: after the first tokens went out (a prompt's
        1k tokens of SmolLM2 are 47 MB of keys and values to copy, 11-13 ms here), and before the cache is
        looked up again."""
        for p, keys, values in self._unstored:
            self.prefix.store(p, keys, values)
        self._unstored = []

    def _forward(self, slots: Slots, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The final hidden states [n, dim] of the rows' last new tokens; their keys and values go into
        `slots` at columns t.. (the caller moves t)."""
        new = ids.shape[1]
        if self.decoder:
            slots.reserve(slots.n, slots.t + new)
            head = (slots.head_k, slots.head_v) if slots.head else None
            causal = new > 1 and not any(slots.start) and head is None  # a prefill with no row padded
            return self.decoder.forward(ids, positions, slots.k, slots.v, slots.t, None if causal else slots.mask(new),
                                        head)
        out = self.model.inner.base_model(input_ids=ids, position_ids=positions, attention_mask=slots.mask(new),
                                          past_key_values=slots.cache(new), use_cache=True)
        return out.last_hidden_state[:, -1]

    def _step(self) -> None:
        s = self.slots
        ids = torch.tensor([[r.last] for r in self.rows])
        positions = torch.tensor([[s.t - lo + len(s.head)] for lo in s.start])
        threads = self._threads.next()
        torch.set_num_threads(threads)
        started = time.perf_counter()
        logits = self._logits(self._forward(s, ids, positions))
        self._threads.took(threads, time.perf_counter() - started)
        s.t += 1
        self.stats["steps"] += 1
        for r in self._emit(list(self.rows), logits):
            self._finish(r)

    def _emit(self, rows: list[_Row], logits: torch.Tensor) -> list[_Row]:
        """Sample each row's next token from its logits [len(rows), vocab] and hand it to its job; the rows
        that end, for the caller to finish. Rows that share a generator (a seeded job's own, or the
        engine's) sample in one call, in the job's row order. A constrained row's logits are masked first:
        its logprobs are of what it sampled from."""
        matchers = [r.matcher for r in rows]
        if any(m is not None for m in matchers):
            mask_logits(logits, matchers, self.grammars.executor())
        temps = torch.tensor([r.job.temperature if r.job.temperature > 0 else 1.0 for r in rows])
        logp = F.log_softmax(logits / temps[:, None], dim=-1)
        tokens = logits.argmax(-1).tolist()
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            if r.job.temperature > 0:
                groups.setdefault(id(r.generator), []).append(i)
        for group in groups.values():
            group.sort(key=lambda i: (id(rows[i].job), rows[i].index))
            probs = logp[group].exp()
            top_p = torch.tensor([rows[i].job.top_p for i in group])[:, None]
            if (top_p < 1.0).any():
                sorted_p, order = probs.sort(dim=1, descending=True)
                keep = (sorted_p.cumsum(1) - sorted_p < top_p) | (top_p >= 1.0)
                probs = torch.zeros_like(probs).scatter(1, order, sorted_p * keep)
            picked = torch.multinomial(probs, 1, generator=rows[group[0]].generator or self._rng)[:, 0].tolist()
            for i, token in zip(group, picked):
                tokens[i] = token
        lps = logp.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
        ended = []
        for r, token, lp in zip(rows, tokens, lps):
            if r.matcher is not None:
                advance(r.matcher, token)
            r.out.tokens.append(token)
            r.out.logprobs.append(lp)
            r.last = token
            stopped = bool(r.job.on_token(r.index, token, lp)) if r.job.on_token else False
            if r.job.cancelled:
                r.out.finish_reason = "abort"
                ended.append(r)
            elif (token in self.eos and not r.job.ignore_eos) or stopped:
                r.out.finish_reason = "stop"  # the stop token is kept, with its logprob: the policy chose it
                ended.append(r)
            elif len(r.out.tokens) >= r.limit:
                ended.append(r)
        return ended

    def _finish(self, row: _Row) -> None:
        i = self.rows.index(row)
        self.slots.remove(i)
        self.rows[i] = self.rows[-1]
        self.rows.pop()
        job = row.job
        job.result[row.index] = row.out
        if all(x is not None for x in job.result) and not any(r.job is job for r in self.rows):
            job.done.set()

    def _fail(self, error: BaseException, job: Job | None = None) -> None:
        """A job that could not run fails; a failed step fails every running job (the batch restarts)."""
        jobs = {id(r.job): r.job for r in self.rows} if job is None else {id(job): job}
        for j in jobs.values():
            j.error = error
        if job is None:
            self.rows.clear()
            self.slots = Slots(*self._layout, self.dtype)
        else:
            for r in [r for r in self.rows if r.job is job]:
                self._finish(r)
        for j in jobs.values():
            j.done.set()
