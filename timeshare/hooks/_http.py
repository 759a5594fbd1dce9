"""POST to an engine's HTTP API with the standard library only (urllib),
so the ready-made server hooks add no dependency."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode

# How much of an engine's error body a failed hook reports.
MAX_BODY_CHARS = 300


class EngineError(RuntimeError):
    """The engine refused or could not be reached; the message says which."""


def post(
    base_url: str,
    path: str,
    timeout: float,
    query: list[tuple[str, str]] | None = None,
    body: dict[str, Any] | None = None,
) -> None:
    url = base_url.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method="POST")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:MAX_BODY_CHARS]
        raise EngineError(f"POST {url}: HTTP {error.code} {detail}".strip()) from None
    except OSError as error:
        raise EngineError(f"POST {url}: {error}") from None
