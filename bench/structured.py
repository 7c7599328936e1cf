"""Structured output on SmolLM2-135M-Instruct: how many of the refiner's proposals are valid with and
without constraints, and what the token masks cost per decoded token. Prints a table and writes
bench/results/structured.json.

    .venv/bin/python bench/structured.py [-n 50] [--temperature 1.0] [--rounds 5] [--dtype float32]

- **Valid proposals.** The refiner plans (harness_store.refiner.Refiner.plan: its own prompt, a short
  transcript of a session that ran the wrong test command twice) `-n` times per arm, through the agent's
  model client (agent.refine.model_caller) against `rl serve`'s app on the built-in sampler:
  `free` (no response_format: what the refiner got from this server before, which ignored it),
  `json_object` (the refiner's `refine.json_mode`) and `json_schema` (the proposal's schema,
  `refine.structured`). A proposal is valid when it parses and validates as a `Proposal`; the failures
  are counted by kind (no JSON, JSON invalid or cut short, not a Proposal).
- **Per-token overhead.** The same prompt decoded by the sampler (no HTTP) under the proposal's grammar,
  then free, at batch 1 and batch 8, `--rounds` times: each free row samples past its end tokens
  (ignore_eos) and is stopped after as many tokens as its constrained twin wrote, so both runs decode
  the same tokens per row at the same context lengths with the same rows in the batch at every step.
  Decode time is from the batch's first token to its last (the prefill excluded); tokens/s is the
  tokens decoded after each row's first over that time, summed over rounds (`A/B overhead`: masked
  time per token over free, less 1). On a shared machine that A/B difference moves with the load more
  than with the masks, so the grammar's own work is also timed apart (`mask share`): the constrained
  rows' sampled tokens replayed through fresh matchers, each step's masks computed and applied to
  logits of the model's shape as the sampler does and each matcher advanced, over the free run's
  decode time. Grammar compile times
  (llguidance's tokenizer, then the schema) are reported apart: both are paid once per server (the
  schema once per distinct schema).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from agent.config_models import Config  # noqa: E402
from agent.model import OpenAIModel  # noqa: E402
from agent.refine import model_caller  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from harness_store.refiner import Proposal, RefinementError, Refiner, reply_schema  # noqa: E402
from harness_store.store import HarnessStore  # noqa: E402
from rl.engine import HFEngine  # noqa: E402
from rl.grammar import Grammars, advance, constraint, mask_logits, start  # noqa: E402
from rl.hf import load_hf  # noqa: E402
from rl.policy.sampler import Job  # noqa: E402
from rl.pull import pull  # noqa: E402
from rl.serve import BackgroundServer  # noqa: E402

EVIDENCE = """user: run the tests and tell me if they pass
assistant: ```python
%%bash
make test
```
tool: make: *** No rule to make target 'test'.  Stop.
assistant: ```python
%%bash
make test
```
tool: make: *** No rule to make target 'test'.  Stop.
assistant: ```python
%%bash
ls; python -m pytest -q
```
tool: pyproject.toml  src  tests
12 passed in 0.41s
assistant: The tests pass (12 passed). There is no Makefile: the tests run with `python -m pytest -q`."""

MAX_TOKENS = 256
"""A constrained row of the per-token comparison writes at most this many."""

ARMS = {"free": {"json_mode": False, "structured": False}, "json_object": {"json_mode": True, "structured": False},
        "json_schema": {"json_mode": True, "structured": True}}


def failure(reason: str) -> str:
    if "holds no JSON" in reason:
        return "no_json"
    if "invalid or truncated" in reason:
        return "bad_json"
    return "not_a_proposal"


async def proposals(url: str, arm: str, n: int, temperature: float, max_tokens: int, concurrency: int,
                    home: Path) -> dict:
    config = Config.model_validate({
        "model": {"name": "smollm2", "base_url": url, "temperature": temperature, "max_completion_tokens": max_tokens,
                  "stream": False, "max_retries": 0, "timeout": 3600},
        "refine": ARMS[arm]})
    model = OpenAIModel(config.model)
    tokens: list[int] = []

    def usage(c) -> None:
        tokens.append(c.usage.completion_tokens)

    refiner = Refiner({"project": HarnessStore(home / arm, "project")}, model_caller(model, config, usage))
    gate = asyncio.Semaphore(concurrency)
    counts = {"valid": 0, "no_json": 0, "bad_json": 0, "not_a_proposal": 0}
    edits = 0

    async def one() -> None:
        nonlocal edits
        async with gate:
            try:
                plan = await refiner.plan(EVIDENCE, "", trigger="bench")
            except RefinementError as e:
                counts[failure(str(e))] += 1
                return
            counts["valid"] += 1
            edits += len(plan.proposal.edits)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    seconds = time.perf_counter() - started
    await model.close()
    return {"arm": arm, "n": n, **counts, "share_valid": counts["valid"] / n, "edits_in_valid": edits,
            "completion_tokens_mean": statistics.mean(tokens), "seconds": seconds}


def decode(engine: HFEngine, prompt: list[int], rows: int, grammar, lengths: list[int] | None, seed: int):
    """Decode `rows` copies of `prompt` under `grammar`, or free with row i stopped after `lengths[i]` tokens:
    (tokens decoded after the first of each row, seconds from the batch's first token to its last, each
    row's length)."""
    stamps: list[list[float]] = [[] for _ in range(rows)]

    def on_token(row: int, token: int, logprob: float) -> bool:
        stamps[row].append(time.perf_counter())
        return lengths is not None and len(stamps[row]) >= lengths[row]

    job = Job([prompt] * rows, MAX_TOKENS, 1.0, 1.0, seed, [], on_token, ignore_eos=grammar is None, grammar=grammar)
    engine.submit(job)
    assert job.done.wait(900) and job.error is None, job.error
    first, last = min(s[0] for s in stamps), max(s[-1] for s in stamps)
    return sum(len(s) - 1 for s in stamps), last - first, [r.tokens for r in job.result]


def mask_work(engine: HFEngine, grammar, rows: list[list[int]]) -> float:
    """Seconds the sampler's grammar work took for these constrained rows, replayed: at each step, the
    masks of the rows still decoding (computed and applied to logits of the model's shape) and each
    row's matcher advanced by the token it sampled."""
    matchers = [start(grammar) for _ in rows]
    logits = torch.zeros(len(rows), engine.vocab_size)
    seconds = 0.0
    for step in range(max(map(len, rows))):
        alive = [i for i, r in enumerate(rows) if step < len(r)]
        started = time.perf_counter()
        mask_logits(logits[: len(alive)], [matchers[i] for i in alive], engine.grammars.executor())
        for i in alive:
            advance(matchers[i], rows[i][step])
        seconds += time.perf_counter() - started
    return seconds


def overhead(engine: HFEngine, rounds: int) -> tuple[list[dict], dict]:
    fresh = Grammars(engine.tok, engine.vocab_size, engine.eos)  # what a new server pays, once
    started = time.perf_counter()
    fresh.tokenizer()
    tokenizer_s = time.perf_counter() - started
    c = constraint({"type": "json_schema", "json_schema": {"name": "Proposal", "schema": reply_schema(Proposal)}},
                   None, None)
    assert c is not None
    started = time.perf_counter()
    fresh.compile(c.grammar)
    compile_s = time.perf_counter() - started
    grammar = engine.grammars.compile(c.grammar)
    prompt = engine.tok.chat([{"role": "system", "content": "Reply with one JSON object: a plan."},
                              {"role": "user", "content": EVIDENCE}])
    out = []
    for rows in (1, 8):
        masked = [0, 0.0]
        free = [0, 0.0]
        work = 0.0
        for r in range(rounds):
            tokens, seconds, sampled = decode(engine, prompt, rows, grammar, None, r)
            masked[0] += tokens
            masked[1] += seconds
            tokens, seconds, _ = decode(engine, prompt, rows, None, [len(t) for t in sampled], r)
            free[0] += tokens
            free[1] += seconds
            work += mask_work(engine, grammar, sampled)
        tm, tf = masked[1] / masked[0], free[1] / free[0]
        out.append({"rows": rows, "tokens": masked[0], "masked_ms_per_token": tm * 1e3, "free_ms_per_token": tf * 1e3,
                    "masked_tokens_per_s": 1 / tm, "free_tokens_per_s": 1 / tf, "overhead": tm / tf - 1,
                    "mask_ms_per_token": work / masked[0] * 1e3, "mask_share": work / free[1]})
    return out, {"tokenizer_s": tokenizer_s, "compile_s": compile_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=50, help="proposals per arm")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=256,
                    help="per proposal (256: what rl serve gives a chat request that names none, as the refiner's does)")
    ap.add_argument("--concurrency", type=int, default=10, help="plans in flight at once")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the per-token comparison")
    ap.add_argument("--parts", default="valid,overhead")
    ap.add_argument("--dtype", default="float32", help="the served model's (rl serve --dtype)")
    ap.add_argument("--out", default="structured.json", help="under bench/results/")
    args = ap.parse_args()
    load = load_average()
    torch.manual_seed(0)
    engine = HFEngine(load_hf(pull("smollm2-135m-instruct")), name="smollm2", dtype=getattr(torch, args.dtype))
    record: dict = {"model": "smollm2-135m-instruct", "dtype": args.dtype, "temperature": args.temperature,
                    "max_tokens": args.max_tokens, "threads": torch.get_num_threads()}
    out = ROOT / "bench" / "results" / args.out
    try:
        if "valid" in args.parts:
            with BackgroundServer(engine) as url, tempfile.TemporaryDirectory() as home:
                record["valid"] = [asyncio.run(proposals(url, arm, args.n, args.temperature, args.max_tokens,
                                                         args.concurrency, Path(home))) for arm in ARMS]
            print_valid(record)
            save(out, record, load)
        if "overhead" in args.parts:
            record["overhead"], record["compile"] = overhead(engine, args.rounds)
            print_overhead(record)
            save(out, record, load)
    finally:
        engine.stop()


