"""The refiner asks for its reply's JSON schema where the server says it enforces one (`refine.structured`)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from agent.model import OpenAIModel
from agent.refine import model_caller
from agent.testing.openai_server import OpenAIServer, Reply
from harness_store.refiner import Proposal, RefinementError, Refiner, Review
from harness_store.store import HarnessStore
from tests.conftest import make_config

PLAN = json.dumps({"summary": "nothing to learn", "edits": []})


@pytest.mark.parametrize("advertised, structured, sent", [
    (True, "auto", "json_schema"),    # `rl serve` says `structured_outputs: true`
    (None, "auto", "json_object"),    # a server that says nothing (vLLM, OpenAI): JSON mode, as before
    (None, True, "json_schema"),      # the user knows better
    (True, False, "json_object"),
])
async def test_the_plan_request_carries_the_proposal_schema_where_the_server_enforces_one(
        tmp_path: Path, advertised, structured, sent):
    listing = [{"id": "m", "object": "model", **({"structured_outputs": advertised} if advertised else {})}]
    with OpenAIServer([Reply(content='{"should_refine": true}'), Reply(content=PLAN)], models=listing) as server:
        config = make_config(model={"name": "m", "base_url": server.base_url, "stream": False},
                             refine={"structured": structured})
        model = OpenAIModel(config.model)
        refiner = Refiner({"project": HarnessStore(tmp_path / "harness", "project")}, model_caller(model, config))
        assert (await refiner.review("evidence")).should_refine
        plan = await refiner.plan("evidence", "", trigger="explicit")
        await model.close()
    assert plan.proposal.summary == "nothing to learn"
    review, planning = (r["response_format"] for r in server.requests)
    assert planning["type"] == review["type"] == sent
    if sent == "json_schema":
        assert review["json_schema"]["name"] == "Review" and planning["json_schema"]["name"] == "Proposal"
        check_closed(review["json_schema"]["schema"], Review, {"should_refine": True, "rationale": "r"},
                     [{"should_refine": True, "reason_type": "create"}])
        check_closed(planning["json_schema"]["schema"], Proposal, {"summary": "s", "edits": [
            {"action": "create", "kind": "prompt", "id": "n", "title": "t", "content": "c", "files": {"a.py": ""}}]},
            [{"summary": "The task is to create a new task with a single input.", "action": "create",
              "action_type_name": "create"}, {"summary": "s", "edits": [{"action": "create", "reason_type": "x"}]},
             {"summary": "s", "edits": [{"action": "create", "files": {f"f{i}.py": "" for i in range(5)}}]},
             {"summary": "s", "edits": [{"action": "delete", "id": f"e{i}"} for i in range(5)]}])


def check_closed(schema: dict, model, valid: dict, endless: list[dict]) -> None:
    """The schema sent holds what the model parses, and leaves no endless path: SmolLM2-135M, held by
    `rl serve` to the open schema, invented keys (the first of `endless`, the top of its reply, closed),
    and held to closed objects, wrote file after file into a skill's `files`, until its token limit cut
    the plan short. The reply is parsed as leniently as ever."""
    jsonschema.validate(valid, schema)
    model.model_validate(valid)
    for reply in endless:
        model.model_validate(reply)  # extra keys ignored, any number of edits and files
        with pytest.raises(jsonschema.ValidationError, match="Additional properties|too many|is too long"):
            jsonschema.validate(reply, schema)


async def test_a_plan_stopped_for_looping_is_no_plan_not_an_outage(tmp_path: Path):
    """SmolLM2-135M at temperature 0.2 wrote `. The task is to create a new task with a different name`
    over and over inside a string; the repetition guard stops such a reply. For the refiner that is a
    reply with no plan (the refine loop goes on to its next round), never a model error (which stops the
    loop as an outage)."""
    looping = '{"summary": "s", "rationale": "' + ". The task is to create a new task" * 40
    with OpenAIServer([Reply(content=looping)], models=[{"id": "m", "object": "model"}]) as server:
        config = make_config(model={"name": "m", "base_url": server.base_url, "stream": False})
        model = OpenAIModel(config.model)
        refiner = Refiner({"project": HarnessStore(tmp_path / "harness", "project")}, model_caller(model, config))
        with pytest.raises(RefinementError, match="fell into a loop"):
            await refiner.plan("evidence", "", trigger="explicit")
        await model.close()
