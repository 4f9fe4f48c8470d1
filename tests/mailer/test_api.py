"""POST /api/mailer/send and GET /api/mailer/mailers through the real site:
validation, envelope, limits, truncation, what the PHP
client relies on, and what must never reach a log."""

from __future__ import annotations

import base64
import json

import pytest
import pytest_twisted
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.logger import formatEvent

from gorge.mailer.outcome import Outcome
from tests.mailer.conftest import TOKEN, contract_env, make_harness, valid_message

SECRET_MARKER = "s3cr3t-body-text"


def without(key):
    m = valid_message(textBody=SECRET_MARKER)
    del m[key]
    return {"message": m}


def msg(**kw):
    return {"message": valid_message(textBody=SECRET_MARKER, **kw)}


BAD_REQUESTS = [
    (b"", "empty"),
    (b"{broken", "not valid JSON"),
    (b"[1,2]", "must be a JSON object"),
    (b'{"message": NaN}', "not valid JSON"),
    (b"\xff\xfe{}", "UTF-8"),
    (json.dumps({"message": "x"}).encode(), "message must be an object"),
    ({}, "from address is required"),
    (without("from"), "from address is required"),
    (msg(**{"from": {"name": "x", "address": ""}}), "from address is required"),
    (without("to"), "at least one recipient is required"),
    (msg(to=[]), "at least one recipient is required"),
    (without("subject"), "subject is required"),
    (msg(subject=""), "subject is required"),
    (msg(subject=5), "message.subject must be a string"),
    (msg(to="a@b"), "message.to must be an array"),
    (msg(to=["a@b"]), "message.to[0] must be an object"),
    (msg(headers={}), "message.headers must be an array"),
    # Elements are read in order: the first bad one is the one named.
    (msg(to=[{"address": 5}, "x"]), "message.to[0].address must be a string"),
    (msg(headers=[{"name": 5}, "x"]), "message.headers[0].name must be a string"),
    (msg(attachments=[{"filename": 5}, "x"]), "message.attachments[0].filename must be a string"),
    (msg(to=[{"address": "no-at-sign"}]), "message.to[0].address must look like local@domain"),
    (msg(to=[{"address": "@example.com"}]), "local@domain"),
    (msg(to=[{"address": "a@"}]), "local@domain"),
    (msg(to=[{"address": "a b@example.com"}]), "whitespace"),
    (msg(to=[{"address": "a@example.com\r\nBcc: x@y"}]), "control character"),
    (msg(to=[{"address": "<a@example.com>"}]), "without '<' or '>'"),
    (msg(cc=[{"address": "bad"}]), "message.cc[0].address"),
    (msg(bcc=[{"address": "bad"}]), "message.bcc[0].address"),
    (msg(replyTo={"address": "bad"}), "message.replyTo.address"),
    (msg(**{"from": {"address": "x\x00@y"}}), "control character"),
    (msg(attachments=[{"filename": "a", "data": "***"}]), "standard padded base64"),
    (msg(attachments=[{"filename": "a", "data": "SGVsbG8"}]), "standard padded base64"),
    (msg(attachments=[{"filename": "a", "data": "SGV-bG8="}]), "standard padded base64"),
    (msg(attachments=[{"filename": "", "data": ""}]), "filename is required"),
    (msg(attachments=[{"filename": "a"}]), "data is required"),
    (msg(headers=[{"name": "Bad Name", "value": "x"}]), "message.headers[0].name"),
    (msg(headers=[{"name": "Bad:Name", "value": "x"}]), "message.headers[0].name"),
    (msg(headers=[{"name": "\r\n", "value": "x"}]), "message.headers[0].name"),
    # Only CR/LF are stripped from a name; a NUL is not printable.
    (msg(headers=[{"name": "X-A\x00B", "value": "x"}]), "message.headers[0].name"),
    ({"message": valid_message(), "mailerKeys": "test-mailer"}, "mailerKeys must be an array"),
    ({"message": valid_message(), "mailerKeys": [1]}, "mailerKeys[0] must be a string"),
    ({"message": valid_message(), "mailerKeys": [None]}, "mailerKeys[0] must be a string"),
    (
        b'{"message":{"from":{"address":"a@b"},"to":[{"address":"c@d"}],"subject":"x",'
        b'"textBody":"\\ud800"}}',
        "message.textBody contains invalid Unicode",
    ),
    (msg(subject="ok \ud83d"), "message.subject contains invalid Unicode"),
]


