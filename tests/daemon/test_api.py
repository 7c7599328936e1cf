"""The daemon's API against a real daemon, real kernels and the fake model server."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from agent.kernel.sandbox import unavailable
from agent.testing.openai_server import OpenAIServer
from daemon.client import Client, DaemonError
from daemon.paths import socket_file
from daemon.schemas import ModelKey
from tests.daemon.conftest import agent_script, collect, running_daemon


async def test_a_session_runs_a_turn_and_streams_its_events(daemon: Client, project: Path, model_server, prime_home):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url, title="t")
    assert (s.state, s.cwd, s.model, s.title) == ("idle", str(project), "fake", "t")
    accepted = await daemon.send(s.id, "run: x = 6 * 7\nprint(x)")
    assert accepted.model_dump() == {"turn_id": "t1", "mode": "prompt", "queued": False}
    events = await collect(daemon, s.id, "t1")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = [e.type for e in events]
    assert types[0] == "session.started" and "cell.finished" in types
    assert events[-1].outcome == "completed" and events[-1].answer == "ran: 42"
    info = await daemon.session(s.id)
    assert (info.state, info.turns, info.last_seq) == ("idle", 1, events[-1].seq)
    assert info.usage.prompt_tokens > 0
    on_disk = prime_home / "sessions" / s.id
    assert {"session.json", "events.jsonl", "trajectory.jsonl"} <= {p.name for p in on_disk.iterdir()}
    transcript = await daemon.transcript(s.id)
    kinds = [r.kind for r in transcript.records]
    assert kinds[kinds.index("turn_finished") + 1:] in ([], ["checkpoint"])  # the turn's end checkpoint may follow
    assert [x.id for x in await daemon.sessions()] == [s.id]

    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    await daemon.send(s.id, f"run: import base64\nfrom IPython.display import Image\ndisplay(Image(base64.b64decode('{png}')))")
    cell = next(e for e in await collect(daemon, s.id, "t2", events[-1].seq) if e.type == "cell.finished")
    assert cell.attachments == ["image/png"]
    shown = await daemon.cell_outputs(s.id, "t2", cell.cell_id)  # the image itself, by the cell's id
    assert [(o.mime, "".join(o.data.split())) for o in shown] == [("image/png", png)]
    with pytest.raises(DaemonError) as e:
        await daemon.cell_outputs(s.id, "t1", cell.cell_id)
    assert e.value.status == 404


async def test_prompts_queue_behind_a_running_turn_and_steering_reaches_it(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    first = await daemon.send(s.id, "run: import time; time.sleep(1.5); print('slept')")
    second = await daemon.send(s.id, "second")
    assert (first.turn_id, second.turn_id, second.queued) == ("t1", "t2", True)
    while (await daemon.session(s.id)).state != "running":
        await asyncio.sleep(0.02)
    steer = await daemon.send(s.id, "also this", mode="steer")
    assert steer.model_dump() == {"turn_id": "t1", "mode": "steer", "queued": False}
    events = await collect(daemon, s.id, "t2")
    finished = [e for e in events if e.type == "turn.finished"]
    assert [(e.turn_id, e.outcome) for e in finished] == [("t1", "completed"), ("t2", "completed")]
    assert finished[1].answer == "echo: second"
    assert any(e.type == "turn.queued" and e.turn_id == "t2" for e in events)
    assert any(e.type == "steer.delivered" for e in events)


async def test_steering_an_interrupt_cut_off_is_handed_back_not_dropped(daemon: Client, project: Path, model_server):
    """Issue 52: steering not delivered because of an interrupt was dropped (a note said so)."""
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: import time; print('sleeping', flush=True); time.sleep(60)")
    async for e in daemon.events(s.id):
        if e.type == "cell.output":
            break
    await daemon.send(s.id, "also check the logs", mode="steer")
    await daemon.send(s.id, "and the config", mode="steer")
    await daemon.interrupt(s.id)
    events = []

    async def until_handed_back() -> None:  # once the turn has ended
        async for e in daemon.events(s.id, 0):
            events.append(e)
            if e.type == "steer.returned":
                return

    await asyncio.wait_for(until_handed_back(), 60)
    assert [e.text for e in events if e.type == "steer.queued"] == ["also check the logs", "and the config"]
    (returned,) = [e for e in events if e.type == "steer.returned"]
    assert (returned.turn_id, returned.text) == ("t1", "also check the logs\n\nand the config")
    assert not any(e.type == "steer.delivered" for e in events)
    assert (await daemon.send(s.id, "print('next')")).turn_id == "t2"  # handed back: no turn of its own began


async def test_interrupt_stops_the_running_cell_and_can_drop_the_queue(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: import time; print('sleeping', flush=True); time.sleep(60)")
    await daemon.send(s.id, "never")
    async for e in daemon.events(s.id):
        if e.type == "cell.output":  # the cell runs (not merely sent to the kernel)
            break
    stopped = await daemon.interrupt(s.id, drop_queued=True)
    assert stopped.model_dump() == {"turn_id": "t1", "dropped": ["t2"]}
    events = await collect(daemon, s.id, "t1")
    outcomes = {e.turn_id: e.outcome for e in events if e.type == "turn.finished"}
    assert outcomes == {"t2": "interrupted", "t1": "interrupted"}
    # the kernel kept its state; the session takes the next prompt
    turn = await daemon.send(s.id, "run: print(time.time() > 0)")
    assert turn.turn_id == "t3"
    events = await collect(daemon, s.id, "t3", after=events[-1].seq)
    assert events[-1].answer == "ran: True"


async def test_replay_from_last_event_id_then_live_with_nothing_repeated(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "one")
    first = await collect(daemon, s.id, "t1")
    await daemon.send(s.id, "two")
    rest = await collect(daemon, s.id, "t2", after=first[3].seq)
    assert rest[0].seq == first[3].seq + 1
    seqs = [e.seq for e in rest]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(socket_file())), base_url="http://d") as h:
        async with h.stream("GET", f"/v1/sessions/{s.id}/events", params={"after": rest[-1].seq - 1}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = []
            async for line in r.aiter_lines():
                lines.append(line)
                if not line:
                    break
    assert lines[0] == f"id: {rest[-1].seq}" and json.loads(lines[1][5:])["type"] == "turn.finished"


async def test_bad_requests_get_clear_4xx_errors(daemon: Client, project: Path, model_server, tmp_path: Path):
    async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(socket_file())), base_url="http://d") as h:
        cases = [
            (await h.post("/v1/sessions", content=b"{not json"), 422),
            (await h.post("/v1/sessions", json={"cwd": "relative/dir"}), 400),
            (await h.post("/v1/sessions", json={"cwd": str(tmp_path / "missing")}), 400),
            (await h.post("/v1/sessions", json={"cwd": str(project)}), 400),  # no model configured
            (await h.post("/v1/sessions", json={"cwd": str(project), "budget": {"max_steps": "many"}}), 422),
            (await h.post("/v1/sessions", json={"cwd": str(project), "colour": "blue"}), 422),
            (await h.get("/v1/sessions/nope"), 404),
            (await h.post("/v1/sessions/nope/messages", json={"text": "hi"}), 404),
            (await h.get("/v1/sessions/nope/events"), 404),
            (await h.get("/v1/nothing-here"), 404),
            (await h.put("/v1/sessions"), 405),
            (await h.post("/v1/sessions", content=b"x" * (2 << 20), headers={"content-type": "application/json"}), 413),
        ]
        for response, status in cases:
            assert response.status_code == status, response.text
            error = response.json()["error"]
            assert error["code"] and error["message"]
        s = await Client().create_session(project, model="fake", base_url=model_server.base_url)
        r = await h.post(f"/v1/sessions/{s.id}/messages", json={"text": "hi", "mode": "shout"})
        assert r.status_code == 422 and "mode" in r.json()["error"]["message"]
        r = await h.get(f"/v1/sessions/{s.id}/events", headers={"Last-Event-ID": "abc"})
        assert r.status_code == 400


async def test_socket_is_private_and_tcp_needs_the_token(project: Path, prime_home: Path):
    async with running_daemon(tcp="127.0.0.1:0") as client:
        mode = stat.S_IMODE(os.stat(socket_file()).st_mode)
        assert mode == 0o600 and stat.S_IMODE(os.stat(prime_home / "run").st_mode) == 0o700
        status = await client.status()
        url = f"http://{status.tcp}"
        token = (prime_home / "run" / "token").read_text().strip()
        assert stat.S_IMODE(os.stat(prime_home / "run" / "token").st_mode) == 0o600
        async with httpx2.AsyncClient(base_url=url) as h:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
                r = await h.get("/v1/sessions", headers=headers)
                assert r.status_code == 401 and "token" in r.json()["error"]["message"]
            assert (await h.get("/openapi.json")).status_code == 401
        async with Client(url=url, token=token) as tcp:
            assert (await tcp.status()).pid == os.getpid()
            assert await tcp.sessions() == []


async def test_deleting_a_session_stops_its_kernel_and_ends_its_streams(daemon: Client, project: Path, model_server,
                                                                          prime_home: Path):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    kernel = await daemon.kernel(s.id)
    assert Path(kernel.connection_file).is_file()
    stream = daemon.events(s.id, reconnect=0)
    assert (await anext(stream)).type == "session.started"
    await daemon.delete(s.id)
    with pytest.raises(DaemonError) as e:
        await anext(stream)  # the stream ends; reconnecting finds the session gone
    assert e.value.status == 404
    assert not Path(kernel.connection_file).exists()
    assert await daemon.sessions() == []
    assert json.loads((prime_home / "sessions" / s.id / "session.json").read_text())["deleted"] is True


async def test_a_jupyter_client_attaches_to_the_agents_kernel(daemon: Client, project: Path, model_server):
    from jupyter_client import AsyncKernelClient

    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: answer = 6 * 7\nprint('set')")
    await collect(daemon, s.id, "t1")
    seen: list[dict] = []
    kc = AsyncKernelClient()
    kc.load_connection_file((await daemon.kernel(s.id)).connection_file)
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=30)
        reply = await kc.execute_interactive("answer", timeout=30, output_hook=lambda msg: seen.append(msg))
    finally:
        kc.stop_channels()
    assert reply["content"]["status"] == "ok"
    results = [m["content"]["data"]["text/plain"] for m in seen if m["msg_type"] == "execute_result"]
    assert results == ["42"]
    await daemon.send(s.id, "run: print(answer + 1)")  # the agent goes on, undisturbed
    assert (await collect(daemon, s.id, "t2"))[-1].answer == "ran: 43"



async def test_a_kernel_that_dies_never_takes_the_daemon_down(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: import os; os._exit(1)")
    events = await collect(daemon, s.id, "t1")
    assert "restarted" in events[-1].answer
    await daemon.send(s.id, "run: print('alive')")
    assert (await collect(daemon, s.id, "t2", after=events[-1].seq))[-1].answer == "ran: alive"
    assert (await daemon.status()).live_sessions == 1


async def test_a_home_too_deep_for_a_socket_path_gets_a_short_private_one(tmp_path: Path, monkeypatch):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    monkeypatch.setenv("PRIME_AGENT_HOME", str(deep))
    async with running_daemon() as client:
        path = socket_file()
        assert len(str(path)) < 100 and not str(path).startswith(str(deep))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        assert (await client.status()).socket == str(path)


async def test_events_with_unicode_line_separators_arrive_whole(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: print('a\\u2028b\\u2029c\\x85d')")
    events = await collect(daemon, s.id, "t1")
    assert events[-1].answer == "ran: a\u2028b\u2029c\x85d"


async def test_odd_headers_get_4xx_not_5xx(project: Path, prime_home: Path):
    async with running_daemon(tcp="127.0.0.1:0") as client:
        url = f"http://{(await client.status()).tcp}"
        async with httpx2.AsyncClient(base_url=url) as h:
            r = await h.get("/v1/sessions", headers={"Authorization": "Bearer \xe9\xe9".encode("latin-1")})
            assert r.status_code == 401
        async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(socket_file())), base_url="http://d") as h:
            for bad in ("\xb2".encode("latin-1"), b"9" * 5000, b"-1"):
                r = await h.get("/v1/sessions/x/events", headers={"Last-Event-ID": bad})
                assert r.status_code == 400, r.text


def test_a_stale_pid_file_names_no_daemon(prime_home: Path):
    import subprocess

    from daemon.client import daemon_pid
    from daemon.paths import pid_file

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        pid_file().write_text(str(sleeper.pid))  # a killed daemon's file, its pid reused
        assert daemon_pid() is None
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_a_session_takes_its_own_config_and_an_idle_one_can_be_put_to_sleep(daemon: Client, project: Path,
                                                                                   model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url, config={
        "model": {"temperature": 0.25, "extra_body": {"truncate_prompt_tokens": 64}}})
    await daemon.send(s.id, "hello")
    await collect(daemon, s.id, "t1")
    request = model_server.requests[-1]
    assert (request["temperature"], request["truncate_prompt_tokens"]) == (0.25, 64)
    for bad in ({"daemon": {"max_sessions": 1}}, {"model": "text"}, {"model": {"temperature": "hot"}}, {"colour": 1}):
        with pytest.raises(DaemonError) as e:
            await daemon.create_session(project, model="fake", base_url=model_server.base_url, config=bad)
        assert e.value.status == 400 and e.value.code == "bad_config", bad

    kernel = await daemon.kernel(s.id)
    assert (await daemon.sleep(s.id)).state == "dormant"
    assert not Path(kernel.connection_file).exists()
    await daemon.send(s.id, "run: print('awake')")  # wakes on its next prompt
    assert (await collect(daemon, s.id, "t2"))[-1].answer == "ran: awake"
    await daemon.send(s.id, "run: import time; time.sleep(30)")
    while (await daemon.session(s.id)).state != "running":
        await asyncio.sleep(0.02)
    with pytest.raises(DaemonError) as e:
        await daemon.sleep(s.id)
    assert e.value.status == 409
    await daemon.interrupt(s.id)


async def test_the_spec_describes_every_event_the_stream_carries(daemon: Client, project: Path, model_server):
    spec = (await daemon._http.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    stream = spec["paths"]["/v1/sessions/{session_id}/events"]["get"]["responses"]["200"]["content"]
    assert stream["text/event-stream"]["schema"] == {"$ref": "#/components/schemas/Event"}
    types = {ref["$ref"].rsplit("/", 1)[1]: schemas[ref["$ref"].rsplit("/", 1)[1]]["properties"]["type"]["const"]
             for ref in schemas["Event"]["oneOf"]}
    assert types["CellFinished"] == "cell.finished" and types["TurnFinished"] == "turn.finished"
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: print(1)")
    seen = {e.type for e in await collect(daemon, s.id, "t1")}
    assert seen <= set(types.values()) and {"cell.finished", "turn.finished"} <= seen


async def test_the_api_shows_usage_and_cost_per_turn_and_per_session(daemon: Client, project: Path, model_server,
                                                                     prime_home: Path):
    from agent.config_models import Price

    (prime_home / "config.toml").write_text('[model.prices.fake]\ninput = 3.0\ncached_input = 0.3\noutput = 15.0\n')
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: print(6 * 7)")
    events = await collect(daemon, s.id, "t1")
    calls = [e.usage for e in events if e.type == "model.completed"]
    finished = events[-1]
    price = Price(input=3.0, cached_input=0.3, output=15.0)
    assert finished.usage.cost == pytest.approx(sum(price.cost(u) for u in calls)) and finished.usage.cost > 0
    assert finished.spend["turn"] == finished.usage
    info = await daemon.session(s.id)
    assert info.usage == finished.usage


def request_over_tcp(url: str, token: str, method: str, path: str, body: dict) -> str:
    """A cell's code: send `body` to the daemon's TCP listener with the token (as an attacker who read
    it would), printing the status and the reply."""
    return ("import json, urllib.request, urllib.error\n"
            f"req = urllib.request.Request({url + path!r}, data=json.dumps({body!r}).encode(), method={method!r},\n"
            f"    headers={{'Authorization': 'Bearer {token}', 'Content-Type': 'application/json'}})\n"
            "try:\n"
            "    r = urllib.request.urlopen(req, timeout=30)\n"
            "    print(r.status, r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code, e.read().decode())\n")


async def test_over_tcp_no_client_can_loosen_a_sandbox_unless_the_daemon_allows_it(project: Path, prime_home: Path,
                                                                                   model_server):
    """Finding 5: with the token, a cell found the daemon's TCP port and created a session with no sandbox."""
    prime_home.mkdir(exist_ok=True)
    (prime_home / "config.toml").write_text("[sandbox]\nnetwork = false\n")
    fake = {"cwd": str(project), "model": "fake", "base_url": model_server.base_url}
    async with running_daemon(tcp="127.0.0.1:0") as client:
        url = f"http://{(await client.status()).tcp}"
        token = (prime_home / "run" / "token").read_text().strip()
        s = await client.create_session(project, model="fake", base_url=model_server.base_url,
                                        config={"sandbox": {"network": True}})  # the kernel must reach the port
        attacks = [{"sandbox": "full-access"}, {"config": {"sandbox": {"network": True}}},
                   {"config": {"sandbox": {"hidden": []}}},
                   {"config": {"mcp": {"servers": {"x": {"command": "sh", "args": ["-c", "touch pwned"]}}}}}]
        after = 0
        for attack in attacks:
            accepted = await client.send(s.id, "run: " + request_over_tcp(url, token, "POST", "/v1/sessions", {**fake, **attack}))
            events = await collect(client, s.id, accepted.turn_id, after)
            after = events[-1].seq
            status, _, body = events[-1].answer.removeprefix("ran: ").partition(" ")
            assert status == "403", (attack, events[-1].answer)
            error = json.loads(body)["error"]
            assert error["code"] == "remote_loosening" and "--allow-remote-unsandboxed" in error["message"]
        assert [x.id for x in await client.sessions()] == [s.id]  # nothing was made
        assert "sandbox.mode full-access (configured: workspace-write)" in json.loads(
            (await _post(url, token, {**fake, "sandbox": "full-access"})).text)["error"]["message"]

        async with Client(url=url, token=token) as tcp:  # what only tightens is fine over TCP too
            tight = await tcp.create_session(project, model="fake", base_url=model_server.base_url, sandbox="read-only")
            assert tight.sandbox.startswith("read-only"), tight.sandbox
        loose = await client.create_session(project, model="fake", base_url=model_server.base_url,
                                            sandbox="full-access")  # over the Unix socket: the person's client
        assert loose.sandbox.startswith("full-access"), loose.sandbox

    async with running_daemon(tcp="127.0.0.1:0", remote_unsandboxed=True) as client:
        status = await client.status()
        assert status.remote_unsandboxed
        async with Client(url=f"http://{status.tcp}", token=token) as tcp:
            loose = await tcp.create_session(project, model="fake", base_url=model_server.base_url,
                                             sandbox="full-access")
            assert loose.sandbox.startswith("full-access"), loose.sandbox


