"""Payload rules for the golden cases and for all inputs."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gorge.webhook import payload
from tests.webhook.golden import delivered_cases, load_case

PHID_ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cs",))


# -- an independent PhutilJSON::encodeFormatted() to compare against ---------


def _php_scalar(value) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20:
            out.append(f"\\u{code:04x}")
        elif code <= 0x7F:  # "/" unescaped (JSON_UNESCAPED_SLASHES), DEL literal as in PHP
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    out.append('"')
    return "".join(out)


def _phutil(value, indent: int = 0) -> str:
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "[]"  # any empty PHP array prints as []
        inner = ",\n".join(
            f"{pad}{_php_scalar(k)}: {_phutil(v, indent + 1)}" for k, v in value.items()
        )
        return "{\n" + inner + "\n" + "  " * indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        inner = ",\n".join(f"{pad}{_phutil(v, indent + 1)}" for v in value)
        return "[\n" + inner + "\n" + "  " * indent + "]"
    return _php_scalar(value)


# -- golden ------------------------------------------------------------------


@pytest.mark.parametrize("case", delivered_cases(), ids=lambda c: c.name)
def test_golden_body_signature_and_write_back(case):
    before, after = case.request_before, case.request_after
    props = payload.parse_properties(before["properties"])
    body = payload.build_body(before["objectPHID"], before["dateCreated"], props)
    assert body == case.body
    assert payload.sign(case.hook_before["hmacKey"], body) == case.info["signature_header"]
    code = json.loads(after["properties"])["errorCode"]
    assert payload.with_outcome(props.document, "http", code) == after["properties"]


def test_golden_disabled_hook_write_back():
    case = load_case("disabled_hook")
    props = payload.parse_properties(case.request_before["properties"])
    written = payload.with_outcome(props.document, "hook", payload.CODE_DISABLED)
    assert written == case.request_after["properties"]


def test_spec_example_signature():
    props = payload.parse_properties(
        json.dumps(
            {
                "retry": "forever",
                "transactionPHIDs": [
                    "PHID-XACT-TASK-aaaaaaaaaaaaaaa",
                    "PHID-XACT-TASK-bbbbbbbbbbbbbbb",
                ],
                "triggerPHIDs": ["PHID-HRUL-cccccccccccccccccccc"],
                "silent": False,
                "secure": False,
            }
        )
    )
    body = payload.build_body("PHID-TASK-abcdefghijklmnopqrst", 1700000000, props)
    assert payload.sign("abcdefghijklmnopqrstuvwxyz012345", body) == (
        "d504cec8079af32f5c6cb2a5a027c13f0df0741537310386d5c3cc223793d2f0"
    )


# -- read rules --------------------------------------------------------------


@pytest.mark.parametrize("text", ["[]", "null", "{}"])
def test_empty_documents_read_as_empty_object(text):
    props = payload.parse_properties(text)
    assert (props.retry_forever, props.triggers, props.test) == (False, (), False)
    assert (
        payload.with_outcome(props.document, "http", 200) == '{"errorType":"http","errorCode":200}'
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[1]",
        '"x"',
        "3",
        "true",
        '{"transactionPHIDs":"PHID-X"}',
        '{"transactionPHIDs":[1]}',
        '{"triggerPHIDs":{"a":2}}',
        '{"silent":"yes"}',
        '{"test":1}',
        '{"secure":[]}',
    ],
)
def test_invalid_properties(text):
    with pytest.raises(payload.InvalidProperties):
        payload.parse_properties(text)


def test_type_failure_keeps_the_parsed_object():
    with pytest.raises(payload.InvalidProperties) as info:
        payload.parse_properties('{"retry":"forever","silent":"yes","x":[1,2]}')
    written = payload.with_outcome(info.value.document, "hook", payload.CODE_INVALID_PROPERTIES)
    assert written == (
        '{"retry":"forever","silent":"yes","x":[1,2],'
        '"errorType":"hook","errorCode":"invalid-properties"}'
    )


def test_unparseable_properties_are_replaced():
    with pytest.raises(payload.InvalidProperties) as info:
        payload.parse_properties("{nope")
    written = payload.with_outcome(info.value.document, "hook", payload.CODE_INVALID_PROPERTIES)
    assert written == '{"errorType":"hook","errorCode":"invalid-properties"}'


@pytest.mark.parametrize(
    "retry,expected",
    [("forever", True), ("Forever", False), ("never", False), (None, False), (1, False)],
)
def test_retry_only_for_exact_forever(retry, expected):
    assert payload.parse_properties(json.dumps({"retry": retry})).retry_forever is expected


@pytest.mark.parametrize(
    "phid,kind",
    [
        ("PHID-TASK-abc", "TASK"),
        ("PHID-CMIT-a-b-c", "CMIT"),
        ("nonsense", ""),
        ("", ""),
        ("PHID-", ""),
    ],
)
def test_object_type(phid, kind):
    assert payload.phid_type(phid) == kind


def test_id_keyed_transactions_sort_by_id_descending():
    props = payload.parse_properties('{"transactionPHIDs":{"9":"a","45":"b","10":"c"}}')
    assert payload.newest_first(props.transactions) == ["b", "c", "a"]


def test_phid_keyed_transactions_are_reversed():
    props = payload.parse_properties('{"transactionPHIDs":{"x":"a","007":"b","y":"c"}}')
    assert payload.newest_first(props.transactions) == ["c", "b", "a"]


@pytest.mark.parametrize("phid", ["a\x7fb", "a\\u007fb", "a\\\x7f", "\\\\u007f"])
def test_del_is_left_literal_like_php(phid):
    body = payload.build_body(phid, 1, payload.parse_properties("{}"))
    assert json.loads(body)["object"]["phid"] == phid
    assert body.count(b"\x7f") == phid.count("\x7f")


@pytest.mark.parametrize("value", ["a\x7fb", "a\\u007fb", "\\\x7f"])
def test_write_back_leaves_del_literal_like_php(value):
    written = payload.with_outcome({"note": value}, "http", 200)
    assert json.loads(written)["note"] == value
    assert written.count("\x7f") == value.count("\x7f")


def test_integer_codes_written_as_integers_and_slashes_escaped():
    written = payload.with_outcome({"a/b": "c/d", "errorCode": "500"}, "http", 502)
    assert written == '{"a\\/b":"c\\/d","errorCode":502,"errorType":"http"}'


# -- properties for all inputs ------------------------------------------------

phids = st.text(PHID_ALPHABET, max_size=40)
phid_lists = st.lists(phids, max_size=6)
id_maps = st.dictionaries(st.integers(0, 10**6).map(str), phids, max_size=6)
phid_maps = st.dictionaries(phids, phids, max_size=6)
json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(PHID_ALPHABET, max_size=10)
)
unknown_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(PHID_ALPHABET, max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def documents(draw):
    doc = {}
    keys = draw(
        st.permutations(
            [
                "retry",
                "transactionPHIDs",
                "triggerPHIDs",
                "silent",
                "secure",
                "test",
                "extra",
                "errorCode",
            ]
        )
    )
    for key in keys[: draw(st.integers(0, len(keys)))]:
        if key == "retry":
            doc[key] = draw(st.sampled_from(["never", "forever", None]))
        elif key == "transactionPHIDs":
            doc[key] = draw(phid_lists | id_maps | phid_maps | st.none())
        elif key == "triggerPHIDs":
            doc[key] = draw(phid_lists | phid_maps | st.none())
        elif key in ("silent", "secure", "test"):
            doc[key] = draw(st.booleans() | st.none())
        elif key == "errorCode":
            doc[key] = draw(st.integers(0, 600) | st.sampled_from(["500", "uri"]))
        else:
            doc[
                draw(
                    st.text(PHID_ALPHABET, min_size=1, max_size=8).filter(
                        lambda k: (
                            k
                            not in (
                                "retry",
                                "transactionPHIDs",
                                "triggerPHIDs",
                                "silent",
                                "secure",
                                "test",
                                "errorType",
                                "errorCode",
                            )
                        )
                    )
                )
            ] = draw(unknown_values)
    return doc


def _expected_transactions(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        if value and all(
            k.isascii() and k.isdigit() and (k == "0" or not k.startswith("0")) for k in value
        ):
            return [value[k] for k in sorted(value, key=int, reverse=True)]
        return list(value.values())[::-1]
    return value[::-1]


@settings(max_examples=300, deadline=None)
@given(
    doc=documents(),
    object_phid=phids,
    epoch=st.integers(0, 2**32 - 1),
    key=st.text(PHID_ALPHABET, min_size=1, max_size=32),
)
def test_body_for_all_inputs(doc, object_phid, epoch, key):
    props = payload.parse_properties(json.dumps(doc))
    body = payload.build_body(object_phid, epoch, props)
    decoded = json.loads(body)
    triggers = doc.get("triggerPHIDs") or []
    triggers = list(triggers.values()) if isinstance(triggers, dict) else triggers
    expected = {
        "object": {"type": payload.phid_type(object_phid), "phid": object_phid},
        "triggers": [{"phid": p} for p in triggers],
        "action": {
            "test": bool(doc.get("test")),
            "silent": bool(doc.get("silent")),
            "secure": bool(doc.get("secure")),
            "epoch": epoch,
        },
        "transactions": [{"phid": p} for p in _expected_transactions(doc.get("transactionPHIDs"))],
    }
    assert decoded == expected
    assert list(decoded) == ["object", "triggers", "action", "transactions"]
    assert list(decoded["action"]) == ["test", "silent", "secure", "epoch"]
    assert body == (_phutil(expected) + "\n").encode("ascii")
    signature = payload.sign(key, body)
    assert hmac.compare_digest(
        signature, hmac.new(key.encode("utf-8"), body, hashlib.sha256).hexdigest()
    )
    assert len(signature) == 64 and signature == signature.lower()


@settings(max_examples=300, deadline=None)
@given(doc=documents(), code=st.integers(0, 999) | st.sampled_from(["uri", "disabled"]))
def test_write_back_keeps_every_other_key_in_place(doc, code):
    text = json.dumps(doc)
    props = payload.parse_properties(text)
    written = payload.with_outcome(props.document, "http", code)
    assert "/" not in written.replace("\\/", "")
    round_trip = json.loads(written)
    assert round_trip["errorType"] == "http" and round_trip["errorCode"] == code
    assert type(round_trip["errorCode"]) is type(code)
    others = [(k, v) for k, v in round_trip.items() if k not in ("errorType", "errorCode")]
    assert others == [(k, v) for k, v in doc.items() if k not in ("errorType", "errorCode")]
    if "errorCode" in doc:
        # Replaced in place, not moved to the end.
        assert list(round_trip).index("errorCode") == list(doc).index("errorCode")
