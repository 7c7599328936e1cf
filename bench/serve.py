"""Policy server benchmark, ours beside the real vLLM: prints a table and writes bench/results/serve.json.

    .venv/bin/python bench/serve.py [--ours] [--vllm] [--url URL ...] [--model NAME|DIR]
    .venv/bin/python bench/serve.py --build-vllm      # builds .venv-vllm/ (bench/vllm_venv.sh), ~3.4 GB

With no server named it measures ours and, where its venv is built, vLLM, one after the other
(never both up at once; `--order vllm,ours` reverses them: run both, the machine's load drifts),
each started here and stopped after; `--url` measures a server already running (any
OpenAI-compatible one). It prints the load average before and after. Every figure goes over HTTP,
as the agent and the RL trainer reach a server:

- decode: tokens/s summed over 1, 8, 16 and 32 concurrent chat requests (short prompts, greedy,
  `max_tokens` fixed with `ignore_eos`): generated tokens / wall time, after a warm-up;
- time to first token (streamed) of a ~1k-token prompt: the server's first request (what a user
  sees after it starts), a new prompt after the warm-up (cold: nobody sent its start before), and
  the same prompt again (its prefix cached);
- the prefill the prefix cache saves for a group of 16 rollouts of the agent's own first request
  (its text-mode system prompt and a kernel_tasks question), sent at once as an RL group is:
  sum(usage.prompt_tokens_details.cached_tokens) / sum(usage.prompt_tokens), and the group's latency.
  Three groups: the first (the server has never seen the prompt), the next step's (same system
  prompt, another task), and the group as rollouts send it today (each rollout's system prompt
  names its own temporary workspace on its first line, which ends the prefix the group shares);
- memory: the PSS of the server's processes sampled every 50 ms, the peak of each measure and of the
  run; each measure's peak resident set as the kernel kept it (VmHWM, not sampled); and ours' own
  breakdown after (GET /v1/models: weights, KV cache, prefix cache, other). The sampling pauses
  while a time to first token is measured: reading /proc/PID/smaps_rollup every 50 ms holds the
  server's memory-map lock, and it doubled ours' cold time to first token (1.09-1.14 s alone,
  2.35-2.58 s sampled: a 1k-token prompt, one process at a time, on an idle machine).

This machine has 2 cores, shared with whatever else runs: compare servers only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from agent.config_models import Config  # noqa: E402
from agent.prompt import system_prompt  # noqa: E402
from bench.kernel import descendants, proc_kb, pss_kb  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from evals.runner import prompt_of, workspace  # noqa: E402
from evals.tasksets.kernel_tasks import KernelTasks  # noqa: E402
from rl.pull import ModelError, resolve  # noqa: E402

VENV_BIN = Path(sys.executable).parent
VLLM_VENV = ROOT / ".venv-vllm"  # where bench/vllm_venv.sh builds it by default (gitignored)
DEFAULT_MODEL = "smollm2-135m-instruct"
WORDS = ("the river north light stone market winter garden signal paper engine harbor silver orchard "
         "window letter valley forest number bridge morning castle thunder island pocket shadow").split()


# --- servers ----------------------------------------------------------------------------------

class NotReady(Exception):
    """A server that could not be started or never answered /v1/models; the message says why."""


@dataclass
class Server:
    """A server to measure: where it answers, the model id it serves, and its process if we started it."""
    name: str
    base_url: str
    model: str = ""
    proc: subprocess.Popen | None = None
    log: Path | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    tmp: Path | None = None
    """Its TMPDIR, removed once it stopped (vLLM leaves its ZMQ sockets and torch's compile cache there)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_model(model: str) -> Path | None:
    """The directory a model spec names (a directory, or an installed name: rl.pull.resolve); None if neither."""
    try:
        return resolve(model).resolve()
    except ModelError:
        return None


def log_tail(path: Path | None, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path and path.exists() else ""


def spawn(name: str, argv: list[str], env: dict[str, str], port: int, logs: Path, launch: dict) -> Server:
    log = logs / f"{name}.log"
    with open(log, "wb") as out:
        # Its own session (and process group), so that stop() ends it with everything it started.
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=ROOT, start_new_session=True)
    return Server(name, f"http://127.0.0.1:{port}/v1", proc=proc, log=log, launch={"argv": argv, **launch})


def start_ours(model: str, logs: Path) -> Server:
    exe = VENV_BIN / "prime-agent"
    if not exe.exists():
        raise NotReady(f"no {exe}: install the project first (bash scripts/setup.sh)")
    port = free_port()
    argv = [str(exe), "rl", "serve", "--model", model, "--port", str(port)]  # a name or a directory, as given
    return spawn("ours", argv, dict(os.environ), port, logs, {"model": model})


def vllm_ready(venv: Path) -> str | None:
    """None when the vLLM venv is built, else why it cannot run."""
    if not (venv / "bin" / "python").exists():
        return f"no vLLM venv at {venv} (build it: .venv/bin/python bench/serve.py --build-vllm)"
    if not (venv / ".complete").exists():
        return f"the vLLM venv at {venv} is incomplete (its build failed or was cut short: rerun --build-vllm)"
    return None


def start_vllm(model: str, logs: Path, dtype: str, venv: Path) -> Server:
    if why := vllm_ready(venv):
        raise NotReady(why)
    if (resolved := resolve_model(model)) is None:
        raise NotReady(f"vLLM needs a model directory or an installed model's name, not {model!r}")
    port = free_port()
    ncpu = os.cpu_count() or 1
    env = dict(os.environ,
               # OMP_NUM_THREADS alone puts every thread on one core (0.4 tok/s): bind them to all cores.
               VLLM_CPU_OMP_THREADS_BIND=f"0-{ncpu - 1}", VLLM_CPU_NUM_OF_RESERVED_CPU="0",
               VLLM_CPU_KVCACHE_SPACE="2",  # GiB of KV cache; ~5 GB RSS in all
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("OMP_NUM_THREADS", None)
    env["TMPDIR"] = tmp = tempfile.mkdtemp(prefix="vllm-")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")
    served = resolved.name if Path(model).is_dir() else model
    # The `vllm` command fails (the distribution is named vllm-cpu): run the server's module.
    # Prefix caching is on by default in V1; --enable-prompt-tokens-details makes usage report it.
    argv = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(resolved), "--served-model-name", served, "--port", str(port), "--host", "127.0.0.1",
            "--dtype", dtype, "--enforce-eager", "--enable-prompt-tokens-details", "--uvicorn-log-level", "warning"]
    version = (venv / ".complete").read_text().strip()
    server = spawn("vllm", argv, env, port, logs, {"model": str(resolved), "version": version, "dtype": dtype,
                                                    **{k: env[k] for k in ("VLLM_CPU_OMP_THREADS_BIND",
                                                                           "VLLM_CPU_KVCACHE_SPACE")}})
    server.tmp = Path(tmp)
    return server


async def wait_ready(server: Server, timeout: float) -> float:
    """Seconds until GET /v1/models lists a model (its id becomes server.model); NotReady if the
    process exits first or it does not answer within `timeout`."""
    started = time.perf_counter()
    async with httpx2.AsyncClient(timeout=5) as client:
        while True:
            if server.proc is not None and server.proc.poll() is not None:
                raise NotReady(f"it exited ({server.proc.returncode}) before it was ready; its log ends:\n"
                               f"{log_tail(server.log)}")
            with contextlib.suppress(httpx2.HTTPError, ValueError, KeyError, IndexError):
                r = await client.get(f"{server.base_url}/models")
                if r.status_code == 200:
                    server.model = server.model or r.json()["data"][0]["id"]
                    return time.perf_counter() - started
                if server.proc is None and server.model:  # a running server without the route, named by --served-model
                    return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise NotReady(f"no answer from {server.base_url}/models in {timeout:.0f} s; its log ends:\n"
                               f"{log_tail(server.log)}")
            await asyncio.sleep(0.5)


def hwm_kb(pid: int) -> int:
    """A process's peak resident set since it started or since `reset_hwm` (the kernel's VmHWM: exact,
    not sampled)."""
    return proc_kb(pid, "status", "VmHWM:")


def reset_hwm(pid: int) -> bool:
    """Start a process's VmHWM again from its resident set now (proc(5): clear_refs, 5); False where the
    kernel refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PeakPss:
    """The PSS of a server's process and its children (vLLM's engine core is one), sampled every
    `every` seconds in a thread: the highest since the last `take()` (one measure's) and of the run.
    `take()` also reads each process's exact peak resident set since the last (VmHWM), which a sample
    50 ms apart can miss: their sum, an upper bound where there are several (vLLM's peaks need not
    coincide). RSS counts a page shared with another process (a library's) whole, where PSS shares it."""

    def __init__(self, pid: int, every: float = 0.05):
        self.pid, self.peak, self.run_peak = pid, 0.0, 0.0
        self.hwm = 0.0
        self.resets = all([reset_hwm(p) for p in self.pids()])
        """Whether each peak resident set can start again at each measure (else it is none)."""
        self._stop, self._running = threading.Event(), threading.Event()
        self._running.set()
        threading.Thread(target=self._sample, args=(every,), daemon=True).start()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No sampling inside: a read of smaps_rollup holds the server's memory-map lock, which its
        allocations wait on (a latency measured while sampling is the sampler's as much as the server's)."""
        self._running.clear()
        try:
            yield
        finally:
            self._running.set()

    def pids(self) -> list[int]:
        return [self.pid, *descendants(self.pid)]

    def now(self) -> float:
        return sum(pss_kb(p) for p in self.pids()) / 1024

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            if not self._running.is_set():
                continue
            mb = self.now()
            self.peak, self.run_peak = max(self.peak, mb), max(self.run_peak, mb)

    def take(self) -> tuple[float, float | None]:
        """The sampled peak PSS and the peak RSS (MB) since the last take, and start both again."""
        pids = self.pids()
        peak, self.peak, hwm = self.peak, 0.0, sum(hwm_kb(p) for p in pids) / 1024
        self.hwm = max(self.hwm, hwm)  # the run's, from the server's start
        self.resets = all([reset_hwm(p) for p in pids]) and self.resets
        return peak, hwm if self.resets else None

    def close(self) -> None:
        self._stop.set()


def stop(server: Server) -> tuple[str, list[int]]:
    """End a server we started and everything in its process group: SIGINT, then SIGTERM, then
    SIGKILL, with a wait between. Returns the signal that ended it (with its seconds), and the pids
    still alive after the last (there should be none)."""
    try:
        return _stop(server.proc)
    finally:
        if server.tmp is not None:
            shutil.rmtree(server.tmp, ignore_errors=True)


def _stop(proc: subprocess.Popen | None) -> tuple[str, list[int]]:
    if proc is None or (proc.poll() is not None and not members(proc.pid)):
        return "", []
    group, t = proc.pid, time.monotonic()  # start_new_session: the group's id is the leader's pid
    for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reaps the leader
            if not members(group):
                return f"{sig.name} after {time.monotonic() - t:.1f} s", []
            time.sleep(0.2)
    return "", members(group)


def members(group: int) -> list[int]:
    """The live processes (zombies left out) of a process group."""
    out = []
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            state, _, pgrp = (p / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == group and state != "Z":
                out.append(int(p.name))
    return out


# --- requests ---------------------------------------------------------------------------------

@dataclass
class Reply:
    """One chat completion as measured: its usage and timings."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None  # None: the server reported no prompt_tokens_details
    latency: float
    ttft: float | None = None  # streamed requests only


def usage_of(body: dict[str, Any], fallback_completion: int = 0) -> tuple[int, int, int | None]:
    usage = body.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or fallback_completion), \
        None if cached is None else int(cached)


async def chat(client: httpx2.AsyncClient, server: Server, messages: list[dict], max_tokens: int,
               temperature: float = 0.0, stream: bool = False) -> Reply:
    """One chat request; streamed, also the time to its first generated text (usage: its last chunk's)."""
    body = {"model": server.model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
            "ignore_eos": True, **({"stream": True, "stream_options": {"include_usage": True}} if stream else {})}
    t = time.perf_counter()
    ttft, data, chunks = None, {}, 0
    async with client.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"chat/completions answered {r.status_code}: {(await r.aread())[:300]!r}")
        if not stream:
            data = json.loads(await r.aread())
            chunks = len((data.get("choices") or [{}])[0].get("token_ids") or [])
        else:
            async for line in r.aiter_lines():
                if not line.startswith("data:") or (payload := line[5:].strip()) == "[DONE]":
                    continue
                chunk = json.loads(payload)
                for choice in chunk.get("choices") or []:
                    if ttft is None and ((choice.get("delta") or {}).get("content") or choice.get("token_ids")):
                        ttft = time.perf_counter() - t
                    chunks += 1
                data = chunk if chunk.get("usage") else data
    return Reply(*usage_of(data, chunks), time.perf_counter() - t, ttft)


