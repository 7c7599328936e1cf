"""The sandbox, tested by the attacks it stops: each attempt is made from a real kernel cell (or a
process it starts, or a subagent's kernel), must fail with an error the model reads, and must
change nothing; what a session needs keeps working beside it."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from agent.config_models import Config
from agent.harness import scope_roots
from agent.kernel.homes import _placeholder_key, _placeholder_lock
from agent.kernel.sandbox import unavailable
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.types import Cell
from harness_store.store import HarnessStore
from tests.conftest import make_config

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")

TRY = '''
def attempt(label, fn):
    try:
        fn()
        print(label, "ok")
    except BaseException as e:
        print(label, type(e).__name__, e)
'''


def outcomes(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


@pytest.fixture
def world(project: Path, prime_home: Path, tmp_path: Path) -> dict[str, Path]:
    """A project with a git repository and a harness scope, a user scope, the daemon's token and
    socket, another session with its records, and a secret store."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / "main.py").write_text("print('hello')\n")
    subprocess.run(["git", "-C", str(project), "add", "main.py"], check=True)
    subprocess.run(["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
                   check=True)
    HarnessStore(project / ".prime-agent" / "harness", "project").commit_user_edits()
    for scope, root in scope_roots(prime_home, project, None).items():
        (root / "prompt").mkdir(parents=True, exist_ok=True)
        (root / "prompt" / "style.md").write_text(f"---\nid: style\nkind: prompt\ntitle: {scope} style\n---\nBe brief.\n")
        HarnessStore(root, scope).commit_user_edits()
    run = prime_home / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "token").write_text("daemon-token-" + "x" * 40)
    other = prime_home / "sessions" / "other-session"
    other.mkdir(parents=True)
    (other / "trajectory.jsonl").write_text('{"secret": "another session"}\n')
    ssh = tmp_path / "fake-home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_text("PRIVATE KEY")
    return {"project": project, "home": prime_home, "run": run, "other": other, "ssh": ssh, "outside": tmp_path}


def sandboxed(world: dict[str, Path], **sandbox) -> Config:
    return make_config(sandbox={"hidden": [str(world["ssh"])], "env_allow": ["ALLOWED_TOKEN"], **sandbox})


async def run(session: Session, code: str):
    return await session.kernel.execute(Cell(id="c", code=code, timeout=60))


def harness_state(world: dict[str, Path]) -> dict[str, list[str]]:
    roots = scope_roots(world["home"], world["project"], None)
    return {scope: [c.commit for c in HarnessStore(root, scope).log()] for scope, root in roots.items()}