@pytest.mark.skipif(unavailable() is not None, reason=f"no sandbox here: {unavailable()}")
async def test_over_tcp_a_session_cannot_loosen_itself_nor_approve_its_plan(project: Path, prime_home: Path,
                                                                           model_server):
    """With the token, a cell switched its own session to full-access (PATCH), or left plan mode or
    approved its own plan: the sandbox loosened from inside it. Over TCP only tightening is taken."""
    async with running_daemon(tcp="127.0.0.1:0") as client:
        url = f"http://{(await client.status()).tcp}"
        token = (prime_home / "run" / "token").read_text().strip()
        s = await client.create_session(project, model="fake", base_url=model_server.base_url, mode="plan")
        after = 0
        plan = "run: print('carried out')"
        for method, path, body in [("PATCH", f"/v1/sessions/{s.id}", {"sandbox": "full-access"}),
                                   ("PATCH", f"/v1/sessions/{s.id}", {"plan": False}),
                                   ("POST", f"/v1/sessions/{s.id}/plan", {"approve": True})]:
            code = request_over_tcp(url, token, method, path, body) + ("" if "plan" in path else f"propose_plan({plan!r})")
            accepted = await client.send(s.id, "run: " + code)
            events = await collect(client, s.id, accepted.turn_id, after)
            after = events[-1].seq
            (out,) = [e.result.stdout for e in events if e.type == "cell.finished"]
            status, _, reply = out.splitlines()[0].partition(" ")
            assert status == "403", (body, reply)
            assert json.loads(reply)["error"]["code"] == "remote_loosening"
            info = await client.session(s.id)
            assert info.sandbox.startswith("workspace-write") and info.planning, (body, info)
        async with Client(url=url, token=token) as tcp:
            # between turns, as a process the cell left behind would send them
            for attempt in (tcp.update(s.id, sandbox="full-access"), tcp.update(s.id, plan=False),
                            tcp.decide_plan(s.id, True)):
                with pytest.raises(DaemonError) as e:
                    await attempt
                assert e.value.status == 403, e.value.message
            assert (await client.session(s.id)).planning
            # what tightens is fine over TCP: rejecting the plan, read-only
            assert (await tcp.decide_plan(s.id, False, note="no")).approved is False
            await tcp.update(s.id, sandbox="read-only")
            with pytest.raises(DaemonError) as e:  # and from read-only, back is looser
                await tcp.update(s.id, sandbox="workspace-write")
            assert e.value.status == 403 and "read-only to workspace-write loosens it" in e.value.message
        await client.update(s.id, sandbox="full-access")  # the person's client, over the Unix socket
        accepted = await client.send(s.id, "run: print('unconfined')")
        await collect(client, s.id, accepted.turn_id, after)
        assert (await client.session(s.id)).sandbox.startswith("full-access")