def client_for(concurrency: int) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(timeout=httpx2.Timeout(900.0, connect=10.0),
                              limits=httpx2.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4))


# --- measures ---------------------------------------------------------------------------------

def short_prompt(i: int) -> list[dict]:
    topic = WORDS[i % len(WORDS)]
    return [{"role": "user", "content": f"Story {i}: write a long story about a {topic}."}]


async def warm_up(server: Server, width: int) -> None:
    async with client_for(width) as client:
        await chat(client, server, short_prompt(0), 16)
        await asyncio.gather(*(chat(client, server, short_prompt(i), 8) for i in range(width)))


async def decode(server: Server, concurrency: int, max_tokens: int) -> dict[str, Any]:
    async with client_for(concurrency) as client:
        t = time.perf_counter()
        replies = await asyncio.gather(*(chat(client, server, short_prompt(100 + i), max_tokens)
                                         for i in range(concurrency)))
        wall = time.perf_counter() - t
    tokens = sum(r.completion_tokens for r in replies)
    return {"tok_s": tokens / wall, "wall_s": wall, "tokens": tokens,
            "all_max_tokens": all(r.completion_tokens == max_tokens for r in replies),
            "latency_p50_s": statistics.median(r.latency for r in replies)}


def long_text(words: int, nonce: str) -> str:
    rng = random.Random(7)  # the same body every time: only the start varies
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Note {nonce}. Read this and summarise it: {body}"


