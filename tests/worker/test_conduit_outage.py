"""A Phorge web outage costs no task anything: a worker.execute call that
never reached PHP hands the task back uncounted, delegated classes wait
while the probe fails, and work resumes once it passes (docs/worker.md,
When Phorge's web server is down)."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import error
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, deferLater
from twisted.web.iweb import IAgent
from zope.interface import implementer

from gorge.client.failure import Cause, TransportFailure
from gorge.worker.conduit import (
    ConduitClient,
    ConduitError,
    ConduitNotReached,
    DelegationPause,
    never_reached,
)
from gorge.worker.consumer import Consumer, LoopSettings
from gorge.worker.handlers.conduit import ConduitDelegate
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.outcome import NotReached
from gorge.worker.registry import LeasePlan, Registry
from gorge.worker.service import PROBE_UNREACHED_RETRY_SEC
from tests.worker.fakes import CapturedEvents, FakeQueue, make_task, run_through_consumer
from tests.worker.rawhttp import Answer
from tests.worker.test_service import FakeQueueResource, delegating_service, readyz

TOKEN = "conduit-secret"
DELEGATED = "PhabricatorSearchWorker"
NATIVE = "NativeWorker"


def envelope(result=None, code=None, info=None) -> bytes:
    return json.dumps({"result": result, "error_code": code, "error_info": info}).encode()


# ---------------------------------------------------------------- a Phorge that misbehaves


class _Misbehaving(Protocol):
    """Reads one whole request, then does what ``mode`` says."""

    def __init__(self, mode: str) -> None:
        self._mode = mode
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        head, found, body = self._buffer.partition(b"\r\n\r\n")
        if not found:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(body) < length:
            return
        self.factory.requests += 1
        if self._mode == "close":  # closed before any answer byte
            self.transport.loseConnection()
        elif self._mode == "reset":  # an RST before any answer byte
            self.transport.abortConnection()
        elif self._mode == "head-cut":  # the answer had started
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Ty")
            self.transport.loseConnection()
        elif self._mode == "body-cut":
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b'Content-Length: 500\r\n\r\n{"result":'
            )
            self.transport.loseConnection()
        elif self._mode == "head-then-hang":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{")
        # "hang": nothing at all


class Misbehaving(Factory):
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0

    def buildProtocol(self, addr):
        protocol = _Misbehaving(self.mode)
        protocol.factory = self
        return protocol


@pytest.fixture
def phorge(reactor):
    """Start a misbehaving Phorge on 127.0.0.1; its base URL and factory."""
    ports = []

    def start(mode: str) -> tuple[str, Misbehaving]:
        factory = Misbehaving(mode)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        ports.append(port)
        return f"http://127.0.0.1:{port.getHost().port}", factory

    yield start
    for port in ports:
        pytest_twisted.blockon(port.stopListening())


@pytest.fixture
def refusing(reactor):
    """A base URL on 127.0.0.1 where nothing listens any more."""
    port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
    url = f"http://127.0.0.1:{port.getHost().port}"
    pytest_twisted.blockon(port.stopListening())
    return url


@implementer(IAgent)
class TimingOutAgent:
    """Every request ends in the connect timeout, before any answer."""

    def request(self, method, uri, headers=None, bodyProducer=None):
        return fail(error.TimeoutError())


async def _execute(client: ConduitClient) -> object:
    return await Deferred.fromCoroutine(client.execute(12, DELEGATED, "{}"))


# ---------------------------------------------------------------- what "never reached" is


@pytest.mark.parametrize(
    "cause, submitted, reached",
    [
        (Cause.REFUSED, False, False),
        (Cause.CONNECT, False, False),
        (Cause.DNS, False, False),
        (Cause.TIMED_OUT, False, False),
        (Cause.NOT_SENT, False, False),
        (Cause.SEND_FAILED, False, False),
        (Cause.EMPTY_REPLY, True, False),
        (Cause.RESET, True, False),
        (Cause.TLS, False, False),
        # The handshake had completed and the request gone: PHP may have it.
        (Cause.TLS, True, True),
        # PHP may be running the task: the lease deadline, a cancel, an answer begun.
        (Cause.DEADLINE, True, True),
        (Cause.CANCELLED, True, True),
        (Cause.HEAD_CUT, True, True),
        (Cause.BODY_CUT, True, True),
        (Cause.OTHER, True, True),
    ],
)
def test_which_transport_failures_never_reached_php(cause, submitted, reached):
    assert never_reached(TransportFailure(cause, submitted=submitted)) is not reached


@pytest.mark.parametrize("mode", ["close", "reset"])
@pytest_twisted.ensureDeferred
async def test_a_connection_that_ends_before_any_answer_byte_never_reached(
    mode, reactor, http_client, phorge
):
    base, factory = phorge(mode)
    with pytest.raises(ConduitNotReached, match="connection"):
        await _execute(ConduitClient(http_client, reactor, base, TOKEN))
    assert factory.requests == 1


@pytest_twisted.ensureDeferred
async def test_refused_and_connect_timeout_never_reached(reactor, http_client, refusing):
    with pytest.raises(ConduitNotReached, match="connection refused"):
        await _execute(ConduitClient(http_client, reactor, refusing, TOKEN))
    with pytest.raises(ConduitNotReached, match="timed out"):
        await _execute(ConduitClient(TimingOutAgent(), reactor, "http://phorge", TOKEN))


@pytest.mark.parametrize("status", [502, 503, 504])
@pytest_twisted.ensureDeferred
async def test_a_proxys_5xx_never_reached(status, reactor, http_client, raw_server):
    proxy_says = envelope(code="ERR-CONDUIT-PROXY", info="Upstream request failed.")
    server, base = raw_server(Answer(status=status, body=proxy_says))
    with pytest.raises(ConduitNotReached) as info:
        await _execute(ConduitClient(http_client, reactor, base, TOKEN))
    assert str(info.value).startswith(f"HTTP {status} from a proxy in front of PHP: ")
    assert "ERR-CONDUIT-PROXY" in str(info.value)


@pytest.mark.parametrize("mode", ["head-cut", "body-cut"])
@pytest_twisted.ensureDeferred
async def test_an_answer_that_had_started_is_a_failure_as_before(
    mode, reactor, http_client, phorge
):
    base, _ = phorge(mode)
    with pytest.raises(ConduitError) as info:
        await _execute(ConduitClient(http_client, reactor, base, TOKEN))
    assert not isinstance(info.value, ConduitNotReached)


@pytest.mark.parametrize("mode", ["hang", "head-then-hang"])
@pytest_twisted.ensureDeferred
async def test_the_lease_deadline_cancel_stays_a_cancel(mode, reactor, http_client, phorge):
    base, factory = phorge(mode)
    client = ConduitClient(http_client, reactor, base, TOKEN)
    call = Deferred.fromCoroutine(client.execute(12, DELEGATED, "{}"))
    while factory.requests == 0:
        await deferLater(reactor, 0.01)
    await deferLater(reactor, 0.05)  # the head of "head-then-hang" has arrived
    call.cancel()
    with pytest.raises(CancelledError):
        await call


@pytest_twisted.ensureDeferred
async def test_the_probe_says_whether_it_reached_php(
    reactor, http_client, refusing, raw_server, phorge
):
    refused = await Deferred.fromCoroutine(
        ConduitClient(http_client, reactor, refusing, TOKEN).check()
    )
    assert (refused.reason, refused.reached) == ("http: connection refused", False)
    _, base = raw_server(Answer(status=503, body=b"<html>busy</html>"))
    busy = await Deferred.fromCoroutine(ConduitClient(http_client, reactor, base, TOKEN).check())
    assert (busy.reason, busy.reached) == (
        "HTTP 503 from a proxy in front of PHP: <html>busy</html>",
        False,
    )
    # A timeout once the answer had started: PHP was there.
    base, _ = phorge("head-then-hang")
    slow = await Deferred.fromCoroutine(
        ConduitClient(http_client, reactor, base, TOKEN).check(timeout=0.2)
    )
    assert slow.reason == "http: deadline reached" and slow.reached


# ---------------------------------------------------------------- through the consumer

NEVER_REACHED = ["refused", "close", "reset", "502", "503", "504", "connect-timeout"]


@pytest.mark.parametrize("case", NEVER_REACHED)
@pytest_twisted.ensureDeferred
async def test_never_reached_is_handed_back_with_no_failure_counted(
    case, reactor, http_client, refusing, phorge, raw_server
):
    agent = http_client
    if case == "refused":
        base = refusing
    elif case in ("close", "reset"):
        base, _ = phorge(case)
    elif case == "connect-timeout":
        agent, base = TimingOutAgent(), "http://phorge"
    else:
        _, base = raw_server(Answer(status=int(case), body=b"Bad Gateway"))
    registry = Registry()
    registry.set_fallback(ConduitDelegate(ConduitClient(agent, reactor, base, TOKEN)))
    task = make_task(12, DELEGATED, expires=None, failure_count=2)
    report, consumer = await run_through_consumer(reactor, registry, task)
    # A yield: the queue counts no failure, and the task is leasable again soon.
    assert (report.kind, report.task_id, report.args["duration"]) == ("yield", 12, 5)
    assert (consumer.counters.failed, consumer.counters.yielded) == (0, 0)


@pytest.mark.parametrize(
    "answer",
    [
        Answer(status=500, body=b"<html>Fatal error</html>", content_type="text/html"),
        Answer(body=envelope(code="ERR-CONDUIT-CORE", info="boom")),
    ],
    ids=["php-500", "error-envelope"],
)
@pytest_twisted.ensureDeferred
async def test_an_answer_from_php_is_still_a_temporary_failure(
    answer, reactor, http_client, raw_server
):
    _, base = raw_server(answer)
    registry = Registry()
    registry.set_fallback(ConduitDelegate(ConduitClient(http_client, reactor, base, TOKEN)))
    task = make_task(12, DELEGATED, expires=None)
    report, consumer = await run_through_consumer(reactor, registry, task)
    assert (report.kind, report.args["permanent"]) == ("fail", False)
    assert consumer.counters.failed == 1


# ---------------------------------------------------------------- pausing, on a clock


class Delegate:
    """Stands for the Conduit delegate: refuses while ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.calls: list[int] = []

    async def __call__(self, task: dict, data: str | None) -> None:
        self.calls.append(task["id"])
        if self.down:
            raise NotReached(f"conduit worker.execute for id={task['id']} not reached")


