"""``version.<daemon>`` of ``gorge doctor``: a real gorge-taskqueue's
``GET /api/queue/version`` read and held to this gorge's API and to the
Phorge library's; daemons of other releases (another API version, no
version route) stand in as small HTTP servers answering as they would."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hypothesis import given
from hypothesis import strategies as st

from gorge.cli.doctor.site import Daemon
from gorge.cli.doctor.version import (
    check_version,
    compatible,
    expected_api_version,
    parse_version,
)
from gorge.web.version import package_version
from tests.cli.test_queue import TOKEN, queue  # noqa: F401 (the fixture)

TIMEOUT = 10.0


def taskqueue_at(url: str, token: str = TOKEN) -> Daemon:
    return Daemon("taskqueue", {}, url, token)


# -- the rule -----------------------------------------------------------------------

versions = st.tuples(*(st.integers(0, 30),) * 3)


@given(versions, versions)
def test_compatible_is_same_major_and_not_older(have, need):
    text = ".".join(map(str, have))
    required = ".".join(map(str, need))
    assert compatible(text, required) == (have[0] == need[0] and have >= need)


def test_versions_that_are_not_versions():
    assert parse_version("0.1") == (0, 1, 0)
    for bad in (None, 1, "", "v1.0", "1", "1.x", "1.2.3.4"):
        assert parse_version(bad) is None
        assert not compatible(bad, "0.1.0")  # type: ignore[arg-type]


# -- a real daemon --------------------------------------------------------------------


def test_a_daemon_of_this_release_passes_and_says_both_versions(queue):  # noqa: F811
    check = check_version(taskqueue_at(queue), TIMEOUT, "0.1.0")
    ours = expected_api_version("taskqueue")
    assert check.status == "ok", check
    assert check.name == "version.taskqueue"
    assert check.detail == (
        f"gorge-taskqueue {package_version()}, API {ours} "
        f"(this gorge speaks {ours}, the library needs 0.1.0)"
    )


def test_a_library_that_needs_a_later_api_fails(queue):  # noqa: F811
    major = parse_version(expected_api_version("taskqueue"))[0]  # type: ignore[index]
    for needs in (f"{major}.999.0", f"{major + 1}.0.0"):
        check = check_version(taskqueue_at(queue), TIMEOUT, needs)
        assert check.status == "fail", check
        assert f"the Phorge library needs API {needs}" in check.detail
        assert "restart gorge-taskqueue" in check.fix


def test_a_refused_token_fails(queue):  # noqa: F811
    check = check_version(taskqueue_at(queue, token="not-the-token"), TIMEOUT, None)
    assert check.status == "fail"
    assert "refused the service token" in check.detail


# -- daemons of other releases ----------------------------------------------------------


@contextmanager
def daemon_answering(status: int, body: dict) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every GET with ``body``."""
    raw = json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def about(api: str) -> dict:
    return {
        "data": {
            "service": "taskqueue",
            "version": "9.9.9",
            "apiVersion": api,
            "startedAt": 1,
            "uptimeSeconds": 5,
        }
    }


def test_another_major_api_fails():
    ours = parse_version(expected_api_version("taskqueue"))
    assert ours is not None
    with daemon_answering(200, about(f"{ours[0] + 1}.0.0")) as url:
        check = check_version(taskqueue_at(url), TIMEOUT, None)
    assert check.status == "fail", check
    assert "another major version" in check.detail
    assert "gorge-taskqueue 9.9.9" in check.detail


def test_an_older_api_of_the_same_major_warns(monkeypatch):
    # This gorge speaks x.5.0; the daemon an older x.4.0.
    monkeypatch.setattr("gorge.cli.doctor.version.expected_api_version", lambda name: "3.5.0")
    with daemon_answering(200, about("3.4.0")) as url:
        check = check_version(taskqueue_at(url), TIMEOUT, None)
    assert check.status == "warn", check
    assert "older than this gorge's API 3.5.0" in check.detail
    with daemon_answering(200, about("3.6.1")) as url:
        assert check_version(taskqueue_at(url), TIMEOUT, None).status == "ok"


def test_no_version_route_or_no_api_version_fails():
    not_found = {"error": {"code": "ERR_NOT_FOUND", "message": "no such route"}}
    with daemon_answering(404, not_found) as url:
        check = check_version(taskqueue_at(url), TIMEOUT, None)
    assert check.status == "fail"
    assert check.detail == (
        "gorge-taskqueue has no version route (HTTP 404 ERR_NOT_FOUND): "
        "it runs a release older than this gorge"
    )
    with daemon_answering(200, {"data": {"version": "0.0.1"}}) as url:
        check = check_version(taskqueue_at(url), TIMEOUT, None)
    assert check.status == "fail"
    assert "names no API version (None)" in check.detail