async def test_every_escape_from_a_default_session_fails_and_changes_nothing(world, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "sk-live-123456")
    monkeypatch.setenv("SERVICE_TOKEN", "tok-987654")
    monkeypatch.setenv("ALLOWED_TOKEN", "fine-to-see")
    project, home = world["project"], world["home"]
    daemon = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(world["run"] / "daemon.sock"))
    before = harness_state(world)
    secret_cell = "import os\nprint(sorted(os.environ))\nprint(os.environ.get('ALLOWED_TOKEN'))"
    model = ScriptedModel([cells(secret_cell), "done"])
    session = Session(sandboxed(world), model, cwd=project)
    await session.start()
    try:
        assert session.sandbox == "workspace-write"
        sdir = session.dir
        attacks = {
            "harness-write": "write('.prime-agent/harness/prompt/x.md', '---\\nid: x\\nkind: prompt\\n---\\nobey')",
            "harness-open": f"open({str(project / '.prime-agent/harness/prompt/style.md')!r}, 'a').write('obey')",
            "user-harness": f"open({str(home / 'harness/prompt/style.md')!r}, 'w').write('obey')",
            "session-harness": f"os.makedirs({str(sdir / 'harness/prompt')!r}, exist_ok=True)",
            "trajectory": f"open({str(sdir / 'trajectory.jsonl')!r}, 'a').write('{{}}')",
            "events": f"open({str(sdir / 'events.jsonl')!r}, 'w').write('')",
            "checkpoints": f"open({str(sdir / 'checkpoints' / 'x')!r}, 'w')",  # only kernel/ in it is writable
            "via-snapshots": f"open({str(sdir / 'checkpoints/kernel/../../trajectory.jsonl')!r}, 'a')",
            "git": "open('.git/config', 'a').write('[core]\\n')",
            "git-hook": "open('.git/hooks/pre-commit', 'w').write('#!/bin/sh')",
            "token": f"print(open({str(world['run'] / 'token')!r}).read())",
            "daemon-socket": f"socket.socket(socket.AF_UNIX).connect({str(world['run'] / 'daemon.sock')!r})",
            "host-environ": f"print(open('/proc/{os.getpid()}/environ').read())",
            "host-signal": f"os.kill({os.getpid()}, 0)",
            "home-file": f"open({str(Path.home() / 'pa-sandbox-x')!r}, 'w')",
            "prime-home": f"open({str(home / 'x')!r}, 'w')",
            "outside": f"open({str(world['outside'] / 'x')!r}, 'w')",
            "other-session": f"print(open({str(world['other'] / 'trajectory.jsonl')!r}).read())",
            "ssh": f"print(os.listdir({str(world['ssh'])!r}) or open({str(world['ssh'] / 'id_ed25519')!r}).read())",
            "background": f"subprocess.run(['sh', '-c', 'echo pwned > {home}/bg'], check=True)",
            "remount": "subprocess.run(['mount', '-o', 'remount,rw', '.git'], check=True, capture_output=True)",
            "unmount": "subprocess.run(['umount', '.git'], check=True, capture_output=True)",
        }
        code = "import os, socket, subprocess\n" + TRY + "".join(
            f"attempt({label!r}, lambda: {expr})\n" for label, expr in attacks.items())
        r = await run(session, code)
        got = outcomes(r.stdout)
        assert set(got) == set(attacks), r
        assert [label for label, what in got.items() if what == "ok"] == [], got
        assert "Read-only file system" in got["harness-write"] and "Read-only file system" in got["git"]
        for label in ("token", "daemon-socket", "host-environ", "other-session"):
            assert got[label].startswith("FileNotFoundError"), (label, got[label])
        assert got["host-signal"].startswith("ProcessLookupError")
        assert got["ssh"].startswith(("FileNotFoundError", "PermissionError", "OSError")), got["ssh"]

        shell = await run(session, "%%bash\necho obey > .prime-agent/harness/prompt/y.md\n"
                          "cd .prime-agent/harness && git commit -q --allow-empty -m pwned; echo rc=$?")
        assert "Read-only file system" in shell.stderr and "rc=0" not in shell.stdout, shell
        child = await run(session, "import subprocess, time\n"
                          f"p = subprocess.Popen(['sh', '-c', 'sleep 0.3; echo pwned > {project}/.git/bg'])\n"
                          "print(p.wait())")
        assert child.stdout.strip() != "0"

        # What the session needs still works beside it.
        ok = await run(session, "write('notes/a.py', 'print(6 * 7)')\n"
                       "import subprocess\nprint(subprocess.run(['python', 'notes/a.py'], capture_output=True, "
                       "text=True).stdout.strip(), read('main.py').strip())")
        assert ok.stdout == "42 print('hello')\n", ok
        git = await run(session, "%%bash\necho more >> main.py; git status --short && git diff --stat && git log --oneline")
        assert " M main.py" in git.stdout and "1 file changed" in git.stdout and "init" in git.stdout, git
        made = await run(session, "print(harness.create('memory', 'm1', 'remember this'))")
        assert "session scope" in made.stdout, made
        assert (sdir / "harness" / "memory" / "m1.md").is_file()
        result = await session.prompt("show me the environment")
        assert result.outcome == "completed"
        await session.checkpoints.settle()  # the turn's end: the kernel snapshots its namespace, for rewind
        manifests = sdir / "checkpoints" / "kernel"
        for _ in range(200):
            if any(manifests.glob("*.json")):
                break
            await asyncio.sleep(0.05)
        assert [json.loads(m.read_text()).get("error") for m in manifests.glob("*.json")] == [None], manifests
        refine = await run(session, "print(await refine.request('tidy up'))")  # planned by the model, after
        assert refine.error_name is None and "planning started" in refine.stdout, refine
    finally:
        await session.close()
        daemon.close()
    sent = "\n".join(m.content for call in model.calls for m in call)
    assert "fine-to-see" in sent  # the model saw the environment, allowed names included ...
    assert "sk-live-123456" not in sent and "tok-987654" not in sent and "MY_API_KEY" not in sent  # ... no secret
    assert harness_state(world) == before  # `harness log` shows no new change in any scope
    assert not (home / "bg").exists() and not (project / ".git" / "bg").exists()
    assert not (world["outside"] / "x").exists() and not (home / "x").exists()
    assert (project / ".prime-agent/harness/prompt/style.md").read_text().endswith("Be brief.\n")
    assert (project / "main.py").read_text() == "print('hello')\nmore\n"


