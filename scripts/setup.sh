#!/usr/bin/env bash
# Set up .venv with prime-agent installed (editable); `setup.sh test` adds the test tools (Ray among them),
# `setup.sh cluster` Ray alone (rollouts on a Ray cluster: docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# The kernels' sandbox: bubblewrap (and util-linux's nsenter, mount and prlimit, already on Debian).
if ! command -v bwrap > /dev/null && command -v apt-get > /dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get install -y -qq bubblewrap > /dev/null 2>&1 || { $sudo apt-get update -qq && $sudo apt-get install -y -qq bubblewrap; }
fi
# The web page's tests (tests/web) drive Debian's headless chromium through its chromium-driver.
if [ "${1:-}" = "test" ] && ! { command -v chromium && command -v chromedriver; } > /dev/null && command -v apt-get > /dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get install -y -qq chromium chromium-driver > /dev/null 2>&1 || { $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium chromium-driver; }
fi
command -v bwrap > /dev/null || echo "setup: bubblewrap is not installed: kernels will run unsandboxed (see docs/sandbox.md)" >&2
[ -x .venv/bin/python ] || python3 -m venv .venv
extra=""
case "${1:-}" in test|cluster) extra="[$1]" ;; esac
if ! .venv/bin/pip install --quiet --disable-pip-version-check -e ".${extra}" > .venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    exit 1
fi
# The tests' third-party MCP servers, pinned, beside the venv's own packages: from npm (node 20), and
# mcp-server-time from PyPI in a venv of its own (it asks mcp>=2.3; the project pins verifiers' mcp 2.0.0).
if [ "${1:-}" = "test" ]; then
    time_venv=.venv/mcp-servers/time
    .venv/bin/pip uninstall --quiet --yes mcp-server-time > /dev/null 2>&1 || true  # an older setup's, beside the project
    [ -x "$time_venv/bin/mcp-server-time" ] || {
        python3 -m venv "$time_venv" &&
        "$time_venv/bin/pip" install --quiet --disable-pip-version-check mcp-server-time==2026.10.19 > .venv/pip-time.log 2>&1
    } || { cat .venv/pip-time.log >&2; exit 1; }
    npm install --prefix .venv/mcp-servers --no-audit --no-fund --loglevel=error \
        @modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-filesystem@2026.8.31 \
        > .venv/npm.log 2>&1 || { cat .venv/npm.log >&2; exit 1; }
fi
# PYTHONDONTWRITEBYTECODE may be set: compile our own packages once so starts stay fast.
.venv/bin/python -m compileall -q agent tui cli harness_store daemon evals rl prime_agent_py
# The command is in .venv/bin; nothing here changes your PATH.
echo "setup: done. prime-agent is .venv/bin/prime-agent: 'source .venv/bin/activate' (or export PATH=\"$PWD/.venv/bin:\$PATH\") puts it on your PATH; 'prime-agent doctor' checks the rest" >&2
