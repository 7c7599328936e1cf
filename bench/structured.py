"""Structured output on SmolLM2-135M-Instruct: how many of the refiner's proposals are valid with and
without constraints, and what the token masks cost per decoded token. Prints a table and writes
bench/results/structured.json.

    .venv/bin/python bench/structured.py [-n 50] [--temperature 1.0] [--rounds 5]

- **Valid proposals.** The refiner plans (harness_store.refiner.Refiner.plan: its own prompt, a short
  transcript of a session that ran the wrong test command twice) `-n` times per arm, through the agent's
  model client (agent.refine.model_caller) against `rl serve`'s app on the built-in sampler:
  `free` (no response_format: what the refiner got from this server before, which ignored it),
  `json_object` (the refiner's `refine.json_mode`) and `json_schema` (the proposal's schema,
  `refine.structured`). A proposal is valid when it parses and validates as a `Proposal`; the failures
  are counted by kind (no JSON, JSON invalid or cut short, not a Proposal).
- **Per-token overhead.** The same prompt decoded under the proposal's grammar and free, at batch 1
  and batch 8, round after round in alternating order: the free run samples past its end tokens
  (ignore_eos) for as many steps as the constrained one took, so both decode the same number of
  tokens at the same context lengths. A step's time is read between consecutive tokens of row 0 (prefill
  excluded), while every row of the batch is still decoding; tokens/s = rows / step time, medians
  over all steps of all rounds. Grammar compile times (llguidance's tokenizer, then the schema) are
  reported apart: both are paid once per server (the schema once per distinct schema).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from agent.config_models import Config  # noqa: E402
from agent.model import OpenAIModel  # noqa: E402
from agent.refine import model_caller  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from harness_store.refiner import Proposal, RefinementError, Refiner  # noqa: E402
from harness_store.store import HarnessStore  # noqa: E402
from rl.engine import HFEngine  # noqa: E402
from rl.grammar import constraint  # noqa: E402
from rl.hf import load_hf  # noqa: E402
from rl.model import Job  # noqa: E402
from rl.models import pull  # noqa: E402
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
                  "stream": False, "max_retries": 0},
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


def step_times(engine: HFEngine, prompt: list[int], rows: int, grammar, steps: int | None, seed: int):
    """Decode `rows` copies of `prompt` (under `grammar`, or free for `steps` steps): the seconds between
    row 0's consecutive tokens while every row decodes, and the steps the shortest row took."""
    stamps: list[list[float]] = [[] for _ in range(rows)]

    def on_token(row: int, token: int, logprob: float) -> bool:
        stamps[row].append(time.perf_counter())
        return False

    job = Job([prompt] * rows, steps or 400, 1.0, 1.0, seed, [], on_token, ignore_eos=grammar is None, grammar=grammar)
    engine.submit(job)
    assert job.done.wait(600) and job.error is None, job.error
    shortest = min(len(s) for s in stamps)
    row = stamps[0][:shortest]
    return [b - a for a, b in zip(row, row[1:])], shortest


def overhead(engine: HFEngine, rounds: int) -> tuple[list[dict], dict]:
    started = time.perf_counter()
    engine.grammars._tokenizer()
    tokenizer_s = time.perf_counter() - started
    c = constraint({"type": "json_schema", "json_schema": {"name": "Proposal", "schema": Proposal.model_json_schema()}},
                   None, None)
    started = time.perf_counter()
    grammar = engine.grammars.compile(c.grammar)
    compile_s = time.perf_counter() - started
    prompt = engine.tok.chat([{"role": "system", "content": "Reply with one JSON object: a plan."},
                              {"role": "user", "content": EVIDENCE}])
    out = []
    for rows in (1, 8):
        masked: list[float] = []
        free: list[float] = []
        for r in range(rounds):
            if r % 2:  # alternate which goes first
                f, _ = step_times(engine, prompt, rows, None, 64, r)
                m, steps = step_times(engine, prompt, rows, grammar, None, r)
            else:
                m, steps = step_times(engine, prompt, rows, grammar, None, r)
                f, _ = step_times(engine, prompt, rows, None, max(steps, 2), r)
            masked += m
            free += f[: len(m)]
        tm, tf = statistics.median(masked), statistics.median(free)
        out.append({"rows": rows, "steps_measured": len(masked), "masked_step_ms": tm * 1e3, "free_step_ms": tf * 1e3,
                    "masked_tokens_per_s": rows / tm, "free_tokens_per_s": rows / tf, "overhead": tm / tf - 1})
    return out, {"tokenizer_s": tokenizer_s, "compile_s": compile_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=50, help="proposals per arm")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=10, help="plans in flight at once")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the per-token comparison")
    ap.add_argument("--parts", default="valid,overhead")
    args = ap.parse_args()
    load = load_average()
    torch.manual_seed(0)
    engine = HFEngine(load_hf(pull("smollm2-135m-instruct")), name="smollm2")
    record: dict = {"model": "smollm2-135m-instruct", "temperature": args.temperature, "max_tokens": args.max_tokens,
                    "threads": torch.get_num_threads()}
    try:
        if "overhead" in args.parts:
            record["overhead"], record["compile"] = overhead(engine, args.rounds)
        if "valid" in args.parts:
            import tempfile

            with BackgroundServer(engine) as url, tempfile.TemporaryDirectory() as home:
                record["valid"] = [asyncio.run(proposals(url, arm, args.n, args.temperature, args.max_tokens,
                                                         args.concurrency, Path(home))) for arm in ARMS]
    finally:
        engine.stop()
    if "valid" in record:
        print(f"SmolLM2-135M proposals, temperature {args.temperature}, max_tokens {args.max_tokens}")
        print(f"{'arm':<12} {'valid':>9} {'no JSON':>8} {'bad JSON':>9} {'not a Proposal':>15} {'tokens':>7} {'s':>6}")
        for r in record["valid"]:
            print(f"{r['arm']:<12} {r['valid']:>4}/{r['n']:<4} {r['no_json']:>8} {r['bad_json']:>9} "
                  f"{r['not_a_proposal']:>15} {r['completion_tokens_mean']:>7.0f} {r['seconds']:>6.0f}")
    if "overhead" in record:
        c = record["compile"]
        print(f"llguidance tokenizer {c['tokenizer_s']:.2f} s (once per server); Proposal schema {c['compile_s'] * 1e3:.0f} ms "
              "(once per schema)")
        print(f"{'rows':>4} {'steps':>6} {'masked ms':>10} {'free ms':>8} {'masked tok/s':>13} {'free tok/s':>11} {'overhead':>9}")
        for r in record["overhead"]:
            print(f"{r['rows']:>4} {r['steps_measured']:>6} {r['masked_step_ms']:>10.1f} {r['free_step_ms']:>8.1f} "
                  f"{r['masked_tokens_per_s']:>13.1f} {r['free_tokens_per_s']:>11.1f} {r['overhead']:>8.1%}")
    save(ROOT / "bench" / "results" / "structured.json", record, load)


if __name__ == "__main__":
    main()