@pytest.mark.parametrize("body,fragment", BAD_REQUESTS)
@pytest_twisted.ensureDeferred
async def test_bad_request_never_reaches_a_backend(harness, events, body, fragment):
    status, doc, raw = await harness.post("/api/mailer/send", body)
    assert status == 400
    assert doc["error"]["code"] == "ERR_BAD_REQUEST" and "data" not in doc
    assert fragment in doc["error"]["message"]
    assert all(b.attempts == 0 for b in harness.backends.values())
    logged = " ".join(formatEvent(e) + repr(e) for e in events)
    assert SECRET_MARKER not in logged and TOKEN not in logged
    assert SECRET_MARKER not in raw.decode("utf-8", "replace")


@pytest_twisted.ensureDeferred
async def test_lenient_decoding(harness):
    body = msg(
        replyTo={"name": "x", "address": ""},
        cc=None,
        htmlBody=None,
        unknownKey=1,
        attachments=[{"filename": "a.bin", "mimeType": None, "data": "SGVs\r\nbG8=\n"}],
    )
    body["mailerKeys"] = []
    status, doc, _ = await harness.post(
        "/api/mailer/send", body, headers={"Content-Type": "text/plain"}
    )
    assert status == 200, doc
    sent = harness.backends["test-mailer"].messages[-1]
    assert sent.reply_to is None and sent.html_body == ""
    assert sent.attachments[0].content == b"Hello" and sent.attachments[0].data == "SGVsbG8="
    assert sent.attachments[0].mime_type == "application/octet-stream"


@pytest_twisted.ensureDeferred
async def test_header_values_lose_cr_lf_and_names_are_kept(harness):
    body = msg(
        headers=[
            {"name": "X-Evil", "value": "ok\r\nBcc: victim@example.com\x00"},
            {"name": "X\r\n-Split", "value": "v"},
        ]
    )
    status, _, _ = await harness.post("/api/mailer/send", body)
    assert status == 200
    headers = harness.backends["test-mailer"].messages[-1].headers
    assert [(h.name, h.value) for h in headers] == [
        ("X-Evil", "okBcc: victim@example.com"),
        ("X-Split", "v"),
    ]


@pytest_twisted.ensureDeferred
async def test_success_answer_shape(harness):
    status, doc, raw = await harness.post("/api/mailer/send", msg())
    assert status == 200
    assert doc == {"data": {"mailerKey": "test-mailer", "messageId": "test-1"}}
    assert b" " not in raw  # compact JSON


@pytest_twisted.ensureDeferred
async def test_message_id_omitted_when_empty():
    h = make_harness(contract_env())
    h.service.part("dispatcher").backends[0].send = _returning(Outcome.accepted(""))
    status, doc = await h.send()
    assert status == 200 and doc == {"data": {"mailerKey": "test-mailer"}}


def _returning(outcome):
    async def send(message, *, deadline):
        return outcome

    return send


@pytest_twisted.ensureDeferred
async def test_unknown_mailer_keys_are_422_saying_what_to_fix(harness):
    status, doc = await harness.send(mailerKeys=["nope", "other"])
    assert (status, doc["error"]["code"]) == (422, "ERR_UNKNOWN_MAILER")
    assert doc["error"]["message"].startswith(
        "mailerKeys names no configured mailer: [nope, other]; use keys that "
        "GET /api/mailer/mailers lists"
    )
    assert all(b.attempts == 0 for b in harness.backends.values())


@pytest_twisted.ensureDeferred
async def test_no_backends():
    h = make_harness({"GORGE_SERVICE_TOKEN": TOKEN})
    status, doc = await h.send()
    assert (status, doc["error"]["code"], doc["error"]["message"]) == (
        502,
        "ERR_SEND_FAILED",
        "no mailers configured",
    )
    status, doc, _ = await h.get("/api/mailer/mailers")
    assert (status, doc) == (200, {"data": []})
    status, doc, _ = await h.get("/readyz", token=None)
    assert (status, doc) == (503, {"status": "unavailable", "reason": "no mailers configured"})
    status, doc, _ = await h.get("/healthz", token=None)
    assert (status, doc) == (200, {"status": "ok"})


