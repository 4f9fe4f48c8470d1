"""Each private Twisted, treq or Klein name gorge reads (all of them in
gorge/app/private_names.py) still means what gorge takes it to mean. A test
here that fails after an upgrade names the one that changed: gorge goes on
working without it, only slower or vaguer, until private_names.py is
adapted."""

from __future__ import annotations

import importlib

import pytest
from klein import Klein
from treq.testing import StubTreq
from twisted.internet import abstract, task
from twisted.internet.defer import Deferred
from twisted.internet.testing import MemoryReactor
from twisted.web.resource import Resource
from twisted.web.server import Site

from gorge.app import private_names


def _gone(where: str, name: str) -> str:
    return (
        f"{where} no longer has {name!r} as gorge.app.private_names reads it: "
        "adapt that module to this release"
    )


def test_every_private_name_is_tested_here():
    tested = {
        ("twisted.internet.abstract.FileDescriptor", "_tempDataBuffer"),
        ("twisted.web._newclient.LengthEnforcingConsumer", "_consumer"),
        ("treq.testing.RequestTraversalAgent", "_serverFactory"),
        ("treq.testing.StubTreq", "_agent"),
        ("klein.resource.KleinResource", "_app"),
        ("twisted.internet.task.LoopingCall", "call"),
    }
    assert set(private_names.PRIVATE_NAMES) == tested


@pytest.mark.parametrize("where,name", private_names.PRIVATE_NAMES)
def test_each_class_still_exists(where, name):
    module, _, cls = where.rpartition(".")
    assert hasattr(importlib.import_module(module), cls), f"{where} is gone"


def test_file_descriptor_queues_writes_in_temp_data_buffer():
    transport = abstract.FileDescriptor(reactor=MemoryReactor())
    transport.connected = True
    assert private_names.unsent_writes(transport) == [], _gone("FileDescriptor", "_tempDataBuffer")
    transport.write(b"queued")
    assert private_names.unsent_writes(transport) == [b"queued"], _gone(
        "FileDescriptor", "_tempDataBuffer"
    )


def test_length_enforcing_consumer_keeps_its_transport_in_consumer():
    from twisted.web._newclient import LengthEnforcingConsumer

    class Producer:
        length = 0

    transport = object()
    consumer = LengthEnforcingConsumer(Producer(), transport, Deferred())
    assert private_names.body_consumer_transport(consumer) is transport, _gone(
        "LengthEnforcingConsumer", "_consumer"
    )


def test_stub_treq_dispatches_through_its_agents_server_factory():
    try:
        factory = private_names.stub_server_factory(StubTreq(Resource()))
    except AttributeError:
        raise AssertionError(_gone("StubTreq", "_agent._serverFactory")) from None
    assert isinstance(factory, Site), _gone("StubTreq", "_agent._serverFactory")


def test_klein_resource_keeps_its_app():
    app = Klein()

    @app.route("/x", methods=["POST"])
    def x(request):
        return b""

    url_map = private_names.klein_url_map(app.resource())
    assert url_map is app.url_map, _gone("KleinResource", "_app")
    assert private_names.klein_url_map(Resource()) is None


def test_looping_call_keeps_its_next_iteration_in_call():
    clock = task.Clock()
    ran: list[float] = []
    loop = task.LoopingCall(lambda: ran.append(clock.seconds()))
    loop.clock = clock
    loop.start(10, now=False)
    call = private_names.next_iteration(loop)
    assert call is not None and call.active(), _gone("LoopingCall", "call")
    call.reset(0)
    clock.advance(0)
    assert ran == [0.0], _gone("LoopingCall", "call")
    loop.stop()
