"""Every test gets its own $PRIME_AGENT_HOME and no model settings from the environment; `smollm2` is the
real SmolLM2-135M-Instruct, pulled once per test run."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

# torch in every worker and in what the tests start (rl serve, torchrun): one thread. Three workers on
# two cores, each with two threads spinning for the others, took twice the CPU time for an RL run.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from agent.config import ENV_VARS, home
from agent.config_models import Config
from agent.kernel.homes import forget_home
from agent.trust import TrustStore


def needs(package: str, module: str) -> pytest.MarkDecorator:
    """Skip a file's tests where `package` of the test extra is not installed: its `module` is looked up, not
    imported (pytest.importorskip imported verifiers or reasoning-gym into every xdist worker's collection)."""
    return pytest.mark.skipif(find_spec(module) is None,
                              reason=f"{package} is in the test extra: bash scripts/setup.sh test")


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture(autouse=True)
def prime_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Path]:
    home = tmp_path / "home"
    monkeypatch.setenv("PRIME_AGENT_HOME", str(home))
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    yield home
    if not request.node.stash.get(FAILED, False):  # a failed test's home is kept to read (and stays registered)
        # Removed, as a person removes a home: every kernel started later covers each registered home
        # (a registry that only grows makes every start slower), and one no longer registered must be gone.
        shutil.rmtree(home, ignore_errors=True)
        forget_home(home)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Hugging Face directory of the real SmolLM2-135M-Instruct, pulled once per test run (~20 s) as
    `prime-agent models pull` does, into a home of its own: `smollm2.parents[1]` is that $PRIME_AGENT_HOME.
    Read it, never write it: every test that asks shares it, in every xdist worker (the pull's own lock
    lets the first worker convert it while the others wait)."""
    from rl.pull import pull

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is under the run's own
        root = root.parent
    with pytest.MonkeyPatch.context() as mp:  # this call only: each test still gets its own home (prime_home)
        mp.setenv("PRIME_AGENT_HOME", str(root / "models-home"))
        return pull("smollm2-135m-instruct")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project directory (a git root) for a session to work in."""
    root = tmp_path / "project"
    root.mkdir()
    (root / ".git").mkdir()
    return root


def make_config(**sections: dict) -> Config:
    """A Config with quick kernel timeouts for tests; `sections` override by component."""
    data: dict = {"kernel": {"interrupt_grace": 1.0}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.model_validate(data)


def trust(root: Path, *paths: str) -> None:
    """Trust the project's files as they are now, as a person does with `prime-agent trust`."""
    store = TrustStore(home())
    for path in paths:
        file = store.check(root, path)
        assert file is not None and file.content is not None, f"{path}: nothing to trust"
        store.trust(root, file)


SIGINT_IGNORED = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "os.execv(sys.argv[1], sys.argv[1:])"]
"""A prefix that runs a command with SIGINT ignored, as a script's background job (`cmd &`) is, and so every
process it starts: its Ctrl-C must work all the same."""


LONGEST = ["tests/e2e/test_smollm2.py", "tests/rl/test_vllm.py", "tests/daemon/test_fuzz.py", "tests/rl/test_dist_hf.py",
           "tests/e2e/test_demo.py", "tests/e2e/test_sessions_cleanup.py", "tests/e2e/test_sessions.py",
           "tests/rl/test_train.py", "tests/e2e/test_trust.py", "tests/rl/test_dist.py",
           "tests/rl/test_every_token_trains.py", "tests/daemon/test_recovery.py", "tests/prime_agent_py/test_harness.py",
           "tests/test_types.py", "tests/e2e/test_harness_cli.py", "tests/rl/test_pull.py", "tests/e2e/test_run.py",
           "tests/cli/test_acp.py", "tests/rl/test_train_hf.py", "tests/evals/test_cluster.py",
           "tests/rl/test_structured.py"]
"""The files that take longest (a minute or more each in a full run, measured 2026-12-04), longest first: the
README's command hands whole files to three workers in this order (pyproject's addopts turns off xdist's own
reordering, which puts the files with the most tests first and left the one-test demo to start last), so the
longest start at once and the rest fill in around them. The third is one without SmolLM2: the first two wait for
its pull (~30 s on one core), and a third waiting too left the other core idle meanwhile."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONGEST)))