@pytest_twisted.ensureDeferred
async def test_readyz_names_an_invalid_list_without_values():
    h = make_harness(
        {"GORGE_MAILER_CONFIG": '[{"key":"a","type":"smtp","options":{"password":["hunter2"]}}]'}
    )
    status, doc, _ = await h.get("/readyz", token=None)
    assert status == 503 and doc["reason"].startswith("mailer configuration invalid: ")
    assert "hunter2" not in doc["reason"]


@pytest_twisted.ensureDeferred
async def test_list_mailers_in_dispatch_order_without_options():
    mailers = [
        {"key": "z", "type": "test", "options": {"fail": "temporary"}},
        {"key": "y", "type": "test", "priority": 5},
        {"key": "x", "type": "test"},
        {"key": "w", "type": "test", "priority": -1},
    ]
    h = make_harness({"GORGE_SERVICE_TOKEN": TOKEN, "GORGE_MAILER_CONFIG": json.dumps(mailers)})
    status, doc, raw = await h.get("/api/mailer/mailers")
    assert status == 200
    assert doc["data"] == [
        {"key": "y", "type": "test", "priority": 5},
        {"key": "z", "type": "test", "priority": -1},
        {"key": "w", "type": "test", "priority": -1},
        {"key": "x", "type": "test", "priority": -2},
    ]
    assert b"temporary" not in raw


