"""What a vision model sees of the images its cells display (`model.vision`, docs/models.md#vision).

- Whether the model sees images: `model.vision`, or with `auto` what its server lists of it
  (OpenRouter's `architecture.input_modalities`) and else whether its name is of a known vision family.
- Each PNG or JPEG a cell displays goes to the model in its next request, in a user message after
  the cell's result (agent/loop.py), downscaled to `model.image_max_edge`; an SVG is named, not
  rasterised. Images are decoded on the host with Pillow, after their header says they are small
  enough to (`MAX_PIXELS`): a cell's bytes are never trusted to be what they claim.
- A request carries the latest `model.max_images` images; each older one is its text stub (`bounded`),
  so that a session of plots cannot outgrow the context.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import Any

from agent.types import Attachment, Image, Message

KNOWN = re.compile(
    r"gpt-4o|gpt-4\.1|gpt-4-turbo|gpt-5|(^|/)(o1|o3)(?!-mini)|(^|/)o4-mini|claude-(?!2|instant)|gemini|gemma-?3|"
    r"qwen[0-9.]*-?vl|qvq|llava|pixtral|llama-?4|internvl|minicpm-v|glm-[0-9.]+v|kimi-vl|grok-(2-vision|4)|smolvlm|"
    r"vision|[-_]vl\b",
    re.IGNORECASE)
"""Model names of families that take images in (`model.vision = "auto"` where the server says nothing)."""
MAX_PIXELS = 40_000_000
"""Pixels an image may have to be decoded on the host (a PNG of a few KB can claim billions): past it
the model is told the image was too large."""


def known_vision(name: str | None) -> bool:
    """Whether `name` is of a model family known to see images."""
    return bool(name and KNOWN.search(name))


def listed_vision(entry: dict[str, Any]) -> bool | None:
    """What a server's model listing says of images in: OpenRouter's `architecture.input_modalities`
    (or `input_modalities` at the top); None where it says nothing."""
    arch = entry.get("architecture")
    modalities = (arch.get("input_modalities") if isinstance(arch, dict) else None) or entry.get("input_modalities")
    return "image" in modalities if isinstance(modalities, list) else None


def prepare(attachments: list[Attachment], cell_id: str, max_edge: int) -> tuple[list[Image], list[str]]:
    """The images of a cell's displays as the model is sent them, and a line for each it is not
    (an SVG, an image that cannot be read, one too large to decode)."""
    images: list[Image] = []
    notes: list[str] = []
    for a in attachments:
        if not a.mime.startswith("image/"):
            continue
        try:
            images.append(_image(a, f"cell {cell_id}", max_edge))
        except _NotShown as e:
            notes.append(f"[{a.mime} the cell {cell_id} displayed is not shown to you: {e}]")
    return images, notes


class _NotShown(Exception):
    pass


def _image(a: Attachment, where: str, max_edge: int) -> Image:
    if a.mime not in ("image/png", "image/jpeg"):
        raise _NotShown("SVG is not rasterised" if a.mime == "image/svg+xml" else "only PNG and JPEG are sent")
    from PIL import Image as Pillow  # noqa: N814 (imported where used: ~0.1 s)
    from PIL import UnidentifiedImageError

    try:
        raw = base64.b64decode(a.data, validate=True)
        with Pillow.open(io.BytesIO(raw), formats=["PNG" if a.mime == "image/png" else "JPEG"]) as img:
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise _NotShown(f"{width}×{height} pixels is more than {MAX_PIXELS:,}")
            if max(width, height) > max_edge:
                img.thumbnail((max_edge, max_edge))
                out = io.BytesIO()
                if a.mime == "image/png":
                    img.save(out, "PNG")
                else:
                    img.convert("RGB").save(out, "JPEG", quality=85)
                raw, (width, height) = out.getvalue(), img.size
    except (binascii.Error, ValueError, OSError, UnidentifiedImageError, Pillow.DecompressionBombError) as e:
        raise _NotShown(f"it could not be read as {a.mime} ({type(e).__name__})") from None
    label = f"{a.mime} {width}×{height} from {where}"
    return Image(mime=a.mime, data=base64.b64encode(raw).decode(), label=label)  # type: ignore[arg-type]


def caption(images: list[Image], notes: list[str]) -> str:
    """The text of the user message that shows a step's images, after its cells' results."""
    return "\n".join([f"[image {n}: {i.label}]" for n, i in enumerate(images, 1)] + notes)


def bounded(messages: list[Message], limit: int) -> list[Message]:
    """`messages` with only the latest `limit` images (0: none), each older one replaced by its stub."""
    total = sum(len(m.images) for m in messages)
    if total <= limit:
        return messages
    drop, out = total - limit, []
    for m in messages:
        if drop and m.images:
            gone, kept = m.images[:drop], m.images[drop:]
            drop -= len(gone)
            m = m.model_copy(update={"images": kept, "content": "\n".join([m.content, *(i.stub for i in gone)])})
        out.append(m)
    return out