class Outage:
    """A consumer on a clock with one native class and a fallback delegate."""

    def __init__(self, *, native: bool = True, **loop) -> None:
        self.clock = Clock()
        self.queue = FakeQueue()
        self.delegate = Delegate()
        self.native_ran: list[int] = []
        registry = Registry()
        if native:
            registry.register(NATIVE, lambda task, data: self.native_ran.append(task["id"]))
            registry.set_fallback(self.delegate)
        else:
            registry.register(DELEGATED, self.delegate)
        self.rechecks = 0
        self.pause = DelegationPause(self.clock, lambda name: registry.get(name) is self.delegate)
        self.pause.recheck_with(self._recheck)
        self.metrics = CollectorRegistry()
        self.consumer = Consumer(
            queue=self.queue,
            registry=registry,
            plan=LeasePlan(registry, ()),
            clock=self.clock,
            settings=LoopSettings(**{"poll_interval": 1.0, **loop}),
            metrics=WorkerMetrics(self.metrics),
            delegation=self.pause,
        )

    def _recheck(self) -> None:
        self.rechecks += 1

    def task(self, task_id: int, task_class: str) -> dict:
        return make_task(task_id, task_class, expires=int(self.clock.seconds()) + 3600)

    def run_for(self, seconds: float) -> None:
        for _ in range(int(seconds * 8)):
            self.clock.advance(0.125)

    def handed_back(self) -> float | None:
        return self.metrics.get_sample_value(
            "gorge_worker_tasks_total", {"task_class": DELEGATED, "outcome": "handed_back"}
        )


