"""ATIF → samples (`prime-agent rl ingest --format atif`): a session sampled by the policy server,
exported as ATIF by the command line and by the daemon, re-ingests to the samples the session gives."""

from __future__ import annotations

import json
from pathlib import Path

import atif

from cli.main import main
from rl.policy.policy import PolicyConfig
from rl.serve import BackgroundServer, engine_from
from tests.conftest import trust


async def test_an_exported_session_re_ingests_to_the_same_samples(project: Path, prime_home: Path, tmp_path: Path):
    from tests.daemon.conftest import collect, running_daemon

    (project / ".prime-agent").mkdir()
    (project / ".prime-agent" / "config.toml").write_text(
        '[model]\naction_format = "text"\nrecord_logprobs = true\nmax_completion_tokens = 24\nstream = false\n'
        "[refine]\nauto_every = 0\n")
    trust(project, ".prime-agent/config.toml")  # a project's settings count once a person trusted them
    engine = engine_from(None, PolicyConfig(d_model=32, n_layer=1, n_head=2, max_seq=8192), seed=1)
    with BackgroundServer(engine) as url:
        async with running_daemon() as client:
            s = await client.create_session(project, model="prime-policy", base_url=url)
            for text in ["say something", "and again"]:
                turn = await client.send(s.id, text)
                await collect(client, s.id, turn.turn_id)
            served = await client.trajectory(s.id, format="atif")
    assert main(["rate", s.id, "0.25"]) == 0
    exported = tmp_path / "session.atif.json"
    assert main(["trajectory", "export", s.id, "--format", "atif", "-o", str(exported)]) == 0
    doc = atif.Trajectory.model_validate_json(exported.read_text())
    agent = [step for step in doc.steps if step.source == "agent"]
    assert agent and all(step.metrics.prompt_token_ids and step.metrics.completion_token_ids
                         and len(step.metrics.logprobs) == len(step.metrics.completion_token_ids) for step in agent)
    assert doc.final_metrics.extra["reward"] == 0.25
    # the daemon's document is the same one (the rating came after it)
    served_doc = atif.Trajectory.model_validate(served)
    assert served_doc.steps == doc.steps and served_doc.agent.name == "prime-agent"

    original, reingested = tmp_path / "original.jsonl", tmp_path / "atif.jsonl"
    assert main(["rl", "ingest", s.id, "-o", str(original)]) == 0
    assert main(["rl", "ingest", "--format", "atif", str(exported), "-o", str(reingested)]) == 0
    want = [json.loads(line) for line in original.read_text().splitlines()]
    got = [json.loads(line) for line in reingested.read_text().splitlines()]
    assert want and got == want
    assert all(sample["reward"] == 0.25 and any(sample["mask"]) for sample in got)


def test_a_file_that_is_not_atif_is_refused_by_name(tmp_path: Path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": "ATIF-v1.8", "steps": []}))
    assert main(["rl", "ingest", "--format", "atif", str(bad), "-o", str(tmp_path / "out.jsonl")]) == 2
    assert f"{bad}: not an ATIF trajectory" in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()
