"""The demo's webhook receiver: verifies every signature, answers per path.

``POST /hooks/<name>`` is checked against that hook's HMAC key exactly as a
real receiver would (lowercase hex HMAC-SHA256 of the raw body in
``X-Phabricator-Webhook-Signature``), then answered with the status the
hook's :class:`ReceiverPath` dictates.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass

from twisted.web.resource import Resource

SIGNATURE_HEADER = b"x-phabricator-webhook-signature"


@dataclass(frozen=True)
class ReceiverPath:
    name: str
    hmac_key: str
    status: int = 200


@dataclass(frozen=True)
class ReceiverEvent:
    path: str
    object_phid: str
    signature_ok: bool
    status: int


def signature_of(key: str, body: bytes) -> str:
    return hmac.new(key.encode("utf-8"), body, hashlib.sha256).hexdigest()


def _object_phid(body: bytes) -> str:
    try:
        document = json.loads(body)
        return str(document["object"]["phid"])
    except (ValueError, KeyError, TypeError):
        return "?"


class _HookPath(Resource):
    isLeaf = True

    def __init__(self, path: ReceiverPath, on_event: Callable[[ReceiverEvent], None]) -> None:
        super().__init__()
        self._path = path
        self._on_event = on_event

    def render_POST(self, request) -> bytes:
        body = request.content.read()
        presented = request.getHeader(SIGNATURE_HEADER) or b""
        expected = signature_of(self._path.hmac_key, body).encode("ascii")
        signature_ok = hmac.compare_digest(presented, expected)
        # A receiver must refuse what it cannot authenticate, whatever the path says.
        status = self._path.status if signature_ok else 401
        self._on_event(ReceiverEvent(self._path.name, _object_phid(body), signature_ok, status))
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"text/plain")
        return b"ok\n" if status < 300 else b"no\n"


def build_receiver(
    paths: list[ReceiverPath], on_event: Callable[[ReceiverEvent], None]
) -> Resource:
    """The root resource: ``/hooks/<name>`` for each path, 404 elsewhere."""
    root = Resource()
    hooks = Resource()
    root.putChild(b"hooks", hooks)
    for path in paths:
        hooks.putChild(path.name.encode("ascii"), _HookPath(path, on_event))
    return root
