"""Many inference servers (train.rollout_urls): two real policy servers, each a process of its own, share
every step's rollouts and load every step's weights; one killed mid-run leaves the run going on the other,
the failure reported."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import pytest

from evals.tasksets.reverse_text import ReverseText
from rl.config import RunConfig
from rl.fleet import Fleet
from rl.policy.checkpoint import save_checkpoint
from rl.policy.policy import build_policy
from rl.train import train
from tests.rl.servers import Recording, policy_server_process


def held(url: str) -> int:
    """The policy version a server last sampled with, as it says itself."""
    with urllib.request.urlopen(f"{url}/models", timeout=30) as r:
        return json.load(r)["data"][0]["policy_version"]


class Watching(Recording):
    """The orchestrator, noting after each step's sampling which weights each live server sampled with and how
    many requests each answered, and killing the second server as step `kill_at` begins."""

    def __init__(self, seen: list, kill, kill_at: int, *args, **kwargs):
        super().__init__([], *args, **kwargs)
        self.seen, self.kill, self.kill_at = seen, kill, kill_at

    def collect(self, step: int):
        before = [s.requests for s in self.servers.servers]
        if step == self.kill_at:
            self.kill()
        batch = super().collect(step)
        # the policy server swaps new weights in before the batch that follows their reload
        versions = [held(s.url) if s.failure is None else None for s in self.servers.servers]
        answered = [s.requests - b for s, b in zip(self.servers.servers, before)]
        self.seen.append({"step": step, "held": versions, "answered": answered,
                          "versions": {s.version for s in batch.samples}})
        return batch


def test_two_servers_share_the_rollouts_load_every_step_and_one_lost_is_reported(tmp_path: Path, caplog):
    cfg = RunConfig.model_validate({
        "model": {"d_model": 16, "n_layer": 1, "n_head": 2, "max_seq": 32},
        "env": {"name": "reverse_text", "options": {"min_len": 3, "max_len": 4}},
        "train": {"steps": 4, "batch_size": 4, "group_size": 4, "max_tokens": 6, "threads": 1,
                  "out": str(tmp_path / "run"), "checkpoint_every": 100, "request_timeout": 60},
    })
    save_checkpoint(tmp_path / "start" / "step-0", build_policy(cfg.model), None, 0)
    seen: list[dict] = []
    with policy_server_process("--checkpoint", str(tmp_path / "start")) as (a, _), \
            policy_server_process("--checkpoint", str(tmp_path / "start")) as (b, second):

        def kill() -> None:
            second.kill()
            second.wait(timeout=10)

        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"rollout_urls": [a, b]})})
        with caplog.at_level(logging.WARNING, logger="rl.train"):
            history = train(cfg, log=lambda *_: None, progress=False, orchestrator=lambda servers: Watching(
                seen, kill, 2, servers, ReverseText(min_len=3, max_len=4), cfg.train))

    assert [h["step"] for h in history] == [0, 1, 2, 3] and all(h["rollouts"] == 16 for h in history)
    # steps 0 and 1: each server answered a share, sampled with the weights of the step before (loaded after it)
    assert [s["held"] for s in seen[:2]] == [[0, 0], [1, 1]]
    assert [s["answered"] for s in seen[:2]] == [[1, 1], [1, 1]]
    # step 2 began with the second server killed: its share went to the first, and it left the rotation
    assert [s["held"] for s in seen[2:]] == [[2, None], [3, None]]
    assert [s["answered"] for s in seen[2:]] == [[2, 0], [1, 0]]  # step 3: one server, one request
    for h, s in zip(history, seen):  # every rollout stamped with the version its server held, and all trained
        assert s["versions"] <= {h["step"]} and h["errored"] == 0 and h["off_policy_max"] == 0
    assert [h["servers_live"] for h in history] == [2, 2, 1, 1]
    assert [len(h["servers_lost"]) for h in history] == [0, 0, 1, 0]
    assert history[2]["servers_lost"][0].startswith(f"{b}: unreachable")
    assert [r.message for r in caplog.records if "out of rotation" in r.message] == [
        f"rollout server out of rotation, training goes on with the others: {history[2]['servers_lost'][0]}"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows == json.loads(json.dumps(history))


def test_a_server_that_fails_to_load_the_weights_leaves_the_rotation(tmp_path: Path):
    policy = build_policy(RunConfig().model.model_copy(update={"d_model": 16, "n_layer": 1, "n_head": 2,
                                                                "max_seq": 32}))
    save_checkpoint(tmp_path / "start" / "step-0", policy, None, 0)
    save_checkpoint(tmp_path / "new" / "step-1", policy, None, 1)
    with policy_server_process("--checkpoint", str(tmp_path / "start")) as (a, _):
        fleet = Fleet([a, a], [f"{a}/reload", f"{a}/no-such-route"], timeout=30)
        fleet.reload(tmp_path / "new" / "step-1", 1)
        assert [s.version for s in fleet.servers] == [1, 0] and fleet.live == fleet.servers[:1]
        (lost,) = fleet.take_failures()
        assert lost.startswith(f"{a}: did not load step 1's weights") and "404" in lost
        assert fleet.take_failures() == []  # reported once
        with pytest.raises(RuntimeError, match="no rollout server loaded"):
            Fleet([a], [f"{a}/no-such-route"], timeout=30).reload(tmp_path / "new" / "step-1", 1)


def test_config_names_servers_one_way():
    for bad in ({"rollout_url": "http://a/v1", "rollout_urls": ["http://b/v1"]},
                {"rollout_urls": ["http://a/v1"], "reload_url": "http://a/reload"},
                {"rollout_urls": ["http://a/v1", "http://b/v1"], "reload_urls": ["http://a/reload"]}):
        with pytest.raises(ValueError):
            RunConfig.model_validate({"train": bad})
    with pytest.raises(ValueError, match="one server"):
        RunConfig.model_validate({"env": {"harness": True}, "train": {"rollout_urls": ["http://a/v1", "http://b/v1"]}})
    one = RunConfig.model_validate({"train": {"rollout_url": "http://a/v1"}}).train.rollout_servers()
    assert one == RunConfig.model_validate({"train": {"rollout_urls": ["http://a/v1"]}}).train.rollout_servers() == [
        ("http://a/v1", "http://a/v1/reload")]