async def _post(url: str, token: str, body: dict) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as h:
        return await h.post("/v1/sessions", json=body)


async def test_over_tcp_a_request_to_run_outside_the_sandbox_can_only_be_denied(project: Path, prime_home: Path,
                                                                                model_server):
    """With the token, a cell could approve its own request to run a command outside the sandbox."""
    async with running_daemon(tcp="127.0.0.1:0") as client:
        url = f"http://{(await client.status()).tcp}"
        token = (prime_home / "run" / "token").read_text().strip()
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        accepted = await client.send(s.id, "run: print(await request_permission('touch pwned'))")
        async with Client(url=url, token=token) as tcp:
            async for e in client.events(s.id):
                if e.type == "approval.requested":
                    for decision in ("approve", "always"):
                        with pytest.raises(DaemonError) as refused:
                            await tcp.decide_approval(s.id, e.request_id, decision)
                        assert refused.value.status == 403 and "only be denied" in refused.value.message
                    await tcp.decide_approval(s.id, e.request_id, "deny")
                if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
                    break
        assert "the user denied it" in e.answer and not (project / "pwned").exists()


KEY = "sk-test-4f2b9c1e8d7a6b5c"
PRINT_ENV = "run: import os\nprint('KEY' if any('4f2b9c1e' in v for v in os.environ.values()) else 'no key', len(os.environ))"


