"""What a vision model sees of its cells' images (agent/vision.py), and tables read as Markdown
(agent/kernel/tables.py): real kernels, real matplotlib, the requests checked on the wire of each API's
scripted server, which refuses malformed image parts as the services do."""

from __future__ import annotations

import base64
import io
import json
import struct
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest
from PIL import Image as Pillow

from agent.config import load_config, parse_override
from agent.config_models import ModelConfig
from agent.kernel.tables import as_markdown
from agent.model import OpenAIModel, ServerModel, fitted
from agent.session import Session
from agent.testing import anthropic_server as ant
from agent.testing import responses_server as resp
from agent.testing.openai_server import OpenAIServer, Reply
from agent.types import Attachment, Image, Message
from agent.vision import bounded, prepare
from tests.agent.test_providers import anthropic, responses

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"


def png(width: int, height: int) -> str:
    out = io.BytesIO()
    Pillow.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def shown(n: int) -> Message:
    return Message(role="user", content=f"[image {n}]", images=[Image(mime="image/png", data=png(4, 4), label=f"plot {n}")])


@pytest.mark.parametrize("setting", ["true", "false"])
async def test_a_plot_reaches_a_vision_model_as_a_png_data_url_and_no_other(project: Path, setting: str):
    """The acceptance: `--set model.vision=true` (or `-c`), a cell that shows a matplotlib figure, and the
    next request carries it as an image_url data URL after the tool result; with `false`, none."""
    with OpenAIServer([Reply(code=[PLOT]), Reply(content="a line that rises, then falls")]) as server:
        config = load_config(project, parse_override(f"model.vision={setting}"))
        config.model = ModelConfig(name="scripted", base_url=server.base_url, vision=config.model.vision, timeout=10)
        async with Session(config, OpenAIModel(config.model), cwd=project) as s:
            r = await s.prompt("plot it and tell me what you see")
    assert r.answer == "a line that rises, then falls"
    result = s.messages[3]
    assert result.role == "tool" and "[display: image/png" in result.content
    assert "MPLCONFIGDIR" not in result.content and "cache directory" not in result.content  # a writable config dir
    after = server.requests[1]["messages"][4:]
    parts = [p for m in server.requests[1]["messages"] if isinstance(m["content"], list) for p in m["content"]]
    if setting == "false":
        assert parts == [] and after == []
        return
    (message,) = after
    assert message["role"] == "user" and message["content"][0]["text"].startswith("[image 1: image/png ")
    url = message["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    with Pillow.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as img:
        assert img.format == "PNG" and max(img.size) <= 1024


async def test_the_anthropic_and_responses_forms_of_an_image_pass_their_servers():
    messages = [Message(role="system", content="sys"), Message(role="user", content="plot"), shown(1)]
    with ant.AnthropicServer([ant.Reply(text="seen")]) as server:
        assert (await anthropic(server, vision=True).complete(messages)).message.content == "seen"
    block = server.requests[0]["messages"][0]["content"][-1]
    assert block["type"] == "image" and block["source"]["media_type"] == "image/png"
    with resp.ResponsesServer([resp.Reply(text="seen")]) as server:
        assert (await responses(server, vision=True).complete(messages)).message.content == "seen"
    part = server.requests[0]["input"][-1]["content"][-1]
    assert part["type"] == "input_image" and part["image_url"].startswith("data:image/png;base64,")


def post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_each_scripted_server_refuses_a_malformed_image_as_its_service_does():
    jpeg_named_png = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 20).decode()
    with OpenAIServer([]) as server:
        for content, said in [([{"type": "image_url", "image_url": {"url": "http-ish:nothing"}}], "data URL"),
                              ([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{jpeg_named_png}"}}],
                               "appears to be image/jpeg")]:
            status, text = post(server.base_url + "/chat/completions",
                                {"model": "m", "messages": [{"role": "user", "content": content}]}, {})
            assert status == 400 and said in text
        tool = {"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
        status, text = post(server.base_url + "/chat/completions", {"model": "m", "messages": [tool]}, {})
        assert status == 400 and "only allowed for messages with role 'user'" in text
    with ant.AnthropicServer([]) as server:
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"}}
        status, text = post(server.base_url + "/v1/messages", {"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": [image]}]}, {"anthropic-version": "2023-06-01"})
        assert status == 400 and "invalid base64" in text
    with resp.ResponsesServer([]) as server:
        status, text = post(server.base_url + "/responses", {"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/gif;base64,R0lG"}]}]}, {})
        assert status == 400 and "image_url" in text


def test_a_request_carries_the_latest_images_and_the_older_as_their_stubs():
    messages = [Message(role="user", content="go"), *(shown(n) for n in range(1, 7))]
    sent = bounded(messages, 4)
    assert [len(m.images) for m in sent] == [0, 0, 0, 1, 1, 1, 1]
    assert sent[1].content == "[image 1]\n[plot 1: no longer shown to you]"
    assert messages[1].images  # the context keeps them: only the request leaves them out
    assert all(not m.images for m in bounded(messages, 0))  # a model that sees none reads every stub
    assert bounded(messages, 6) is messages


