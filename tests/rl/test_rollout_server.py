"""An external rollout server (train.rollout_url), with the policy server standing in for vLLM: it
samples, the trainer hands it new weights after every step, and rollouts older than allowed are dropped."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from fastapi.responses import JSONResponse

from evals.tasksets.reverse_text import ReverseText
from rl.config import RunConfig
from rl.policy.checkpoint import load_policy, save_checkpoint
from rl.orchestrator import Orchestrator, reload
from rl.serve import BackgroundServer, Engine, create_app
from rl.train import sft, train
from tests.rl.servers import policy_server


def warm(run: Path, **train) -> tuple[RunConfig, Path]:
    """A tiny policy after a short warm start: its rewards differ within a group, so there is something
    to train on; and the config to go on from it."""
    cfg = RunConfig.model_validate({
        "model": {"d_model": 32, "n_layer": 2, "n_head": 2, "max_seq": 64},
        "env": {"name": "reverse_text", "options": {"min_len": 5, "max_len": 5}},
        "sft": {"steps": 20, "batch_size": 16, "lr": 1e-3},
        "train": {"steps": 3, "batch_size": 4, "group_size": 4, "max_tokens": 8, "threads": 1, "lr": 1e-3,
                  "out": str(run), "checkpoint_every": 100, **train},
    })
    return cfg, sft(cfg, log=lambda *_: None)


def test_the_trainer_hands_an_external_server_its_weights_after_every_step(tmp_path: Path):
    cfg, start = warm(tmp_path / "run")
    with policy_server("--checkpoint", str(start)) as url:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"rollout_url": url})})
        history = train(cfg, log=lambda *_: None, progress=False)
        assert all(h["samples"] for h in history), history
        # every step sampled with the weights of the step before: the server loaded each in turn, and its
        # logprobs per sampled token are the trainer's own
        assert [h["off_policy_max"] for h in history] == [0, 0, 0]
        assert max(h["mismatch_kl"] for h in history) < 1e-6
        body = json.dumps({"prompt": "ab", "max_tokens": 1}).encode()
        request = urllib.request.Request(f"{url}/completions", data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(request) as r:  # the next request samples the last step's weights
            assert json.load(r)["policy_version"] == 3
        assert [p.name for p in (tmp_path / "run" / "weights").iterdir()] == ["step-3"]  # older ones removed


def vllm_shaped(engine: Engine):
    """The policy server without `policy_version` in its replies: what vLLM sends."""
    app = create_app(engine)

    @app.middleware("http")
    async def drop_version(request, call_next):
        reply = await call_next(request)
        body = json.loads(b"".join([chunk async for chunk in reply.body_iterator]))
        body.pop("policy_version", None)
        return JSONResponse(body, reply.status_code)

    return app


def test_without_versions_from_the_server_rollouts_carry_the_last_reload_and_stale_ones_are_dropped(tmp_path: Path):
    cfg, start = warm(tmp_path / "run", async_level=1, max_off_policy_steps=0)
    policy = load_policy(start)
    save_checkpoint(tmp_path / "new" / "step-5", policy, None, 5)
    with BackgroundServer(vllm_shaped(Engine(policy))) as url:
        orchestrator = Orchestrator(url, ReverseText(min_len=5, max_len=5), cfg.train, version=4)
        first = orchestrator.collect(step=4)
        assert first.samples and all(s.version == 4 for s in first.samples)
        for s in first.samples:  # one logprob per sampled token
            assert len(s.inference_logprobs) == len(s.completion_ids) > 0 and max(s.inference_logprobs) <= 0
        reload(f"{url}/reload", tmp_path / "new" / "step-5", timeout=30)
        orchestrator.servers.set_version(5)
        assert all(s.version == 5 for s in orchestrator.collect(step=5).samples)

        # No new weights come: step 5's rollouts are fresh, those of steps 6 and 7 one and two steps
        # old, more than max_off_policy_steps = 0 allows; they are dropped and counted, whether sampled
        # ahead of training or not (a server behind on its reloads)
        in_step = Orchestrator(url, ReverseText(min_len=5, max_len=5), cfg.train.model_copy(update={"async_level": 0}),
                               version=5)
        for sampler in (orchestrator, in_step):
            batches = list(sampler.batches(5, 8))
            assert batches[0].samples and batches[0].counts["stale"] == 0
            for b in batches[1:]:
                assert b.samples == [] and b.counts["stale"] > 0
