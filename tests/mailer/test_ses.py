"""Amazon SES ``SendRawEmail`` backend."""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import parse_qsl

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import task

from gorge.config import ConfigError
from gorge.mailer import sigv4
from gorge.mailer.backends import ses
from gorge.mailer.backends.http import HttpReply
from gorge.mailer.message import format_address
from gorge.mailer.mime import build_mime
from gorge.mailer.outcome import Kind
from tests.mailer.test_providers_support import (
    LoopbackServer,
    MemoryHttp,
    Scripted,
    entry,
    from_backend_list,
    full_message,
    message,
)

# AWS's published SigV4 test-suite credentials and time (2015-08-30T12:36:00Z).
ACCESS = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
VECTOR_TIME = 1440938160.0
STAMP = "20150830T123600Z"


def fixed_hex(n: int) -> str:
    return "5" * (2 * n)


def backend(clock=None, client=None, **options) -> ses.SesBackend:
    options.setdefault("access_key", ACCESS)
    options.setdefault("secret_key", SECRET)
    return ses.SesBackend(
        entry("ses", key="aws", **options),
        clock=clock or task.Clock(),
        client=client,
        token_hex=fixed_hex,
    )


def from_list(options: dict) -> ses.SesBackend:
    return from_backend_list("ses", "aws", options)