def print_valid(record: dict) -> None:
    print(f"SmolLM2-135M proposals, temperature {record['temperature']}, max_tokens {record['max_tokens']}")
    print(f"{'arm':<12} {'valid':>9} {'no JSON':>8} {'bad JSON':>9} {'not a Proposal':>15} {'tokens':>7} {'s':>6}")
    for r in record["valid"]:
        print(f"{r['arm']:<12} {r['valid']:>4}/{r['n']:<4} {r['no_json']:>8} {r['bad_json']:>9} "
              f"{r['not_a_proposal']:>15} {r['completion_tokens_mean']:>7.0f} {r['seconds']:>6.0f}")


def print_overhead(record: dict) -> None:
    c = record["compile"]
    print(f"llguidance tokenizer {c['tokenizer_s']:.2f} s (once per server); Proposal schema {c['compile_s'] * 1e3:.0f} ms "
          "(once per schema)")
    print(f"{'rows':>4} {'tokens':>7} {'masked tok/s':>13} {'free tok/s':>11} {'A/B overhead':>13} "
          f"{'mask ms/tok':>12} {'mask share':>11}")
    for r in record["overhead"]:
        print(f"{r['rows']:>4} {r['tokens']:>7} {r['masked_tokens_per_s']:>13.1f} {r['free_tokens_per_s']:>11.1f} "
              f"{r['overhead']:>12.1%} {r['mask_ms_per_token']:>12.2f} {r['mask_share']:>10.1%}")


if __name__ == "__main__":
    main()
