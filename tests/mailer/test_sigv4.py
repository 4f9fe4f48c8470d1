"""SigV4 against AWS's published Signature Version 4 test suite vectors."""

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from gorge.mailer import sigv4

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
CREDS = sigv4.Credentials("AKIDEXAMPLE", SECRET)
STAMP = "20150830T123600Z"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_get_vanilla_canonical_request_and_signature():
    headers = {"Host": "example.amazonaws.com", "X-Amz-Date": STAMP}
    canonical, signed = sigv4.canonical_request("GET", "/", "", headers, sigv4.sha256_hex(b""))
    assert canonical == (
        "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
        "host;x-amz-date\n" + EMPTY_SHA256
    )
    assert signed == "host;x-amz-date"
    scope = sigv4.credential_scope("20150830", "us-east-1", "service")
    to_sign = sigv4.string_to_sign(STAMP, scope, canonical)
    assert to_sign == (
        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
        "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
    )
    assert sigv4.signature(SECRET, "20150830", "us-east-1", "service", to_sign) == (
        "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    )


def test_get_vanilla_authorization_header():
    value = sigv4.authorization(
        CREDS,
        method="GET",
        path="/",
        body=b"",
        region="us-east-1",
        service="service",
        stamp=STAMP,
        headers={"host": "example.amazonaws.com", "x-amz-date": STAMP},
    )
    assert value == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    )


def test_post_form_urlencoded_vector_uses_the_ses_header_set():
    # Same signed header set as SES: content-type;host;x-amz-date, real payload.
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Host": "example.amazonaws.com",
        "X-Amz-Date": STAMP,
    }
    assert sigv4.sha256_hex(b"Param1=value1") == (
        "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
    )
    value = sigv4.authorization(
        CREDS,
        method="POST",
        path="",
        body=b"Param1=value1",
        region="us-east-1",
        service="service",
        stamp=STAMP,
        headers=headers,
    )
    assert value.endswith(
        "SignedHeaders=content-type;host;x-amz-date, "
        "Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
    )


def test_amz_date_formats_utc():
    when = datetime(2015, 8, 30, 12, 36, 0, tzinfo=UTC)
    assert sigv4.amz_date(when) == (STAMP, "20150830")
    assert sigv4.amz_date_from_posix(when.timestamp()) == (STAMP, "20150830")


def test_secret_not_in_repr():
    assert SECRET not in repr(CREDS)
    assert "AKIDEXAMPLE" in repr(CREDS)


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_signature_depends_on_the_body(a, b):
    def sign(body):
        return sigv4.authorization(
            CREDS,
            method="POST",
            path="/",
            body=body,
            region="us-east-1",
            service="ses",
            stamp=STAMP,
            headers={"host": "h", "x-amz-date": STAMP},
        )

    assert (sign(a) == sign(b)) == (a == b)


@given(st.text(alphabet=" abc", max_size=20))
def test_header_values_are_trimmed_and_collapsed(value):
    block, _ = sigv4.canonical_headers({"X-A": value})
    assert block == "x-a:" + " ".join(value.split()) + "\n"
