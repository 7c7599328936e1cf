"""OpenAIModel through the real `openai` client against the fake OpenAI-compatible server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import load_config, merge, parse_override
from agent.config_models import ModelConfig
from agent.actions import fenced_cells
from agent.model import ModelError, ModelTimeout, OpenAIModel, Repeating, ServerModel, ToolsRefused, fitted
from agent.testing.openai_server import OLLAMA_NO_TOOLS, VLLM_NO_TOOL_PARSER, OpenAIServer, Reply
from agent.types import Message, ToolCall

USER = [Message(role="system", content="sys"), Message(role="user", content="hi")]


def model_for(server: OpenAIServer, **fields) -> OpenAIModel:
    cfg = {"name": "fake", "base_url": server.base_url, "retry_base_delay": 0.01, "timeout": 5, **fields}
    return OpenAIModel(ModelConfig(**cfg))


@pytest.mark.parametrize("stream", [True, False])
async def test_tool_calls_text_and_usage(stream: bool):
    with OpenAIServer([Reply(content="Looking.", code=["print(1)", "x = 2"])]) as server:
        deltas: list[str] = []
        c = await model_for(server, stream=stream).complete(USER, on_delta=deltas.append)
    m = c.message
    assert m.content == "Looking."
    assert [json.loads(t.arguments)["code"] for t in m.tool_calls] == ["print(1)", "x = 2"]
    assert all(t.name == "ipython" and t.id for t in m.tool_calls)
    assert c.finish_reason == "tool_calls" and c.attempts == 1
    assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
    assert "".join(deltas) == ("Looking." if stream else "")
    request = server.requests[0]
    assert [t["function"]["name"] for t in request["tools"]] == ["ipython"]
    assert request["tools"][0]["function"]["parameters"]["required"] == ["code"]
    assert request["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("stream", [True, False])
async def test_one_connection_serves_every_call(stream: bool):
    """A streamed reply is read to its end, after `[DONE]`: else the client drops the connection, and
    each model call opens a new one (for a remote server, a TLS handshake a call)."""
    with OpenAIServer([Reply(code=["1"]), Reply(content="two"), Reply(code=["3"])]) as server:
        model = model_for(server, stream=stream)
        answers = [(await model.complete(USER)).message for _ in range(3)]
        await model.close()
    assert [m.content for m in answers] == ["", "two", ""] and len(answers[2].tool_calls) == 1
    assert server.connections == 1


async def test_text_mode_sends_no_tools_and_cells_are_fenced():
    reply = "I will check.\n```python\nprint(1)\n```\nand\n```py\nx = 2\n```"
    with OpenAIServer([Reply(content=reply)]) as server:
        c = await model_for(server, action_format="text").complete(USER)
    assert "tools" not in server.requests[0]
    assert fenced_cells(c.message.content) == ["print(1)\n", "x = 2\n"]
    assert fenced_cells("no code here\n```bash\nls\n```") == []


@pytest.mark.parametrize("stream", [True, False])
async def test_logprobs_and_token_ids_are_kept_when_recording(stream: bool):
    script = [Reply(content="the answer is four")]
    with OpenAIServer(script) as server:
        model = model_for(server, stream=stream, record_logprobs=True, extra_body={"return_token_ids": True})
        c = await model.complete(USER)
    assert server.requests[0]["logprobs"] is True
    assert len(c.message.logprobs) == len(c.message.token_ids) == 4
    assert all(lp < 0 for lp in c.message.logprobs)


async def test_without_recording_no_logprobs_are_requested():
    with OpenAIServer([Reply(content="ok")]) as server:
        c = await model_for(server).complete(USER)
    assert "logprobs" not in server.requests[0] and c.message.logprobs is None


@pytest.mark.parametrize("fault", [Reply(status=500), Reply(status=429), Reply(drop=True, content="a b c d e f"), Reply(garbage=True)])
async def test_transient_faults_are_retried(fault: Reply):
    with OpenAIServer([fault, fault, Reply(content="fine")]) as server:
        retries: list[tuple[int, float, str]] = []
        c = await model_for(server).complete(USER, on_retry=lambda *a: retries.append(a))
    assert c.message.content == "fine"
    assert c.attempts == 3 and [r[0] for r in retries] == [1, 2]
    assert len(server.requests) == 3


async def test_a_server_that_never_answers_times_out():
    with OpenAIServer([Reply(hang=True), Reply(hang=True)]) as server:
        with pytest.raises(ModelTimeout, match=r"failed after 2 attempts: no answer within 0.5s"):
            await model_for(server, timeout=0.5, max_retries=1).complete(USER)


async def test_client_errors_are_not_retried():
    with OpenAIServer([Reply(status=401, content="bad key")]) as server:
        with pytest.raises(ModelError, match="HTTP 401") as info:
            await model_for(server).complete(USER)
    assert not isinstance(info.value, ModelTimeout)
    assert len(server.requests) == 1


async def test_retries_give_up_with_the_last_reason():
    with OpenAIServer([Reply(status=503)] * 3) as server:
        with pytest.raises(ModelError, match=r"failed after 3 attempts: HTTP 503"):
            await model_for(server, max_retries=2).complete(USER)


async def test_streamed_and_plain_history_round_trips():
    history = [
        *USER,
        Message(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="ipython", arguments='{"code": "1"}')]),
        Message(role="tool", tool_call_id="c1", content="1"),
    ]
    with OpenAIServer([Reply(content="done")]) as server:
        await model_for(server).complete(history)
    sent = server.requests[0]["messages"]
    assert sent[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ipython", "arguments": '{"code": "1"}'}}]}
    assert sent[3] == {"role": "tool", "tool_call_id": "c1", "content": "1"}


# --- fitting the model its server describes ------------------------------------------------------------


LLAMACPP_PROPS = {"default_generation_settings": {"n_ctx": 4096, "params": {"temperature": 0.8}}, "total_slots": 1}


@pytest.mark.parametrize("entry, props, window", [
    ({"id": "fake", "object": "model", "owned_by": "vllm", "max_model_len": 8192}, None, 8192),  # vLLM, ours
    ({"id": "fake", "name": "Fake", "context_length": 131072}, None, 131072),  # OpenRouter
    ({"id": "fake", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx_train": 32768}}, LLAMACPP_PROPS, 4096),
    ({"id": "other", "max_model_len": 8192}, None, None),  # another model's entry says nothing of this one
    ({"id": "fake", "object": "model", "owned_by": "openai"}, None, None),
])
async def test_the_context_window_is_read_from_the_servers_model_listing(entry: dict, props, window):
    with OpenAIServer([], models=[entry], props=props) as server:
        model = model_for(server)
        described = await model.describe()
        assert await model.describe() == await model.variant("fake").describe() == described  # asked once
        gets = list(server.gets)
    assert described.context_window == window
    assert gets == ["/v1/models"] + (["/props"] if props else [])


async def test_a_server_that_lists_no_models_says_nothing_and_openai_itself_is_not_asked():
    with OpenAIServer([]) as server:  # no GET route: a 404, as `transformers serve` offline fails it with a 500
        assert await model_for(server).describe() == ServerModel()
    assert await OpenAIModel(ModelConfig(name="gpt-4.1", api_key="sk-none")).describe() == ServerModel()


async def test_the_servers_tool_flag_and_sampling_defaults_are_read_and_bad_values_ignored():
    entry = {"id": "fake", "max_model_len": 2048, "tools": False,
             "sampling_defaults": {"temperature": 0.2, "top_p": 0.9, "top_k": 50, "bogus": "x"}}
    with OpenAIServer([], models=[entry, {"id": "bad", "max_model_len": -1, "tools": "no",
                                          "sampling_defaults": {"temperature": "hot"}}]) as server:
        good, bad = await model_for(server).describe(), await model_for(server, name="bad").describe()
    assert good == ServerModel(context_window=2048, tools=False, sampling={"temperature": 0.2, "top_p": 0.9})
    assert bad == ServerModel()


SAYS = ServerModel(context_window=8192, tools=False, sampling={"temperature": 0.2, "top_p": 0.9})


def test_what_the_server_says_fills_in_what_the_user_left_at_its_default():
    model = fitted(load_config(Path("/nonexistent")).model, SAYS)
    assert (model.context_window, model.action_format, model.temperature) == (8192, "text", 0.2)
    assert model.extra_body == {"top_p": 0.9} and model.model_fields_set == set()  # still the user's: nothing


@pytest.mark.parametrize("setting, value", [("context_window", 128_000), ("action_format", "tools"),
                                            ("temperature", 1.0), ("extra_body", {"top_p": 1.0})])
def test_a_setting_the_user_made_wins_over_the_server_even_at_the_default_value(setting: str, value):
    key = f"model.{setting}=" + (json.dumps(value) if setting != "extra_body" else "{top_p = 1.0}")
    user = load_config(Path("/nonexistent"), parse_override(key)).model
    model = fitted(user, SAYS)
    assert getattr(model, setting) == value and model.model_fields_set == {setting}


@pytest.mark.parametrize("overrides, server, cap", [
    ([], SAYS, 1638),  # SmolLM2 on our server: a fifth of its 8,192 tokens
    ([], ServerModel(context_window=1_000_000), 32_768),  # never more than 32,768
    (["model.context_window=32768"], ServerModel(), 6553),  # a window the user states fits it too
    ([], ServerModel(), None),  # no window known (OpenAI's API, Ollama): the server's own limit
    (["model.max_completion_tokens=4000"], SAYS, 4000),  # the user's, whatever the window
])
def test_the_completion_cap_is_fitted_to_a_known_window(overrides: list[str], server: ServerModel, cap):
    user = load_config(Path("/nonexistent"), merged(*overrides)).model
    assert fitted(user, server).max_completion_tokens == cap


def merged(*overrides: str) -> dict:
    out: dict = {}
    for o in overrides:
        merge(out, parse_override(o))
    return out


async def test_the_fitted_cap_is_sent_as_max_tokens_and_as_max_completion_tokens_to_openai():
    with OpenAIServer([Reply(content="a")]) as server:
        model = model_for(server)
        model.reconfigure(fitted(model.config, SAYS))
        await model.complete(USER)
    assert server.requests[0]["max_tokens"] == 1638
    openai_itself = OpenAIModel(fitted(ModelConfig(name="gpt-4.1", api_key="sk-none", context_window=400_000),
                                       ServerModel()))
    assert openai_itself._request(USER, True, False)["max_completion_tokens"] == 32_768


async def test_the_advertised_sampling_defaults_are_sent_where_the_user_set_none():
    with OpenAIServer([Reply(content="a"), Reply(content="b")]) as server:
        model = model_for(server)
        model.reconfigure(fitted(model.config, SAYS))
        await model.complete(USER)
        pinned = model_for(server, temperature=0.7)
        pinned.reconfigure(fitted(pinned.config, SAYS))
        await pinned.complete(USER)
    first, second = server.requests
    assert (first["temperature"], first["top_p"], "tools" in first) == (0.2, 0.9, False)  # text mode: no tools
    assert (second["temperature"], second["top_p"]) == (0.7, 0.9)


@pytest.mark.parametrize("refusal", [VLLM_NO_TOOL_PARSER, OLLAMA_NO_TOOLS])
async def test_a_servers_refusal_of_tools_is_told_apart_and_not_retried(refusal: str):
    with OpenAIServer([], refuse_tools=refusal) as server:
        with pytest.raises(ToolsRefused, match="refused tool calling"):
            await model_for(server).complete(USER)
    assert len(server.requests) == 1


# --- a completion that repeats itself ------------------------------------------------------------------


LOOP = "print(mul(2, 3))\n" * 2000
"""34,000 characters of one line: SmolLM2-135M's way of running away, written to the token limit."""


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("reply", [Reply(content="Here it is:\n```python\n" + LOOP, finish_reason="length"),
                                   Reply(raw_arguments=['{"code": "' + json.dumps(LOOP)[1:-1]], finish_reason="length"),
                                   Reply(reasoning="Let me think. " * 3000, content="ok")],
                         ids=["answer", "tool-call", "reasoning"])
