"""The policy server on Hugging Face causal LMs (rl/engine.py): a tiny random-init llama with a
byte-level tokenizer and a ChatML template (tests/rl/conftest.py), never downloaded. Greedy decoding
is compared with plain transformers' own `generate`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from rl.engine import BLOCK, SHARED_HEAD, HFEngine, _Threads
from rl.hf import load_hf
from rl.policy.sampler import Job
from rl.serve import BackgroundServer
from tests.rl.conftest import CHATML
from tests.rl.servers import alone_and_together


@pytest.fixture(scope="module")
def tiny(tiny_llama: Path) -> Path:
    return tiny_llama


@pytest.fixture
def engine(tiny: Path) -> HFEngine:
    return HFEngine(load_hf(tiny), name="tiny")


def chat(engine: HFEngine, text: str) -> list[int]:
    return engine.tok.chat([{"role": "user", "content": text}])


def sample(engine: HFEngine, prompts: list[list[int]], max_tokens: int = 24, temperature: float = 0.0,
           seed: int | None = None) -> list[Job]:
    jobs = [engine.submit(Job([p], max_tokens, temperature, 1.0, seed, [])) for p in prompts]
    for j in jobs:
        assert j.done.wait(60)
        assert j.error is None, j.error
    return jobs


PROMPTS = ["What is the capital of France?", "Write a python cell that prints 2 + 2.", "héllo wörld ✓",
           "Count: one two three four five six seven eight nine ten eleven twelve"]


def test_greedy_decoding_equals_plain_transformers_token_for_token(tiny: Path, engine: HFEngine):
    reference = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    for text in PROMPTS:
        prompt = chat(engine, text)
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):]
        (job,) = sample(engine, [prompt])
        got = job.result[0].tokens
        assert got[: len(expected)] == expected.tolist(), text
        assert len(job.result[0].logprobs) == len(got)


@pytest.mark.parametrize("config", [
    Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, tie_word_embeddings=False, initializer_range=0.3, use_sliding_window=False),
    Qwen3Config(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, initializer_range=0.3),
], ids=["qwen2-fused", "qwen3-transformers-modules"])
def test_other_architectures_decode_greedily_as_plain_transformers(tiny: Path, tmp_path: Path, config):
    # qwen2: rl/decoder.py's fused pass with q/k/v biases and an untied head; qwen3 (q/k norms): transformers' own modules
    for f in tiny.iterdir():
        if "token" in f.name or f.suffix == ".jinja":
            shutil.copy(f, tmp_path / f.name)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    engine = HFEngine(load_hf(tmp_path))
    assert (engine.decoder is not None) == (config.model_type == "qwen2")
    for text in PROMPTS:
        prompt = chat(engine, text)
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):]
        assert sample(engine, [prompt])[0].result[0].tokens[: len(expected)] == expected.tolist(), text


def test_requests_join_a_running_batch_and_each_equals_its_own_request_alone(engine: HFEngine):
    prompts = [chat(engine, f"{t} #{i}") for i, t in enumerate(PROMPTS * 3)]
    alone = [sample(engine, [p], 40)[0].result[0].tokens for p in prompts]
    steps = engine.stats["steps"]
    first = [engine.submit(Job([p], 40, 0.0, 1.0, None, [])) for p in prompts[:6]]
    time.sleep(0.05)  # the first six are decoding when the rest arrive
    rest = [engine.submit(Job([p], 40, 0.0, 1.0, None, [])) for p in prompts[6:]]
    for j in first + rest:
        assert j.done.wait(60) and j.error is None
    assert [j.result[0].tokens for j in first + rest] == alone
    assert engine.stats["steps"] - steps < sum(len(t) for t in alone) / 3  # batched: far fewer steps than tokens


def test_a_shared_prompt_head_is_computed_once_and_changes_nothing(tiny: Path, engine: HFEngine):
    head = "You are a careful agent. " * 12
    first, second = chat(engine, head + "Task one."), chat(engine, head + "Task two, another one.")
    (a,) = sample(engine, [first])
    (b,) = sample(engine, [second])
    shared = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
    assert a.cached == [0]
    assert b.cached == [shared // BLOCK * BLOCK] and b.cached[0] >= shared - BLOCK
    uncached = HFEngine(load_hf(tiny), prefix_cache_mb=0)
    assert sample(uncached, [second])[0].result[0].tokens == b.result[0].tokens
    assert sample(uncached, [second])[0].cached == [0]


def test_a_wave_sharing_a_head_computes_it_once_and_long_prompts_prefill_in_chunks(tiny: Path):
    chunked = HFEngine(load_hf(tiny), max_batched_tokens=2 * BLOCK)  # every prompt is longer than one pass
    head = "You are a careful agent. Answer in one cell. " * 6
    wave = [chat(chunked, head + f"Task {i}: say {i}.") for i in range(4)]
    shared = min(next(i for i, (x, y) in enumerate(zip(wave[0], w)) if x != y) for w in wave[1:])
    assert all(len(p) > 4 * BLOCK for p in wave)
    job = chunked.submit(Job(wave, 12, 0.0, 1.0, None, []))  # arriving together, as an RL group's rollouts do
    assert job.done.wait(60) and job.error is None
    one_pass = HFEngine(load_hf(tiny), prefix_cache_mb=0, max_batched_tokens=8192)
    alone = [sample(one_pass, [p], 12)[0] for p in wave]
    assert [s.tokens for s in job.result] == [a.result[0].tokens for a in alone]  # chunks change nothing
    assert job.cached[0] == 0  # the first computed every chunk of its prompt, the head included
    assert all(c >= shared // BLOCK * BLOCK - BLOCK for c in job.cached[1:])  # the others found the head


def test_rows_that_share_a_head_hold_it_once_whenever_they_join_and_a_row_without_it_gets_it_back(
        engine: HFEngine):
    head = "You are a careful agent. Answer in one cell. " * 6
    wave = [chat(engine, head + f"Task {i}: say {i}.") for i in range(4)]
    other = chat(engine, "Something else entirely.")
    alone = [sample(engine, [p], 12)[0].result[0].tokens for p in [*wave, other]]
    seen, jobs = [], []

    def watch(who: str):
        def on_token(row: int, token: int, logprob: float) -> bool:  # in the engine's thread, between steps
            seen.append((who, len(engine.rows), len(engine.slots.head), engine.slots.nbytes))
            if len(seen) == 2:  # the first row decodes alone: the rest of its group joins
                jobs.append(engine.submit(Job(wave[1:], 12, 0.0, 1.0, None, [], on_token=watch("group"))))
            if len(seen) == 12:  # a request without the head joins the group
                jobs.append(engine.submit(Job([other], 12, 0.0, 1.0, None, [], on_token=watch("other"))))
            return False
        return on_token

    first = engine.submit(Job(wave[:1], 12, 0.0, 1.0, None, [], on_token=watch("group")))
    assert first.done.wait(60) and first.error is None
    for j in jobs:
        assert j.done.wait(60) and j.error is None
    assert [s.tokens for j in [first, *jobs] for s in j.result] == alone  # sharing changes no token
    joined = next(i for i, (who, *_) in enumerate(seen) if who == "other")  # its first token: sampled before it
    together = [(h, nbytes) for _, rows, h, nbytes in seen[:joined] if rows == 4]  # went into the slots
    assert together and all(h >= len(head) // BLOCK * BLOCK - 2 * BLOCK for h, _ in together)
    # the head once, and each row's own columns with room to grow: less than three copies of a prompt, not four
    assert max(n for _, n in together) < 3 * len(wave[0]) * engine.token_bytes
    assert seen[joined][2] == 0  # the head went back into each row


def test_a_groups_shared_head_is_its_prefill_passs_own_keys_and_values_not_a_copy(tiny: Path):
    # an RL group's rows: one prompt n times; the slots hold its head as the pass computed it (before, it was
    # copied twice over: 120 MB of SmolLM2's 1.3k-token prompt at the group's memory peak)
    engine = HFEngine(load_hf(tiny), thread=False)
    prompt = chat(engine, "You are a careful agent. Answer in one cell. " * 6 + "Task: say 1.")
    job = Job([prompt] * 4, 8, 0.0, 1.0, None, [])
    with torch.inference_mode(), torch.profiler.profile(profile_memory=True) as prof:
        engine._start([job])
    head = len(engine.slots.head)
    assert head >= SHARED_HEAD and len(engine.rows) == 4
    layers = len(engine.slots.k)
    one_layer = head * engine.token_bytes // (2 * layers)  # a layer's keys (or values) of the head
    copies = [e.cpu_memory_usage for e in prof.events() if e.name in ("aten::clone", "aten::copy_", "aten::cat")]
    assert max(copies) < one_layer
    (alone,) = sample(HFEngine(load_hf(tiny), prefix_cache_mb=0), [prompt], 8)
    with torch.inference_mode():
        while engine.rows:
            engine._step()
    assert [r.tokens for r in job.result] == [alone.result[0].tokens] * 4  # greedy: each row as the prompt alone


def test_n_rows_of_one_prompt_are_prefilled_once_and_sample_apart(engine: HFEngine):
    prompt = chat(engine, "Tell me something.")
    job = engine.submit(Job([prompt] * 4, 16, 1.0, 1.0, 7, []))
    assert job.done.wait(60) and job.error is None
    assert job.cached == [0] + [len(prompt)] * 3
    assert len({tuple(s.tokens) for s in job.result}) > 1
    again = engine.submit(Job([prompt] * 4, 16, 1.0, 1.0, 7, []))
    assert again.done.wait(60)
    assert [s.tokens for s in again.result] == [s.tokens for s in job.result]  # seeded: the same samples


def test_a_seeded_request_samples_the_same_whatever_else_is_in_the_batch(engine: HFEngine):
    prompt = chat(engine, "Pick a word.")
    (alone,) = sample(engine, [prompt], 20, temperature=1.0, seed=11)
    crowd = [engine.submit(Job([chat(engine, f"noise {i}")], 30, 1.0, 0.9, None, [])) for i in range(5)]
    seeded = engine.submit(Job([prompt], 20, 1.0, 1.0, 11, []))
    for j in crowd + [seeded]:
        assert j.done.wait(60)
    assert seeded.result[0].tokens == alone.result[0].tokens
    assert seeded.result[0].logprobs == pytest.approx(alone.result[0].logprobs, abs=1e-4)


def test_new_weights_swap_in_after_the_running_rows_and_empty_the_prefix_cache(tiny: Path, engine: HFEngine):
    prompt = chat(engine, "Say something long.")
    (before,) = sample(engine, [prompt])
    running = engine.submit(Job([prompt], 200, 0.0, 1.0, None, [], ignore_eos=True))
    time.sleep(0.05)
    changed = {k: v + 0.05 * torch.randn_like(v) for k, v in load_hf(tiny).inner.state_dict().items()}
    engine.update(changed, version=3)
    after = engine.submit(Job([prompt], 24, 0.0, 1.0, None, []))
    assert running.done.wait(60) and after.done.wait(60)
    assert running.version == 0 and running.result[0].tokens[:24] == before.result[0].tokens
    assert after.version == 3 and after.cached == [0] and after.result[0].tokens != before.result[0].tokens
    with pytest.raises(ValueError, match="do not fit"):
        engine.update({"model.embed_tokens.weight": torch.zeros(3, 3)}, version=4)


def test_the_server_answers_the_openai_client_with_a_logprob_and_id_per_token(engine: HFEngine):
    with BackgroundServer(engine) as url:
        client = openai.OpenAI(base_url=url, api_key="none")
        (model,) = client.models.list().data
        assert model.id == "tiny" and model.max_model_len == 512
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
                                           temperature=0, logprobs=True)
        choice = r.choices[0]
        ids = choice.model_extra["token_ids"]
        assert len(ids) == len(choice.logprobs.content) == r.usage.completion_tokens > 0
        assert choice.message.content == engine.tok.decode(ids)
        streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=12, temperature=0, stream=True,
                                                  stream_options={"include_usage": True})
        chunks = list(streamed)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
        # the same prompt again: its head comes from the cache, all but the last token (its logits are needed)
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (r.usage.prompt_tokens - 1) // BLOCK * BLOCK
        stop = choice.message.content[3:5]
        cut = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=12, temperature=0, stop=[stop])
        assert cut.choices[0].message.content == choice.message.content[: choice.message.content.index(stop)]
        assert cut.choices[0].finish_reason == "stop"
        done = client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=5, temperature=0, n=2)
        assert [c.text for c in done.choices][0] == [c.text for c in done.choices][1]
        with pytest.raises(openai.BadRequestError, match="context"):
            client.completions.create(model="tiny", prompt=[5] * 600, max_tokens=5)
        with pytest.raises(openai.BadRequestError, match="token ids"):
            client.completions.create(model="tiny", prompt=[10 ** 6], max_tokens=5)


def test_thirty_two_concurrent_http_requests_each_equal_their_own_request_alone(engine: HFEngine):
    with BackgroundServer(engine) as url:
        alone, together = alone_and_together(url, "tiny", [f"question {i}" for i in range(32)])
    assert together == alone


def test_a_failing_request_fails_alone_and_the_server_keeps_serving(engine: HFEngine):
    good = chat(engine, "fine")
    bad = engine.submit(Job([[engine.vocab_size + 5]], 5, 0.0, 1.0, None, []))  # past the embedding table
    assert bad.done.wait(60) and bad.error is not None
    (ok,) = sample(engine, [good])
    assert ok.result[0].tokens


def test_a_client_that_hangs_up_stops_its_rows(tiny: Path):
    engine = HFEngine(load_hf(tiny), name="tiny", context=8192)  # rope goes past the 512 it was made for
    body = {"model": "tiny", "prompt": "go", "max_tokens": 8000, "ignore_eos": True, "temperature": 0}
    with BackgroundServer(engine) as url:
        with httpx.stream("POST", f"{url}/completions", json={**body, "stream": True}, timeout=30) as r:
            next(r.iter_lines())
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 10
        while engine.rows and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.rows
        assert engine.stats["steps"] < 4000  # both dropped long before their 8,000 tokens


def test_a_model_directory_hot_reloads_over_http_and_a_wrong_one_is_refused(tiny: Path, engine: HFEngine,
                                                                            tmp_path: Path):
    changed = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    changed.save_pretrained(tmp_path / "step-5")
    (tmp_path / "step-5" / "COMPLETE").write_text("5")
    wrong = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(wrong).save_pretrained(tmp_path / "wrong")
    with BackgroundServer(engine) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        ask = dict(model="tiny", prompt="abc", max_tokens=8, temperature=0)
        before = client.completions.create(**ask)
        assert client.post("/reload", body={"path": str(tmp_path)}, cast_to=object)["policy_version"] == 5
        after = client.completions.create(**ask)
        assert after.model_extra["policy_version"] == 5 and after.choices[0].text != before.choices[0].text
        with pytest.raises(openai.BadRequestError, match="do not fit"):
            client.post("/reload", body={"path": str(tmp_path / "wrong")}, cast_to=object)
        assert client.completions.create(**ask).choices[0].text == after.choices[0].text


def test_rl_serve_model_refuses_another_model_name_and_stops_on_sigterm_with_a_request_in_flight(tiny: Path):
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).parent / "prime-agent"), "rl", "serve", "--model", str(tiny),
                               "--served-model-name", "tiny", "--max-model-len", "8192", "--port", str(port)],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert any("policy server:" in line for line in iter(server.stdout.readline, ""))  # after the load's progress
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/models", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        # a misspelt name is refused as OpenAI and vLLM refuse it, on both routes, not answered by the model served
        client = openai.OpenAI(base_url=url, api_key="none")
        with pytest.raises(openai.NotFoundError, match="The model `tiyn` does not exist: this server serves `tiny`") as e:
            client.chat.completions.create(model="tiyn", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert e.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="tiyn", prompt="go", max_tokens=2)

        def tokens(line: str) -> int:  # a streamed event's sampled tokens
            if not line.startswith("data: {"):
                return 0
            return sum(len(c.get("token_ids") or []) for c in json.loads(line[6:]).get("choices", []))

        # SIGTERM cuts a request in flight short: the server does not first serve its 8,000 tokens
        body = {"model": "tiny", "prompt": "go", "max_tokens": 8000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            streamed = tokens(next(lines))
            server.send_signal(signal.SIGTERM)
            with contextlib.suppress(httpx.HTTPError):  # the connection closes mid-stream
                streamed += sum(map(tokens, lines))
        assert server.wait(timeout=120) is not None
        assert streamed < 8000
    finally:
        server.kill()
        server.wait()


def test_a_server_stopped_while_it_starts_a_request_fails_that_request(tiny: Path):
    """`rl serve` stops on SIGTERM by raising KeyboardInterrupt wherever its sampling loop is: here in the
    middle of starting a request (its first token sent, its row not yet in the batch). That request ends
    with an error, not left for its client to wait on."""
    engine = HFEngine(load_hf(tiny), name="tiny", thread=False)

    def stop(row: int, token: int, logprob: float) -> bool:
        raise KeyboardInterrupt  # as the signal would, here

    job = engine.submit(Job([chat(engine, PROMPTS[0])], 50, 0.0, 1.0, None, [], on_token=stop))
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    engine.close()
    assert job.done.is_set() and "shutting down" in str(job.error)


def test_memory_follows_the_work_and_the_listing_reports_it(tiny: Path):
    engine = HFEngine(load_hf(tiny), name="tiny")
    config = load_hf(tiny).inner.config
    assert engine.token_bytes == 2 * config.num_hidden_layers * config.num_key_value_heads * 16 * 4
    assert engine.prefix.max_bytes >= engine.context * engine.token_bytes  # one full context, by default
    idle = 64 * engine.token_bytes  # one row of 64 columns
    with BackgroundServer(engine) as url:
        def memory() -> dict[str, int]:
            return httpx.get(f"{url}/models").json()["data"][0]["memory"]

        before = memory()
        # the packed weights are the only copy: the model's parameters, and a tied head packed again
        assert before["weights"] == (load_hf(tiny).num_params() + config.vocab_size * config.hidden_size) * 4
        assert before["kv_cache"] == idle and before["prefix_cache"] == 0
        assert before["pss"] == before["weights"] + before["kv_cache"] + before["other"] > before["weights"]
        jobs = [engine.submit(Job([chat(engine, f"Say {i} things.")], 300, 0.0, 1.0, None, [], ignore_eos=True))
                for i in range(8)]
        deadline = time.monotonic() + 60
        while engine.stats["steps"] < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        during = memory()
        for j in jobs:
            assert j.done.wait(120) and j.error is None
        after = memory()
    assert during["kv_cache"] >= 8 * 20 * engine.token_bytes  # 8 rows of at least 20 columns
    assert after["kv_cache"] == idle  # the batch ended: its slots are freed
    assert 0 < after["prefix_cache"] <= engine.prefix.max_bytes  # the prompts' whole blocks


def test_bfloat16_serves_the_model_at_half_the_width(tiny: Path):
    engine = HFEngine(load_hf(tiny), dtype=torch.bfloat16)
    assert engine.memory()["weights"] * 2 == HFEngine(load_hf(tiny), thread=False).memory()["weights"]
    (job,) = sample(engine, [chat(engine, PROMPTS[0])], 8)
    assert len(job.result[0].tokens) == 8
    assert all(-30 < lp <= 0 for lp in job.result[0].logprobs)


TOOLS_CHATML = ("{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | map(attribute='function.name') | join(', '))"
                " + '<|im_end|>\\n' }}{% endif %}" + CHATML)
IPYTHON = [{"type": "function", "function": {"name": "ipython", "parameters": {"type": "object", "properties": {}}}}]


def test_the_model_listing_says_what_a_client_needs_to_fit_the_model_and_tools_are_never_dropped_silently(
        tiny: Path, tmp_path: Path):
    # the tiny model's ChatML template renders no tools: said in /v1/models, and a request with tools is refused
    # with a 400 as vLLM's and Ollama's are (the agent switches to text mode on it), not sampled without them
    with BackgroundServer(HFEngine(load_hf(tiny), name="tiny")) as url:
        client = openai.OpenAI(base_url=url, api_key="none")
        (model,) = client.models.list().data
        assert (model.max_model_len, model.tools, model.sampling_defaults) == (512, False, {})
        with pytest.raises(openai.BadRequestError, match="tiny does not support tools"):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, tools=IPYTHON)
    # a model whose generation_config.json sets its sampling, and whose template renders tools
    shutil.copytree(tiny, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    (tmp_path / "m" / "chat_template.jinja").write_text(TOOLS_CHATML)
    config.pop("chat_template", None)
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps(config))
    generation = {"do_sample": True, "temperature": 0.2, "top_p": 0.9, "eos_token_id": config.get("eos_token_id")}
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(generation))
    engine = HFEngine(load_hf(tmp_path / "m"), name="m")
    with BackgroundServer(engine) as url:
        client = openai.OpenAI(base_url=url, api_key="none")
        (model,) = client.models.list().data
        assert (model.tools, model.sampling_defaults) == (True, {"temperature": 0.2, "top_p": 0.9})
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                           tools=IPYTHON)
    assert "Tools: ipython" in engine.tok.tok.decode(r.model_extra["prompt_token_ids"])


def test_decode_steps_run_on_the_thread_count_that_has_been_faster_and_prefills_where_it_clearly_was():
    threads = _Threads(2, period=10, trial=2, longest=20)
    for slow, period in ((1, 20), (1, 20), (2, 10), (2, 20)):  # one thread slower, then faster
        seen = []
        for _ in range(period):
            n = threads.next()
            seen.append(n)
            threads.took(n, 0.2 if n == slow else 0.1)
        # each choice tried twice, the faster kept; one that wins again is kept twice as long (at most 20)
        assert seen[:4] == [1, 1, 2, 2] and set(seen[4:]) == {3 - slow}, (slow, seen)
        assert threads.prefill == 3 - slow  # won by 2x: a loaded machine, prefills follow
    for _ in range(20):  # one thread faster by a tenth (a near tie at a small batch): prefills keep both
        n = threads.next()
        threads.took(n, 0.1 if n == 1 else 0.11)
    assert (threads.best, threads.prefill) == (1, 2)


@pytest.mark.parametrize("head_text, task, one_pass", [
    ("You are a careful agent. " * 6, "Task {i}: say {i}.", False),  # a long head, a short tail: two passes merged
    ("Hi.", "Task {i}: say {i}. " * 40, True),  # a tail 8x the head or more: one pass, the head's queries dropped
])
def test_a_prefill_after_a_cached_head_attends_without_a_mask_and_gives_the_whole_prompts_logits(
        tiny: Path, head_text: str, task: str, one_pass: bool):
    # causal over the new tokens and whole over the cached head, one row and two in a pass
    engine = HFEngine(load_hf(tiny), thread=False)
    reference = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    head = chat(engine, head_text)[:-2]
    prompts = [head + chat(engine, task.format(i=i)) for i in range(4)]
    assert len({len(p) for p in prompts}) == 1
    with torch.inference_mode():
        results = [r for batch in (prompts[:1], prompts[1:2], prompts[2:]) for r in engine._prefill(batch)[0]]
        for p, (keys, _, logits, computed) in zip(prompts, results):
            expected = reference(torch.tensor([p])).logits[0, -1]
            assert torch.allclose(logits, expected, atol=1e-4), (logits - expected).abs().max()
            assert keys[0].shape[1] == len(p)
    shared = len(os.path.commonprefix(prompts)) // BLOCK * BLOCK  # the others' passes start after it
    assert [r[3] for r in results] == [len(prompts[0])] + [len(prompts[1]) - shared] * 3
    assert shared >= BLOCK and (shared * 8 <= len(prompts[1]) - shared) == one_pass  # the pass each case is for


def test_a_model_with_heads_of_64_prefills_on_the_native_attention_as_transformers_computes(tiny: Path, tmp_path: Path):
    # SmolLM2's head size and grouping (3 query heads to a key/value head): rl/_kernels.c runs its
    # prefills, fresh and after a cached head, short and long tails; the greedy tokens and logits are
    # transformers' own
    for f in tiny.iterdir():
        if "token" in f.name or f.suffix == ".jinja":
            shutil.copy(f, tmp_path / f.name)
    config = LlamaConfig(vocab_size=259, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                         initializer_range=0.3, max_position_embeddings=1024)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    engine = HFEngine(load_hf(tmp_path), thread=False)
    head = chat(engine, "You are a careful agent. " * 6)[:-2]
    prompts = [chat(engine, PROMPTS[1] * 4)] + [head + chat(engine, t) for t in ("Say 1.", "Say 2.", "Say 3. " * 40)]
    with torch.inference_mode(), torch.profiler.profile() as prof:
        results = [engine._prefill([p])[0][0] for p in prompts]
    assert [r[3] < len(p) for r, p in zip(results, prompts)] == [False, False, True, True]  # the head found cached
    assert sum(e.count for e in prof.key_averages() if e.key == "rl::causal_attention") == 4 * 2
    for p, (_, _, logits, _) in zip(prompts, results):
        expected = reference(torch.tensor([p])).logits[0, -1]
        assert torch.allclose(logits, expected, atol=1e-4), (logits - expected).abs().max()
    served = HFEngine(load_hf(tmp_path))
    for p in prompts:
        expected = reference.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False)[0, len(p):]
        assert sample(served, [p], max_tokens=16)[0].result[0].tokens[: len(expected)] == expected.tolist()
    served.stop()
