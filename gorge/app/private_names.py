"""Every private name of Twisted, treq and Klein that gorge reads, and
nowhere else.

Each one saves real work that no public interface offers; each is read
defensively (a missing name takes the slower public path, or gives no
answer, never a crash), and tests/app/test_private_names.py names each one
so that an upgrade that removes it fails there, with its name, rather than
quietly making gorge slower or vaguer.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PRIVATE_NAMES",
    "body_consumer_transport",
    "klein_url_map",
    "next_iteration",
    "stub_server_factory",
    "unsent_writes",
]

#: (where, name) of each private name read here, for the test that checks them.
PRIVATE_NAMES = (
    ("twisted.internet.abstract.FileDescriptor", "_tempDataBuffer"),
    ("twisted.web._newclient.LengthEnforcingConsumer", "_consumer"),
    ("treq.testing.RequestTraversalAgent", "_serverFactory"),
    ("treq.testing.StubTreq", "_agent"),
    ("klein.resource.KleinResource", "_app"),
    # Not underscored, but not documented either: the pending DelayedCall.
    ("twisted.internet.task.LoopingCall", "call"),
)


def unsent_writes(transport: Any) -> list[bytes] | None:
    """The writes a TCP transport has queued for the reactor's next turn
    (``FileDescriptor._tempDataBuffer``), or None if it keeps none under
    that name: then a caller must treat the transport as busy."""
    return getattr(transport, "_tempDataBuffer", None)


def body_consumer_transport(consumer: Any) -> Any:
    """The transport beneath the consumer an ``Agent`` hands a body producer
    (twisted.web's ``LengthEnforcingConsumer`` keeps it as ``_consumer``), or
    the consumer itself."""
    return getattr(consumer, "_consumer", consumer)


def stub_server_factory(stub: Any) -> Any:
    """The Site a treq ``StubTreq`` dispatches through (its agent's
    ``_serverFactory``): treq builds it and offers no public way to it."""
    return stub._agent._serverFactory


def klein_url_map(resource: Any) -> Any:
    """The werkzeug URL map of the Klein app behind a ``KleinResource``
    (its ``_app``), or None for any other resource."""
    app = getattr(resource, "_app", None)
    return getattr(app, "url_map", None)


def next_iteration(loop: Any) -> Any:
    """The delayed call of a running ``LoopingCall``'s next iteration (its
    undocumented ``call``), or None: a caller that moves it runs the next
    iteration sooner."""
    return getattr(loop, "call", None)