async def test_a_completion_that_repeats_itself_is_stopped_there_and_not_retried(stream: bool, reply: Reply):
    with OpenAIServer([reply, Reply(content="never asked")]) as server:
        shown: list[str] = []
        with pytest.raises(Repeating, match=r"the model fell into a loop, writing '.+' \d+ times in a row: its completion "
                                            r"was stopped after [\d,]+ characters \(model.repetition_limit = 500\)"):
            await model_for(server, stream=stream).complete(USER, on_delta=shown.append, on_reasoning=shown.append)
        assert len(server.requests) == 1
    if stream:  # stopped as the loop showed, not after the 34,000 characters the server had to send
        assert len("".join(shown)) < 2_000


COUNTING = ("```python\ndef main():\n    with open(\"data.txt\") as f:\n        lines = f.read()\n"
            + "".join(f'        with open(get_line_count(), "w") as f:\n            f.write("Line {i}\\n")\n' for i in range(1, 80)))
"""SmolLM2-135M at its card's temperature (0.2), 2026-12-05: the same two lines but for a number counting up, to
the completion cap (1,638 tokens), in each of three calls: 403 s of tests/e2e/test_smollm2.py on two loaded
cores. No piece of it repeats exactly."""


@pytest.mark.parametrize("stream", [True, False])
async def test_a_completion_that_counts_in_a_loop_is_stopped_there_saying_so(stream: bool):
    with OpenAIServer([Reply(content=COUNTING, finish_reason="length"), Reply(content="never asked")]) as server:
        shown: list[str] = []
        with pytest.raises(Repeating, match=r"the model fell into a loop, writing '.+Line \d+.+' \d+ times in a row "
                                            r"but for its numbers: its completion was stopped after [\d,]+ characters"):
            await model_for(server, stream=stream).complete(USER, on_delta=shown.append)
        assert len(server.requests) == 1
    if stream:  # twice the limit of an exact loop (1,000 characters), then it stops: 6,390 were to come
        assert 1_000 < len("".join(shown)) < 1_600


