"""The models an OpenAI-compatible server lists (`GET {base_url}/models`): for `/model` in the app and
`prime-agent doctor`. The session's own requests go through agent/model.py."""

from __future__ import annotations

import httpx2

OPENAI = "https://api.openai.com/v1"
"""Where a model with no base URL is asked (the openai package's default)."""


class ListingError(Exception):
    """No listing: the server could not be reached (`reached` False), or answered without one."""

    def __init__(self, message: str, reached: bool):
        super().__init__(message)
        self.reached = reached


async def listed_models(base_url: str | None, api_key: str | None, timeout: float = 10.0) -> list[str]:
    """The ids of the models the server lists, sorted."""
    url = (base_url or OPENAI).rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx2.AsyncClient(timeout=timeout) as http:
            r = await http.get(url, headers=headers)
    except httpx2.HTTPError as e:
        raise ListingError(f"{url}: {type(e).__name__}: {e}", reached=False) from None
    if r.status_code != 200:
        raise ListingError(f"{url}: HTTP {r.status_code}", reached=True)
    try:
        entries = r.json().get("data")
        return sorted(e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str))
    except (ValueError, AttributeError, TypeError) as e:
        raise ListingError(f"{url}: not a listing ({type(e).__name__}: {e})", reached=True) from None