@pytest.mark.parametrize(
    "method,path,token,status,code",
    [
        ("GET", "/api/mailer/send", TOKEN, 405, "ERR_METHOD_NOT_ALLOWED"),
        ("POST", "/api/mailer/send/", TOKEN, 404, "ERR_NOT_FOUND"),
        ("POST", "/api/mailer/deliver", TOKEN, 404, "ERR_NOT_FOUND"),
        ("GET", "/api/mailer/nothing", None, 401, "ERR_UNAUTHORIZED"),
        ("GET", "/api/mailer/mailers", "wrong", 401, "ERR_UNAUTHORIZED"),
        ("POST", "/healthz", None, 405, "ERR_METHOD_NOT_ALLOWED"),
        ("GET", "/elsewhere", None, 404, "ERR_NOT_FOUND"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_routing_and_auth(harness, method, path, token, status, code):
    headers = {"X-Service-Token": [token]} if token else {}
    response = await harness.client.request(
        method, "http://mailer" + path, headers=headers, data=b"{}" if method == "POST" else None
    )
    doc = json.loads(await response.content())
    assert response.code == status and doc["error"]["code"] == code and "data" not in doc


@pytest_twisted.ensureDeferred
async def test_wrong_header_is_not_rescued_by_query_token(harness):
    response = await harness.client.get(
        "http://mailer/api/mailer/mailers?token=" + TOKEN, headers={"X-Service-Token": ["wrong"]}
    )
    assert response.code == 401


@pytest_twisted.ensureDeferred
async def test_twenty_mib_body_is_413_before_auth(harness, events):
    body = b'{"message":{"textBody":"' + b"x" * (20 * 1024 * 1024) + b'"}}'
    status, doc, _ = await harness.post("/api/mailer/send", body, token=None)
    assert status == 413 and doc["error"] == {
        "code": "ERR_TOO_LARGE",
        "message": "Request Entity Too Large",
    }
    assert all(b.attempts == 0 for b in harness.backends.values())


@pytest_twisted.ensureDeferred
async def test_nine_mib_attachment_is_accepted(harness):
    data = base64.b64encode(b"\x00" * (7 * 1024 * 1024)).decode()
    body = msg(attachments=[{"filename": "big.bin", "data": data}])
    status, doc, _ = await harness.post("/api/mailer/send", body)
    assert status == 200, doc
    assert len(harness.backends["test-mailer"].messages[-1].attachments[0].content) == 7 << 20


@pytest_twisted.ensureDeferred
async def test_body_truncation_on_code_point_boundary():
    h = make_harness(contract_env(GORGE_MAILER_BODY_LIMIT="10"))
    status, _ = await h.send(valid_message(textBody="Hello, 世界", htmlBody="<p>short</p>"))
    assert status == 200
    sent = h.backends["test-mailer"].messages[-1]
    assert sent.text_body == "Hello, 世" and sent.html_body == "<p>short</"
    assert (
        h.service.part("metrics-registry").get_sample_value("gorge_mailer_body_truncations_total")
        == 2
    )


@pytest_twisted.ensureDeferred
async def test_requests_metric_by_code(harness):
    await harness.send()
    await harness.send(mailerKeys=["rejects"])
    await harness.post("/api/mailer/send", b"{")
    get = harness.service.part("metrics-registry").get_sample_value
    assert get("gorge_mailer_requests_total", {"code": "OK"}) == 1
    assert get("gorge_mailer_requests_total", {"code": "ERR_PERMANENT_FAILURE"}) == 1
    assert get("gorge_mailer_requests_total", {"code": "ERR_BAD_REQUEST"}) == 1
    status, _, raw = await harness.get("/metrics", token=None)
    assert status == 200 and b"gorge_mailer_attempts_total" in raw
    assert b"alice@example.com" not in raw


@pytest_twisted.ensureDeferred
async def test_retry_waits_on_the_clock_through_the_api():
    clock = task.Clock()
    mailers = [
        {"key": "flaky", "type": "test", "options": {"fail": "temporary", "fail-times": "2"}}
    ]
    h = make_harness({"GORGE_MAILER_CONFIG": json.dumps(mailers)}, clock=clock)
    d = Deferred.fromCoroutine(h.send())
    assert not d.called and h.backends["flaky"].attempts == 1
    clock.advance(2)
    h.client.flush()
    assert h.backends["flaky"].attempts == 2 and not d.called
    clock.advance(2)
    h.client.flush()
    status, doc = await d
    assert status == 200 and doc["data"]["mailerKey"] == "flaky"
    assert h.backends["flaky"].attempts == 3


@pytest_twisted.ensureDeferred
async def test_shutdown_lets_an_in_flight_send_finish():
    clock = task.Clock()
    h = make_harness({"GORGE_MAILER_CONFIG": '[{"key":"slow","type":"test"}]'}, clock=clock)
    backend = h.service.part("dispatcher").backends[0]
    release: Deferred = Deferred()

    async def slow_send(message, *, deadline):
        await release
        return Outcome.accepted("late")

    backend.send = slow_send
    h.service.startService()
    response = Deferred.fromCoroutine(h.send())
    stopped = h.service.stopService()
    clock.advance(10)
    h.client.flush()
    assert not stopped.called and not response.called
    # A send whose request completes during the drain began to arrive
    # before the stop (the listener then refuses new connections and closes
    # idle ones): it is sent like any other.
    backend.send = _returning(Outcome.accepted("completed-during-drain"))
    late_status, late_doc = await h.send()
    assert (late_status, late_doc["data"]["messageId"]) == (200, "completed-during-drain")
    release.callback(None)
    h.client.flush()
    status, doc = await response
    assert status == 200 and doc["data"]["messageId"] == "late"
    assert not stopped.called  # a short pause lets the answer leave the buffers
    clock.advance(0.05)
    assert stopped.called


@pytest_twisted.ensureDeferred
async def test_shutdown_drain_budget_cancels_and_still_answers():
    clock = task.Clock()
    h = make_harness(
        {
            "GORGE_MAILER_CONFIG": '[{"key":"stuck","type":"test"}]',
            "GORGE_MAILER_SEND_TIMEOUT": "25",
        },
        clock=clock,
    )
    backend = h.service.part("dispatcher").backends[0]

    async def stuck(message, *, deadline):
        # Ignores the first cancel, like an adapter that cannot abort at once.
        d = Deferred(lambda d: d.callback(Outcome.unknown("cut off after dot")))
        return await d

    backend.send = stuck
    h.service.startService()
    response = Deferred.fromCoroutine(h.send())
    stopped = h.service.stopService()
    clock.advance(25)  # the dispatch deadline cancels the attempt
    h.client.flush()
    status, doc = await response
    assert status == 502 and doc["error"]["code"] == "ERR_OUTCOME_UNKNOWN"
    clock.advance(0.05)
    assert stopped.called


@pytest_twisted.ensureDeferred
async def test_client_disconnect_cancels_the_dispatch(events):
    from twisted.internet import reactor
    from twisted.internet.protocol import ClientFactory, Protocol

    h = make_harness({"GORGE_MAILER_CONFIG": '[{"key":"hang","type":"test"}]'}, clock=reactor)
    cancelled: Deferred = Deferred()

    async def hang(message, *, deadline):
        d = Deferred(lambda d: (d.callback(Outcome.transient("aborted")), cancelled.callback(None)))
        return await d

    h.service.part("dispatcher").backends[0].send = hang
    port = reactor.listenTCP(0, h.service.part("site"), interface="127.0.0.1")
    body = json.dumps({"message": valid_message()}).encode()

    class Client(Protocol):
        def connectionMade(self):
            self.transport.write(
                b"POST /api/mailer/send HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            reactor.callLater(0.05, self.transport.abortConnection)

    factory = ClientFactory.forProtocol(Client)
    reactor.connectTCP("127.0.0.1", port.getHost().port, factory)
    try:
        await cancelled.addTimeout(10, reactor)
    finally:
        await port.stopListening()
    stopped = [e for e in events if "MAILER_SEND_STOPPED" in (e.get("log_format") or "")]
    assert stopped and stopped[0]["reason"] == "client disconnected"
    crashes = [e for e in events if e.get("log_failure") is not None]
    assert crashes == []


# --- property: no request body makes the send handler crash -----------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
)
_keys = st.sampled_from(
    [
        "from",
        "to",
        "cc",
        "bcc",
        "replyTo",
        "subject",
        "textBody",
        "htmlBody",
        "headers",
        "attachments",
        "name",
        "address",
        "value",
        "filename",
        "mimeType",
        "data",
        "x",
    ]
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)
_address = st.fixed_dictionaries(
    {"address": st.sampled_from(["a@b.c", "x", "", "a b@c"]) | st.text(max_size=8)},
    optional={"name": st.text(max_size=8) | st.none()},
)
_message = st.fixed_dictionaries(
    {},
    optional={
        "from": _address | _json,
        "to": st.lists(_address, max_size=2) | _json,
        "subject": st.text(max_size=10) | _json,
        "textBody": st.text(max_size=10) | _json,
        "headers": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=6), "value": st.text(max_size=6)}),
            max_size=2,
        )
        | _json,
        "attachments": st.lists(
            st.fixed_dictionaries(
                {"filename": st.text(max_size=4), "data": st.sampled_from(["", "QQ==", "?"])}
            ),
            max_size=2,
        )
        | _json,
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.fixed_dictionaries({"message": _message}, optional={"mailerKeys": _json}) | _json)
def test_property_any_body_gets_a_documented_answer(body):
    h = make_harness(contract_env())
    results = []
    d = h.client.post(
        "http://mailer/api/mailer/send",
        data=json.dumps(body).encode(),
        headers={"X-Service-Token": [TOKEN]},
    )
    d.addCallback(lambda r: r.content().addCallback(lambda raw: results.append((r.code, raw))))
    assert results, "the answer did not arrive synchronously"
    status, raw = results[0]
    doc = json.loads(raw)
    assert status in (200, 400, 422, 502), raw
    assert ("data" in doc) != ("error" in doc)
    if status == 400:
        assert all(b.attempts == 0 for b in h.backends.values())


@pytest_twisted.ensureDeferred
async def test_readyz_never_dials_out():
    from twisted.internet.testing import MemoryReactorClock

    reactor = MemoryReactorClock()
    mailers = [{"key": "relay", "type": "smtp", "options": {"host": "mail.invalid", "port": 25}}]
    h = make_harness({"GORGE_MAILER_CONFIG": json.dumps(mailers)}, clock=reactor)
    h.real = False
    status, doc, _ = await h.get("/readyz", token=None)
    assert (status, doc) == (200, {"status": "ok"})
    assert reactor.tcpClients == [] and reactor.sslClients == []
