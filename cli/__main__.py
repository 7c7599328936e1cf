"""`python -m cli ...`: the same as `prime-agent ...` (what daemon.client.spawn runs)."""

import sys

from cli.main import main

sys.exit(main())
