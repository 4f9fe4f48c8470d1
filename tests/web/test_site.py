"""gorge.web through the real Site: envelope, auth, probes, routing, 413, request ids."""

import json

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from klein import Klein
from prometheus_client import CollectorRegistry, Counter
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.logger import LogLevel

from gorge.web.envelope import ApiError, add_error_handlers, fail, ok, read_json_object
from gorge.web.site import build_site, stub_client
from tests.support.logcapture import logged_events

LIMIT = 1024
TOKEN = "contract-token"


class ExampleApi:
    app = Klein()

    @app.route("/api/example/echo", methods=["POST"])
    def echo(self, request):
        return ok(request, read_json_object(request))

    @app.route("/api/example/list", methods=["GET"])
    def empty_list(self, request):
        return ok(request, [])

    @app.route("/api/example/missing", methods=["GET"])
    def missing(self, request):
        raise ApiError(404, "ERR_NOT_FOUND", "task not found")

    @app.route("/api/example/crash", methods=["GET"])
    def crash(self, request):
        raise RuntimeError("SELECT * FROM herald 127.0.0.1:3306 connection refused")

    add_error_handlers(app)


class Readiness:
    def __init__(self):
        self.reason = None
        self.hang = False

    async def __call__(self):
        if self.hang:
            await Deferred()  # never fires; the platform bounds it
        return self.reason


def make(token=TOKEN):
    readiness = Readiness()
    registry = CollectorRegistry()
    Counter("example_things", "things seen", registry=registry).inc(3)
    clock = task.Clock()
    site = build_site(
        api_resource=ExampleApi().app.resource(),
        prefix="/api/example/",
        token=token,
        body_limit=LIMIT,
        readiness=readiness,
        registry=registry,
        clock=clock,
    )
    return stub_client(site), readiness, clock


async def call(client, method, path, headers=None, data=None):
    response = await client.request(
        method, "http://127.0.0.1" + path, headers=headers or {}, data=data
    )
    return response, await response.content()


def envelope_of(body):
    decoded = json.loads(body)
    assert isinstance(decoded, dict)
    return decoded


@pytest_twisted.ensureDeferred
async def test_success_envelope_is_compact_and_has_no_error_key():
    client, _, _ = make()
    response, body = await call(
        client,
        "POST",
        "/api/example/echo",
        {"X-Service-Token": TOKEN},
        b'{"a": [1, 2], "u": "\xc3\xa9"}',
    )
    assert response.code == 200
    assert body == '{"data":{"a":[1,2],"u":"é"}}'.encode()
    assert response.headers.getRawHeaders("content-type") == ["application/json"]


@pytest_twisted.ensureDeferred
async def test_empty_list_is_brackets_not_null():
    client, _, _ = make()
    _, body = await call(client, "GET", "/api/example/list", {"X-Service-Token": TOKEN})
    assert body == b'{"data":[]}'


@pytest_twisted.ensureDeferred
async def test_domain_error_keeps_its_message_and_has_no_data_key():
    client, _, _ = make()
    response, body = await call(client, "GET", "/api/example/missing", {"X-Service-Token": TOKEN})
    assert response.code == 404
    assert envelope_of(body) == {"error": {"code": "ERR_NOT_FOUND", "message": "task not found"}}


@pytest.mark.parametrize("body", [b"{not json", b"[1,2]", b'"text"', b""])
@pytest_twisted.ensureDeferred
async def test_bad_json_is_400(body):
    client, _, _ = make()
    response, answer = await call(
        client, "POST", "/api/example/echo", {"X-Service-Token": TOKEN}, body
    )
    assert response.code == 400
    assert envelope_of(answer)["error"]["code"] == "ERR_BAD_REQUEST"
    assert "data" not in envelope_of(answer)


