"""Every producer and consumer of events agrees with agent/events.py on every field: a static check
(mypy, tests/mypy.ini) of each product module that builds or reads events, for the errors a
misnamed field makes (a keyword an event does not take, an attribute it does not have)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "daemon", "evals", "rl", "tui", "cli", "examples", "bench")
FIELD_ERRORS = ("call-arg", "attr-defined", "union-attr")
"""What a producer or consumer that disagrees with an event's fields gets."""


def event_modules() -> list[str]:
    """Every file that imports agent.events or the daemon's client (which returns events and the API's
    replies), so a new consumer is checked without being listed."""
    uses = re.compile(r"^\s*(from agent\.events import|from agent import events|from daemon\.client import)", re.M)
    return sorted(str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                  if uses.search(p.read_text()))


def field_errors(files: list[str], cache: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "tests" / "mypy.ini"),
                          "--cache-dir", str(cache), *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stdout + out.stderr  # 2: mypy itself failed
    return [line for line in out.stdout.splitlines() if any(f"[{code}]" in line for code in FIELD_ERRORS)]


def test_producers_and_consumers_agree_with_the_event_types(tmp_path: Path):
    files = event_modules()
    assert {"agent/loop.py", "daemon/managed.py", "tui/widgets/conversation.py", "cli/show.py",
            "examples/closed_loop/run.py"} <= set(files)
    assert field_errors(files, tmp_path / "cache") == []


def test_a_field_named_wrong_on_either_side_is_an_error(tmp_path: Path):
    """The check is only as good as what it catches: one producer and one consumer that disagree."""
    wrong = ROOT / "tests" / f"_wrong_fields_{tmp_path.name}.py"  # inside the tree: mypy.ini's paths apply
    wrong.write_text(
        "from agent import events as ev\n\n"
        "def produce() -> ev.Event:\n"
        "    return ev.CellStarted(cell_id='c1', source='print(1)')\n\n"
        "def consume(e: ev.Event) -> str:\n"
        "    if isinstance(e, ev.TurnFinished):\n"
        "        return e.result\n"
        "    return e.answer\n"
    )
    try:
        errors = field_errors([str(wrong.relative_to(ROOT))], tmp_path / "cache")
    finally:
        wrong.unlink()
    said = "\n".join(errors)
    assert 'Unexpected keyword argument "source" for "CellStarted"' in said
    assert '"TurnFinished" has no attribute "result"' in said
    assert 'has no attribute "answer"' in said  # read from an event not narrowed to one that has it