def independent_signature(*, secret, region, host, path, stamp, body) -> str:
    """SigV4 written out longhand, to check the backend against."""
    canonical = "\n".join(
        [
            "POST",
            path,
            "",
            f"content-type:application/x-www-form-urlencoded\nhost:{host}\nx-amz-date:{stamp}\n",
            "content-type;host;x-amz-date",
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{stamp[:8]}/{region}/ses/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret).encode()
    for part in (stamp[:8], region, "ses", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def error_doc(code: str, text: str = "details") -> bytes:
    return (
        '<ErrorResponse xmlns="http://ses.amazonaws.com/doc/2010-12-01/">'
        f"<Error><Type>Sender</Type><Code>{code}</Code><Message>{text}</Message></Error>"
        "<RequestId>a1b2</RequestId></ErrorResponse>"
    ).encode()


RECEIPT = (
    b'<SendRawEmailResponse xmlns="http://ses.amazonaws.com/doc/2010-12-01/">'
    b"<SendRawEmailResult><MessageId>0100018c-abc</MessageId></SendRawEmailResult>"
    b"<ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></SendRawEmailResponse>"
)


# ---------------------------------------------------------------- signing


def test_signing_matches_the_published_form_urlencoded_vector():
    # AWS test suite "post-x-www-form-urlencoded": same signed header set as SES.
    headers = ses.signed_headers(
        sigv4.Credentials(ACCESS, SECRET),
        region="us-east-1",
        host="example.amazonaws.com",
        path="/",
        body=b"Param1=value1",
        stamp=STAMP,
        service="service",
    )
    assert headers == {
        "Content-Type": "application/x-www-form-urlencoded",
        "Host": "example.amazonaws.com",
        "X-Amz-Date": STAMP,
        "Authorization": (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=content-type;host;x-amz-date, "
            "Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
        ),
    }


def test_request_signature_matches_a_longhand_computation():
    clock = task.Clock()
    clock.advance(VECTOR_TIME)
    built = backend(clock=clock, region="eu-west-1")
    request = built.build_request(full_message())
    assert request.url == "https://email.eu-west-1.amazonaws.com"
    assert request.headers["X-Amz-Date"] == STAMP
    assert request.headers["Host"] == "email.eu-west-1.amazonaws.com"
    expected = independent_signature(
        secret=SECRET,
        region="eu-west-1",
        host="email.eu-west-1.amazonaws.com",
        path="/",
        stamp=STAMP,
        body=request.body,
    )
    assert request.headers["Authorization"] == (
        f"AWS4-HMAC-SHA256 Credential={ACCESS}/20150830/eu-west-1/ses/aws4_request, "
        f"SignedHeaders=content-type;host;x-amz-date, Signature={expected}"
    )


def test_endpoint_path_and_port_are_signed_as_sent():
    clock = task.Clock()
    clock.advance(VECTOR_TIME)
    built = backend(clock=clock, endpoint="https://ses-proxy.example.com:8443/relay/")
    request = built.build_request(message())
    assert request.url == "https://ses-proxy.example.com:8443/relay"
    assert request.headers["Host"] == "ses-proxy.example.com:8443"
    expected = independent_signature(
        secret=SECRET,
        region="us-east-1",
        host="ses-proxy.example.com:8443",
        path="/relay",
        stamp=STAMP,
        body=request.body,
    )
    assert request.headers["Authorization"].endswith(f"Signature={expected}")
    default_port = backend(endpoint="https://email.us-east-1.amazonaws.com:443")
    assert default_port.host == "email.us-east-1.amazonaws.com"


# ---------------------------------------------------------------- configuration


def test_defaults_and_bare_host_endpoint():
    built = from_list({})
    assert (built.region, built.url) == ("us-east-1", "https://email.us-east-1.amazonaws.com")
    bare = from_list({"endpoint": "email.us-west-2.amazonaws.com", "region": "us-west-2"})
    assert bare.url == "https://email.us-west-2.amazonaws.com"


@pytest.mark.parametrize(
    "options,field",
    [
        ({"region": "us east"}, "region"),
        ({"region": "../x"}, "region"),
        ({"endpoint": "http://email.us-east-1.amazonaws.com"}, "endpoint"),
        ({"endpoint": "ftp://x"}, "endpoint"),
        ({"endpoint": "https://proxy.example.com/a%20b"}, "endpoint"),
    ],
)
def test_bad_options_name_entry_and_field(options, field):
    with pytest.raises(ConfigError) as caught:
        from_list({"access-key": ACCESS, "secret-key": SECRET, **options})
    assert caught.value.setting == f"GORGE_MAILER_CONFIG [aws].{field}"
    assert SECRET not in str(caught.value)


def test_secret_is_not_in_repr_or_request():
    built = backend()
    request = built.build_request(message())
    assert SECRET not in repr(built) and SECRET not in repr(request)
    assert SECRET.encode() not in request.body
    assert all(SECRET not in value for value in request.headers.values())


# ---------------------------------------------------------------- the request body


def test_form_body_keys_values_and_raw_message():
    clock = task.Clock()
    clock.advance(VECTOR_TIME)
    msg = full_message()
    request = backend(clock=clock).build_request(msg)
    pairs = parse_qsl(request.body.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    assert [k for k, _ in pairs] == sorted(k for k, _ in pairs)
    form = dict(pairs)
    assert form.pop("Action") == "SendRawEmail"
    assert form.pop("Source") == "Phorge <noreply@example.com>"
    raw = base64.b64decode(form.pop("RawMessage.Data"), validate=True)
    assert raw == build_mime(msg, now=VECTOR_TIME, token_hex=fixed_hex)
    assert form == {
        "Destinations.member.1": "alice@example.com",
        "Destinations.member.2": "carol@example.com",
        "Destinations.member.3": "bob@example.com",
        "Destinations.member.4": "hidden@example.com",
    }
    assert b"Bcc:" not in raw


def test_form_encoding_of_specials():
    request = backend().build_request(
        message(**{"from": {"name": "A <B>", "address": "x+y@example.com"}})
    )
    body = request.body.decode("ascii")
    assert "Source=%22A+%3CB%3E%22+%3Cx%2By%40example.com%3E" in body
    data = dict(parse_qsl(body))["RawMessage.Data"]
    assert (
        f"RawMessage.Data={data.replace('+', '%2B').replace('/', '%2F').replace('=', '%3D')}"
        in body
    )


# ---------------------------------------------------------------- the answer


@pytest.mark.parametrize(
    "reply,kind",
    [
        (HttpReply(200, {}, RECEIPT), Kind.ACCEPTED),
        (HttpReply(200, {}, None), Kind.ACCEPTED),
        (HttpReply(200, {}, b"<not xml"), Kind.ACCEPTED),
        (
            HttpReply(400, {}, error_doc("Throttling", "Maximum sending rate exceeded.")),
            Kind.TRANSIENT,
        ),
        (
            HttpReply(400, {}, error_doc("Throttling", "Daily message quota exceeded.")),
            Kind.TRANSIENT,
        ),
        (HttpReply(503, {}, error_doc("ServiceUnavailable")), Kind.TRANSIENT),
        (
            HttpReply(400, {}, error_doc("MessageRejected", "Email address is not verified.")),
            Kind.REJECTED_UNSCOPED,
        ),
        (HttpReply(400, {}, error_doc("InvalidParameterValue")), Kind.REJECTED_UNSCOPED),
        (HttpReply(400, {}, error_doc("InvalidParameterCombination")), Kind.REJECTED_UNSCOPED),
        (HttpReply(400, {}, error_doc("SomethingNew")), Kind.REJECTED_UNSCOPED),
        (HttpReply(400, {}, b"<html>bad request</html>"), Kind.REJECTED_UNSCOPED),
        (HttpReply(400, {}, None), Kind.REJECTED_UNSCOPED),
        (HttpReply(403, {}, None), Kind.REJECTED_BACKEND),
        (HttpReply(403, {}, error_doc("SomethingNew")), Kind.REJECTED_BACKEND),
        (HttpReply(429, {}, error_doc("SomethingNew")), Kind.TRANSIENT),
        (HttpReply(500, {}, error_doc("InternalFailure")), Kind.UNKNOWN),
        (HttpReply(502, {}, None), Kind.UNKNOWN),
        (HttpReply(503, {}, None), Kind.TRANSIENT),
        (HttpReply(301, {}, b""), Kind.UNKNOWN),
    ],
)
def test_response_families(reply, kind):
    assert backend().classify(reply, 0.0).kind is kind


@pytest.mark.parametrize("code", sorted(ses.BACKEND_CODES))
def test_account_and_signature_errors_are_backend_scoped(code):
    outcome = backend().classify(HttpReply(400, {}, error_doc(code)), 0.0)
    assert outcome.kind is Kind.REJECTED_BACKEND
    assert outcome.cause == f"ses: HTTP 400: {code}: details"


def test_receipt_message_id_and_throttling_retry_after():
    assert backend().classify(HttpReply(200, {}, RECEIPT), 0.0).message_id == "0100018c-abc"
    throttled = backend().classify(
        HttpReply(
            400, {"retry-after": "9"}, error_doc("Throttling", "Maximum sending rate exceeded.")
        ),
        0.0,
    )
    assert throttled.retry_after == 9.0
    assert throttled.cause == "ses: HTTP 400: Throttling: Maximum sending rate exceeded."


def test_entity_declarations_are_not_expanded():
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa">]>'
        b"<ErrorResponse><Error><Code>&a;</Code></Error></ErrorResponse>"
    )
    assert ses.error_code(bomb) is None
    assert backend().classify(HttpReply(400, {}, bomb), 0.0).kind is Kind.REJECTED_UNSCOPED


def test_echoed_secret_is_scrubbed_from_the_cause():
    outcome = backend().classify(
        HttpReply(400, {}, error_doc("SignatureDoesNotMatch", f"bad {SECRET}")), 0.0
    )
    assert SECRET not in outcome.cause and "[REDACTED]" in outcome.cause


def test_timeouts_before_and_after_submission():
    for connect, kind in ((False, Kind.TRANSIENT), (True, Kind.UNKNOWN)):
        mem = MemoryHttp()
        built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
        assert mem.outcome_past_deadline(built, 4.0, connect=connect).kind is kind


# ---------------------------------------------------------------- over loopback


@pytest_twisted.ensureDeferred
async def test_end_to_end_signature_verifies_on_the_receiving_side():
    from twisted.internet import reactor

    async with LoopbackServer(reactor) as server:
        server.answer = Scripted(200, RECEIPT, {"Content-Type": "text/xml"})
        built = backend(clock=reactor, client=server.client, endpoint=server.url + "/ses")
        outcome = await built.send(full_message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.ACCEPTED and outcome.message_id == "0100018c-abc"
        (seen,) = server.requests
        assert seen.path == b"/ses"
        host = f"127.0.0.1:{server.port.getHost().port}"
        assert seen.headers["host"] == host
        assert seen.headers["content-type"] == "application/x-www-form-urlencoded"
        stamp = seen.headers["x-amz-date"]
        expected = independent_signature(
            secret=SECRET, region="us-east-1", host=host, path="/ses", stamp=stamp, body=seen.body
        )
        assert seen.headers["authorization"].endswith(f"Signature={expected}")

        server.answer = Scripted(400, error_doc("Throttling", "Maximum sending rate exceeded."))
        outcome = await built.send(message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.TRANSIENT


# ---------------------------------------------------------------- properties


@given(
    st.integers(min_value=300, max_value=599),
    st.text(alphabet=st.characters(categories=["L", "N"]), min_size=1, max_size=30),
)
def test_no_ses_error_is_ever_message_permanent(status, code):
    outcome = backend().classify(HttpReply(status, {}, error_doc(code)), 0.0)
    assert outcome.kind not in (Kind.REJECTED_MESSAGE, Kind.ACCEPTED)


@given(
    st.text(max_size=40),
    st.lists(
        st.from_regex(r"[a-z0-9.+_-]{1,10}@[a-z0-9-]{1,10}\.example", fullmatch=True),
        min_size=1,
        max_size=4,
    ),
)
def test_form_body_round_trips_source_and_destinations(name, recipients):
    msg = message(
        **{
            "from": {"name": name, "address": "noreply@example.com"},
            "to": [{"name": "", "address": a} for a in recipients],
        }
    )
    body = ses.form_body(msg, b"raw bytes")
    form = dict(parse_qsl(body.decode("ascii"), keep_blank_values=True, strict_parsing=True))
    assert form["Source"] == format_address(msg.from_)
    assert [form[f"Destinations.member.{n}"] for n in range(1, len(recipients) + 1)] == recipients
    assert base64.b64decode(form["RawMessage.Data"]) == b"raw bytes"
