"""The policy, its sampler, checkpoints, and the OpenAI-compatible server in front of it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch

from rl.policy.checkpoint import latest_checkpoint, load_policy, save_checkpoint
from rl.policy.policy import Policy, PolicyConfig, token_logprobs
from rl.policy.sampler import generate
from rl.policy.tokenizer import ByteTokenizer
from rl.serve import BackgroundServer, Engine
from tests.rl.servers import policy_server

SMALL = PolicyConfig(d_model=32, n_layer=2, n_head=2, max_seq=64)


@pytest.fixture
def policy() -> Policy:
    torch.manual_seed(0)
    return Policy(SMALL)


def test_sampler_logprobs_match_the_trainer(policy: Policy):
    tok = ByteTokenizer()
    prompts = [tok.chat([{"role": "user", "content": t}]) for t in ["hi", "a longer prompt"]]
    out = generate(policy, prompts, max_tokens=10, temperature=0.8, generator=torch.Generator().manual_seed(1))
    for p, s in zip(prompts, out):
        ids = torch.tensor([p + s.tokens])
        trainer = token_logprobs(policy, ids, temperature=0.8)[0, len(p) - 1 :]
        assert torch.allclose(trainer, torch.tensor(s.logprobs), atol=1e-4)  # left padding and the KV cache change nothing


def test_checkpoints_are_complete_or_ignored(policy: Policy, tmp_path: Path):
    opt = torch.optim.AdamW(policy.parameters())
    save_checkpoint(tmp_path / "step-3", policy, opt, 3)
    (tmp_path / "step-9.partial").mkdir()  # a save cut short
    (tmp_path / "step-9").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-3"
    loaded = load_policy(tmp_path / "step-3")
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_policy(tmp_path / "step-9")


def test_the_openai_client_works_against_the_server(policy: Policy, tmp_path: Path):
    engine = Engine(policy)
    with BackgroundServer(engine) as url:
        client = openai.OpenAI(base_url=url, api_key="none")
        assert client.models.list().data[0].id == "prime-policy"
        r = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hello"}], n=3,
                                           max_tokens=8, logprobs=True, temperature=1.0)
        assert len(r.choices) == 3 and r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)
        first = r.choices[0]
        assert len(first.logprobs.content) == len(first.model_extra["token_ids"]) and all(t.logprob <= 0 for t in first.logprobs.content)
        seeded = [client.completions.create(model="p", prompt="abc", max_tokens=6, seed=5, logprobs=1) for _ in range(2)]
        assert seeded[0].choices[0].text == seeded[1].choices[0].text
        assert seeded[0].choices[0].logprobs.token_logprobs == seeded[1].choices[0].logprobs.token_logprobs
        stopped = client.completions.create(model="p", prompt="abc", max_tokens=40, temperature=0, stop=["\x00never"])
        assert stopped.choices[0].finish_reason in ("stop", "length")
        chunks = list(client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                                     stream=True, logprobs=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens >= 1 and chunks[0].choices[0].delta.role == "assistant"

        # Hot reload: new weights, a new version, and a request in flight meanwhile still completes.
        save_checkpoint(tmp_path / "step-7", Policy(SMALL), None, 7)

        async def during_reload():
            ac = openai.AsyncOpenAI(base_url=url, api_key="none")
            slow = asyncio.create_task(ac.completions.create(model="p", prompt="abc", max_tokens=40, temperature=1.0))
            reloaded = await ac.post("/reload", body={"path": str(tmp_path)}, cast_to=object)
            return await slow, reloaded

        done, reloaded = asyncio.run(during_reload())
        assert reloaded == {"policy_version": 7} and done.choices[0].text is not None
        after = client.completions.create(model="p", prompt="abc", max_tokens=2)
        assert after.model_extra["policy_version"] == 7
        bad = client.with_options(max_retries=0)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 64 tokens"):
            bad.completions.create(model="p", prompt="x" * 100, max_tokens=2)


def test_prime_agent_run_works_against_prime_agent_rl_serve(project: Path):
    with policy_server("--truncate") as url:
        env = {**os.environ, "OPENAI_BASE_URL": url, "PRIME_AGENT_MODEL": "prime-policy"}
        run = subprocess.run([str(Path(sys.executable).parent / "prime-agent"), "run", "--json", "--set",
                              "model.max_completion_tokens=16", "say something"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        finished = json.loads(run.stdout.splitlines()[-1])
        assert finished["type"] == "turn.finished" and finished["outcome"] == "completed"


def test_bad_reloads_are_refused_and_streams_match_plain_replies(policy: Policy, tmp_path: Path):
    save_checkpoint(tmp_path / "wide" / "step-1", Policy(PolicyConfig(d_model=64, n_layer=2, n_head=2, max_seq=64)), None, 1)
    with BackgroundServer(Engine(policy)) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="do not fit this policy"):
            client.post("/reload", body={"path": str(tmp_path / "wide")}, cast_to=object)
        assert client.completions.create(model="p", prompt="abc", max_tokens=3).model_extra["policy_version"] == 0
        for stop in (None, ["a"], ["zz", "b"]):
            plain = client.completions.create(model="p", prompt="abc", max_tokens=30, seed=11, stop=stop)
            streamed = "".join(c.choices[0].text for c in client.completions.create(
                model="p", prompt="abc", max_tokens=30, seed=11, stop=stop, stream=True) if c.choices)
            assert streamed == plain.choices[0].text


def test_one_long_prompt_does_not_cut_another_rows_completion(policy: Policy):
    tok = ByteTokenizer()
    short, long = tok.encode("hi"), tok.encode("x" * 60)  # max_seq 64
    out = generate(policy, [short, long], max_tokens=20, stop_ids=(), generator=torch.Generator().manual_seed(0))
    assert len(out[0].tokens) == 20 and len(out[1].tokens) == 4


def test_a_checkpoint_interrupted_before_its_rename_is_ignored(policy: Policy, tmp_path: Path):
    save_checkpoint(tmp_path / "step-2", policy, None, 2)
    partial = tmp_path / "step-4.partial"
    partial.mkdir()
    (partial / "COMPLETE").write_text("4")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-2"
