"""Message rules and MIME output that must hold for all inputs."""

from __future__ import annotations

import base64
import email
import email.policy
import email.utils
from email.header import decode_header, make_header

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gorge.mailer.message import Address, format_address, truncate_utf8
from gorge.mailer.mime import build_mime
from gorge.mailer.outcome import Outcome, parse_retry_after
from tests.mailer.conftest import parsed_message


def build(**overrides) -> bytes:
    return build_mime(parsed_message(**overrides), now=1_790_000_000, token_hex=lambda n: "ab" * n)


@given(st.text(), st.integers(-2, 40))
def test_truncation_never_splits_a_code_point(text, limit):
    out = truncate_utf8(text, limit)
    if limit <= 0:
        assert out == text
    else:
        raw = out.encode()
        assert len(raw) <= limit and text.encode().startswith(raw)
        assert len(raw) > limit - 4 or raw == text.encode()


def test_truncation_examples():
    assert truncate_utf8("Hello, 世界", 10) == "Hello, 世"
    assert truncate_utf8("Hello, 世界", 9) == "Hello, "
    assert truncate_utf8("Hello, 世界", 8) == "Hello, "


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=3),
    names=st.lists(st.text(min_size=1, max_size=30), min_size=3, max_size=3),
    mime=st.text(max_size=30),
)
def test_attachments_decode_to_the_callers_bytes(payloads, names, mime):
    names = [n if n.replace("\r", "").replace("\n", "").replace("\x00", "") else "x" for n in names]
    raw = build(
        attachments=[
            {"filename": n, "mimeType": mime, "data": base64.b64encode(p).decode()}
            for n, p in zip(names, payloads, strict=False)
        ]
    )
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))
    # The smtp backend dot-stuffs only the head (stuff_mime relies on this).
    body_lines = raw.split(b"\r\n\r\n", 1)[1].split(b"\r\n")
    assert not any(line.startswith(b".") for line in body_lines)
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    parts = list(parsed.iter_parts())[1:]
    assert [p.get_payload(decode=True) for p in parts] == payloads
    for part in parts:
        assert "\n" not in part["Content-Type"].replace("\r\n ", "")


@settings(max_examples=100, deadline=None)
@given(
    value=st.text(max_size=200),
    subject=st.text(min_size=1, max_size=200),
    name=st.text(max_size=40),
)
def test_no_caller_string_starts_a_header(value, subject, name):
    raw = build(
        subject=subject,
        to=[{"name": name, "address": "a@example.com"}],
        headers=[{"name": "X-Custom", "value": value}],
    )
    head = raw.split(b"\r\n\r\n", 1)[0]
    names = [
        line.split(b":", 1)[0]
        for line in head.split(b"\r\n")
        if line and not line.startswith((b" ", b"\t"))
    ]
    assert names == [
        b"From",
        b"To",
        b"Subject",
        b"Date",
        b"Message-ID",
        b"X-Custom",
        b"MIME-Version",
        b"Content-Type",
        b"Content-Transfer-Encoding",
    ]
    assert all(len(line) <= 998 for line in head.split(b"\r\n"))
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    raw_subject = next(h for h in head.split(b"\r\n\r\n")[0].decode().split("\r\nSubject: ")[1:])
    raw_subject = raw_subject.split("\r\nDate: ")[0].replace("\r\n", "")
    decoded = str(make_header(decode_header(raw_subject)))
    assert decoded == subject or subject.isascii() and decoded.split() == subject.split()
    assert parsed["To"].addresses[0].addr_spec == "a@example.com"


def test_stuff_mime_equals_full_dot_stuffing():
    from gorge.mailer.backends.smtp_data import dot_stuff, stuff_mime

    raw = build(
        headers=[{"name": ".dotted", "value": "x"}],
        textBody="." * 100,
        attachments=[{"filename": ".f", "data": base64.b64encode(b"." * 500).decode()}],
    )
    assert stuff_mime(raw) == dot_stuff(raw, terminate=False)
    assert b"\r\n..dotted: x" in stuff_mime(raw)


def test_base64_rules():
    from gorge.mailer.message import _is_base64

    for good in [b"", b"QQ==", b"QUI=", b"QUJD", b"+/+/"]:
        assert _is_base64(good) and base64.b64decode(good, validate=True) is not None
    for bad in [b"Q", b"QQ=", b"Q===", b"====", b"QQ==QQ==", b"AB=C", b"QU-D", b"QU_D", b"QUJ\x00"]:
        assert not _is_base64(bad), bad