def test_a_call_that_never_reached_php_pauses_delegation_at_once():
    outage = Outage()
    outage.delegate.down = True
    outage.queue.waiting = [outage.task(1, DELEGATED), outage.task(2, DELEGATED)]
    with CapturedEvents() as captured:
        outage.consumer.start()
        outage.run_for(1.5)
    assert [(r.kind, r.task_id, r.args["duration"]) for r in outage.queue.reports] == [
        ("yield", 1, 5),
        ("yield", 2, 5),
    ]
    assert outage.consumer.counters.failed == 0 and outage.consumer.counters.yielded == 0
    assert outage.handed_back() == 2
    # The first refusal paused delegation: the second task went back unrun.
    assert outage.delegate.calls == [1]
    assert outage.pause.paused and outage.rechecks == 1  # the probe looks again soon
    (paused,) = captured.named("WORKER_DELEGATION_PAUSED")
    assert paused["reason"] == "conduit worker.execute for id=1 not reached"
    assert outage.pause.readiness_reason() == (
        "conduit: conduit worker.execute for id=1 not reached; delegated classes paused"
    )


def test_while_paused_only_native_classes_are_leased_and_work_resumes_after_a_pass():
    outage = Outage(lease_wait=20.0)
    with CapturedEvents() as captured:
        outage.pause.probed("http: connection refused")
        outage.consumer.start()
        outage.run_for(1.0)
        # The fallback asks for every class; paused, only for the native one,
        # and never held, so the call after the resume goes out in time.
        assert outage.queue.leases[-1] == (4, [NATIVE]) and outage.queue.lease_waits[-1] == 0
        # The queue hands out a delegated task anyway: back, unrun, uncounted.
        outage.queue.arrive(outage.task(1, NATIVE), outage.task(2, DELEGATED))
        outage.run_for(10.0)
        assert outage.native_ran == [1] and outage.delegate.calls == []
        assert [(r.kind, r.task_id) for r in outage.queue.reports] == [
            ("complete", 1),
            ("yield", 2),
        ]
        assert outage.queue.reports[1].args["duration"] == 5
        assert outage.handed_back() == 1 and outage.consumer.counters.failed == 0
        assert all(classes == [NATIVE] for _, classes in outage.queue.leases)
        leases_while_paused = len(outage.queue.leases)
        assert leases_while_paused >= 10  # one per poll interval, each logged by no line

        outage.pause.probed(None)
        outage.queue.arrive(outage.task(3, DELEGATED))
        outage.run_for(1.0)
    assert outage.queue.leases[leases_while_paused][1] is None  # every class again
    assert outage.delegate.calls == [3]
    assert outage.queue.reports[-1].kind == "complete"
    assert len(captured.named("WORKER_DELEGATION_PAUSED")) == 1
    (resumed,) = captured.named("WORKER_DELEGATION_RESUMED")
    assert resumed["paused_sec"] >= 11.0