async def test_text_that_repeats_a_little_or_not_at_all_is_no_loop():
    table = "| a | b |\n|---|---|\n" + "".join(f"| {i} | {i * i} |\n" for i in range(400))  # 5,000 characters
    checks = "".join(f"assert add({i}, {i}) == {2 * i}\n" for i in range(30))  # 700 characters but for numbers
    replies = [Reply(content=table), Reply(content="=" * 80 + "\nx = 0\n" * 4 + "done"), Reply(content=checks),
               Reply(content=LOOP)]
    with OpenAIServer(replies) as server:
        model = model_for(server)
        assert (await model.complete(USER)).message.content == table  # numbers alone, no words: data
        assert (await model.complete(USER)).message.content.endswith("done")
        assert (await model.complete(USER)).message.content == checks
        unguarded = model_for(server, repetition_limit=0)
        assert (await unguarded.complete(USER)).message.content == LOOP  # switched off: the whole of it


# --- text mode: a streamed reply ends with its first whole cell ------------------------------------------


AFTER = ("Here it is:\n```python\nprint(sum(int(x) for x in open('numbers.txt')))\n```\nThis prints `279`. "
         + " ".join(f"{i}," for i in range(2000)))
"""SmolLM2 after its cell: the output it imagines, on and on (1,638 tokens, four minutes on two loaded cores)."""


async def test_a_text_mode_reply_ends_with_its_first_cell_where_the_server_streams_token_ids():
    ids = {"return_token_ids": True}  # ours and vLLM send each token's id as it streams
    with OpenAIServer([Reply(content=AFTER), Reply(content=AFTER), Reply(content=AFTER)]) as server:
        shown: list[str] = []
        text = model_for(server, action_format="text", extra_body=ids)
        c = await text.complete(USER, on_delta=shown.append)
        whole_without_ids = (await model_for(server, action_format="text").complete(USER)).message.content
        plain_call = (await text.complete(USER, tools=False)).message.content  # a summary, llm(): read whole
    # up to the chunk that closed the cell (this server's chunks are words; ours and vLLM's are tokens)
    assert c.message.content == "Here it is:\n```python\nprint(sum(int(x) for x in open('numbers.txt')))\n```\nThis"
    assert fenced_cells(c.message.content) == ["print(sum(int(x) for x in open('numbers.txt')))\n"]
    assert c.finish_reason == "stop" and "".join(shown) == c.message.content
    assert c.usage.completion_tokens == len(c.message.token_ids) == 7 and c.usage.prompt_tokens == 0
    assert whole_without_ids == plain_call == AFTER  # no ids to count the usage by, or no cell wanted
