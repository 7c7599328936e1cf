"""Exact usage and cost: cached and reasoning tokens, the price table, the server's own cost, and every
spend (compaction, refinement, `llm()`, subagents) charged to the turn that caused it, through one sink."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent import events as ev
from agent.config_models import Price
from agent.model import OpenAIModel
from agent.prompt import system_prompt
from agent.session import Session
from agent.testing.openai_server import OpenAIServer, Reply
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import ModelCall, read_records
from agent.types import Usage
from tests.conftest import make_config

PRICES = {"gpt-x": {"input": 2.0, "cached_input": 0.5, "output": 8.0}}
"""Dollars per million tokens."""


async def test_a_turns_cost_matches_a_hand_computation_from_the_price_table_and_the_recorded_usage(project: Path):
    script = [
        Reply(code=["print(1)"], prompt_tokens=1000, usage={"prompt_tokens_details": {"cached_tokens": 800}}),
        Reply(content="done", prompt_tokens=1200, usage={"prompt_tokens_details": {"cached_tokens": 1000},
                                                         "completion_tokens_details": {"reasoning_tokens": 0}}),
    ]
    with OpenAIServer(script) as server:
        config = make_config(model={"name": "gpt-x", "base_url": server.base_url, "prices": PRICES})
        events: list[ev.Event] = []
        async with Session(config, OpenAIModel(config.model), cwd=project, on_event=events.append) as s:
            result = await s.prompt("go")
    calls = [r for r in read_records(s.dir / "trajectory.jsonl") if isinstance(r, ModelCall)]
    # By hand: uncached prompt tokens at $2, cached at $0.50, completion at $8, per million.
    # Call 1: 200 uncached, 800 cached, 2 out ('{"code":' and ' "print(1)"}'); call 2: 200, 1000 cached, 1 out.
    assert [(c.usage.prompt_tokens, c.usage.cached_tokens, c.usage.completion_tokens) for c in calls] == \
        [(1000, 800, 2), (1200, 1000, 1)]
    by_hand = [(200 * 2 + 800 * 0.5 + 2 * 8) / 1e6, (200 * 2 + 1000 * 0.5 + 1 * 8) / 1e6]
    assert [c.usage.cost for c in calls] == by_hand
    finished = next(e for e in events if isinstance(e, ev.TurnFinished))
    assert finished.usage.cost == result.usage.cost == s.usage.cost == sum(by_hand) == pytest.approx(0.001724)
    assert (finished.usage.cached_tokens, finished.spend["turn"].cost) == (1800, sum(by_hand))
    assert [e.usage.cost for e in events if isinstance(e, ev.ModelCompleted)] == by_hand


async def test_the_servers_own_cost_is_believed_over_the_price_table():
    # OpenRouter states each call's cost in `usage.cost` (openrouter.ai/docs/use-cases/usage-accounting).
    with OpenAIServer([Reply(content="hi", usage={"cost": 0.0375}), Reply(content="hi")]) as server:
        model = OpenAIModel(make_config(model={"name": "gpt-x", "base_url": server.base_url, "prices": PRICES}).model)
        stated, priced = await model.complete([]), await model.complete([])
    assert stated.usage.cost == 0.0375
    assert priced.usage.cost == Price(**PRICES["gpt-x"]).cost(priced.usage) > 0


def test_a_price_without_a_cached_rate_bills_cached_tokens_as_input():
    usage = Usage(prompt_tokens=1000, cached_tokens=400, completion_tokens=10)
    assert Price(input=1.0, output=4.0).cost(usage) == (1000 * 1.0 + 10 * 4.0) / 1e6


async def test_every_spend_is_charged_to_the_turn_that_caused_it(project: Path):
    review = '{"should_refine": false, "rationale": "nothing to learn yet"}'
    script = [
        cells("print(await llm('say hi')); print('x' * 400)"), "hi",  # the turn's step, then the llm() call from its cell
        "done",
        review,  # auto-refine's review, planned after t1 ended: t1's spend all the same
        "SUMMARY of t1",  # t2 compacts before its first step: t2's
        "two done",
    ]
    base = len(system_prompt(make_config(), project)) // 4
    config = make_config(refine={"auto_every": 1, "cooldown_turns": 0},
                         model={"context_window": (base + 60) * 2, "base_prompt": "full"},
                         compaction={"keep_recent_turns": 0, "threshold": 0.5})
    events: list[ev.Event] = []
    async with Session(config, ScriptedModel(script), cwd=project, on_event=events.append) as s:
        await s.prompt("one")
        for _ in range(200):
            if any(isinstance(e, ev.RefinementSkipped) for e in events):
                break
            await asyncio.sleep(0.02)
        await s.prompt("two")
    t1, t2 = [e for e in events if isinstance(e, ev.TurnFinished)]
    charged = [e for e in events if isinstance(e, ev.UsageCharged)]
    assert sorted(t1.spend) == ["llm", "turn"] and sorted(t2.spend) == ["compaction", "turn"]
    assert [(e.turn_id, e.purpose) for e in charged] == [("t1", "refine")]
    for turn in (t1, t2):
        assert sum((u for u in turn.spend.values()), Usage()) == turn.usage
    assert s.usage == t1.usage + t2.usage + charged[0].usage  # one sink: every token once
