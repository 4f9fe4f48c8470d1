"""Phorge's ``gorge`` mail adapter -> gorge-mailer over HTTPS: the real
twistd daemon serving a certificate from a CA made here, the adapter trusting
that CA through its ``ca-bundle`` option; the wrong CA, or none, refused with
a message that says what to set."""

from __future__ import annotations

import json

import pytest
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.web.client import Agent

from gorge_testing.phorge import BOUND, STEP
from tests.phorge.switched import gorge_mailer_entry
from tests.support.certs import PrivateCA, TrustOnly

pytestmark = [pytest.mark.phorge, pytest.mark.integration, pytest.mark.slow]


async def ready_over_https(daemon, ca_path: str) -> None:
    """Poll /readyz over HTTPS, trusting the test's CA only, within the bound."""
    agent = Agent(reactor, contextFactory=TrustOnly(ca_path))
    url = f"https://127.0.0.1:{daemon.port}/readyz"
    deadline = reactor.seconds() + BOUND
    last = "no answer"
    while True:
        daemon.require_alive()
        try:
            response = await treq.get(url, agent=agent, timeout=10)
            await response.content()
            if response.code == 200:
                return
            last = f"HTTP {response.code}"
        except Exception as exc:  # noqa: BLE001 - not listening yet
            last = repr(exc)
        if reactor.seconds() > deadline:
            raise AssertionError(f"gorge-mailer not ready over HTTPS ({last})")
        await deferLater(reactor, STEP)


async def send_test(switched, to: str, subject: str):
    status, out, err = await switched.site.bin(
        "mail", "send-test", "--to", to, "--subject", subject, stdin=b"over TLS", check=False
    )
    row = switched.site.rows("metamta", "SELECT * FROM metamta_mail ORDER BY id DESC LIMIT 1")[0]
    return status, row


@pytest.mark.parametrize("switched", ["executors"], indirect=True)
async def test_the_adapter_reaches_gorge_mailer_over_https_with_a_private_ca(switched, tmp_path):
    ca = PrivateCA()
    ca_path = ca.write(tmp_path / "ca.pem")
    other_ca = PrivateCA("not the mailer's CA").write(tmp_path / "other-ca.pem")
    cert, key = ca.issue(tmp_path / "mailer.pem", tmp_path / "mailer-key.pem")
    await switched.gorge.stop("mailer")
    daemon = switched.gorge.start("mailer", GORGE_TLS_CERT=cert, GORGE_TLS_KEY=key)
    uri = f"https://127.0.0.1:{daemon.port}"
    entry = gorge_mailer_entry(uri)
    try:
        await ready_over_https(daemon, ca_path)

        entry["options"]["ca-bundle"] = ca_path
        switched.site.configure({"cluster.mailers": [entry]})
        status, row = await send_test(switched, "tls@example.com", "over https")
        assert status == 0, row["message"]
        assert row["status"] == "sent"
        [delivery] = switched.deliveries_to("tls@example.com")
        assert b"over https" in delivery.data

        entry["options"]["ca-bundle"] = other_ca
        switched.site.configure({"cluster.mailers": [entry]})
        status, row = await send_test(switched, "wrong-ca@example.com", "wrong CA")
        assert status != 0
        assert row["status"] == "queued"  # a temporary failure: fixed, it is sent
        message = row["message"]
        assert f'gorge-mailer at "{uri}/api/mailer/send"' in message
        assert "TLS certificate was not accepted" in message and "cURL error 60" in message
        assert f'option "ca-bundle" ({other_ca})' in message

        del entry["options"]["ca-bundle"]
        switched.site.configure({"cluster.mailers": [entry]})
        status, row = await send_test(switched, "system-cas@example.com", "system CAs")
        assert status != 0 and row["status"] == "queued"
        assert "system's CAs" in row["message"] and 'set option "ca-bundle"' in row["message"]

        entry["options"]["ca-bundle"] = str(tmp_path / "missing.pem")
        switched.site.configure({"cluster.mailers": [entry]})
        status, row = await send_test(switched, "no-file@example.com", "no bundle file")
        assert status != 0 and row["status"] == "queued"
        assert "missing.pem" in row["message"] and "not a readable file" in row["message"]

        assert switched.deliveries_to("wrong-ca@example.com") == []
        assert switched.deliveries_to("system-cas@example.com") == []
    finally:
        switched.site.configure(
            {"cluster.mailers": [gorge_mailer_entry(switched.gorge.mailer_uri)]}
        )
        await switched.gorge.stop("mailer")
        await switched.gorge.start_ready("mailer")


@pytest.mark.parametrize("switched", ["executors"], indirect=True)
async def test_bin_config_refuses_a_ca_bundle_for_plain_http_or_a_relative_path(switched):
    for options, words in (
        ({"uri": "http://127.0.0.1:8110", "ca-bundle": "/etc/ca.pem"}, "only used with an https"),
        ({"uri": "https://127.0.0.1:8110", "ca-bundle": "ca.pem"}, "absolute path"),
    ):
        entry = {"key": "g", "type": "gorge", "options": options}
        status, out, err = await switched.site.bin(
            "config", "set", "--database", "cluster.mailers", json.dumps([entry]), check=False
        )
        assert status != 0
        assert 'Option "ca-bundle"' in out + err and words in out + err
