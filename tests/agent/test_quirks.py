"""Servers nobody here wrote depart from OpenAI's API in recorded ways; the test server replays each
one (agent/testing/openai_server.py) and the real `openai` client reads it, through `OpenAIModel`
and, where the harm shows in a turn, a whole session with a real kernel. Each test names where the
quirk was documented or reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import events as ev
from agent.model import ModelError, OpenAIModel
from agent.session import Session
from agent.testing.openai_server import OLLAMA_NO_TOOLS, VLLM_NO_TOOL_PARSER, OpenAIServer, Reply
from agent.types import Message
from tests.conftest import make_config

USER = [Message(role="system", content="sys"), Message(role="user", content="hi")]
BOTH = pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])


def model_for(server: OpenAIServer, **fields) -> OpenAIModel:
    from agent.config_models import ModelConfig

    cfg = {"name": "fake", "base_url": server.base_url, "retry_base_delay": 0.01, "timeout": 5, **fields}
    return OpenAIModel(ModelConfig(**cfg))


def codes(message: Message) -> list[str]:
    return [json.loads(c.arguments)["code"] for c in message.tool_calls]


async def session_turn(server: OpenAIServer, project: Path, prompt: str = "go", **model) -> tuple[Session, list]:
    events: list[ev.Event] = []
    config = make_config(model={"name": "fake", "base_url": server.base_url, "retry_base_delay": 0.01, **model})
    async with Session(config, OpenAIModel(config.model), cwd=project, on_event=events.append) as s:
        await s.prompt(prompt)
    return s, events


# --- tool calls --------------------------------------------------------------------------------------


@BOTH
async def test_tool_call_arguments_as_an_object_and_without_an_id_still_run(stream: bool):
    # llama.cpp's server sent arguments as a JSON object (ggml-org/llama.cpp#20198, made optional in #20202);
    # Ollama does too, and leaves out the call's id (BerriAI/litellm#24095). OpenAI's API sends a string.
    reply = Reply(code=["print(1)", "x = 2"], arguments_as_object=True, tool_call_ids=False)
    with OpenAIServer([reply]) as server:
        c = await model_for(server, stream=stream).complete(USER)
    assert codes(c.message) == ["print(1)", "x = 2"]
    ids = [t.id for t in c.message.tool_calls]
    assert all(ids) and len(set(ids)) == 2  # made up, and unique, so each tool reply finds its call


async def test_streamed_tool_calls_without_an_index_stay_apart():
    # Gemini's OpenAI-compatible endpoint leaves `index` out of tool-call deltas (openai/openai-python#3246,
    # AstrBotDevs/AstrBot#6692); read as index 0, two calls merge into one with broken JSON (SamSaffron/term-llm#314).
    with OpenAIServer([Reply(code=["print(1)", "print(2)"], tool_call_index=False)]) as server:
        c = await model_for(server).complete(USER)
    assert codes(c.message) == ["print(1)", "print(2)"]


async def test_a_call_cut_by_the_token_limit_is_not_run_even_when_its_json_parses(project: Path):
    # finish_reason "length": the output limit stopped the reply (OpenAI's chat API reference), here in the middle
    # of a call. What arrived can still parse, when the server closes the JSON it was cut in, and it is not the
    # code the model meant: the first call ran to its end and runs, the cut one does not.
    cut = '{"code": "import pathlib; pathlib.Path(\'half\').write_text(\'ran\')"}'
    script = [Reply(code=["print('whole')"], raw_arguments=[cut], finish_reason="length"), Reply(content="ok")]
    with OpenAIServer(script) as server:
        s, events = await session_turn(server, project)
        follow_up = server.requests[1]["messages"]
    assert not (project / "half").exists()
    tool_replies = [m["content"] for m in follow_up if m["role"] == "tool"]
    assert tool_replies[0] == "whole" and tool_replies[1].startswith("Not run: your reply was cut off")
    assert [e.code for e in events if isinstance(e, ev.CellStarted)] == ["print('whole')"]


# --- reasoning ---------------------------------------------------------------------------------------


@BOTH
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "both"])
async def test_reasoning_fields_are_kept_apart_from_the_answer_and_out_of_the_next_request(stream: bool, field: str):
    # DeepSeek's reasoning models answer with `reasoning_content` (api-docs.deepseek.com/guides/reasoning_model);
    # OpenRouter and newer vLLM name it `reasoning`, and vLLM sends both with the same text (vllm-project/vllm#29408).
    with OpenAIServer([Reply(content="The answer is 4.", reasoning="Two and two make four.", reasoning_field=field,
                             usage={"completion_tokens_details": {"reasoning_tokens": 5}}),
                       Reply(content="ok")]) as server:
        model = model_for(server, stream=stream)
        thought: list[str] = []
        c = await model.complete(USER, on_reasoning=thought.append)
        await model.complete([*USER, c.message, Message(role="user", content="and?")])
    assert c.message.content == "The answer is 4." and c.message.reasoning == "Two and two make four."
    assert "".join(thought) == ("Two and two make four." if stream else "")
    assert c.usage.reasoning_tokens == 5
    sent = server.requests[1]["messages"][2]
    assert sent == {"role": "assistant", "content": "The answer is 4."}  # reasoning stays out of the request


async def test_reasoning_goes_back_where_the_provider_requires_it():
    # DeepSeek's thinking mode with tool calls: "the reasoning_content must be fully passed back to the API in all
    # subsequent requests", else HTTP 400 (api-docs.deepseek.com/guides/thinking_mode#tool-calls).
    with OpenAIServer([Reply(code=["1"], reasoning="need a cell"), Reply(content="ok")]) as server:
        model = model_for(server, send_reasoning=True)
        c = await model.complete(USER)
        await model.complete([*USER, c.message, Message(role="tool", tool_call_id=c.message.tool_calls[0].id,
                                                        content="1")])
    assert server.requests[1]["messages"][2]["reasoning_content"] == "need a cell"


@BOTH
@pytest.mark.parametrize("content", [
    "<think>\nLet me think.\n</think>\n\nParis.",  # Qwen3 via vLLM with no reasoning parser (vllm-project/vllm#21130)
    "Let me think.\n</think>\n\nParis.",  # Qwen3 thinking models: the template opens <think> (vllm-project/vllm#22507)
])
async def test_a_think_block_is_reasoning_not_the_answer(stream: bool, content: str):
    with OpenAIServer([Reply(content=content)]) as server:
        shown: list[str] = []
        c = await model_for(server, stream=stream).complete(USER, on_delta=shown.append)
    assert (c.message.reasoning, c.message.content) == ("Let me think.", "Paris.")
    if stream and content.startswith("<think>"):  # known from its first token: never shown as the answer
        assert "".join(shown) == "Paris."


async def test_code_a_text_mode_model_only_thought_about_is_not_run(project: Path):
    # DeepSeek-R1 distills and QwQ write their reasoning in <think> (vllm-project/vllm#21130); a fence in it is an
    # idea, not a cell, and the answer after it is the answer.
    thought = "<think>\nI could run\n```python\nopen('thought', 'w').write('ran')\n```\nbut no need.\n</think>\n\n4"
    with OpenAIServer([Reply(content=thought)]) as server:
        s, events = await session_turn(server, project, action_format="text")
    assert not (project / "thought").exists()
    finished = next(e for e in events if isinstance(e, ev.TurnFinished))
    assert (finished.outcome, finished.answer) == ("completed", "4")
    completed = next(e for e in events if isinstance(e, ev.ModelCompleted))
    assert completed.reasoning.startswith("I could run") and completed.text == "4"
    assert [e.text for e in events if isinstance(e, ev.ModelDelta) and e.reasoning]  # streamed apart, for dimming
    recorded = [json.loads(line) for line in (s.dir / "trajectory.jsonl").read_text().splitlines()]
    assistant = [r["message"] for r in recorded if r["kind"] == "message" and r["message"]["role"] == "assistant"]
    assert assistant[0]["reasoning"].startswith("I could run")  # in the trajectory


# --- usage, choices, logprobs ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["separate", "bare", "finish"])
async def test_the_usage_is_read_wherever_the_stream_puts_it(where: str):
    # OpenAI: with include_usage, a last chunk whose `choices` "will always be an empty array"; some proxies leave the
    # key out; transformers serve and llama.cpp put the usage in the finish chunk (seen here, transformers 5.23).
    usage = {"prompt_tokens_details": {"cached_tokens": 600}, "cost": 0.0021}
    with OpenAIServer([Reply(content="hi there", prompt_tokens=1000, usage=usage, usage_chunk=where)]) as server:
        c = await model_for(server).complete(USER)
    assert c.message.content == "hi there"
    assert (c.usage.prompt_tokens, c.usage.cached_tokens, c.usage.completion_tokens, c.usage.cost) == (1000, 600, 2, 0.0021)


async def test_deepseeks_own_cache_field_counts_as_cached():
    # DeepSeek reports cache hits as `prompt_cache_hit_tokens` (api-docs.deepseek.com/guides/kv_cache).
    with OpenAIServer([Reply(content="x", prompt_tokens=100, usage={"prompt_cache_hit_tokens": 64})]) as server:
        c = await model_for(server, stream=False).complete(USER)
    assert c.usage.cached_tokens == 64


@BOTH
async def test_only_the_first_choice_counts_whether_n_is_honoured_or_not(stream: bool):
    # transformers serve ignores `n` (one choice for n=2, seen here); vLLM honours it, and streams the choices
    # interleaved by index. The agent asks for one and reads choice 0 alone.
    with OpenAIServer([Reply(content="the one", choices=2), Reply(content="ignored n")]) as server:
        model = model_for(server, stream=stream, extra_body={"n": 2})
        honoured, ignored = await model.complete(USER), await model.complete(USER)
    assert honoured.message.content == "the one" and ignored.message.content == "ignored n"


async def test_a_server_without_logprobs_is_said_once_when_recording(project: Path):
    # transformers serve and Ollama's OpenAI endpoint ignore `logprobs` (transformers: seen here): a session
    # recording training data says so instead of writing a trajectory nothing can train on.
    with OpenAIServer([Reply(code=["1"], logprobs=False), Reply(content="done", logprobs=False)]) as server:
        s, events = await session_turn(server, project, record_logprobs=True)
    assert server.requests[0]["logprobs"] is True
    notes = [e.text for e in events if isinstance(e, ev.Note)]
    assert len(notes) == 1 and "returned no logprobs" in notes[0]
    assert next(e for e in events if isinstance(e, ev.TurnFinished)).outcome == "completed"


# --- pages that are not the API ----------------------------------------------------------------------


async def test_a_proxys_html_error_page_is_retried_and_named_by_its_title():
    # nginx, Cloudflare and load balancers answer 502/504 with an HTML page of their own; the `openai` client's
    # message is the page's source. Retried like any 5xx, and said in a line.
    with OpenAIServer([Reply(status=502, html=True), Reply(content="fine")]) as server:
        reasons: list[str] = []
        c = await model_for(server).complete(USER, on_retry=lambda attempt, delay, why: reasons.append(why))
    assert c.message.content == "fine"
    assert reasons == ["HTTP 502: 502 Bad Gateway (an HTML page: a proxy or gateway answered, not the model server)"]


@BOTH
async def test_a_web_page_with_status_200_fails_at_once_naming_the_base_url(stream: bool):
    # A base URL that points at a web UI (or a captive portal) answers 200 with HTML: no retry can help.
    with OpenAIServer([Reply(status=200, html=True)] * 3) as server:
        with pytest.raises(ModelError, match=r"answered with a web page \('200 Bad Gateway'\).*check model.base_url"):
            await model_for(server, stream=stream).complete(USER)
    assert len(server.requests) == 1


# --- fitting the session to the model its server describes -------------------------------------------

TEXT_CELL = "```python\nprint(6 * 7)\n```"


def notes(events: list) -> list[str]:
    return [e.text for e in events if isinstance(e, ev.Note)]


@pytest.mark.parametrize("refusal", [VLLM_NO_TOOL_PARSER, OLLAMA_NO_TOOLS])
async def test_a_server_refusing_tools_switches_the_session_to_text_mode_once_with_a_notice(refusal: str,
                                                                                           project: Path):
    # vLLM started without --enable-auto-tool-choice answers a request with tools with a 400 naming the flag
    # (docs.vllm.ai, "Tool Calling"); Ollama names a model whose template has no tools (ollama/ollama#4532)
    script = [Reply(content=TEXT_CELL), Reply(content="It is 42.")]
    models = [{"id": "fake", "object": "model", "max_model_len": 32768}]
    with OpenAIServer(script, models=models, refuse_tools=refusal) as server:
        s, events = await session_turn(server, project, "what is 6 * 7?")
        refused, *sent = server.requests
    assert s.last_result.answer == "It is 42."
    assert [e.result.stdout for e in events if isinstance(e, ev.CellFinished)] == ["42\n"]
    (note,) = notes(events)
    assert "text mode" in note and refusal in note
    assert "tools" in refused and not any("tools" in r for r in sent)
    assert "ipython" in refused["messages"][0]["content"]
    assert "```python" in sent[0]["messages"][0]["content"] and "`ipython` tool" not in sent[0]["messages"][0]["content"]
    (started,) = [e for e in events if isinstance(e, ev.SessionStarted)]
    assert started.context_window == 32768
    records = [json.loads(line) for line in (s.dir / "trajectory.jsonl").read_text().splitlines()]
    assert [r["content"] for r in records if r["kind"] == "system_prompt"] == [sent[0]["messages"][0]["content"]]


async def test_a_user_who_pinned_tools_mode_gets_the_servers_refusal_as_it_is(project: Path):
    with OpenAIServer([], refuse_tools=VLLM_NO_TOOL_PARSER) as server:
        s, events = await session_turn(server, project, action_format="tools")
    assert s.last_result.outcome == "error" and "--enable-auto-tool-choice" in s.last_result.error
    assert len(server.requests) == 1 and not notes(events)


@pytest.mark.parametrize("pinned", [None, "tools"])
async def test_our_servers_flag_for_a_template_without_tools_starts_the_session_in_text_mode(
        pinned: str | None, project: Path):
    models = [{"id": "fake", "max_model_len": 8192, "tools": False, "owned_by": "prime-agent"}]
    setting = {"action_format": pinned} if pinned else {}
    with OpenAIServer([Reply(content="done")], models=models) as server:
        s, events = await session_turn(server, project, base_prompt="full", **setting)
        (request,) = server.requests
    if pinned:
        assert "tools" in request and not notes(events)
    else:
        assert "tools" not in request and "```python" in request["messages"][0]["content"]
        (note,) = notes(events)
        assert "renders no tools" in note and "text mode" in note


@pytest.mark.parametrize("pinned", [None, "full"])
async def test_a_small_context_gets_the_short_base_prompt_unless_the_user_pinned_one(pinned: str | None,
                                                                                    project: Path):
    models = [{"id": "fake", "max_model_len": 4096}]  # the full system prompt (~1,000 tokens) is over an eighth
    setting = {"base_prompt": pinned} if pinned else {}
    with OpenAIServer([Reply(content="done")], models=models) as server:
        s, events = await session_turn(server, project, **setting)
        system = server.requests[0]["messages"][0]["content"]
    assert s.config.model.context_window == 4096
    if pinned:
        assert "harness" in system and not notes(events)
    else:
        assert len(system) < 1000 and "short base prompt" in notes(events)[0] and "4,096" in notes(events)[0]


async def test_where_the_server_says_nothing_nothing_changes(project: Path):
    with OpenAIServer([Reply(content="done")]) as server:  # no /v1/models at all, as every replay above
        s, events = await session_turn(server, project)
        (request,) = server.requests
    (started,) = [e for e in events if isinstance(e, ev.SessionStarted)]
    assert started.context_window == 128_000 and not notes(events)
    assert "tools" in request and "temperature" not in request and "top_p" not in request
    assert len(request["messages"][0]["content"]) > 3000  # the full base prompt
    assert s.config.model == make_config(model={"name": "fake", "base_url": server.base_url,
                                                "retry_base_delay": 0.01}).model


async def test_explicit_settings_win_over_everything_the_server_says(project: Path):
    models = [{"id": "fake", "max_model_len": 2048, "tools": False,
               "sampling_defaults": {"temperature": 0.2, "top_p": 0.9}}]
    with OpenAIServer([Reply(content="done")], models=models) as server:
        s, events = await session_turn(server, project, context_window=64_000, action_format="tools",
                                       base_prompt="full", temperature=1.0, extra_body={"top_p": 1.0})
        (request,) = server.requests
    assert not notes(events) and s.config.model.context_window == 64_000
    assert "tools" in request and (request["temperature"], request["top_p"]) == (1.0, 1.0)
    assert len(request["messages"][0]["content"]) > 3000