def words_for(model_dir: Path | None, tokens: int) -> int:
    """Words of `long_text` for a prompt of about `tokens` tokens, by the model's own tokenizer."""
    with contextlib.suppress(Exception):  # noqa: BLE001 - without it, ~1.25 tokens a word
        return max(50, round(800 * tokens / len(tokenizer(model_dir)(long_text(800, "x"))["input_ids"])))
    return round(tokens * 0.8)


async def first_request(server: Server, words: int) -> dict[str, Any]:
    """The server's first request, as a user's first after it starts: nothing warmed, nothing cached."""
    async with client_for(1) as client:
        reply = await chat(client, server, [{"role": "user", "content": long_text(words, "first")}], 8, stream=True)
    return {"ttft_s": reply.ttft, "prompt_tokens": reply.prompt_tokens}


async def ttft(server: Server, words: int, repeats: int) -> dict[str, Any]:
    """After the warm-up and the decode runs: a prompt no one sent before (cold), then the same again."""
    async with client_for(2) as client:
        cold, warm = [], []
        for i in range(repeats):
            messages = [{"role": "user", "content": long_text(words, f"{time.time_ns():x}-{i}")}]
            cold.append(await chat(client, server, messages, 8, stream=True))
            warm.append(await chat(client, server, messages, 8, stream=True))
    med = lambda xs: statistics.median(xs) if (xs := [x for x in xs if x is not None]) else None  # noqa: E731
    return {"prompt_tokens": cold[0].prompt_tokens,
            "cold_ttft_s": med(r.ttft for r in cold), "cached_ttft_s": med(r.ttft for r in warm),
            "cold_cached_tokens": med(r.cached_tokens for r in cold),
            "cached_cached_tokens": med(r.cached_tokens for r in warm),
            "runs": [{"cold": vars(c), "cached": vars(w)} for c, w in zip(cold, warm)]}