def test_images_are_downscaled_and_what_cannot_be_shown_is_said():
    big = Attachment(mime="image/png", data=png(3000, 600))
    small = Attachment(mime="image/png", data=png(40, 30))
    svg = Attachment(mime="image/svg+xml", data=base64.b64encode(b"<svg/>").decode())
    liar = Attachment(mime="image/png", data=base64.b64encode(b"GIF89a" + b"\0" * 30).decode())
    # a PNG of a few bytes whose header claims 8,000 x 8,000 pixels: never decoded on the host
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8000, 8000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    images, notes = prepare([big, small, svg, liar, Attachment(mime="image/png", data=base64.b64encode(bomb).decode())],
                            "c1", 1024)
    assert [i.label for i in images] == ["image/png 1024×205 from cell c1", "image/png 40×30 from cell c1"]
    assert images[1].data == small.data  # small enough: sent as it came
    assert notes[0] == "[image/svg+xml the cell c1 displayed is not shown to you: SVG is not rasterised]"
    assert "could not be read as image/png" in notes[1] and "8000×8000 pixels is more than 40,000,000" in notes[2]


def test_auto_asks_the_server_then_the_model_family():
    listed = ServerModel(vision=True)
    assert fitted(ModelConfig(name="my-finetune"), listed).vision is True
    assert fitted(ModelConfig(name="gpt-4o"), ServerModel(vision=False)).vision == "auto"  # and off: not True
    assert fitted(ModelConfig(name="claude-sonnet-4-5"), ServerModel()).vision is True
    assert fitted(ModelConfig(name="Qwen/Qwen2.5-VL-7B-Instruct"), ServerModel()).vision is True
    assert fitted(ModelConfig(name="HuggingFaceTB/SmolLM2-135M-Instruct"), ServerModel()).vision == "auto"
    assert fitted(ModelConfig(name="gpt-4o", vision=False), listed).vision is False  # the user's setting wins


async def test_a_listing_with_input_modalities_says_whether_the_model_sees_images():
    entries = [{"id": "a", "architecture": {"input_modalities": ["text", "image"]}},
               {"id": "b", "architecture": {"input_modalities": ["text"]}}, {"id": "c"}]
    with OpenAIServer([], models=entries) as server:
        said = [(await OpenAIModel(ModelConfig(name=n, base_url=server.base_url)).describe()).vision for n in "abc"]
    assert said == [True, False, None]


PANDAS_HTML = """<div><style scoped>.dataframe tbody tr th {vertical-align: top;}</style>
<table border="1" class="dataframe"><thead><tr style="text-align: right;"><th></th><th>city</th><th>temp|C</th></tr>
<tr><th>id</th><th></th><th></th></tr></thead>
<tbody><tr><th>0</th><td>Oslo</td><td>-3.5</td></tr><tr><th>1</th><td>Lima &amp; Cusco</td><td>18.0</td></tr>
<tr><th>...</th><td>...</td><td>...</td></tr></tbody></table><p>60 rows × 2 columns</p></div>"""


def test_a_dataframe_html_table_reads_as_a_capped_markdown_table():
    table = as_markdown({"text/plain": "   city ...", "text/html": PANDAS_HTML})
    assert table == ("| id | city | temp\\|C |\n|---|---|---|\n| 0 | Oslo | -3.5 |\n| 1 | Lima & Cusco | 18.0 |\n"
                     "| ... | ... | ... |\n\n60 rows × 2 columns")
    rows = "".join(f"<tr><td>{n}</td><td>{'x' * 50}</td></tr>" for n in range(500))
    cut = as_markdown({"text/html": f"<table><tr><th>n</th><th>text</th></tr>{rows}</table>"}, limit=1000)
    assert cut is not None and len(cut) < 1100 and cut.endswith("more rows not shown") and cut.startswith("| n | text |")
    multi = ("<table><thead><tr><th></th><th></th><th>v</th></tr><tr><th>k</th><th>n</th><th></th></tr></thead><tbody>"
             '<tr><th rowspan="2">x</th><th>1</th><td>1</td></tr><tr><th>2</th><td>2</td></tr></tbody></table>')
    assert as_markdown({"text/html": multi}) == "| k | n | v |\n|---|---|---|\n| x | 1 | 1 |\n| x | 2 | 2 |"  # pandas' MultiIndex
    columns = '<table><tr><th colspan="2">A</th></tr><tr><th>p</th><th>q</th></tr><tr><td>1</td><td>2</td></tr></table>'
    assert as_markdown({"text/html": columns}) == "| A p | A q |\n|---|---|\n| 1 | 2 |"
    assert as_markdown({"text/html": "<b>bold</b>", "text/plain": "bold"}) is None
    assert as_markdown({"text/markdown": "# Title"}) == "# Title"


async def test_tables_and_markdown_a_cell_displays_reach_the_model_as_text_and_the_person_as_markdown(project: Path):
    from agent import events as ev
    from agent.testing.scripted import ScriptedModel, cells
    from tests.conftest import make_config

    code = ("from IPython.display import HTML, Markdown, display\n"
            f"display(Markdown('**bold** words'))\nHTML({PANDAS_HTML!r})")
    events: list[ev.Event] = []
    async with Session(make_config(), ScriptedModel([cells(code), "ok"]), cwd=project, on_event=events.append) as s:
        await s.prompt("show")
    told = s.messages[3].content
    assert told.startswith("**bold** words\n| id | city | temp\\|C |") and "60 rows × 2 columns" in told
    finished = next(e for e in events if isinstance(e, ev.CellFinished))
    assert [a.mime for a in finished.result.attachments] == ["text/markdown", "text/markdown"]
    assert finished.result.result is None
