"""Bad input to the daemon gets a 4xx naming the problem, and writes nothing (issue 24, 6-8).

Each attack is sent as raw bytes, as a client in another language would send it (Python's json
writes NaN and Infinity, which JSON does not have, and FastAPI's parser reads them back).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx2
import pytest

from daemon.client import Client
from daemon.paths import socket_file


def http() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(socket_file())), base_url="http://d",
                             timeout=60)  # a session create takes seconds on a loaded machine


def tree(root: Path) -> set[str]:
    """Every path under `root` (folders included), relative to it."""
    return {os.path.relpath(os.path.join(d, name), root) for d, dirs, files in os.walk(root) for name in dirs + files}


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def create_body(project: Path, model_server, **fields: str) -> bytes:
    """A create request whose fields are given as JSON text (so NaN stays NaN)."""
    base = {"cwd": json.dumps(str(project)), "model": '"fake"', "base_url": json.dumps(model_server.base_url), **fields}
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in base.items()) + "}").encode()


async def test_non_finite_numbers_in_a_session_config_are_refused_naming_the_field(
        daemon: Client, project: Path, model_server, prime_home: Path):
    cases = {
        '{"kernel": {"cell_timeout": NaN}}': "kernel.cell_timeout",
        '{"kernel": {"cell_timeout": Infinity}}': "kernel.cell_timeout",
        '{"model": {"temperature": -Infinity}}': "model.temperature",
        '{"compaction": {"threshold": NaN}}': "compaction.threshold",
        '{"model": {"extra_body": {"top_p": NaN}}}': "model.extra_body.top_p",
        '{"model": {"extra_body": {"stop": [1, Infinity]}}}': "model.extra_body.stop.1",
        '{"budget": {"max_seconds": NaN}}': "budget.max_seconds",
    }
    async with http() as h:
        for config, field in cases.items():
            r = await h.post("/v1/sessions", content=create_body(project, model_server, config=config),
                             headers={"content-type": "application/json"})
            assert r.status_code == 400, (config, r.text)
            error = r.json()["error"]
            assert error["code"] == "bad_config" and f"field {field}:" in error["message"], (config, error)
            assert "finite" in error["message"]
        r = await h.post("/v1/sessions", content=create_body(project, model_server, budget='{"max_seconds": Infinity}'),
                         headers={"content-type": "application/json"})
        assert r.status_code == 400 and "field budget.max_seconds:" in r.json()["error"]["message"], r.text
    assert await daemon.sessions() == []
    assert not any((prime_home / "sessions").glob("*"))  # nothing was written for a refused create


async def test_a_cwd_too_long_for_the_file_system_is_a_bad_request(daemon: Client, model_server, prime_home: Path):
    async with http() as h:
        for cwd in ("/" + "a" * 5000, "/tmp/" + "/".join(["b" * 255] * 30)):
            r = await h.post("/v1/sessions", json={"cwd": cwd, "model": "fake", "base_url": model_server.base_url})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "bad_cwd" and "File name too long" in error["message"], error
            assert len(error["message"]) < 500  # the path is shortened, not echoed whole
    assert not any((prime_home / "sessions").glob("*"))


async def test_config_values_nested_too_deep_are_refused_before_any_work(daemon: Client, project: Path,
                                                                          model_server, prime_home: Path):
    async with http() as h:
        for depth in (30, 31, 200, 900):  # model.extra_body is two levels down: 30 more make 32
            config = '{"model": {"extra_body": %s}}' % nested(depth)
            r = await h.post("/v1/sessions", content=create_body(project, model_server, config=config),
                             headers={"content-type": "application/json"})
            if depth == 30:
                assert r.status_code == 201, r.text
                await daemon.delete(r.json()["id"])
                continue
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "bad_config" and "field model.extra_body.a.a" in error["message"], error
            assert "nested deeper than 32 levels" in error["message"] and len(error["message"]) < 500
        r = await h.post("/v1/sessions", content=create_body(project, model_server, config=f'{{"x": [{nested(900)}]}}'),
                         headers={"content-type": "application/json"})
        assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"], r.text
    assert [s.id for s in await daemon.sessions()] == []
    assert len(list((prime_home / "sessions").glob("*"))) == 1  # the one within the limit (deleted)


async def test_a_config_that_would_not_load_back_is_never_saved(daemon: Client, project: Path, model_server,
                                                                prime_home: Path):
    """session.json is written by pydantic, which cannot write a lone surrogate: the create is refused
    before anything is written, rather than failing (500) after the session directory exists."""
    async with http() as h:
        body = create_body(project, model_server, config='{"model": {"extra_body": {"user": "\\ud800"}}}')
        r = await h.post("/v1/sessions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "bad_config" and "saved" in r.json()["error"]["message"]
    assert not any((prime_home / "sessions").glob("*"))


@pytest.mark.parametrize("bad", ["/" + "p" * 5000, "/tmp/" + "/".join(["q" * 255] * 30)])
async def test_a_project_path_the_file_system_refuses_is_a_bad_request(daemon: Client, bad: str):
    async with http() as h:
        for path in ("/v1/harness", "/v1/harness/entries/x", "/v1/harness/log", "/v1/harness/diff"):
            r = await h.get(path, params={"project": bad, "scope": "project"})
            assert r.status_code == 400, (path, r.text)
            error = r.json()["error"]
            assert error["code"] == "bad_project" and "File name too long" in error["message"], error
        r = await h.post("/v1/harness/rollback", json={"ref": "HEAD", "scope": "project", "project": bad})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_project", r.text


async def test_reading_the_harness_creates_no_scope(daemon: Client, tmp_path: Path, prime_home: Path):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".git").mkdir()  # a project root, as a person's checkout is
    before = tree(fresh)
    async with http() as h:
        reads = [("/v1/harness", {}), ("/v1/harness/entries/nothing", {})]
        for scope in ("user", "project"):
            reads += [("/v1/harness/log", {"scope": scope}), ("/v1/harness/diff", {"scope": scope}),
                      ("/v1/harness/diff", {"scope": scope, "a": "HEAD~1", "b": "HEAD"})]
        for path, params in reads:
            r = await h.get(path, params={"project": str(fresh), **params})
            assert r.status_code in (200, 400, 404), (path, params, r.text)
            assert tree(fresh) == before, (path, params, tree(fresh) - before)
            assert not (prime_home / "harness").exists(), (path, params)  # nor the user scope
        assert (await h.get("/v1/harness/log", params={"project": str(fresh), "scope": "project"})).json() == []
        assert (await h.get("/v1/harness/diff", params={"project": str(fresh), "scope": "project"})).text == ""
        r = await h.post("/v1/harness/rollback", json={"ref": "HEAD", "scope": "project", "project": str(fresh)})
        assert r.status_code == 400 and "no history yet" in r.json()["error"]["message"], r.text
    assert tree(fresh) == before  # a refused rollback created nothing either


async def test_a_project_too_deep_to_read_under_is_a_bad_request(daemon: Client, tmp_path: Path, model_server,
                                                                 prime_home: Path):
    """The directory itself is fine; its harness files' paths pass the file system's limit."""
    deep = tmp_path
    while len(str(deep)) < 4080:
        deep /= "d" * min(200, 4080 - len(str(deep)))
    deep.mkdir(parents=True)
    async with http() as h:
        for path in ("/v1/harness", "/v1/harness/log", "/v1/harness/diff", "/v1/harness/entries/x"):
            r = await h.get(path, params={"project": str(deep), "scope": "project"})
            assert r.status_code == 400 and "File name too long" in r.json()["error"]["message"], (path, r.text)
        r = await h.post("/v1/sessions", json={"cwd": str(deep), "model": "fake", "base_url": model_server.base_url})
        assert r.status_code == 400 and "config.toml" in r.json()["error"]["message"], r.text
    assert not any((prime_home / "sessions").glob("*"))


def test_the_round_trip_alone_stops_a_config_that_would_not_load_back(project: Path, model_server):
    """Behind the value check, the overrides are written and read as session.json would, and must
    come back the same (as if a new kind of value slipped past the check)."""
    from daemon.errors import Refused
    from daemon.manager import as_saved, validate
    from daemon.schemas import CreateSession

    with pytest.raises(Refused, match="would not read back the same from session.json"):
        as_saved({"model": {"extra_body": {"top_p": float("nan")}}})
    req = CreateSession(cwd=str(project), model="fake", base_url=model_server.base_url,
                        config={"model": {"extra_body": {}}})
    cwd, overrides, config = validate(req)
    assert as_saved(overrides) == overrides
    assert overrides["model"]["name"] == "fake" and config.model.name == "fake"


async def test_a_base_url_that_is_no_http_url_is_refused_at_create_not_retried_at_every_prompt(
        daemon: Client, project: Path, model_server, prime_home: Path):
    # issue 52: {"base_url": "not a url"} was a 201, then five retries of the same permanent error per prompt
    async with http() as h:
        for body in ({"base_url": "not a url"}, {"base_url": "localhost:8000/v1"},
                     {"base_url": None, "config": {"model": {"base_url": "file:///etc/passwd"}}}):
            r = await h.post("/v1/sessions", json={"cwd": str(project), "model": "fake", **body})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "bad_config" and "field model.base_url:" in error["message"], error
            assert "is not an http(s) URL of a server, e.g. http://localhost:8000/v1" in error["message"]
    assert await daemon.sessions() == []
    assert not any((prime_home / "sessions").glob("*"))


async def test_a_directory_with_a_nul_is_a_4xx_naming_the_field_not_a_500(daemon: Client, project: Path,
                                                                         model_server, prime_home: Path):
    """The fuzzer's find: `GET /v1/sessions?cwd=%00` was a 500 ("embedded null byte") from the listing."""
    before = tree(prime_home)
    async with http() as h:
        listed = await h.get("/v1/sessions", params={"cwd": "/tmp/\x00x"})
        created = await h.post("/v1/sessions", content=create_body(project, model_server,
                                                                  cwd=json.dumps(f"{project}\x00")),
                               headers={"content-type": "application/json"})
        pruned = await h.post("/v1/sessions/prune", json={"cwd": "\x00", "dry_run": True})
    for r in (listed, created, pruned):
        assert r.status_code == 422 and "cwd" in r.text, r.text
    assert tree(prime_home) == before
