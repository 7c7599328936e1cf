"""Trajectories -> samples: the loss mask is exactly the tokens the policy sampled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.trajectory import (
    CompactionRecord,
    MessageRecord,
    RewindRecord,
    SessionRecord,
    SystemPromptRecord,
    read_records,
)
from agent.types import Message, Usage
from rl.data import IngestCounts, ingest, load_rubric, rate, samples
from rl.policy.policy import PolicyConfig
from rl.policy.tokenizer import ByteTokenizer
from rl.serve import BackgroundServer, engine_from
from tests.conftest import trust

TOK = ByteTokenizer()


def sampled(text: str, end: bool = True) -> Message:
    ids = TOK.encode(text) + ([TOK.END] if end else [])
    return Message(role="assistant", content=text, token_ids=ids, logprobs=[-0.5] * len(ids))


def rec(message: Message, turn: str | None = "t1") -> MessageRecord:
    return MessageRecord(turn_id=turn, message=message)


START = SessionRecord(session_id="s", cwd="/p", model="m", action_format="text", harness_version="user@abc")


def test_a_multi_turn_session_is_one_sample_masked_exactly_where_the_harness_wrote():
    system, ask = Message(role="system", content="sys"), Message(role="user", content="add 2 and 2")
    out = Message(role="user", content="4")  # a cell's output, in text mode
    records = [START, rec(system, None), rec(ask), rec(sampled("```python\n2+2\n```")), rec(out),
               rec(sampled("It is 4.")), rec(Message(role="user", content="thanks"), "t2"), rec(sampled("ok"), "t2")]
    counts = IngestCounts()
    (s,) = list(samples(records, counts))
    conversation = [system, ask, sampled("```python\n2+2\n```"), out, sampled("It is 4."),
                    Message(role="user", content="thanks"), sampled("ok")]
    assert s.ids == TOK.chat([m.model_dump() for m in conversation], add_generation_prompt=False)
    # each request extends the one before: its prompt is a prefix of the sample
    for k in (2, 4, 6):
        request = TOK.chat([m.model_dump() for m in conversation[:k]])
        assert s.ids[: len(request)] == request and not s.mask[len(request) - 1]  # ...<|assistant|>, masked
    trained = [t for t, m in zip(s.ids, s.mask) if m]
    assert trained == sampled("```python\n2+2\n```").token_ids + sampled("It is 4.").token_ids + sampled("ok").token_ids
    assert [lp for lp, m in zip(s.logprobs, s.mask) if not m] == [0.0] * (len(s.ids) - len(trained))
    assert (s.turns, s.harness_version, counts.samples, counts.splits) == (["t1", "t2"], "user@abc", 1, 0)


def test_chains_are_cut_where_a_request_does_not_extend_the_last():
    system = Message(role="system", content="sys")
    records = [START, rec(system, None), rec(Message(role="user", content="a")), rec(sampled("cut short", end=False)),
               rec(Message(role="user", content="b"), "t2"), rec(sampled("fine"), "t2"),
               SystemPromptRecord(turn_id="t3", content="new sys", harness_version="user@def"),
               rec(Message(role="user", content="c"), "t3"), rec(sampled("after"), "t3"),
               rec(Message(role="assistant", content="no logprobs"), "t3"),
               CompactionRecord(turn_id="t4", summary="x", messages=[Message(role="system", content="new sys"),
                                                                     Message(role="user", content="summary")],
                                usage=Usage()),
               rec(sampled("last"), "t4")]
    counts = IngestCounts()
    out = list(samples(records, counts))
    assert len(out) == 4 and counts.splits == 3 and counts.skipped_no_logprobs == 1 and counts.replies == 5
    # the second chain starts from the whole history, re-rendered and masked
    second = out[1]
    history = TOK.chat([{"role": "system", "content": "sys"}, {"role": "user", "content": "a"},
                        {"role": "assistant", "content": "cut short"}, {"role": "user", "content": "b"}])
    assert second.ids[: len(history)] == history and not any(second.mask[: len(history)])
    assert out[2].harness_version == "user@def" and out[2].ids[:3] == [TOK.BOS, TOK.SYSTEM, *TOK.encode("n")]
    assert TOK.decode(out[3].ids).startswith("new syssummary")


def test_replies_another_model_sampled_are_masked_text_not_training_tokens():
    foreign = Message(role="assistant", content="hi", token_ids=[151643, 9], logprobs=[-1.0, -1.0])
    records = [START, rec(Message(role="user", content="q")), rec(foreign), rec(Message(role="user", content="r")),
               rec(sampled("ok"))]
    counts = IngestCounts()
    (s,) = list(samples(records, counts))
    assert counts.foreign == 1 and max(s.ids) < TOK.vocab_size
    assert [t for t, m in zip(s.ids, s.mask) if m] == sampled("ok").token_ids


def test_rewards_come_from_a_rating_or_a_rubric(tmp_path: Path):
    rated, unrated = tmp_path / "a", tmp_path / "b"
    for d in (rated, unrated):
        d.mkdir()
        lines = [r.model_dump_json() for r in (START, rec(Message(role="user", content="q")), rec(sampled("x")))]
        (d / "trajectory.jsonl").write_text("\n".join(lines) + "\n")
    rate(rated, 0.75, "good")
    with pytest.raises(ValueError):
        rate(rated, 1.5)
    rubric = tmp_path / "rubric.py"
    rubric.write_text("def score(records):\n    return 0.25 * len(records)\n")
    out, counts = ingest([rated, unrated], load_rubric(f"{rubric}:score"))
    assert [s.reward for s in out] == [0.75, 0.75]
    out, counts = ingest([rated, unrated])
    assert [s.reward for s in out] == [0.75, None] and counts.unrewarded == 1


async def test_a_daemon_session_against_the_policy_server_becomes_exact_samples(project: Path, prime_home: Path):
    from tests.daemon.conftest import collect, running_daemon

    (project / ".prime-agent").mkdir()
    (project / ".prime-agent" / "config.toml").write_text(
        '[model]\naction_format = "text"\nrecord_logprobs = true\nmax_completion_tokens = 24\nstream = false\n'
        "[refine]\nauto_every = 0\n")
    trust(project, ".prime-agent/config.toml")
    engine = engine_from(None, PolicyConfig(d_model=32, n_layer=1, n_head=2, max_seq=8192), seed=1)
    with BackgroundServer(engine) as url:
        async with running_daemon() as client:
            s = await client.create_session(project, model="prime-policy", base_url=url)
            for n, text in enumerate(["say something", "and again"], 1):
                turn = await client.send(s.id, text)
                await collect(client, s.id, turn.turn_id)
    directory = prime_home / "sessions" / s.id
    records = read_records(directory / "trajectory.jsonl")
    replies = [r.message for r in records if isinstance(r, MessageRecord) and r.message.role == "assistant"]
    assert replies and all(m.token_ids and len(m.token_ids) == len(m.logprobs) for m in replies)
    out, counts = ingest([directory])
    assert counts.replies == len(replies) and counts.skipped_no_logprobs == 0
    # token by token: what is trainable is exactly what the policy sampled, reply by reply, in order
    trained = [[t for t, m in zip(x.ids, x.mask) if m] for x in out]
    assert sum(trained, []) == sum((m.token_ids for m in replies), [])
    # and every reply's request (the messages before it, rendered as the server renders them) is
    # masked and stands right before its tokens in some sample
    context = [r.message for r in records if isinstance(r, MessageRecord)]
    for i, m in enumerate(context):
        if m.role != "assistant":
            continue
        request = TOK.chat([c.model_dump() for c in context[:i]])
        sample = next(x for x in out if x.ids[len(request): len(request) + len(m.token_ids)] == m.token_ids
                      and x.ids[: len(request)] == request)
        assert not any(sample.mask[: len(request)])
        assert all(sample.mask[len(request): len(request) + len(m.token_ids)])
    assert json.loads(Path(directory / "session.json").read_text())["turns"] == 2


def test_an_ingested_sample_trains_only_on_its_sampled_tokens():
    import torch

    from rl.config import RunConfig
    from rl.policy.policy import Policy
    from rl.sample import Batch
    from rl.train import train_step

    records = [START, rec(Message(role="system", content="sys"), None), rec(Message(role="user", content="q")),
               rec(sampled("ab")), rec(Message(role="user", content="inserted text")), rec(sampled("cd"))]
    (s,) = list(samples(records))
    sample = s.to_sample(advantage=1.0)
    assert sample.completion_ids[: 3] == [*TOK.encode("ab"), TOK.END]
    assert sum(sample.completion_mask) == 6 and len(sample.completion_mask) == len(sample.completion_ids)
    torch.manual_seed(0)
    cfg = RunConfig.model_validate({"model": {"d_model": 16, "n_layer": 1, "n_head": 2, "max_seq": 128}})
    model = Policy(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = train_step(model, opt, Batch(step=0, samples=[sample], rewards=[1.0], version=0), cfg)
    assert metrics["tokens"] == 6 and metrics["loss"] == metrics["loss"]  # the six sampled tokens, and finite


async def test_samples_of_a_truncating_server_reproduce_its_logprobs(project: Path, prime_home: Path):
    """The policy's context (256) is far shorter than the agent's prompt: the server keeps the tail.
    Samples are built from the server's own prompt ids, so the trainer, on the same weights, gives
    the sampled tokens the logprobs the server reported."""
    import torch

    from rl.policy.policy import token_logprobs
    from tests.daemon.conftest import collect, running_daemon

    (project / ".prime-agent").mkdir()
    (project / ".prime-agent" / "config.toml").write_text(
        '[model]\naction_format = "text"\nrecord_logprobs = true\nmax_completion_tokens = 16\nstream = false\n'
        "temperature = 1.0\n[refine]\nauto_every = 0\n")
    trust(project, ".prime-agent/config.toml")
    engine = engine_from(None, PolicyConfig(d_model=32, n_layer=1, n_head=2, max_seq=256), seed=2, truncate=True)
    with BackgroundServer(engine) as url:
        async with running_daemon() as client:
            s = await client.create_session(project, model="prime-policy", base_url=url)
            for text in ("first", "second"):
                turn = await client.send(s.id, text)
                await collect(client, s.id, turn.turn_id)
    records = read_records(prime_home / "sessions" / s.id / "trajectory.jsonl")
    calls = [r for r in records if r.kind == "model_call"]
    assert calls and all(c.prompt_token_ids and len(c.prompt_token_ids) < 256 for c in calls)
    out = list(samples(records))
    assert out and all(len(x.ids) <= 256 for x in out)
    engine.model.eval()
    with torch.no_grad():
        for x in out:
            trainer = token_logprobs(engine.model, torch.tensor([x.ids]))[0]
            positions = [i for i, m in enumerate(x.mask) if m]
            got = [float(trainer[i - 1]) for i in positions]
            want = [x.logprobs[i] for i in positions]
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def test_after_a_rewind_samples_follow_the_context_the_model_saw():
    system, first = Message(role="system", content="sys"), Message(role="user", content="one")
    records = [START, rec(system, None), rec(first), rec(sampled("did one")),
               rec(Message(role="user", content="two"), "t2"), rec(sampled("did two"), "t2"),
               RewindRecord(rewind_id="rw-1", turn=2, parts=["conversation"], target="t2:start",
                            messages=[system, first, sampled("did one")], turn_starts=[1]),
               rec(Message(role="user", content="[rewound] two again"), "t3"), rec(sampled("redo"), "t3")]
    counts = IngestCounts()
    before, after = list(samples(records, counts))
    assert counts.splits == 1
    seen = TOK.chat([m.model_dump() for m in (system, first, sampled("did one"),
                                               Message(role="user", content="[rewound] two again"))])
    assert after.ids[: len(seen)] == seen and "did two" not in TOK.decode(after.ids)  # not the abandoned branch
    assert [t for t, m in zip(after.ids, after.mask) if m] == sampled("redo").token_ids
    assert "did two" in TOK.decode(before.ids)  # the turns after the checkpoint stay data
