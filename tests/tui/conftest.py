"""The app against a real daemon (in the test's event loop) and the fake model server."""

import shutil
from pathlib import Path

import pytest

from tests.daemon.conftest import daemon, model_server, no_daemon_left_behind  # noqa: F401 - fixtures


@pytest.fixture
def fixed_project():
    """The same path every run, so what the screens show (and wrap) is the same every run."""
    root = Path("/tmp/prime-agent-snapshot-project")
    shutil.rmtree(root, ignore_errors=True)
    (root / ".git").mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)
