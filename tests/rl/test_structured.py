"""Structured output in the policy server (rl/grammar.py): `response_format` and forced tool calls, held
by token masks in both samplers. The byte policy (random weights: left alone it writes noise) and the
real SmolLM2, each served by the real `rl serve` app over HTTP."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import httpx2 as httpx
import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field

from rl.engine import HFEngine
from rl.hf import load_hf
from rl.policy.policy import Policy, PolicyConfig
from rl.policy.sampler import Job
from rl.policy.tokenizer import ByteTokenizer
from rl.serve import BackgroundServer, Engine


class Pet(BaseModel):
    """Bounded everywhere, so that even a random policy ends it well inside 256 bytes of context."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=6)
    kind: Literal["cat", "dog", "owl"]
    age: int = Field(ge=0, le=30)
    vaccinated: bool
    tags: list[Literal["old", "shy", "loud"]] = Field(max_length=2)


PET = {"type": "json_schema", "json_schema": {"name": "pet", "schema": Pet.model_json_schema(), "strict": True}}
MOVE = {"type": "function", "function": {"name": "move", "description": "Move the robot.", "parameters": {
    "type": "object", "properties": {"direction": {"enum": ["north", "south"]}, "steps": {"type": "integer", "minimum": 1,
                                                                                         "maximum": 9}},
    "required": ["direction", "steps"], "additionalProperties": False}}}
WAIT = {"type": "function", "function": {"name": "wait", "parameters": {
    "type": "object", "properties": {"seconds": {"type": "integer", "minimum": 0, "maximum": 60}},
    "required": ["seconds"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def byte_server():
    torch.manual_seed(0)
    with BackgroundServer(Engine(Policy(PolicyConfig()))) as url:
        yield url


def post(url: str, path: str = "/chat/completions", **body) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "A pet, as JSON."}])
    return httpx.post(url + path, json=body, timeout=120)


def test_the_server_says_it_enforces_schemas(byte_server: str):
    (entry,) = httpx.get(byte_server + "/models").json()["data"]
    assert entry["structured_outputs"] is True


def test_a_json_schema_reply_is_valid_every_time_at_temperature_1(byte_server: str):
    free = post(byte_server, max_tokens=200, seed=1, n=4).json()
    assert not any(_valid(Pet, c["message"]["content"]) for c in free["choices"])  # the policy alone writes noise
    body = post(byte_server, response_format=PET, max_tokens=200, seed=0, n=16, temperature=1.0, logprobs=True).json()
    assert len(body["choices"]) == 16
    for c in body["choices"]:  # one batch of 16 rows, each its own matcher
        Pet.model_validate_json(c["message"]["content"])
        assert c["finish_reason"] == "stop"
        assert all(math.isfinite(e["logprob"]) for e in c["logprobs"]["content"])


def test_logprobs_are_of_the_masked_distribution(byte_server: str):
    # every byte of {"kind": "fixed"} is forced: each was sampled with probability 1; then one of the two
    # end tokens (the policy's <|end|> and <eos>), with its share of the two
    schema = {"type": "object", "properties": {"kind": {"const": "fixed"}}, "required": ["kind"],
              "additionalProperties": False}
    body = post(byte_server, response_format={"type": "json_schema", "json_schema": {"name": "k", "schema": schema}},
                logprobs=True, seed=3).json()
    (choice,) = body["choices"]
    assert choice["message"]["content"] == '{"kind": "fixed"}'
    *text, end = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert text == [0.0] * len('{"kind": "fixed"}') and math.log(0.5) - 3 < end < 0
    assert choice["token_ids"][-1] in (ByteTokenizer.END, ByteTokenizer.EOS)
    free = post(byte_server, logprobs=True, seed=3, max_tokens=8).json()["choices"][0]["logprobs"]["content"]
    assert all(e["logprob"] < -1 for e in free)  # the policy's own: near uniform over 264 tokens


def test_a_json_object_reply_parses(byte_server: str):
    for seed in range(3):
        body = post(byte_server, response_format={"type": "json_object"}, max_tokens=240, seed=seed, n=2).json()
        done = [c for c in body["choices"] if c["finish_reason"] == "stop"]
        for c in done:
            assert isinstance(json.loads(c["message"]["content"]), dict)
        # a free object may not close within the budget (a random policy opens keys without end): what was
        # written is a prefix of JSON, never anything else
        for c in body["choices"]:
            assert c["message"]["content"].startswith("{")


def test_a_completions_request_is_constrained_too(byte_server: str):
    body = httpx.post(byte_server + "/completions", json={"prompt": "pet:", "response_format": PET, "max_tokens": 200,
                                                          "seed": 4}, timeout=120).json()
    Pet.model_validate_json(body["choices"][0]["text"])


def test_a_forced_tool_call_has_arguments_valid_under_the_tool_schema(byte_server: str):
    # the byte policy's template renders no tools: a tools request is refused unless it forces a call
    assert post(byte_server, tools=[MOVE]).status_code == 400
    body = post(byte_server, tools=[MOVE, WAIT], tool_choice={"type": "function", "function": {"name": "move"}},
                seed=0, n=4, max_tokens=100).json()
    assert len(body["choices"]) == 4
    for choice in body["choices"]:
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "move" and call["id"].startswith("call_")
        args = json.loads(call["function"]["arguments"])
        assert args["direction"] in ("north", "south") and 1 <= args["steps"] <= 9 and set(args) == {"direction", "steps"}
    names = set()
    body = post(byte_server, tools=[MOVE, WAIT], tool_choice="required", seed=0, n=6, max_tokens=200).json()
    assert len(body["choices"]) == 6
    for choice in body["choices"]:
        if choice["finish_reason"] == "length":  # a random policy may keep adding calls to the array
            continue
        assert choice["finish_reason"] == "tool_calls"
        for call in choice["message"]["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            names.add(call["function"]["name"])
            assert set(args) == ({"direction", "steps"} if call["function"]["name"] == "move" else {"seconds"})
    assert names  # some reply ended


@pytest.mark.parametrize("body, says", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array",
                                                                                          "uniqueItems": True}}}},
     "uniqueItems"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}},
     "not"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
                                                                                          "format": "zip-code"}}}},
     "zip-code"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "'yaml' is not supported"),
    ({"tools": [MOVE], "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "'fly'"),
    ({"tool_choice": "required"}, "no tools"),
    ({"tools": [MOVE], "tool_choice": "required", "response_format": PET}, "cannot both"),
    ({"response_format": PET, "ignore_eos": True}, "ignore_eos"),
])
def test_what_cannot_be_enforced_is_a_clear_400(byte_server: str, body: dict, says: str):
    r = post(byte_server, **body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]
    assert post(byte_server, response_format=PET, max_tokens=200, seed=0).status_code == 200  # and the server goes on


