"""Skill folders shaped like the published ones (the reference collection, anthropics/skills), built
in the test: binary assets, a long SKILL.md, a nested scripts/ package, and the unsafe cases."""

from __future__ import annotations

import hashlib
import io
import os
import random
import tarfile
from pathlib import Path

LONG_DESCRIPTION = ("Build against the Example API with the official SDKs, streaming, tool use, batches, files "
                    "and prompt caching, with the limits and error codes of each endpoint spelled out. " * 8)[:1099] + "."
LONG_SKILL_CHARS = 75_000


def font() -> bytes:
    """A TrueType-like file: the sfnt header, a table directory and glyph bytes, NULs and all."""
    rng = random.Random(25)
    return b"\x00\x01\x00\x00\x00\x0c\x00\x80\x00\x03\x00\x40" + b"glyfhead" + rng.randbytes(96_000)


def pdf() -> bytes:
    """A PDF whose first 8,000 bytes look like text to git (no NUL): only .gitattributes makes it binary."""
    rng = random.Random(26)
    text = b"".join(b"%d 0 obj\r\n<< /Type /Page /Contents %d 0 R >>\r\nendobj\r\n" % (i, i + 1) for i in range(300))
    stream = bytes(b for b in rng.randbytes(12_000) if b)  # high bytes and CRLFs, never a NUL
    return b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" + text + b"stream\r\n" + stream + b"\r\nendstream\r\n%%EOF\n"


def tar_gz() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in [("components/button.tsx", b"export const Button = () => null;\n"),
                           ("components/card.tsx", b"export const Card = () => null;\n")]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


MEASURE = '''"""Digest of the skill's own font, found from this file's place in the skill folder."""
import hashlib
import pathlib

FONT = pathlib.Path(__file__).resolve().parents[2] / "canvas-fonts" / "Arsenal-Regular.ttf"


def font_digest() -> str:
    return hashlib.sha256(FONT.read_bytes()).hexdigest()


if __name__ == "__main__":
    print(font_digest())
'''


def long_skill_md() -> str:
    head = f"---\nname: long-api\ndescription: {LONG_DESCRIPTION}\nlicense: MIT\nmetadata:\n  version: '1.2'\n---\n"
    body, i = "# Long API\n\nEverything about the API, in one file.\n", 0
    while len(head) + len(body) < LONG_SKILL_CHARS:
        body += f"\n## Endpoint {i}\n\nCall it with `client.endpoint_{i}(...)`; it returns a page of results.\n"
        i += 1
    return head + body[: LONG_SKILL_CHARS - len(head) - 1] + "\n"


def publish(root: Path, *, cap: int) -> Path:
    """A folder of skills: two valid ones, and one refused for each reason (`cap`: the per-file cap)."""
    kit = root / "canvas-kit"
    files = {
        "SKILL.md": b"---\nname: canvas-kit\ndescription: Make posters with the bundled fonts and templates\n"
                    b"license: Complete terms in LICENSE.txt\n---\n# Canvas kit\n\nRender with "
                    b"`scripts/render/measure.py`; the fonts are in `canvas-fonts/`.\n",
        "LICENSE.txt": b"Licensed to you.\r\nWindows line endings stay as they are.\r\n",
        "canvas-fonts/Arsenal-Regular.ttf": font(),
        "canvas-fonts/Arsenal-Bold.ttf": font()[::-1],
        "showcase.pdf": pdf(),
        "scripts/components.tar.gz": tar_gz(),
        "scripts/__init__.py": b"",
        "scripts/render/__init__.py": b"from scripts.render.measure import font_digest\n",
        "scripts/render/measure.py": MEASURE.encode(),
        "scripts/build.sh": b"#!/bin/sh\necho built\n",
        "canvas_kit/__init__.py": b"import hashlib, pathlib\n\n"
                                  b"FONTS = pathlib.Path(__file__).resolve().parent.parent / 'canvas-fonts'\n\n\n"
                                  b"def font_digest():\n"
                                  b"    data = (FONTS / 'Arsenal-Regular.ttf').read_bytes()\n"
                                  b"    return hashlib.sha256(data).hexdigest()\n",
    }
    for rel, data in files.items():
        (kit / rel).parent.mkdir(parents=True, exist_ok=True)
        (kit / rel).write_bytes(data)
    (kit / "scripts/build.sh").chmod(0o755)
    (kit / "scripts/__pycache__").mkdir()
    (kit / "scripts/__pycache__/junk.cpython-313.pyc").write_bytes(b"\x00cache")  # left out: not part of the skill

    (root / "long-api").mkdir()
    (root / "long-api/SKILL.md").write_text(long_skill_md())

    (root / "outside.txt").write_text("a secret outside every skill\n")
    (root / "linked").mkdir()
    (root / "linked/SKILL.md").write_text("---\nname: linked\ndescription: Links out\n---\nbody\n")
    (root / "linked/notes.md").symlink_to(root / "outside.txt")

    (root / "huge").mkdir()
    (root / "huge/SKILL.md").write_text("---\nname: huge\ndescription: Ships a big file\n---\nbody\n")
    with open(root / "huge/data.bin", "wb") as f:
        f.truncate(cap + 1)

    (root / "piped").mkdir()
    (root / "piped/SKILL.md").write_text("---\nname: piped\ndescription: Holds a FIFO\n---\nbody\n")
    os.mkfifo(root / "piped/feed")
    return root


def digests(folder: Path) -> dict[str, tuple[str, bool]]:
    """Every regular file under `folder` (caches aside): its sha256 and whether it is executable."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
            out[path.relative_to(folder).as_posix()] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                        bool(path.stat().st_mode & 0o100))
    return out
