"""`python -m daemon [--tcp HOST:PORT]`: the daemon in the foreground (what `prime-agent daemon start` spawns)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from daemon.server import AlreadyRunning, serve


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m daemon")
    p.add_argument("--tcp", metavar="HOST:PORT", help="also listen on TCP (bearer token required)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("httpx", "httpx2", "openai"):  # a line per model request would bury what the daemon says
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        asyncio.run(serve(args.tcp))
    except AlreadyRunning as e:
        print(f"prime-agent daemon: {e}", file=sys.stderr)
        return 0
    except ValueError as e:
        print(f"prime-agent daemon: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