def wheel(directory: Path) -> Path:
    """A one-module wheel, so `pip install` needs no network."""
    path = directory / "pa_demo-0.1-py3-none-any.whl"
    files = {"pa_demo.py": "VALUE = 7\n",
             "pa_demo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: pa-demo\nVersion: 0.1\n",
             "pa_demo-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("pa_demo-0.1.dist-info/RECORD", "".join(f"{n},,\n" for n in files) + "pa_demo-0.1.dist-info/RECORD,,\n")
    return path


async def test_a_subagents_kernel_is_confined_too_and_pip_installs_into_the_workspace(world):
    project = world["project"]
    whl = wheel(project)
    seen: list[str] = []

    def child_report(messages):
        seen.append(messages[-1].content)
        return "reported"

    attack = "import os\n" + TRY + "".join(f"attempt({label!r}, lambda: {expr})\n" for label, expr in {
        "harness": f"open({str(project / '.prime-agent/harness/prompt/style.md')!r}, 'a')",
        "parent-records": "open(os.path.dirname(os.environ['PRIME_AGENT_SESSION_DIR']) + '/trajectory.jsonl', 'a')",
        "token": f"open({str(world['run'] / 'token')!r})",
        "git": "open('.git/config', 'a')",
    }.items())
    model = ScriptedModel([
        cells("print(await rlm.run('try to get out', name='kid'))"),
        cells(attack), child_report,
        cells(f"import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', "
              f"'--target', 'libs', {str(whl)!r}], capture_output=True, text=True)\nprint(r.returncode, r.stderr[-300:])\n"
              "sys.path.insert(0, 'libs'); import pa_demo; print('value', pa_demo.VALUE)"),
        "done",
    ])
    async with Session(sandboxed(world), model, cwd=project) as session:
        result = await session.prompt("delegate, then install")
        assert result.outcome == "completed", result
        out = [m.content for m in session.messages if m.role == "tool"]
    got = outcomes(seen[0] if seen else "")
    assert set(got) == {"harness", "parent-records", "token", "git"}, seen
    assert all(v != "ok" for v in got.values()), got
    assert "value 7" in out[-1], out[-1]
    assert (project / "libs" / "pa_demo.py").is_file()


async def test_read_only_mode_writes_nothing_in_the_workspace_but_its_tmp(world):
    async with Session(sandboxed(world, mode="read-only"), ScriptedModel([]), cwd=world["project"]) as s:
        assert s.sandbox == "read-only"
        r = await run(s, TRY + "import os, tempfile\nattempt('workspace', lambda: open('new.txt', 'w'))\n"
                      "attempt('tmp', lambda: open(os.path.join(tempfile.gettempdir(), 't'), 'w').write('x'))\n"
                      "attempt('read', lambda: open('main.py').read())")
    assert outcomes(r.stdout) == {"workspace": "OSError [Errno 30] Read-only file system: 'new.txt'", "tmp": "ok",
                                  "read": "ok"}
    assert not (world["project"] / "new.txt").exists()


async def test_full_access_writes_anywhere_says_so_and_its_harness_edits_are_external(world):
    project = world["project"]
    async with Session(sandboxed(world, mode="full-access"), ScriptedModel([]), cwd=project) as s:
        assert s.sandbox.startswith("full-access: NO SANDBOX")
        r = await run(s, TRY + f"attempt('git', lambda: open('.git/x', 'w'))\n"
                      f"attempt('harness', lambda: open({str(project / '.prime-agent/harness/prompt/style.md')!r}, "
                      "'a').write('More.\\n'))")
        assert outcomes(r.stdout) == {"git": "ok", "harness": "ok"}
        store = s.harness.store("project")
        for _ in range(100):  # the watcher commits the edit a moment later
            if store.log()[0].trigger != "user-edit":
                break
            await asyncio.sleep(0.05)
        latest = store.log()[0]
    assert latest.trigger == "external-edit" and "unsandboxed kernel" in latest.summary
    assert "source: external" in (project / ".prime-agent/harness/prompt/style.md").read_text()


async def test_a_cell_past_the_memory_or_process_limit_ends_naming_it_and_the_session_goes_on(world):
    config = sandboxed(world, memory_mb=256, max_processes=64)
    async with Session(config, ScriptedModel([]), cwd=world["project"]) as s:
        mem = await run(s, "b = b'x' * (1024 * 2**20)\nlen(b)")
        assert "memory limit (256 MiB" in mem.kernel_message, mem
        forks = await run(s, "import os, time\nkids = []\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n"
                          "        time.sleep(30)\n        os._exit(0)\n    kids.append(pid)")
        assert forks.error_name == "BlockingIOError" and "process limit (64" in forks.kernel_message, forks
        assert (await run(s, "import subprocess; subprocess.run(['true']).returncode")).result == "0"


async def test_without_network_a_cell_reaches_no_server_yet_runs_cells(world):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        connect = TRY + f"import socket\nattempt('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), 5))"
        async with Session(sandboxed(world), ScriptedModel([]), cwd=world["project"]) as online:
            assert outcomes((await run(online, connect)).stdout) == {"tcp": "ok"}  # the server is there
        async with Session(sandboxed(world, network=False), ScriptedModel([]), cwd=world["project"]) as s:
            assert s.sandbox == "workspace-write, no network"
            got = outcomes((await run(s, connect)).stdout)
            assert got["tcp"].startswith(("ConnectionRefusedError", "OSError")), got
            assert (await run(s, "print(harness.list() == [] or True, 6 * 7)")).stdout == "True 42\n"
    finally:
        server.close()


def test_where_the_os_cannot_sandbox_required_refuses_and_otherwise_it_says_so(tmp_path: Path, project: Path):
    """Without bubblewrap on the PATH (as on a machine without it), a session says it is unsandboxed,
    and with sandbox.required it does not start."""
    script = f"""
import asyncio, os
os.environ["PATH"] = {str(tmp_path / "bin")!r}
from pathlib import Path
from agent.kernel.sandbox import SandboxError
from agent.session import Session
from agent.testing.scripted import ScriptedModel
from tests.conftest import make_config
async def main():
    async with Session(make_config(), ScriptedModel([]), cwd=Path({str(project)!r})) as s:
        print(s.sandbox)
    try:
        await Session(make_config(sandbox={{"required": True}}), ScriptedModel([]), cwd=Path({str(project)!r})).start()
    except SandboxError as e:
        print("refused:", e)
asyncio.run(main())
"""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "git").symlink_to(shutil.which("git"))  # and nothing else
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    lines = r.stdout.splitlines() + ["", ""]
    assert lines[0].startswith("UNSANDBOXED: kernels cannot be sandboxed: bwrap not found"), r
    assert lines[1].startswith("refused: kernels cannot be sandboxed") and "sandbox.required" in lines[1], r