@pytest_twisted.ensureDeferred
async def test_crash_is_opaque_500_and_logged():
    with logged_events() as observer:
        client, _, _ = make()
        response, body = await call(client, "GET", "/api/example/crash", {"X-Service-Token": TOKEN})
    assert response.code == 500
    assert envelope_of(body) == {
        "error": {"code": "ERR_INTERNAL", "message": "internal server error"}
    }
    for leak in (b"3306", b"herald", b"SELECT", b"connection refused", b"127.0.0.1"):
        assert leak not in body
    formats = [e.get("log_format", "") for e in observer]
    assert any(f.startswith("PANIC_RECOVERED") for f in formats)
    assert any(f.startswith("REQUEST_FAILED") for f in formats)


@pytest.mark.parametrize(
    "headers,path,status",
    [
        ({}, "/api/example/list", 401),
        ({"X-Service-Token": "wrong"}, "/api/example/list", 401),
        ({"X-Service-Token": ""}, "/api/example/list", 401),
        ({"X-Service-Token": TOKEN}, "/api/example/list", 200),
        ({}, f"/api/example/list?token={TOKEN}", 200),
        ({"X-Service-Token": "wrong"}, f"/api/example/list?token={TOKEN}", 401),  # header wins
        ({"X-Service-Token": ""}, f"/api/example/list?token={TOKEN}", 200),
        ({}, "/api/example/does-not-exist", 401),  # auth before routing
        ({"X-Service-Token": TOKEN}, "/api/example/does-not-exist", 404),
    ],
)
@pytest_twisted.ensureDeferred
async def test_token_gate(headers, path, status):
    client, _, _ = make()
    response, body = await call(client, "GET", path, headers)
    assert response.code == status
    if status == 401:
        assert envelope_of(body) == {
            "error": {"code": "ERR_UNAUTHORIZED", "message": "missing or invalid service token"}
        }


@pytest_twisted.ensureDeferred
async def test_empty_token_disables_auth():
    client, _, _ = make(token="")
    response, _ = await call(client, "GET", "/api/example/list")
    assert response.code == 200


