"""Rate limits, quota and outages: waits the server asks for, quota waits that tell the user, switching
to `model.fallback`, and streams cut mid-way, against the test server through the real `openai` client."""

from __future__ import annotations

import email.utils
import socket
import time
from pathlib import Path

import pytest

from agent import events as ev
from agent.model import ModelError, OpenAIModel, retry_after
from agent.session import Session
from agent.testing.openai_server import OpenAIServer, Reply
from agent.types import Message
from tests.agent.test_quirks import USER, model_for
from tests.conftest import make_config

QUOTA = {"message": "You exceeded your current quota, please check your plan and billing details.",
         "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}
"""OpenAI's 429 for an account out of credit (platform.openai.com/docs/guides/error-codes)."""


async def test_a_429_with_retry_after_2_waits_about_2_seconds_then_completes():
    with OpenAIServer([Reply(status=429, headers={"Retry-After": "2"}), Reply(content="done")]) as server:
        retries: list[tuple[int, float, str]] = []
        started = time.monotonic()
        c = await model_for(server).complete(USER, on_retry=lambda *a: retries.append(a))
        waited = time.monotonic() - started
    assert c.message.content == "done" and c.attempts == 2
    assert [(a, d) for a, d, _ in retries] == [(1, 2.0)] and "the server asked to wait 2s" in retries[0][2]
    assert waited >= 2.0  # no upper bound: a loaded machine may be slow, never early


@pytest.mark.parametrize("headers, expected", [
    ({"retry-after": "7"}, 7.0),
    ({"retry-after-ms": "1500"}, 1.5),  # OpenAI sends both; the millisecond one is finer
    ({"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "0",
      "x-ratelimit-reset-tokens": "20ms", "x-ratelimit-remaining-tokens": "900"}, 360.0),  # the limit that ran out
    ({"x-ratelimit-reset-tokens": "1.5s", "x-ratelimit-reset-requests": "120ms"}, 1.5),  # neither said: the longer
    ({"x-ratelimit-reset-tokens": "1h2m3s"}, 3723.0),
    ({"retry-after": "soon"}, None),
    ({}, None),
])
def test_retry_after_reads_seconds_and_openais_reset_durations(headers: dict, expected: float | None):
    assert retry_after(headers) == expected


def test_retry_after_reads_an_http_date():
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after({"retry-after": when}) <= 30


async def test_a_503_honours_retry_after_and_a_wait_past_max_wait_is_refused_at_once():
    with OpenAIServer([Reply(status=503, headers={"Retry-After": "0.2"}), Reply(content="up")]) as server:
        delays: list[float] = []
        c = await model_for(server).complete(USER, on_retry=lambda a, d, w: delays.append(d))
    assert c.message.content == "up" and delays == [0.2]
    with OpenAIServer([Reply(status=503, headers={"Retry-After": "3600"})]) as server:
        with pytest.raises(ModelError, match=r"HTTP 503.*gave up after waiting 0s in all \(model.max_wait = 60\)"):
            await model_for(server, max_wait=60).complete(USER)
    assert len(server.requests) == 1


async def test_out_of_quota_waits_and_tells_the_user_instead_of_ending_the_turn(project: Path):
    script = [Reply(status=429, error=QUOTA), Reply(status=429, error=QUOTA), Reply(content="back")]
    with OpenAIServer(script) as server:
        config = make_config(model={"name": "gpt-x", "base_url": server.base_url, "quota_retry_delay": 0.1,
                                    "max_retries": 0})  # quota waits are not retries: max_wait bounds them
        events: list[ev.Event] = []
        async with Session(config, OpenAIModel(config.model), cwd=project, on_event=events.append) as s:
            result = await s.prompt("hello")
    assert (result.outcome, result.answer) == ("completed", "back")
    waits = [e for e in events if isinstance(e, ev.ModelRetry)]
    assert [w.delay for w in waits] == [0.1, 0.2]  # backoff, doubling
    assert waits[0].reason.startswith("out of quota: HTTP 429: You exceeded your current quota")
    assert "waiting 0.1s for the quota (up to 900s more in all: model.max_wait)" in waits[0].reason


async def test_out_of_quota_past_max_wait_ends_the_call_saying_why():
    with OpenAIServer([Reply(status=402, content="Insufficient Balance")] * 5) as server:  # DeepSeek's 402
        with pytest.raises(ModelError, match=r"out of quota: HTTP 402: Insufficient Balance; gave up after waiting 0.3s"):
            await model_for(server, quota_retry_delay=0.1, max_wait=0.5).complete(USER)


async def test_insufficient_quota_waits_then_falls_back_with_an_event(project: Path):
    script = [Reply(status=429, error=QUOTA), Reply(status=429, error=QUOTA), Reply(content="from the fallback"),
              Reply(content="still")]
    with OpenAIServer(script) as server:
        config = make_config(model={"name": "big", "base_url": server.base_url, "fallback": ["small", "tiny"],
                                    "fallback_after": 2, "quota_retry_delay": 0.1})
        events: list[ev.Event] = []
        async with Session(config, OpenAIModel(config.model), cwd=project, on_event=events.append) as s:
            result = await s.prompt("hello")
            await s.prompt("again")  # the fallback stays in use
    assert result.answer == "from the fallback"
    assert [r["model"] for r in server.requests] == ["big", "big", "small", "small"]
    kinds = [e.type for e in events if isinstance(e, ev.ModelRetry | ev.ModelFallback | ev.ModelCompleted)]
    assert kinds[:3] == ["model.retry", "model.fallback", "model.completed"]
    fallback = next(e for e in events if isinstance(e, ev.ModelFallback))
    assert (fallback.from_model, fallback.to_model, fallback.turn_id) == ("big", "small", "t1")
    assert "out of quota" in fallback.reason


async def test_an_outage_that_outlasts_the_retries_falls_back_instead_of_failing():
    with OpenAIServer([Reply(status=500)] * 3 + [Reply(content="ok")]) as server:
        switched: list[tuple[str, str, str]] = []
        model = model_for(server, max_retries=2, fallback_after=5, fallback=["spare"])
        c = await model.complete(USER, on_fallback=lambda *a: switched.append(a))
    assert c.message.content == "ok" and model.name == "spare"
    assert [r["model"] for r in server.requests] == ["fake"] * 3 + ["spare"]
    assert switched == [("fake", "spare", "HTTP 500: injected 500")]


async def test_with_no_fallback_left_the_error_is_the_last_models():
    with OpenAIServer([Reply(status=500)] * 4) as server:
        with pytest.raises(ModelError, match=r"failed after 2 attempts: HTTP 500"):
            await model_for(server, max_retries=1, fallback=["spare"], fallback_after=2).complete(USER)
    assert [r["model"] for r in server.requests] == ["fake", "fake", "spare", "spare"]


async def test_a_stream_cut_mid_way_is_retried_without_showing_its_text_twice():
    words = "one two three four five six seven eight"
    with OpenAIServer([Reply(content=words, drop=True), Reply(content=words)]) as server:
        shown: list[str] = []
        c = await model_for(server).complete(USER, on_delta=shown.append)
    assert c.message.content == words and c.attempts == 2
    assert "".join(shown) == words  # the retry's first half was shown already: only the rest is


async def test_a_retried_stream_that_says_something_else_shows_only_what_goes_past_and_completes_whole():
    with OpenAIServer([Reply(content="alpha beta gamma delta", drop=True), Reply(content="alpha beta omega psi chi")]) as server:
        shown: list[str] = []
        c = await model_for(server).complete([Message(role="user", content="hi")], on_delta=shown.append)
    assert c.message.content == "alpha beta omega psi chi"  # the completed message is the truth (clients show it)
    assert len("".join(shown)) == len("alpha beta omega psi chi")  # nothing shown twice


@pytest.mark.parametrize("status", [500, 429, 0], ids=["error", "rate-limited", "hangs"])
async def test_a_model_listing_that_fails_or_hangs_neither_breaks_nor_holds_up_the_session(status: int,
                                                                                         project: Path):
    # the listing is a courtesy: not retried, waited on at most model.timeout (or 10 s), and then the defaults
    models = [{"id": "fake", "max_model_len": 4096}]
    with OpenAIServer([Reply(content="done")], models=models, listing_status=status) as server:
        config = make_config(model={"name": "fake", "base_url": server.base_url, "timeout": 1})
        events: list[ev.Event] = []
        started = time.monotonic()
        async with Session(config, OpenAIModel(config.model), cwd=project, on_event=events.append) as s:
            result = await s.prompt("go")
        took = time.monotonic() - started
        gets = list(server.gets)
    assert result.answer == "done" and s.config.model.context_window == 128_000
    assert gets == ["/v1/models"] and not [e for e in events if isinstance(e, ev.Note)]
    assert took < 30  # the hanging listing costs its 1 s timeout, not the server's 120 s


async def test_a_session_started_before_its_server_is_fitted_to_it_once_the_server_answers(project: Path):
    # Issue 52: a session made while the model server was down kept a 128,000-token context and the full
    # base prompt once it came up (an 8k model then got 1,294-token prompts, and compaction misjudged).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    models = [{"id": "fake", "max_model_len": 8192, "tools": False}]
    config = make_config(model={"name": "fake", "base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 0})
    events: list[ev.Event] = []
    async with Session(config, OpenAIModel(config.model), cwd=project, on_event=events.append) as down:
        assert down.config.model.context_window == 128_000
        failed = await down.prompt("hello")  # nothing listens yet
        with OpenAIServer([Reply(content="fine")], models=models, port=port) as server:
            result = await down.prompt("go")
            late = list(server.requests)
        with OpenAIServer([Reply(content="fine")], models=models) as server:  # the same server, up from the start
            up_config = make_config(model={"name": "fake", "base_url": server.base_url})
            async with Session(up_config, OpenAIModel(up_config.model), cwd=project) as up:
                await up.prompt("go")
            early = list(server.requests)
    assert failed.outcome == "error" and "connection failed" in failed.error and result.answer == "fine"
    assert (down.config.model.context_window, down.config.model.action_format) == (8192, "text")
    (request,), (expected,) = late, early
    assert request["max_tokens"] == expected["max_tokens"] == 8192 // 5 and "tools" not in request
    assert request["messages"][0] == expected["messages"][0]  # the short base prompt, as if it had been up
    notes = [e.text for e in events if isinstance(e, ev.Note)]
    assert notes[0].startswith(f"the server at http://127.0.0.1:{port}/v1 could not be asked about fake")
    assert notes[1] == (f"the server at http://127.0.0.1:{port}/v1 answered: fake has a context of 8,192 tokens, "
                        "completions of up to 1,638 tokens")
    assert "text mode" in notes[2] and "short base prompt" in notes[3]