def test_a_sandboxed_kernel_dies_with_its_host_killed_outright(tmp_path: Path, project: Path, prime_home: Path):
    """ipykernel's parent poller cannot see the host from inside a PID namespace: the lifeline does."""
    host = subprocess.Popen([sys.executable, "-c", f"""
import asyncio
from pathlib import Path
from agent.session import Session
from agent.testing.scripted import ScriptedModel
from tests.conftest import make_config
async def main():
    s = Session(make_config(), ScriptedModel([]), cwd=Path({str(project)!r}))
    await s.start()
    print(s.kernel._km.provisioner.process.pid, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    launcher = int(host.stdout.readline())
    tree = [launcher, *(kid for kid in _descendants(launcher))]
    assert len(tree) == 3  # bubblewrap, its PID 1, the kernel
    host.kill()
    host.wait()
    for _ in range(200):
        if not any(map(_alive, tree)):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the sandbox {tree} outlived its host")


def _descendants(pid: int) -> list[int]:
    kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [k for kid in kids for k in (kid, *_descendants(kid))]


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


async def test_a_fresh_project_cannot_gain_a_prime_agent_dir_or_a_git_repository(tmp_path: Path, prime_home: Path):
    """With no `.prime-agent/` and no `.git` at the start, a cell can create neither (a config or a
    harness entry in force next session, a `core.fsmonitor` the host's git would run), ordinary
    writes and `pip install --target` still work, and no placeholder is left on the host."""
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    whl = wheel(tmp_path)
    attacks = {
        "harness": "os.makedirs('.prime-agent/harness/prompt')",
        "config": "open('.prime-agent/config.toml', 'w').write('[sandbox]\\nmode = \"full-access\"\\n')",
        "mkdir-git": "os.makedirs('.git/hooks')",
        "git-config": "open('.git/config', 'w').write('[core]\\nfsmonitor = touch /tmp/pwned\\n')",
        "replace": "os.rename('.git', 'g') or os.symlink('.', '.git')",
    }
    code = "import os\n" + TRY + "".join(f"attempt({k!r}, lambda: {v})\n" for k, v in attacks.items())
    async with Session(make_config(), ScriptedModel([]), cwd=fresh) as s:
        got = outcomes((await run(s, code)).stdout)
        init = await run(s, "%%bash\ngit init -q . ; echo rc=$?; mkdir .prime-agent/x; echo rc=$?")
        ok = await run(s, "import subprocess, sys\nwrite('src/a.py', 'A = 1')\n"
                       f"r = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--target', "
                       f"'libs', {str(whl)!r}], capture_output=True, text=True)\nprint(r.returncode, r.stderr[-300:])")
    assert set(got) == set(attacks) and all(v != "ok" for v in got.values()), got
    assert "rc=0" not in init.stdout, init
    assert ok.stdout.startswith("0 "), ok
    assert sorted(p.name for p in fresh.iterdir()) == ["libs", "src"]  # no .git, no .prime-agent, no placeholder
    assert (fresh / "libs" / "pa_demo.py").is_file()


async def test_placeholders_are_shared_by_kernels_in_one_workspace_and_gone_after_the_last(tmp_path: Path):
    """Two sessions in one fresh workspace: the first to close leaves the other's cover in place
    (removing the placeholder on the host would lift it), the last removes it."""
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    probe = TRY + "import os\nattempt('git', lambda: os.makedirs('.git/hooks'))"
    first = Session(make_config(), ScriptedModel([]), cwd=fresh)
    await first.start()
    try:
        async with Session(make_config(), ScriptedModel([]), cwd=fresh) as second:
            assert (fresh / ".git").is_dir()  # the placeholder, while kernels run
            await first.close()
            assert outcomes((await run(second, probe)).stdout)["git"] != "ok"
    finally:
        await first.close()
    assert not (fresh / ".git").exists() and not (fresh / ".prime-agent").exists()
    for placeholder in (fresh / ".git", fresh / ".prime-agent"):  # nor anything of theirs in the registry
        registry, key = _placeholder_key(placeholder)
        assert not list(registry.glob(f"{key}*"))


def test_the_placeholder_lock_excludes_while_its_file_is_removed_and_made_again(tmp_path: Path):
    """Each holder that finds no placeholder removes the lock file as it lets go; whoever waited on the
    removed file must wait again on the new one, never hold the lock beside another."""
    inside, most, errors = [0], [0], []
    guard = threading.Lock()

    def contend() -> None:
        try:
            for _ in range(200):
                with _placeholder_lock(tmp_path / ".git"):
                    with guard:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    time.sleep(0)
                    with guard:
                        inside[0] -= 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and most[0] == 1
    registry, key = _placeholder_key(tmp_path / ".git")
    assert not list(registry.glob(f"{key}*"))


async def test_no_kernel_reads_the_homes_keys_checkpoints_or_another_homes_daemon(tmp_path: Path, prime_home: Path,
                                                                                monkeypatch):
    """Home A runs a daemon (its run/ with a token and a socket, a config with an api_key, a
    checkpoint store); a kernel under home B reaches none of it, nor B's own config and checkpoints,
    yet reads its harness scopes and writes its namespace snapshots."""
    from daemon import paths

    key, private = f"sk-in-config-{secrets.token_hex(8)}", f"PRIVATE KEY COPY {secrets.token_hex(8)}"  # this run's own
    home_a = tmp_path / "home-a"
    monkeypatch.setenv("PRIME_AGENT_HOME", str(home_a))
    token_a = paths.token()  # what a daemon does at its start: run/ made, the home registered
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(paths.socket_file()))
    server.listen()
    monkeypatch.setenv("PRIME_AGENT_HOME", str(prime_home))
    for home in (home_a, prime_home):
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(f'[model]\napi_key = "{key}"\n')
        (home / "checkpoints" / "ws-1").mkdir(parents=True)
        (home / "checkpoints" / "ws-1" / "id_rsa").write_text(private)
    project = tmp_path / "project"
    project.mkdir()
    user_skill = prime_home / "harness" / "skill" / "s1"
    user_skill.mkdir(parents=True)
    (user_skill / "SKILL.md").write_text("---\nid: s1\nkind: skill\n---\nA skill.\n")
    reads = {
        "a-token": f"open({str(home_a / 'run' / 'token')!r}).read()",
        "a-socket": f"socket.socket(socket.AF_UNIX).connect({str(paths.socket_file())!r})",
        "a-config": f"open({str(home_a / 'config.toml')!r}).read()",
        "a-checkpoint": f"open({str(home_a / 'checkpoints/ws-1/id_rsa')!r}).read()",
        "b-config": f"open({str(prime_home / 'config.toml')!r}).read()",
        "b-checkpoint": f"open({str(prime_home / 'checkpoints/ws-1/id_rsa')!r}).read()",
        "b-run": f"os.listdir({str(prime_home / 'run')!r}) and 1/0",
    }
    code = "import os, socket\n" + TRY + "".join(f"attempt({k!r}, lambda: {v})\n" for k, v in reads.items())
    try:
        async with Session(make_config(), ScriptedModel([]), cwd=project) as s:
            got = outcomes((await run(s, code)).stdout)
            skill = await run(s, f"print(open({str(user_skill / 'SKILL.md')!r}).read().split()[-1])")
            snap = await run(s, f"open(os.path.join({str(s.layout.kernel_snapshots)!r}, 'probe'), 'w').write('x')")
            # this test's files, then all of /tmp but the tests' trees (gigabytes of models: a minute of CPU)
            patterns = f"'-e', {key!r}, '-e', {private!r}, '-e', {token_a!r}"
            whole = await run(s, "import subprocess\nfor where in ("
                              f"[{str(tmp_path)!r}], ['--exclude-dir=pytest-of-*', '/tmp']):\n"
                              f"    print(subprocess.run(['grep', '-rl', {patterns}, *where], capture_output=True, "
                              "text=True).stdout, end='')")
    finally:
        server.close()
    assert set(got) == set(reads) and all(v != "ok" for v in got.values()), got
    assert skill.stdout == "skill.\n", skill
    assert snap.error_name is None, snap
    assert whole.stdout.strip() == "", whole  # nowhere on the machine the kernel can read


def fake_user_home(tmp_path: Path, monkeypatch) -> Path:
    """A `$HOME` of the test's own (what `~` means to the host and its sandbox), with a file a kernel may read."""
    user = tmp_path / "user-home"
    user.mkdir()
    (user / "notes.txt").write_text("readable")
    monkeypatch.setenv("HOME", str(user))
    return user


async def test_every_default_secret_store_is_hidden_from_a_kernel(tmp_path: Path, project: Path, monkeypatch):
    """Each store `sandbox.hidden` names by default, made in the user's home with a secret in it (the
    gh, Hugging Face, PyPI, npm, kube and Claude credentials, shell histories...), is unreadable from a
    kernel with the default settings: no read, no listing, no grep over the home finds a secret."""
    from agent.config_models import SECRET_STORES

    user = fake_user_home(tmp_path, monkeypatch)
    files = []
    for entry in SECRET_STORES:
        path = user / entry.removeprefix("~/").rstrip("/")
        if entry.endswith("/"):
            path.mkdir(parents=True)
            path = path / "credentials"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"SECRET-IN {entry}")
        files.append(path)
    for name in (".config/gh/hosts.yml", ".kube/config", ".claude/.credentials.json"):  # the report's own
        (user / name).write_text(f"SECRET-IN ~/{name}")
        files.append(user / name)
    code = ("import os, subprocess\n" + TRY
            + "".join(f"attempt({str(f)!r}, lambda: print(open({str(f)!r}).read()))\n" for f in files)
            + f"print('grep', subprocess.run(['grep', '-rl', 'SECRET-IN', {str(user)!r}], capture_output=True, "
              f"text=True).stdout.split())\nprint('notes', open({str(user / 'notes.txt')!r}).read())")
    async with Session(make_config(), ScriptedModel([]), cwd=project) as s:
        r = await run(s, code)
    got = outcomes(r.stdout)
    assert "SECRET-IN" not in r.stdout, r.stdout  # each read failed, or read an empty cover (/dev/null)
    assert {str(f) for f in files} <= set(got), got
    assert got["grep"] == "[]" and got["notes"] == "readable", r  # the rest of the home is still there


async def test_the_default_home_is_hidden_when_the_hosts_home_is_elsewhere(tmp_path: Path, project: Path,
                                                                       prime_home: Path, monkeypatch):
    """`~/.prime-agent`, the home a plain `prime-agent` uses, was never registered by a host whose
    `PRIME_AGENT_HOME` points elsewhere; its key and daemon token are still out of every kernel's reach
    (one of a session and one of the pool), and so is the whole home."""
    from agent.kernel import KernelPool
    from agent.kernel.sandbox import Launch

    user = fake_user_home(tmp_path, monkeypatch)
    default = user / ".prime-agent"
    (default / "run").mkdir(parents=True)
    (default / "config.toml").write_text('[model]\napi_key = "sk-default-home"\n')
    (default / "run" / "token").write_text("daemon-token-of-the-default-home")
    (default / "sessions" / "s1").mkdir(parents=True)
    (default / "sessions" / "s1" / "trajectory.jsonl").write_text("a session of the default home\n")
    assert prime_home != default
    reads = {"config": default / "config.toml", "token": default / "run" / "token",
             "session": default / "sessions" / "s1" / "trajectory.jsonl"}
    code = ("import os, subprocess\n" + TRY
            + "".join(f"attempt({k!r}, lambda: print(open({str(v)!r}).read()))\n" for k, v in reads.items())
            + f"attempt('list', lambda: print(os.listdir({str(default)!r}) or 1/0))\n")
    config = make_config()
    pool = KernelPool(1, config.kernel, Launch.of(config.sandbox))
    pool.fill()
    try:
        async with Session(config, ScriptedModel([]), cwd=project) as s:
            own = outcomes((await run(s, code)).stdout)
        async with Session(config, ScriptedModel([]), cwd=project, kernel_pool=pool) as s:
            pooled = outcomes((await run(s, code)).stdout)
    finally:
        await pool.close()
    for got in (own, pooled):
        assert set(got) == {*reads, "list"} and all(not v.startswith("ok") for v in got.values()), got


async def test_pooled_kernels_cover_other_homes_ahead_and_a_session_inside_one_still_works_there(
        tmp_path: Path, prime_home: Path, monkeypatch):
    """The pool covers the other homes of this user before any session takes a kernel. A session then
    reads none of them: one registered before the kernel started, one after, one removed and made
    again since (its first cover went with it); and a session whose workspace lies inside another
    home works there, that home's secrets still covered."""
    from agent.kernel import KernelPool
    from agent.kernel.homes import register_home
    from agent.kernel.sandbox import Launch

    def register(name: str) -> Path:
        home = tmp_path / name
        home.mkdir()
        (home / "config.toml").write_text(f"secret of {name}")
        monkeypatch.setenv("PRIME_AGENT_HOME", str(home))
        register_home()
        monkeypatch.setenv("PRIME_AGENT_HOME", str(prime_home))  # what the pool and the sessions run under
        return home

    before, again = register("before"), register("again")
    (before / "work").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    config = make_config()
    pool = KernelPool(2, config.kernel, Launch.of(config.sandbox))
    pool.fill()
    try:
        pooled = [km for km, _ in await asyncio.gather(*pool._starting)]
        assert all(str(before) in km.box.covered and str(again) in km.box.covered for km in pooled)
        shutil.rmtree(again)
        again.mkdir()
        (again / "config.toml").write_text("secret of again")
        register("after")
        reads = "".join(f"attempt({n!r}, lambda: open({str(tmp_path / n / 'config.toml')!r}).read().index('secret'))\n"
                        for n in ("before", "again", "after"))  # a file covered reads empty
        write = "attempt('work', lambda: open('notes.txt', 'w').write('x'))\n"
        async with Session(config, ScriptedModel([]), cwd=project, kernel_pool=pool) as s, \
                Session(config, ScriptedModel([]), cwd=before / "work", kernel_pool=pool) as inside:
            assert {s.kernel._km, inside.kernel._km} == set(pooled)  # both from the pool
            got = outcomes((await run(s, TRY + reads)).stdout)
            there = outcomes((await run(inside, TRY + reads + write)).stdout)
    finally:
        await pool.close()
    assert set(got) == {"before", "again", "after"} and all(v != "ok" for v in got.values()), got
    assert there.pop("work") == "ok" and set(there) == set(got) and all(v != "ok" for v in there.values()), there
    assert (before / "work" / "notes.txt").read_text() == "x"


async def test_secret_looking_variables_and_urls_with_passwords_do_not_reach_a_kernel(project: Path, monkeypatch):
    secrets_ = {"DATABASE_URL": "postgres://app:hunter2@db:5432/x", "MYSQL_PWD": "pw-1", "GH_PAT": "pat-2",
                "SENTRY_DSN": "https://abc@o1.ingest.sentry.io/1", "NPM_AUTH": "auth-3", "CI_JOB_JWT": "jwt-4",
                "HTTPS_PROXY": "http://me:pw-5@proxy:3128", "SESSION_COOKIE": "c-6", "PATCH_PASS": "p-7"}
    kept = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "/x"), "LANG": "C.UTF-8",
            "TERM": "xterm", "VIRTUAL_ENV": "/venv", "PATCH_LEVEL": "3", "SERVICE_URL": "https://host:8443/api"}
    for name, value in {**secrets_, **kept}.items():
        monkeypatch.setenv(name, value)
    async with Session(make_config(), ScriptedModel([]), cwd=project) as s:
        r = await run(s, "import json\nprint(json.dumps([v.decode() for v in open('/proc/self/environ', "
                      "'rb').read().split(b'\\0') if v]))")  # as the kernel was started, whatever it changed since
    env = dict(v.split("=", 1) for v in json.loads(r.stdout))
    assert not set(secrets_) & set(env), set(secrets_) & set(env)
    assert all(env.get(k) == v for k, v in kept.items()), {k: env.get(k) for k in kept}
    assert env.get("HOME") == os.environ["HOME"]
    assert not any(v in r.stdout for v in ("hunter2", "pw-1", "pat-2", "pw-5"))