def test_a_stream_under_a_schema_is_the_same_json(byte_server: str):
    plain = post(byte_server, response_format=PET, max_tokens=200, seed=7).json()["choices"][0]["message"]["content"]
    text = ""
    with httpx.stream("POST", byte_server + "/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "A pet, as JSON."}], "response_format": PET, "max_tokens": 200,
            "seed": 7, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    text += c["delta"].get("content") or ""
    assert text == plain
    Pet.model_validate_json(text)


def test_a_streamed_forced_call_is_the_same_call(byte_server: str):
    body = {"tools": [MOVE, WAIT], "tool_choice": {"type": "function", "function": {"name": "wait"}}, "seed": 5,
            "max_tokens": 60, "logprobs": True}
    (plain,) = post(byte_server, **body).json()["choices"][0]["message"]["tool_calls"]
    calls, finish, tokens = [], None, 0
    with httpx.stream("POST", byte_server + "/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "A pet, as JSON."}], "stream": True, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    assert not c["delta"].get("content")  # a call is no text
                    calls += c["delta"].get("tool_calls") or []
                    tokens += len(c.get("token_ids") or [])
                    finish = c["finish_reason"] or finish
    (call,) = calls
    assert finish == "tool_calls" and tokens > 0
    assert call["function"] == plain["function"] and call["index"] == 0


def test_constrained_and_free_rows_share_a_continuous_batch(tiny_llama: Path):
    # each row its own matcher: a free greedy row samples the same tokens beside constrained ones as alone
    engine = HFEngine(load_hf(tiny_llama), name="tiny")
    grammar = engine.grammars.compile(_grammar(PET))
    prompt = engine.tok.chat([{"role": "user", "content": "a pet"}])
    alone = _wait(engine.submit(Job([prompt], 20, 0.0, 1.0, None, [])))
    jobs = [engine.submit(Job([prompt] * 3, 120, 1.0, 1.0, seed, [], grammar=grammar)) for seed in (1, 2)]
    free = engine.submit(Job([prompt], 20, 0.0, 1.0, None, []))
    for job in jobs:
        for row in _wait(job).result:
            Pet.model_validate_json(engine.tok.decode(row.tokens))
            assert row.finish_reason == "stop" and row.tokens[-1] in engine.eos
    assert _wait(free).result[0].tokens == alone.result[0].tokens
    engine.stop()


@pytest.mark.timeout(600)  # the real model (pulled and converted on first use) on 2 cores, maybe loaded
def test_smollm2_answers_in_the_schema_at_temperature_1(smollm2: Path):
    engine = HFEngine(load_hf(smollm2), name="smollm2")
    try:
        with BackgroundServer(engine) as url:
            body = post(url, response_format=PET, max_tokens=120, seed=0, n=4, temperature=1.0,  # one batch: cheap
                        messages=[{"role": "user", "content": "Describe a pet as JSON."}]).json()
            assert len(body["choices"]) == 4
            for c in body["choices"]:
                Pet.model_validate_json(c["message"]["content"])
            body = post(url, tools=[MOVE, WAIT], tool_choice={"type": "function", "function": {"name": "wait"}},
                        seed=0, max_tokens=40, messages=[{"role": "user", "content": "Wait ten seconds."}]).json()
            (call,) = body["choices"][0]["message"]["tool_calls"]
            assert 0 <= json.loads(call["function"]["arguments"])["seconds"] <= 60
    finally:
        engine.stop()


def _grammar(response_format: dict) -> str:
    from rl.grammar import constraint

    c = constraint(response_format, None, None)
    assert c is not None
    return c.grammar


def _wait(job: Job) -> Job:
    assert job.done.wait(120)
    assert job.error is None, job.error
    return job


def _valid(model: type[BaseModel], text: str) -> bool:
    try:
        model.model_validate_json(text)
        return True
    except ValueError:
        return False
