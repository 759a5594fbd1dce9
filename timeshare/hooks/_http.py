"""Call an engine's HTTP API with the standard library only (urllib), so the
ready-made server hooks add no dependency."""

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
    _send(request, timeout)


def get_json(base_url: str, path: str, timeout: float) -> Any:
    url = base_url.rstrip("/") + path
    raw = _send(urllib.request.Request(url, method="GET"), timeout)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        raise EngineError(f"GET {url}: the reply is not JSON") from None


def _send(request: urllib.request.Request, timeout: float) -> bytes:
    where = f"{request.get_method()} {request.full_url}"
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:MAX_BODY_CHARS]
        raise EngineError(f"{where}: HTTP {error.code} {detail}".strip()) from None
    except OSError as error:
        raise EngineError(f"{where}: {error}") from None