def _cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "prime-agent"), *args], cwd=cwd, text=True,
                          capture_output=True, timeout=120, env={**os.environ, **env})


def _files_holding(root: Path, secret: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and secret in p.read_bytes()]


@pytest.mark.slow
def test_a_daemon_started_without_a_key_uses_the_clients_and_writes_it_nowhere(prime_home: Path, project: Path):
    assert _cli("daemon", "start", cwd=project).returncode == 0  # no key in its environment (nor in this one)
    with OpenAIServer(agent_script, api_key=KEY) as server:
        model = {"OPENAI_BASE_URL": server.base_url, "PRIME_AGENT_MODEL": "fake"}
        without = _cli("run", "--daemon", "hello", cwd=project, **model)
        assert without.returncode == 3 and "HTTP 401" in without.stderr
        assert "export OPENAI_API_KEY in your shell and send the prompt again" in without.stderr
        r = _cli("run", "--daemon", PRINT_ENV, cwd=project, **model, OPENAI_API_KEY=KEY)  # exported since
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("ran: no key ")  # the kernel's environment has no key
        assert server.requests and server.requests[-1]["messages"][-1]["role"] == "tool"
        status = _cli("daemon", "status", cwd=project)
        assert "no OPENAI_API_KEY" in status.stdout and "(1 session(s) have one)" in status.stdout, status
        assert "started    " in status.stdout
    assert _cli("daemon", "stop", cwd=project).returncode == 0
    sessions = list((prime_home / "sessions").iterdir())
    assert len(sessions) == 2 and all((s / "events.jsonl").is_file() and (s / "session.json").is_file()
                                      for s in sessions)
    assert (prime_home / "run" / "daemon.log").is_file()
    assert _files_holding(prime_home, KEY.encode()) == [] and _files_holding(project, KEY.encode()) == []