def agent_messages(task_index: int, cwd: Path, base_prompt: str = "full") -> list[dict]:
    """A rollout's first request, as the agent sends it in text mode (no tools: the system prompt
    carries agent/prompts/text.md): its system prompt for a session in `cwd`, and the task.
    The harness view is left out (it is empty for a fresh harness)."""
    task = KernelTasks().tasks(task_index + 1, seed=0)[task_index]
    model: dict[str, str] = {"action_format": "text"}
    if base_prompt != "full":
        model["base_prompt"] = base_prompt
    config = Config.model_validate({"model": model})
    return [{"role": "system", "content": system_prompt(config, cwd)}, {"role": "user", "content": prompt_of(task)}]


async def group(server: Server, prompts: list[list[dict]], max_tokens: int) -> dict[str, Any]:
    async with client_for(len(prompts)) as client:
        t = time.perf_counter()
        # Sampled, as rollouts are, but unseeded: vllm-cpu 0.32.0's engine dies ("CPU Generator does
        # not use offset") on a seeded request whose prefill is split over steps, as a ~1k-token one is.
        replies = await asyncio.gather(*(chat(client, server, m, max_tokens, temperature=1.0) for m in prompts))
        wall = time.perf_counter() - t
    prompt = sum(r.prompt_tokens for r in replies)
    cached = None if any(r.cached_tokens is None for r in replies) else sum(r.cached_tokens for r in replies)
    return {"saved": None if cached is None or not prompt else cached / prompt, "prompt_tokens": prompt,
            "cached_tokens": cached, "prompt_tokens_each": replies[0].prompt_tokens,
            "wall_s": wall, "latency_p50_s": statistics.median(r.latency for r in replies)}


