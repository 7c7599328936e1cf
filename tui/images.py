"""The figures a cell displayed, for a person at a terminal: drawn with the terminal's own graphics
(kitty's protocol, sixel: textual-image) where it has them, else named by a row (`image 640×480`)
from which the system's viewer opens them, or they are saved and the path said. The app (its image
rows) and `attach` share it.

A terminal says what graphics it draws only when asked before Textual takes over its input, so
`terminal_graphics()` is asked once, at start, and its answer handed to the app.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from agent.config import home
from agent.types import Attachment

DRAWN = {"image/png", "image/jpeg", "image/gif", "image/webp"}
"""What is drawn in the terminal (decoded by Pillow); other images (SVG) get their row."""
MAX_PIXELS = 4096 * 4096
"""Past this, a figure gets its row only: a cell's data is not decoded into gigabytes."""
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
              "image/svg+xml": "svg"}


@dataclass
class Figure:
    """One displayed image, decoded from its attachment."""

    mime: str
    data: bytes
    size: tuple[int, int] | None
    """Width and height in pixels, where Pillow could read them."""

    @classmethod
    def of(cls, attachment: Attachment) -> Figure | None:
        """The figure an attachment holds; None for one that is not an image or not base64."""
        if not attachment.mime.startswith("image/"):
            return None
        try:
            data = base64.b64decode(attachment.data, validate=True)
        except (binascii.Error, ValueError):
            return None
        return cls(attachment.mime, data, _size(attachment.mime, data))

    def describe(self) -> str:
        """`image 640×480`, or the type where the size is not known (`image/svg+xml, 2,048 bytes`)."""
        if self.size:
            return f"image {self.size[0]}×{self.size[1]}"
        return f"{self.mime}, {len(self.data):,} bytes"

    def pil(self):
        """The image decoded by Pillow, for textual-image to draw; None for one too large to draw, or
        that does not decode (a header that promised more than the bytes hold)."""
        if self.mime not in DRAWN or self.size is None or self.size[0] * self.size[1] > MAX_PIXELS:
            return None
        from PIL import Image

        try:
            image = Image.open(io.BytesIO(self.data))
            image.load()
        except Exception:  # noqa: BLE001 - the kernel made these bytes: any decoder error (SyntaxError...) is "not drawn"
            return None
        return image

    def save(self, name: str) -> Path:
        """Written to a new file under $PRIME_AGENT_HOME/images (never over one there, never through a
        link); its path."""
        folder = home() / "images"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "image"
        for n in range(1000):
            path = folder / f"{stem}{f'-{n}' if n else ''}.{EXTENSIONS.get(self.mime, 'bin')}"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(self.data)
            return path
        raise FileExistsError(f"no free name for {stem} under {folder}")

    def open(self, name: str) -> str:
        """Saved, then opened with the system's viewer where there is one and a display to show it
        on; what happened, in words. Only an image Pillow read is opened: the kernel wrote these bytes,
        and an SVG (scripts, links) or anything else named an image is saved, not handed to whatever
        the desktop opens it with (a browser)."""
        path = self.save(name)
        viewer = viewer_command()
        if self.size is None:
            return f"saved to {path} (not opened: only PNG, JPEG, GIF and WebP images are)"
        if viewer is None:
            return f"saved to {path} (no image viewer here to open it)"
        opened = subprocess.Popen([*viewer, str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=opened.wait, daemon=True).start()  # reaped when it exits
        return f"opened {path} with {viewer[0]}"


def _size(mime: str, data: bytes) -> tuple[int, int] | None:
    """Width and height from the image's header (nothing decoded)."""
    if mime not in DRAWN:
        return None
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception:  # noqa: BLE001 - UnidentifiedImageError, DecompressionBombError, or any decoder's error
        return None


def viewer_command() -> list[str] | None:
    """The system's way of opening a file in its viewer: `open` on macOS, `xdg-open` where a
    graphical session runs (DISPLAY, WAYLAND_DISPLAY); None over a bare terminal or SSH."""
    if sys.platform == "darwin":
        return ["open"]
    if (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and shutil.which("xdg-open"):
        return ["xdg-open"]
    return None


def terminal_graphics(widget: bool = True) -> type | None:
    """What draws with this terminal's graphics (sixel, kitty's protocol): textual-image's widget
    (for the app), or with `widget=False` its Rich renderable (for `attach`); None where the terminal
    has neither (the figures' rows then) or output is not a terminal. `PRIME_AGENT_IMAGES=off` says
    none without asking. Ask before the app starts: the terminal answers on standard input, which
    Textual reads once it runs."""
    if os.environ.get("PRIME_AGENT_IMAGES") == "off" or not (sys.__stdout__ and sys.__stdout__.isatty()):
        return None
    from textual_image import renderable

    if renderable.Image not in (renderable.SixelImage, renderable.TGPImage):
        return None
    if not widget:
        return renderable.Image
    from textual_image import widget as widgets

    return widgets.Image
