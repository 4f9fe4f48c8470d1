"""A small blocking client of a gorge daemon's HTTP API, for the command line.

The daemons speak to each other through treq on the reactor; a one-shot
command has nothing else to do while it waits, so plain ``urllib`` is the
simpler tool here. Every failure to get the daemon's own answer becomes a
:class:`ServiceUnavailable` whose message is the one line the command
prints; the daemon's own 4xx answers (other than 401) become :class:`Refused`."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT = 30.0


class ServiceUnavailable(Exception):
    """No usable answer: unreachable, token refused, server error, not the daemon."""


@dataclass(frozen=True)
class Refused(Exception):
    """The daemon's own 4xx answer (not 401): ``code`` and ``message`` from the envelope."""

    status: int
    code: str
    message: str

    def __str__(self) -> str:
        return self.message


class ApiClient:
    """Calls under ``prefix`` (``/api/queue/``) of the daemon at ``base_url``.

    ``noun`` names the daemon in messages ("the queue"), ``product`` is what
    it should be when the answer is not ours ("gorge-taskqueue").
    """

    def __init__(
        self,
        base_url: str,
        prefix: str,
        *,
        noun: str,
        product: str,
        token: str = "",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._prefix = "/" + prefix.strip("/") + "/"
        self._noun = noun
        self._product = product
        self._token = token
        self._timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    def get(self, path: str, **query: Any) -> Any:
        params = {k: v for k, v in query.items() if v is not None}
        if params:
            path += "?" + urllib.parse.urlencode(params)
        return self._call("GET", path, None)

    def post(self, path: str, body: dict | None) -> Any:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict | None) -> Any:
        url = self.base_url + self._prefix + path
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["X-Service-Token"] = self._token
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except urllib.error.URLError as e:
            raise ServiceUnavailable(
                f"cannot reach {self._noun} at {self.base_url}: {_reason(e.reason)}"
            ) from None
        except TimeoutError:
            raise ServiceUnavailable(
                f"{self._noun} at {self.base_url} did not answer within {self._timeout:g}s"
            ) from None
        except (OSError, ValueError) as e:
            raise ServiceUnavailable(f"cannot reach {self._noun} at {self.base_url}: {e}") from None
        return self._answer(status, raw)

    def _answer(self, status: int, raw: bytes) -> Any:
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or ("data" not in doc and "error" not in doc):
            raise ServiceUnavailable(
                f"{self.base_url} answered HTTP {status} without {self._noun}'s JSON envelope; "
                f"is it a {self._product}?"
            )
        error = doc.get("error")
        if error is None and 200 <= status < 300:
            return doc.get("data")
        error = error if isinstance(error, dict) else {}
        code, message = str(error.get("code", "")), str(error.get("message", ""))
        if status == 401:
            raise ServiceUnavailable(
                f"{self._noun} refused the service token (set GORGE_SERVICE_TOKEN or --token)"
            )
        if 400 <= status < 500:
            raise Refused(status, code, message)
        raise ServiceUnavailable(f"{self._noun} answered HTTP {status} {code}: {message}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is not the daemon's answer; following it would turn a POST into a GET."""

    def redirect_request(self, *args, **kwargs):
        return None


def _reason(reason: Any) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    return str(reason)