@functools.cache
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def shared_head(model_dir: Path | None, prompts: list[list[dict]]) -> int | None:
    """Tokens common to the start of every prompt (the most a prefix cache can share), by the
    model's own tokenizer and chat template; None where it cannot be loaded here."""
    with contextlib.suppress(Exception):  # noqa: BLE001 - only an annotation of the figures
        ids = [tokenizer(model_dir).apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in prompts]
        return len(os.path.commonprefix([x["input_ids"] if hasattr(x, "keys") else x for x in ids]))
    return None


LATENCY = ("first", "ttft")
"""The measures of time to first token, run with the PSS sampler paused (PeakPss.paused)."""


async def measure(server: Server, args, model_dir: Path | None, pss: PeakPss | None) -> dict[str, Any]:
    """Every figure of one server, each measure's with the peak PSS sampled while it ran. A measure
    that fails is recorded as its error and the next one runs, unless the server died: then the rest
    are marked skipped."""
    # First one workspace path for all 16 (what a shared prefix can save), then each rollout's
    # own, made as evals.runner.rollout makes them.
    cwd = Path(tempfile.gettempdir()) / "pa-eval-workspace"
    first = [agent_messages(0, cwd, args.base_prompt)] * args.group
    after = [agent_messages(1, cwd, args.base_prompt)] * args.group
    spaces = [workspace() for _ in range(args.group)]
    try:
        as_sent = [agent_messages(2, Path(d.name), args.base_prompt) for d in spaces]
    finally:
        for d in spaces:
            d.cleanup()

    async def grouped(prompts: list[list[dict]]) -> dict[str, Any]:
        return {**await group(server, prompts, args.group_max_tokens), "shared_head_tokens": shared_head(model_dir, prompts)}

    words = words_for(model_dir, args.ttft_tokens)
    steps = [("first", lambda: first_request(server, words)), ("warm_up", lambda: warm_up(server, max(args.concurrency)))]
    steps += [(f"decode_{c}", lambda c=c: decode(server, c, args.max_tokens)) for c in args.concurrency]
    steps += [("ttft", lambda: ttft(server, words, args.repeats)),
              ("group_first", lambda: grouped(first)), ("group_next", lambda: grouped(after)),
              ("group_as_sent", lambda: grouped(as_sent))]
    out: dict[str, Any] = {}
    for key, step in steps:
        if server.proc is not None and server.proc.poll() is not None:
            out[key] = {"error": f"skipped: the server had exited ({server.proc.returncode})"}
            continue
        print(f"[{server.name}] {key}", flush=True)
        try:
            with pss.paused() if pss is not None and key in LATENCY else contextlib.nullcontext():
                figures = await asyncio.wait_for(step(), args.step_timeout)
        except TimeoutError:
            out[key] = {"error": f"not done in {args.step_timeout:.0f} s (--step-timeout)"}
            print(f"[{server.name}] {key} failed: {out[key]['error']}", flush=True)
        except Exception as e:  # noqa: BLE001 - a failed measure is a result; the others still run
            out[key] = {"error": f"{type(e).__name__}: {e}"}
            print(f"[{server.name}] {key} failed: {out[key]['error']}", flush=True)
        else:
            out[key] = figures or {}
        if pss is not None:  # a time to first token's peaks start again too, not counted in the next measure's
            peaks = pss.take()
            if key not in LATENCY:
                out[key]["peak_pss_mb"], out[key]["peak_rss_mb"] = peaks
    if pss is not None:
        out["pss_mb"], out["peak_pss_mb"], out["peak_rss_mb"] = pss.now(), pss.run_peak, pss.hwm
    out["memory_mb"] = await reported_memory(server)
    return out