@pytest.mark.parametrize(
    "method,path,status,code,allow",
    [
        ("GET", "/api/example/list/", 404, "ERR_NOT_FOUND", None),  # strict routing
        ("POST", "/api/example/list", 405, "ERR_METHOD_NOT_ALLOWED", b"GET, HEAD"),
        ("DELETE", "/api/example/echo", 405, "ERR_METHOD_NOT_ALLOWED", b"POST"),
        ("TRACE", "/api/example/echo", 405, "ERR_METHOD_NOT_ALLOWED", b"POST"),
        ("OPTIONS", "/api/example/list", 405, "ERR_METHOD_NOT_ALLOWED", b"GET, HEAD"),
        ("TRACE", "/api/example/nope", 404, "ERR_NOT_FOUND", None),
        ("GET", "/elsewhere", 404, "ERR_NOT_FOUND", None),
        ("POST", "/healthz", 405, "ERR_METHOD_NOT_ALLOWED", b"GET, HEAD"),
        ("DELETE", "/readyz", 405, "ERR_METHOD_NOT_ALLOWED", b"GET, HEAD"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_routing_misses_are_enveloped(method, path, status, code, allow):
    client, _, _ = make()
    response, body = await call(client, method, path, {"X-Service-Token": TOKEN})
    assert response.code == status
    assert envelope_of(body)["error"]["code"] == code
    assert response.headers.getRawHeaders(b"allow", [None])[0] == allow


@pytest.mark.parametrize("path", ["/", "/healthz"])
@pytest_twisted.ensureDeferred
async def test_liveness_probes_are_bare(path):
    client, readiness, _ = make()
    readiness.reason = "database unreachable"  # liveness does not care
    response, body = await call(client, "GET", path)
    assert response.code == 200 and body == b'{"status":"ok"}'


@pytest_twisted.ensureDeferred
async def test_readyz_follows_readiness_without_auth():
    client, readiness, _ = make()
    response, body = await call(client, "GET", "/readyz")
    assert (response.code, body) == (200, b'{"status":"ok"}')
    readiness.reason = "unknown database"
    response, body = await call(client, "GET", "/readyz")
    assert response.code == 503
    assert body == b'{"status":"unavailable","reason":"unknown database"}'


@pytest_twisted.ensureDeferred
async def test_readyz_is_bounded_when_the_check_hangs():
    client, readiness, clock = make()
    readiness.hang = True
    pending = call(client, "GET", "/readyz")
    d = Deferred.fromCoroutine(pending)
    clock.advance(5)
    client.flush()
    response, body = await d
    assert response.code == 503
    assert json.loads(body)["status"] == "unavailable"


@pytest_twisted.ensureDeferred
async def test_head_probe_has_no_body():
    client, _, _ = make()
    response, body = await call(client, "HEAD", "/healthz")
    assert response.code == 200 and body == b""


@pytest_twisted.ensureDeferred
async def test_metrics_is_prometheus_text_without_auth():
    client, _, _ = make()
    response, body = await call(client, "GET", "/metrics")
    assert response.code == 200
    assert b"example_things_total 3.0" in body
    assert response.headers.getRawHeaders("content-type")[0].startswith("text/plain")


@pytest.mark.parametrize("size,status", [(LIMIT, 200), (LIMIT + 1, 413), (5 * 1024 * 1024, 413)])
@pytest_twisted.ensureDeferred
async def test_body_limit_before_auth(size, status):
    client, _, _ = make()
    payload = b'{"k":"' + b"x" * (size - 8) + b'"}'
    assert len(payload) == size
    # no token at all: an oversize body must still get 413, not 401
    headers = {} if status == 413 else {"X-Service-Token": TOKEN}
    response, body = await call(client, "POST", "/api/example/echo", headers, payload)
    assert response.code == status
    if status == 413:
        assert envelope_of(body) == {
            "error": {"code": "ERR_TOO_LARGE", "message": "Request Entity Too Large"}
        }


@pytest_twisted.ensureDeferred
async def test_request_id_is_reused_or_generated():
    client, _, _ = make()
    response, _ = await call(client, "GET", "/healthz", {"X-Request-Id": "abc-123"})
    assert response.headers.getRawHeaders("x-request-id") == ["abc-123"]
    response, _ = await call(client, "GET", "/healthz")
    [generated] = response.headers.getRawHeaders("x-request-id")
    assert len(generated) == 32


@pytest_twisted.ensureDeferred
async def test_access_log_line_redacts_the_token():
    with logged_events() as observer:
        client, _, _ = make()
        await call(client, "GET", f"/api/example/list?token={TOKEN}", {"X-Request-Id": "r-9"})
    [event] = [e for e in observer if e.get("log_format", "").startswith("REQUEST ")]
    assert event["uri"] == "/api/example/list?token=[REDACTED]"
    assert event["status"] == 200 and event["request_id"] == "r-9"


@pytest_twisted.ensureDeferred
async def test_only_one_access_log_line_per_request():
    with logged_events() as observer:
        client, _, _ = make()
        await call(client, "GET", "/healthz")
    lines = [
        e
        for e in observer
        if "REQUEST" in (e.get("log_format") or "")
        or "HTTP/1.1" in (e.get("log_format") or "")
        or e.get("log_namespace") == "twisted.web.server"
    ]
    assert [e["log_format"].split()[0] for e in lines] == ["REQUEST"]


@pytest_twisted.ensureDeferred
async def test_without_access_log_only_failures_are_logged():
    from twisted.web.resource import Resource

    class Api(Resource):
        isLeaf = True

        def render(self, request):
            if request.path == b"/api/example/boom":
                raise RuntimeError("boom")
            return ok(request, {"fine": True})

    async def ready():
        return None

    site = build_site(
        api_resource=Api(),
        prefix="/api/example/",
        token="",
        body_limit=1024,
        readiness=ready,
        registry=CollectorRegistry(),
        clock=task.Clock(),
        access_log=False,
    )
    client = stub_client(site)
    with logged_events() as observer:
        fine = await client.get("http://x/api/example/list")
        await fine.content()
        failed = await client.get("http://x/api/example/boom")
        await failed.content()
    names = [e.get("log_format", "").split(" ")[0] for e in observer]
    assert (fine.code, failed.code) == (200, 500)
    assert "REQUEST" not in names and "REQUEST_FAILED" in names


def _quiet_site(*, debug_log: bool):
    from twisted.web.resource import Resource

    class Api(Resource):
        isLeaf = True

        def render(self, request):
            if request.path == b"/api/example/refused":
                return fail(request, 409, "ERR_LEASE_CONFLICT", "not yours")
            return ok(request, {"fine": True})

    async def ready():
        return None

    site = build_site(
        api_resource=Api(),
        prefix="/api/example/",
        token="",
        body_limit=1024,
        readiness=ready,
        registry=CollectorRegistry(),
        clock=task.Clock(),
        quiet_paths=frozenset({b"/api/example/lease", b"/api/example/refused"}),
        debug_log=debug_log,
    )
    return stub_client(site)


@pytest.mark.parametrize("debug_log", [False, True])
@pytest_twisted.ensureDeferred
async def test_routine_calls_to_quiet_paths_are_logged_at_debug_only(debug_log):
    client = _quiet_site(debug_log=debug_log)
    with logged_events() as observer:
        for path in ("lease", "list", "refused"):
            response = await client.post(f"http://x/api/example/{path}")
            await response.content()
    lines = {
        e["uri"]: e["log_level"] for e in observer if e.get("log_format", "").startswith("REQUEST ")
    }
    expected = {"/api/example/list": LogLevel.info, "/api/example/refused": LogLevel.info}
    if debug_log:
        expected["/api/example/lease"] = LogLevel.debug
    assert lines == expected


class _Body:
    def __init__(self, raw: bytes) -> None:
        import io

        self.content = io.BytesIO(raw)


def _json_reference(raw: bytes):
    """What the body means to json.loads, which detects the encoding itself."""
    try:
        return "ok", json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return "400", f"request body is not valid JSON: {e}"
    except RecursionError:
        return "400", "request body is nested too deeply"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@settings(max_examples=400)
@given(
    st.one_of(
        st.binary(max_size=24),
        st.builds(
            lambda value, encoding, bom: bom + json.dumps(value).encode(encoding),
            st.dictionaries(st.text(max_size=4), _json_values, max_size=3),
            st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32-be"]),
            st.sampled_from([b"", b"\xef\xbb\xbf"]),
        ),
        # Raw bytes inside a string: broken UTF-8, lone surrogates.
        st.builds(
            lambda inside: b'{"k":"' + inside + b'"}',
            st.lists(
                st.sampled_from([b"a", b"\xed\xa0\x80", b"\xff", b"\xc3\xa9", b"\\ud800"]),
                max_size=4,
            ).map(b"".join),
        ),
    )
)
def test_a_body_means_what_json_says_it_means_whatever_its_encoding(raw):
    kind, expected = _json_reference(raw)
    try:
        body = read_json_object(_Body(raw))
    except ApiError as e:
        assert e.status == 400
        if kind == "400" and raw.strip():
            assert e.message == expected
        else:
            assert not (kind == "ok" and isinstance(expected, dict) and raw.strip())
        return
    assert kind == "ok" and isinstance(expected, dict)
    assert json.dumps(body, sort_keys=True) == json.dumps(
        _replace_lone_surrogates(expected), sort_keys=True
    )


def _replace_lone_surrogates(value):
    from gorge.web.envelope import _replace_surrogates

    return _replace_surrogates(value)
