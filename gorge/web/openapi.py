"""Serving a service's OpenAPI document."""

from __future__ import annotations

import importlib.resources
import json
from typing import Any


class OpenApiDocument:
    """A package's ``openapi.json``, read and checked once when the API is built.

    Served as it is stored (it is the document, not wrapped in ``{data}``), so
    a client gets exactly what the repository holds.
    """

    def __init__(self, package: str, name: str = "openapi.json") -> None:
        raw = importlib.resources.files(package).joinpath(name).read_bytes()
        # A broken file stops start-up rather than every client's first call.
        document = json.loads(raw)
        if not isinstance(document, dict) or "openapi" not in document:
            raise ValueError(f"{package}/{name} is not an OpenAPI document")
        self.raw = raw

    def render(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"content-length", str(len(self.raw)).encode("ascii"))
        return self.raw