async def reported_memory(server: Server) -> dict[str, float] | None:
    """The memory breakdown the server reports in GET /v1/models (ours does), in MB; None if it says none."""
    with contextlib.suppress(httpx2.HTTPError, ValueError, KeyError, IndexError, TypeError):
        async with httpx2.AsyncClient(timeout=30) as client:
            memory = (await client.get(f"{server.base_url}/models")).json()["data"][0]["memory"]
            return {k: v / 2**20 for k, v in memory.items()}
    return None


# --- the table --------------------------------------------------------------------------------

def rows(levels: list[int], group: int, ttft_tokens: int) -> list[tuple[str, str, str]]:
    """The table's rows: (label, path into a server's figures, "a|b" for two figures, format)."""
    return [
        ("ready after start (s)", "ready_s", "{:.1f}"),
        *[(f"decode tok/s, {c} concurrent", f"decode_{c}.tok_s", "{:.1f}") for c in levels],
        (f"ttft, ~{ttft_tokens}-token prompt, first request (s)", "first.ttft_s", "{:.3f}"),
        ("ttft, a new prompt after warm-up, cold (s)", "ttft.cold_ttft_s", "{:.3f}"),
        ("ttft, same prompt again, cached (s)", "ttft.cached_ttft_s", "{:.3f}"),
        ("  prompt tokens / cached when resent", "ttft.prompt_tokens|ttft.cached_cached_tokens", "{:.0f}"),
        (f"agent group x{group}, first: prefill saved", "group_first.saved", "{:.1%}"),
        (f"  (at most {(group - 1) / group:.1%}); group wall time (s)", "group_first.wall_s", "{:.2f}"),
        (f"agent group x{group}, next task: saved", "group_next.saved", "{:.1%}"),
        ("  group wall time (s)", "group_next.wall_s", "{:.2f}"),
        (f"agent group x{group}, own workspaces: saved", "group_as_sent.saved", "{:.1%}"),
        ("  group wall time (s)", "group_as_sent.wall_s", "{:.2f}"),
        ("  prompt tokens each / shared head", "group_as_sent.prompt_tokens_each|group_as_sent.shared_head_tokens",
         "{:.0f}"),
        ("peak PSS during the run (MB)", "peak_pss_mb", "{:.0f}"),
        ("  in the groups: first / next / own (MB)", "group_first.peak_pss_mb|group_next.peak_pss_mb|"
                                                     "group_as_sent.peak_pss_mb", "{:.0f}"),
        ("  peak RSS in the groups (VmHWM, MB)", "group_first.peak_rss_mb|group_next.peak_rss_mb|"
                                                      "group_as_sent.peak_rss_mb", "{:.0f}"),
        ("server memory after, PSS (MB)", "pss_mb", "{:.0f}"),
        ("  weights / kv cache / prefix cache / other", "memory_mb.weights|memory_mb.kv_cache|memory_mb.prefix_cache|"
                                                        "memory_mb.other", "{:.0f}"),
    ]


def lookup(figures: dict[str, Any], path: str) -> Any:
    value: Any = figures
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def cell(figures: dict[str, Any], path: str, fmt: str) -> str:
    parts = [lookup(figures, p) for p in path.split("|")]
    return " / ".join("-" if v is None else fmt.format(v) for v in parts)