def test_with_every_class_delegated_nothing_is_leased_while_paused():
    outage = Outage(native=False)
    outage.pause.probed("http: connection refused")
    outage.consumer.start()
    outage.run_for(5.0)
    assert outage.queue.leases == []
    assert outage.consumer.first_lease_done.called  # READY is not Phorge's to hold
    outage.pause.probed(None)
    outage.run_for(1.0)
    assert outage.queue.leases == [(4, [DELEGATED])]


# ---------------------------------------------------------------- the assembled service


class SwitchedPhorge(FakeQueueResource):
    """The fake queue and a Phorge whose proxy answers 503 while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.lease_bodies: list[dict] = []

    def render(self, request):
        if request.path == b"/api/queue/lease":
            self.lease_bodies.append(json.loads(request.content.read() or b"{}"))
        if request.path == b"/api/worker.execute" and self.down:
            self.seen.append(request.path)
            request.setResponseCode(503)
            return b"<html>Service Unavailable</html>"
        return super().render(request)


def test_the_service_pauses_retries_every_few_seconds_and_resumes():
    phorge = SwitchedPhorge()
    svc, clock, _, stub = delegating_service(
        phorge, GORGE_WORKER_CONDUIT_PROBE_SEC="3600", GORGE_WORKER_LEASE_WAIT_SEC="0"
    )
    probe, consumer = svc.part("conduit-probe"), svc.part("consumer")
    probe.start()
    consumer.start()
    clock.advance(1.0)
    stub.flush()
    assert readyz(svc.part("site")) == (200, {"status": "ok"})
    assert "taskClasses" not in phorge.lease_bodies[-1]  # the fallback: every class

    phorge.down = True
    with CapturedEvents() as captured:
        # What a task's call that never reached PHP does.
        probe.pause.not_reached("http: connection refused")
        probes: list[float] = []
        for _ in range(20):
            phorge.seen.clear()
            clock.advance(1.0)
            stub.flush()
            probes.extend(clock.seconds() for p in phorge.seen if p == b"/api/worker.execute")
        # Quick retries at 2 s, 4 s, then at most PROBE_UNREACHED_RETRY_SEC apart.
        assert probes[:3] == [3.0, 7.0, 7.0 + PROBE_UNREACHED_RETRY_SEC]
        assert [b - a for a, b in zip(probes[2:], probes[3:], strict=False)] == [
            PROBE_UNREACHED_RETRY_SEC
        ] * (len(probes) - 3)
        assert readyz(svc.part("site")) == (
            503,
            {
                "status": "unavailable",
                "reason": "conduit: HTTP 503 from a proxy in front of PHP: "
                "<html>Service Unavailable</html>; delegated classes paused",
            },
        )
        assert phorge.lease_bodies[-1]["taskClasses"] == [
            "FeedPublisherHTTPWorker",
            "HeraldWebhookWorker",
        ]
        phorge.down = False
        for _ in range(int(PROBE_UNREACHED_RETRY_SEC) + 1):
            clock.advance(1.0)
            stub.flush()
    assert readyz(svc.part("site")) == (200, {"status": "ok"})
    assert "taskClasses" not in phorge.lease_bodies[-1]
    assert len(captured.named("WORKER_DELEGATION_PAUSED")) == 1
    assert len(captured.named("WORKER_DELEGATION_RESUMED")) == 1
    # One probe line per change of reason, not one per retry.
    assert len(captured.named("WORKER_CONDUIT_PROBE_FAILED")) == 1
    probe.stop()
    Deferred.fromCoroutine(consumer.stop())
