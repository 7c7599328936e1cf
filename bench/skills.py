"""Skill import and export benchmark: prints a table and writes bench/results/skills.json.

    .venv/bin/python bench/skills.py [--repeats 5]

A collection shaped like the reference one (anthropics/skills): 17 skills, one with 54 font files
(~100 KB each), one with a PDF showcase, one with a .tar.gz, one with a 74,000-character SKILL.md,
the rest a SKILL.md and a few scripts. Timed: the first import into an empty scope, a re-import
of the unchanged folder, a re-import after one font changed, the prompt view, an export into an
empty folder, and the rollback of the first import.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save  # noqa: E402
from harness_store.skills import export_skills, import_skills, skill_folders  # noqa: E402
from harness_store.entries import size_text  # noqa: E402
from harness_store.store import HarnessStore  # noqa: E402
from harness_store.view import HarnessView  # noqa: E402


def collection(root: Path) -> tuple[int, int]:
    """Write the collection; return its file count and size in bytes."""
    rng = random.Random(0)

    def skill(name: str, body: str = "Use the scripts.\n", files: dict[str, bytes] | None = None) -> None:
        (root / name).mkdir(parents=True)
        (root / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: What {name} does, and when to "
                                              f"use it.\nlicense: Complete terms in LICENSE.txt\n---\n# {name}\n{body}")
        for rel, data in (files or {}).items():
            (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / name / rel).write_bytes(data)

    scripts = {"scripts/run.py": b"print('ok')\n" * 40, "LICENSE.txt": b"Licensed.\n" * 100}
    skill("canvas-design", files={**scripts, **{f"canvas-fonts/Font{i:02d}-Regular.ttf": rng.randbytes(100_000)
                                                for i in range(54)}})
    skill("theme-factory", files={**scripts, "theme-showcase.pdf": rng.randbytes(1_000_000)})
    skill("web-artifacts-builder", files={**scripts, "scripts/shadcn-components.tar.gz": rng.randbytes(200_000)})
    skill("claude-api", body="## Endpoint\nCall it.\n" * 3_360)
    for i in range(13):
        skill(f"skill-{i:02d}", files=scripts)
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(repeats: int) -> tuple[dict[str, float], tuple[int, int]]:
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "skills"
            shape = collection(src)
            folders = skill_folders(src)
            store = HarnessStore(Path(tmp) / "harness", "user")
            first: list = []
            steps = {
                "import": lambda: first.append(import_skills(store, folders, summary="import")),
                "reimport_unchanged": lambda: import_skills(store, folders, summary="again"),
                "reimport_one_font": lambda: ((src / "canvas-design/canvas-fonts/Font00-Regular.ttf").write_bytes(
                    b"changed"), import_skills(store, folders, summary="one font")),
                "view_cold": lambda: HarnessView([HarnessStore(store.root, "user")]).render(),
                "export": lambda: export_skills([(e, store.skill_files(e.id)) for e in store.entries()],
                                                Path(tmp) / "out"),
                "rollback_import": lambda: store.rollback(first[0].change.refinement_id),
            }
            for name, step in steps.items():
                if name == "rollback_import":  # the later re-import touched canvas-design: undo it first
                    store.rollback(store.log(1)[0].refinement_id)
                runs.setdefault(name, []).append(timed(step))
    return {k: statistics.median(v) * 1e3 for k, v in runs.items()}, shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "skills.json"))
    args = ap.parse_args()
    load = load_average()
    results, (count, size) = measure(args.repeats)
    print(f"17 skills, {count} files, {size_text(size)}; median of {args.repeats} (ms)")
    for name, ms in results.items():
        print(f"{name:>20} {ms:>9.1f}")
    save(args.out, {"results_ms": results, "files": count, "bytes": size, "repeats": args.repeats}, load)


if __name__ == "__main__":
    main()