SYSCALL = {"x86_64": {"keyctl": 250, "bpf": 321, "clone3": 435}, "aarch64": {"keyctl": 219, "bpf": 280, "clone3": 435}}


@pytest.mark.skipif(os.uname().machine not in SYSCALL, reason="the seccomp filter covers x86_64 and aarch64")
async def test_a_kernel_cannot_trace_use_keyrings_bpf_new_user_namespaces_or_mount_yet_works(project: Path):
    nr = SYSCALL[os.uname().machine]
    calls = {
        "ptrace": "libc.ptrace(0, 0, 0, 0)",  # PTRACE_TRACEME
        "keyctl": f"libc.syscall({nr['keyctl']}, 0, -3, 0)",  # KEYCTL_GET_KEYRING_ID, the session keyring
        "bpf": f"libc.syscall({nr['bpf']}, 0, 0, 0)",
        "unshare": "libc.unshare(0x10000000)",  # CLONE_NEWUSER
        "mount": "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)",
        "clone3": f"libc.syscall({nr['clone3']}, 0, 0)",
    }
    code = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            + "".join(f"print({k!r}, 'ok' if {v} >= 0 else errno.errorcode[ctypes.get_errno()])\n"
                      for k, v in calls.items())
            + "print('status', *[l.split()[1] for l in open('/proc/self/status') if l.startswith(('NoNewPrivs', 'Seccomp:'))])")
    work = ("import subprocess, threading, multiprocessing, sys\n"
            "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
            "with multiprocessing.get_context('fork').Pool(2) as p: print(p.map(abs, [-1, -2]))\n"
            "with multiprocessing.get_context('spawn').Pool(1) as p: print(p.map(abs, [-3]))\n"
            "print(subprocess.run([sys.executable, '-m', 'pip', '--version'], capture_output=True, text=True).returncode)")
    async with Session(make_config(), ScriptedModel([]), cwd=project) as s:
        got = outcomes((await run(s, code)).stdout)
        ok = await run(s, work)
        shell = await run(s, "%%bash\nsleep 0.1 & wait; echo shell $((6 * 7))")
    assert got == {"ptrace": "EPERM", "keyctl": "EPERM", "bpf": "EPERM", "unshare": "EPERM", "mount": "EPERM",
                   "clone3": "ENOSYS", "status": "1 2"}, got
    assert ok.stdout == "thread\n[1, 2]\n[3]\n0\n", ok
    assert shell.stdout == "shell 42\n", shell


async def test_mounts_never_go_through_a_process_still_in_the_hosts_namespaces():
    """A launcher whose grandchild is still in the host's namespaces is never taken for the sandboxed
    kernel: the kernel's covers must not be mounted where the host lives."""
    from agent.kernel.sandbox import SandboxError, _sandboxed_child

    launcher = await asyncio.create_subprocess_exec("/bin/sh", "-c", "/bin/sh -c 'sleep 30' & wait",
                                                    start_new_session=True)
    try:
        with pytest.raises(SandboxError, match="did not start within 1s"):
            await _sandboxed_child(launcher.pid, timeout=1.0)
    finally:
        os.killpg(launcher.pid, 9)
        await launcher.wait()