@given(st.binary(max_size=64))
def test_base64_check_agrees_with_the_strict_decoder(raw):
    import binascii

    from gorge.mailer.message import _is_base64

    try:
        binascii.a2b_base64(raw, strict_mode=True)
        strict_ok = True
    except (binascii.Error, ValueError):
        strict_ok = False
    assert _is_base64(raw) == strict_ok or (raw.strip(b"=") == b"" and raw)


def test_reserved_custom_headers_are_dropped():
    raw = build(
        headers=[
            {"name": "bcc", "value": "x@y"},
            {"name": "Content-Type", "value": "x"},
            {"name": "Message-ID", "value": "<a@b>"},
            {"name": "Message-ID", "value": "<second@b>"},
        ]
    )
    assert b"x@y" not in raw and b"<second@b>" not in raw
    assert raw.count(b"Content-Type:") == 1 and b"Message-ID: <a@b>\r\n" in raw


def test_single_part_text_when_no_html_and_no_attachments():
    raw = build(textBody="")
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert (
        parsed.get_content_type() == "text/plain"
        and parsed["Content-Transfer-Encoding"] == "base64"
    )
    assert b"\r\nDate: " in raw and b"Message-ID: <" + b"ab" * 16 + b"@example.com>" in raw


def test_alternative_order_text_then_html():
    parsed = email.message_from_bytes(
        build(textBody="", htmlBody="<b>x</b>"), policy=email.policy.default
    )
    assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]


def test_address_formatting():
    assert format_address(Address("a@b")) == "a@b"
    assert format_address(Address("a@b", "Doe, John")) == '"Doe, John" <a@b>'
    assert format_address(Address("a@b", 'x "y" (z)')) == '"x \\"y\\" (z)" <a@b>'
    assert format_address(Address("a@b", "Jörg")).startswith("=?utf-8?")


def test_retry_after():
    assert parse_retry_after("120", 0) == 120
    assert parse_retry_after(b"7", 0) == 7
    assert parse_retry_after("soon", 0) is None
    assert parse_retry_after(None, 0) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412400) == 80
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412500) == 0


def test_outcome_scopes_and_cap():
    assert Outcome.rejected_message("x").scope == "message"
    assert Outcome.rejected_backend("x").scope == "backend"
    assert Outcome.rejected_unscoped("x").scope == "unscoped"
    assert Outcome.transient("x").retryable and Outcome.unknown("x").scope is None
    assert len(Outcome.unknown("y" * 5000).cause) == 512


@settings(max_examples=40, deadline=None)
@given(
    name=st.one_of(
        st.text(min_size=1, max_size=400),
        st.text(alphabet="abc 世界.", min_size=300, max_size=1200),
    )
)
def test_long_attachment_names_stay_within_the_line_limit(name):
    # No header line may exceed 998 octets -- a long (or long non-ASCII,
    # percent-encoded three times over) filename included; the name must
    # still read back exactly.
    name = name.replace("\r", "").replace("\n", "").replace("\x00", "") or "x"
    # The stdlib reader unquotes a filename twice, so a name that is itself
    # wrapped in quotes or angle brackets cannot be read back through it.
    assume(email.utils.unquote(name.strip()) == name.strip())
    raw = build(attachments=[{"filename": name, "mimeType": "text/plain", "data": "eA=="}])
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    part = list(parsed.iter_parts())[1]
    # (The stdlib reader strips surrounding whitespace from a filename.)
    assert part.get_filename() == name.strip()
    assert part.get_payload(decode=True) == b"x"


def test_long_cjk_attachment_name_example():
    name = "设计评审会议纪要" * 30 + ".txt"  # 244 characters, 2,172 once percent-encoded
    raw = build(attachments=[{"filename": name, "data": "eA=="}])
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    part = list(email.message_from_bytes(raw, policy=email.policy.default).iter_parts())[1]
    assert part.get_filename() == name


def test_long_display_names_stay_within_the_line_limit():
    # No header line may exceed 998 octets, whatever the caller's
    # display name (one unbroken run here, so folding at whitespace cannot help).
    for name in ("x" * 1500, "Doe," + "y" * 1200):
        raw = build(
            to=[{"name": name, "address": "a@example.com"}],
            **{"from": {"name": name, "address": "f@example.com"}},
        )
        assert max(len(line) for line in raw.split(b"\r\n")) <= 998
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        assert parsed["To"].addresses[0].addr_spec == "a@example.com"
        # RFC 2047 reading (the stdlib's address parser keeps the blanks
        # between adjacent encoded words, which the RFC says to drop).
        to = raw.split(b"\r\nTo: ", 1)[1].split(b"\r\nSubject: ", 1)[0].decode()
        phrase = to.replace("\r\n", "").rpartition(" <a@example.com>")[0]
        assert str(make_header(decode_header(phrase))) == name
