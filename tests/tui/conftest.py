"""The app against a real daemon (in the test's event loop) and the fake model server."""

from tests.daemon.conftest import daemon, model_server, no_daemon_left_behind  # noqa: F401 - fixtures
