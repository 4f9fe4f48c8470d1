"""No provider credential reaches a log event, a repr or an outcome cause,
whatever the provider answers (platform logging rules)."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.logger import formatEvent

from gorge.mailer.backends import mailgun, postmark, sendgrid, ses
from gorge.mailer.outcome import Kind
from tests.mailer.test_providers_support import LoopbackServer, Scripted, entry, full_message
from tests.support.logcapture import logged_events

SECRET = "Zq9-credential-4711"

BUILDERS = {
    "sendgrid": (sendgrid.build, {"api-key": SECRET}),
    "mailgun": (mailgun.build, {"api-key": SECRET, "domain": "mg.example.com"}),
    "postmark": (postmark.build, {"access-token": SECRET}),
    "ses": (ses.build, {"access-key": "AKID", "secret-key": SECRET}),
}


@pytest.mark.parametrize("provider", sorted(BUILDERS))
@pytest_twisted.ensureDeferred
async def test_credentials_stay_out_of_logs_reprs_and_causes(provider):
    from twisted.internet import reactor

    with logged_events() as events:
        async with LoopbackServer(reactor) as server:
            build, options = BUILDERS[provider]
            backend = build(
                entry(provider, key="k", endpoint=server.url, **options),
                reactor=reactor,
                http_client=server.client,
            )
            outcomes = []
            for status in (401, 400, 422, 500, 503, 200):
                # A provider that echoes the credential back in its error text.
                server.answer = Scripted(status, f"denied for {SECRET}".encode())
                outcomes.append(await backend.send(full_message(), deadline=reactor.seconds() + 10))

    assert len(server.requests) == 6
    assert {o.kind for o in outcomes} - {Kind.ACCEPTED} <= {
        Kind.REJECTED_BACKEND,
        Kind.REJECTED_UNSCOPED,
        Kind.UNKNOWN,
        Kind.TRANSIENT,
    }
    assert any(o.kind is Kind.REJECTED_BACKEND for o in outcomes)
    for outcome in outcomes:
        assert SECRET not in repr(outcome)
    assert SECRET not in repr(backend)
    for event in events:
        assert SECRET not in (formatEvent(event) or "")
        assert SECRET not in repr(event)