def print_table(results: dict[str, dict[str, Any]], levels: list[int], group: int, ttft_tokens: int) -> None:
    names = list(results)
    print(f"\n{'measure':<44}" + "".join(f"{n:>20}" for n in names))
    for label, path, fmt in rows(levels, group, ttft_tokens):
        print(f"{label:<44}" + "".join(f"{cell(results[n].get('figures', {}), path, fmt):>20}" for n in names))
    for n in names:
        if results[n].get("error"):
            print(f"{n}: not measured: {results[n]['error']}")
        for key, value in results[n].get("figures", {}).items():
            if isinstance(value, dict) and value.get("error"):
                print(f"{n}: {key} not measured: {value['error']}")
            if isinstance(value, dict) and value.get("all_max_tokens") is False:
                print(f"{n}: {key}: some replies fell short of max_tokens (ignore_eos not honoured?)")
    ours, vllm = results.get("ours", {}).get("figures"), results.get("vllm", {}).get("figures")
    for c in levels if ours and vllm else ():
        if (a := lookup(ours, f"decode_{c}.tok_s")) and (b := lookup(vllm, f"decode_{c}.tok_s")):
            print(f"target: decode at {c} concurrent >= 1.2x vLLM's: {a / b:.2f}x {'ok' if a >= 1.2 * b else 'MISS'}")
    for path in ("group_first.peak_pss_mb", "group_next.peak_pss_mb") if ours else ():
        if peak := lookup(ours, path):
            print(f"target: peak PSS ({path.split('.')[0]}) <= 1536 MB: {peak:.0f} {'ok' if peak <= 1536 else 'MISS'}")
    if ours and group == 16 and (saved := lookup(ours, "group_first.saved")) is not None:
        print(f"target: prefill saved for the group >= 90%: {saved:.1%} {'ok' if saved >= 0.9 else 'MISS'}")


# --- main -------------------------------------------------------------------------------------

def build_vllm(venv: Path) -> bool:
    print(f"building the vLLM venv in {venv} (bench/vllm_venv.sh; a few minutes, ~3.4 GB)", flush=True)
    log = ROOT / "bench" / "results" / "vllm_venv.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        rc = subprocess.call(["bash", str(ROOT / "bench" / "vllm_venv.sh"), str(venv)], stdout=out,
                             stderr=subprocess.STDOUT)
    if rc != 0 or vllm_ready(venv):
        print(f"the vLLM venv could not be built (exit {rc}); the build's log ends:\n{log_tail(log)}\n"
              f"(whole log: {log})")
        return False
    print(f"vLLM venv ready: {(venv / '.complete').read_text().strip()}")
    return True


async def run_one(name: str, args, logs: Path, started: list[Server]) -> dict[str, Any]:
    """Start (or reach) one server, measure it, stop it: its figures, or the error that stopped it.
    A server started is added to `started` at once, so that main() stops it whatever happens."""
    result: dict[str, Any] = {}
    server = pss = None
    try:
        if name == "ours":
            server = start_ours(args.model, logs)
            started.append(server)
        elif name == "vllm":
            server = start_vllm(args.model, logs, args.vllm_dtype, args.vllm_venv)
            started.append(server)
        else:
            server = Server(name, name.rstrip("/") if name.rstrip("/").endswith("/v1") else name.rstrip("/") + "/v1",
                            model=args.served_model or "")
        result["launch"] = server.launch
        pss = PeakPss(server.proc.pid) if server.proc else None  # from its start: its peak includes loading
        print(f"[{name}] starting: {' '.join(server.launch.get('argv', [server.base_url]))}", flush=True)
        ready = await wait_ready(server, args.ready_timeout)
        print(f"[{name}] ready in {ready:.1f} s, serving {server.model!r}", flush=True)
        figures = await measure(server, args, resolve_model(args.model), pss)
        result["figures"] = {"ready_s": ready if server.proc else None, **figures}
    except NotReady as e:
        result["error"] = f"could not start: {e}"
    except Exception as e:  # noqa: BLE001 - a failed server is a result, and the next one still runs
        result["error"] = f"{type(e).__name__}: {e}"
        if server is not None and server.proc is not None and server.proc.poll() is not None:
            result["error"] += f"\nit exited ({server.proc.returncode}); its log ends:\n{log_tail(server.log)}"
    finally:
        if pss is not None:
            pss.close()
        if server is not None and server.proc is not None:
            result["stopped_by"], left = stop(server)
            print(f"[{name}] stopped by {result['stopped_by'] or 'itself (it had exited)'}", flush=True)
            if left:
                result["left_running"] = left
                print(f"[{name}] processes still alive after stop: {left}", file=sys.stderr)
    if result.get("error"):
        print(f"[{name}] {result['error']}", flush=True)
    return result


def interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", action="store_true", help="start `prime-agent rl serve --model M` and measure it")
    ap.add_argument("--vllm", action="store_true", help="start the real vLLM from .venv-vllm and measure it")
    ap.add_argument("--url", action="append", default=[], help="measure a running OpenAI-compatible server")
    ap.add_argument("--served-model", help="the model id to ask a --url server for (default: its first listed)")
    ap.add_argument("--build-vllm", action="store_true", help="build .venv-vllm first (then run any server named)")
    ap.add_argument("--order", choices=("ours,vllm", "vllm,ours"), default="ours,vllm",
                    help="which server goes first (run both orders: the machine's load drifts)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="an installed model's name or an HF directory")
    ap.add_argument("--vllm-venv", type=Path, default=VLLM_VENV, help="the venv vLLM runs from (--build-vllm builds it)")
    ap.add_argument("--vllm-dtype", default="float32", help="vLLM's --dtype (ours serves fp32 by default)")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 16, 32])
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens each decode request generates")
    ap.add_argument("--ttft-tokens", type=int, default=1024, help="the length of the time-to-first-token prompt")
    ap.add_argument("--repeats", type=int, default=3, help="cold/cached pairs of the time-to-first-token prompt")
    ap.add_argument("--group", type=int, default=16, help="rollouts in the agent's group")
    ap.add_argument("--base-prompt", default="full", help="the agent's base prompt for the group (model.base_prompt)")
    ap.add_argument("--group-max-tokens", type=int, default=32, help="tokens each rollout of the group generates")
    ap.add_argument("--step-timeout", type=float, default=600.0, help="seconds each measure may take")
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds a server has to answer /v1/models")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.json"))
    args = ap.parse_args()

    if args.build_vllm:
        if vllm_ready(args.vllm_venv) is None:
            print(f"the vLLM venv at {args.vllm_venv} is built already (delete it to rebuild)")
        elif not build_vllm(args.vllm_venv):
            return 1
    if args.build_vllm and not (args.ours or args.vllm or args.url):
        return 0
    names = [n for n in args.order.split(",") if getattr(args, n, False)] + args.url
    notes = []
    if not names:
        names = args.order.split(",")
        if why := vllm_ready(args.vllm_venv):
            notes.append(f"vLLM not run: {why}")
            print(notes[-1])
            names.remove("vllm")

    started, load = time.perf_counter(), load_average()
    results: dict[str, dict[str, Any]] = {}
    servers: list[Server] = []
    logs = Path(tempfile.mkdtemp(prefix="bench-serve-logs-"))
    # SIGTERM and SIGHUP unwind like ^C, so the servers started here are stopped on the way out.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    try:
        for name in names:  # one at a time: two servers on 2 cores would measure each other
            results[name] = asyncio.run(run_one(name, args, logs, servers))
    except KeyboardInterrupt as e:
        print(f"interrupted ({e or 'SIGINT'}): stopping the servers started here, writing nothing", file=sys.stderr)
        return 130
    finally:
        for server in servers:  # stopped already unless interrupted; stop() of a stopped one is a no-op
            if left := stop(server)[1]:
                print(f"[{server.name}] processes still alive after stop: {left}", file=sys.stderr)
        kept = ROOT / "bench" / "results"
        kept.mkdir(parents=True, exist_ok=True)
        for log in logs.glob("*.log"):
            shutil.copy(log, kept / f"serve-{log.name}")
        shutil.rmtree(logs, ignore_errors=True)
    total = time.perf_counter() - started

    print_table(results, args.concurrency, args.group, args.ttft_tokens)
    print(f"{'total bench time (s)':<44}{total:>20.1f}")
    print("2 shared cores: these figures are indicative; compare servers within one run only.")
    save(args.out, {"servers": results, "notes": notes, "args": {k: v for k, v in vars(args).items() if k != "out"},
                    "total_s": total}, load)
    print("server logs: bench/results/serve-*.log")
    return 0 if any("figures" in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