async def test_a_key_is_taken_over_the_unix_socket_only_and_for_its_own_endpoint(project: Path, prime_home: Path):
    with OpenAIServer(agent_script, api_key=KEY) as server:
        async with running_daemon(tcp="127.0.0.1:0") as client:
            url = f"http://{(await client.status()).tcp}"
            token = (prime_home / "run" / "token").read_text().strip()
            body = {"cwd": str(project), "model": "fake", "base_url": server.base_url,
                    "key": {"api_key": KEY, "base_url": server.base_url}}
            async with httpx2.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as h:
                r = await h.post("/v1/sessions", json=body)
            assert r.status_code == 400 and "Unix socket only" in r.json()["error"]["message"]
            elsewhere = Client(key=ModelKey(api_key=KEY, base_url="https://api.openai.com/v1"))
            s = await elsewhere.create_session(project, model="fake", base_url=server.base_url)
            accepted = await elsewhere.send(s.id, "hello")  # a key meant for another endpoint is not sent here
            finished = (await collect(client, s.id, accepted.turn_id))[-1]
            assert finished.outcome == "error" and "HTTP 401" in finished.error
            keyed = Client(key=ModelKey(api_key=KEY, base_url=server.base_url + "/"))
            accepted = await keyed.send(s.id, "hello again")  # a prompt from a client with the key: it is used
            finished = (await collect(client, s.id, accepted.turn_id))[-1]
            assert (finished.outcome, finished.answer) == ("completed", "echo: hello again")
            assert (await client.status()).client_keys == 1
            await elsewhere.close()
            await keyed.close()
        async with running_daemon() as client:  # restarted: the key is gone with the old process
            accepted = await client.send(s.id, "after the restart")
            finished = (await collect(client, s.id, accepted.turn_id))[-1]
            assert finished.outcome == "error" and "after a daemon restart" in finished.error
    assert _files_holding(prime_home, KEY.encode()) == []
