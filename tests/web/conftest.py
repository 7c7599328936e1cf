"""The web page's tests: one real daemon for all of them (per xdist worker), started by the real
`prime-agent web` in a home of its own with the fake OpenAI server as its model, and one headless
Chromium (Debian's `chromium` and `chromium-driver`, which scripts/setup.sh installs) driven by selenium."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.testing.openai_server import OpenAIServer, Reply

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
XSS = ('<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> '
       '[click me](javascript:window.__pwned=3) <a href="javascript:window.__pwned=4">link</a>')
"""What a hostile model or cell writes, hoping the page runs it."""


PLAN = {
    "summary": "remember how this project runs its tests", "rationale": "the user asked for it",
    "expected_outcome": "tests run right the first time",
    "edits": [{"action": "create", "kind": "memory", "id": "test-command", "title": "How to run the tests",
               "content": "Run the tests with `python -m pytest -q`.", "scope": "session", "reason": "asked"}],
}
"""What the refiner's planner proposes."""


@dataclass
class Model:
    """The fake model's script: `run: CODE` runs CODE in a cell and answers with its output (steered:
    with the steering message); `xss`
    answers with XSS; `stream` answers in two halves, the second once `go` is set; anything else is
    echoed; the refiner's planner gets PLAN."""

    go: threading.Event = field(default_factory=threading.Event)

    def __call__(self, request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        if messages[0]["content"].startswith("You refine the harness"):
            return Reply(content=json.dumps(PLAN))
        prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user").rsplit("\n\n", 1)[-1]
        if messages[-1]["content"].startswith("[Message from the user while you work]"):
            return Reply(content=f"steered: {messages[-1]['content'].split(chr(10), 1)[1]}")
        if messages[-1]["role"] == "tool":
            out = messages[-1]["content"]
            first = out.splitlines()[0] if out else ""
            return Reply(content=f"The cell said: {out}\n\n| cell | said |\n| --- | --- |\n| 1 | {first} |")
        if m := re.match(r"run: (.*)", prompt, re.DOTALL):
            return Reply(code=[m.group(1)])
        if prompt == "xss":
            return Reply(content=f"Here: {XSS}")
        if prompt == "stream":
            return Reply(content="The answer streams: then the second half.", pause=self.go)  # paused after "streams:"
        return Reply(content=f"echo: {prompt}")


@dataclass
class Web:
    """`prime-agent web` running: its login URL, the home it serves and the project it was started in."""

    url: str
    home: Path
    project: Path
    model: Model
    process: subprocess.Popen

    @property
    def base(self) -> str:
        return self.url.split("/?")[0]

    @property
    def bearer(self) -> str:
        return (self.home / "run" / "token").read_text().strip()


@pytest.fixture(scope="session")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    root = tmp_path_factory.mktemp("web")
    home, project = root / "home", root / "project"
    home.mkdir()
    project.mkdir()
    model = Model()
    with OpenAIServer(model) as server:
        (home / "config.toml").write_text(f'[model]\nname = "fake"\nbase_url = "{server.base_url}"\n'
                                          '[daemon]\npool_size = 1\n[kernel]\ninterrupt_grace = 1.0\n'
                                          '[refine]\nmode = "review"\nauto_every = 0\n')
        env = {**os.environ, "PRIME_AGENT_HOME": str(home)}
        for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "PRIME_AGENT_MODEL"):
            env.pop(var, None)
        process = subprocess.Popen([sys.executable, "-m", "cli", "web", "--no-browser", "--port", "0"], cwd=project,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = process.stdout.readline()
            assert line.startswith("http://127.0.0.1:"), line + process.stderr.read()
            yield Web(line.strip(), home, project, model, process)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(30)
            subprocess.run([sys.executable, "-m", "cli", "daemon", "stop"], env=env, capture_output=True, timeout=90)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("no chromium/chromedriver: run scripts/setup.sh test (it installs Debian's chromium and "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1100,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(condition, timeout: float = 60.0, what: str = "the page"):
    """`condition()`'s first truthy value, polled; a timeout fails the test naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def shoot(driver, name: str, width: int = 1100, height: int = 900) -> None:
    """With WEB_SCREENSHOTS=FOLDER, a screenshot of the view as FOLDER/NAME.png (docs/web.md's figures)."""
    folder = os.environ.get("WEB_SCREENSHOTS")
    if not folder:
        return
    driver.set_window_size(width, height)
    time.sleep(0.3)  # laid out at the new size
    driver.save_screenshot(str(Path(folder) / f"{name}.png"))
    driver.set_window_size(1100, 900)


def console_errors(driver) -> list[str]:
    return [json.dumps(entry) for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
