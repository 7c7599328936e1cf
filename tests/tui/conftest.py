"""The app against a real daemon (in the test's event loop) and the fake model server."""

import fcntl
import shutil
from pathlib import Path

import pytest

from tests.daemon.conftest import daemon, model_server, no_daemon_left_behind  # noqa: F401 - fixtures


@pytest.fixture
def fixed_project():
    """The same path every run, so what the screens show (and wrap) is the same every run; one test at a
    time holds it (test_app.py and test_goals.py run on two workers at once: one removed the folder while
    the other's session worked in it)."""
    root = Path("/tmp/prime-agent-snapshot-project")
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(root, ignore_errors=True)
        (root / ".git").mkdir(parents=True)
        yield root
        shutil.rmtree(root, ignore_errors=True)
