"""Webhook test harness: a real receiver on 127.0.0.1, a herald database, a dispatcher."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import defer, reactor, task
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web import resource, server

from gorge.config import HttpSettings, MySQLSettings
from gorge.webhook.service import build_webhook_service
from gorge.webhook.settings import WebhookSettings
from gorge.webhook.store import WebhookStore

# Golden captures were taken around this second; tests start their clocks here.
T0 = 1_795_946_900


@dataclass
class Received:
    path: str
    headers: dict[str, list[str]]
    body: bytes
    peer_port: int = 0  # the sender's side of the connection
    answered: bool = False


class _ReceiverResource(resource.Resource):
    isLeaf = True

    def __init__(self, owner: Receiver) -> None:
        super().__init__()
        self._owner = owner

    def render_POST(self, request):
        path = request.path.decode("latin-1")
        headers = {
            k.decode().lower(): [v.decode("latin-1") for v in vs]
            for k, vs in request.requestHeaders.getAllRawHeaders()
        }
        got = Received(path, headers, request.content.read(), request.getClientAddress().port)
        self._owner.requests.append(got)
        status = 200
        if "/status/" in path:
            status = int(path.rsplit("/status/", 1)[1].split("/")[0])
        if path.startswith("/redirect/"):
            # /redirect/<code>/<location, URL-quoted>
            from urllib.parse import unquote

            _, _, code, location = path.split("/", 3)
            status = int(code)
            request.setHeader(b"location", unquote(location).encode())
        if "/after/" in path:  # /status/429/after/<Retry-After value, URL-quoted>
            from urllib.parse import unquote

            request.setHeader(b"retry-after", unquote(path.split("/after/", 1)[1]).encode())
        request.setResponseCode(status)
        owner = self._owner
        owner.active[path] = owner.active.get(path, 0) + 1
        owner.peak_total = max(owner.peak_total, sum(owner.active.values()))
        owner.peak_per_path = max(owner.peak_per_path, owner.active[path])
        owner.arrived(path)
        gate = owner.hold_until_arrived.get(path)
        if owner.delay <= 0 and gate is None:
            owner.active[path] -= 1
            got.answered = True
            return b"ok"

        gone = []
        request.notifyFinish().addErrback(lambda _: gone.append(True))

        def answer(_):
            owner.active[path] -= 1
            got.answered = True
            if not request.finished and not gone:
                request.write(b"ok")
                request.finish()

        opened = owner.when_arrived(gate) if gate is not None else defer.succeed(None)
        opened.addCallback(lambda _: deferLater(reactor, max(owner.delay, 0.0)))
        opened.addCallback(answer)
        return server.NOT_DONE_YET


class Receiver:
    """Records every POST; ``/status/NNN`` in the path picks the answer, like the golden one
    (``/status/NNN/after/VALUE`` adds ``Retry-After: VALUE``)."""

    def __init__(self, tls_options=None) -> None:
        self.requests: list[Received] = []
        self.delay = 0.0
        self.active: dict[str, int] = {}
        self.peak_total = 0
        self.peak_per_path = 0
        # path -> another path: the answers to the first wait until the second
        # has arrived, so two deliveries overlap whatever the machine's speed.
        self.hold_until_arrived: dict[str, str] = {}
        self._arrival_waiters: dict[str, list[defer.Deferred]] = {}
        site = server.Site(_ReceiverResource(self))
        site.noisy = False
        site.log = lambda request: None  # the receiver's own access log is not ours to check
        if tls_options is None:
            self.port = reactor.listenTCP(0, site, interface="127.0.0.1")
        else:
            self.port = reactor.listenSSL(0, site, tls_options, interface="127.0.0.1")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}"

    def arrived(self, path: str) -> None:
        for waiter in self._arrival_waiters.pop(path, []):
            waiter.callback(None)

    def when_arrived(self, path: str) -> defer.Deferred:
        if any(r.path == path for r in self.requests):
            return defer.succeed(None)
        waiter: defer.Deferred = defer.Deferred()
        self._arrival_waiters.setdefault(path, []).append(waiter)
        return waiter

    def count(self, path: str | None = None) -> int:
        return sum(1 for r in self.requests if path is None or r.path == path)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    pytest_twisted.blockon(r.port.stopListening())


def webhook_settings(mysql: MySQLSettings, **overrides: Any) -> WebhookSettings:
    values: dict[str, Any] = dict(
        http=HttpSettings(listen_addr="127.0.0.1:0", endpoint="tcp:0:interface=127.0.0.1"),
        mysql=mysql,
        poll_interval=1.0,
        delivery_timeout=15,
        max_concurrent=8,
        breaker_window=300,
        breaker_threshold=10,
        retry_backoff=60,
        claim_lease=30,
        outbound_blacklist=(),
    )
    values.update(overrides)
    return WebhookSettings(**values)


def daemon_env(mariadb, namespace: str) -> dict[str, str]:
    """The environment of a ``gorge-webhook`` process working ``namespace`` on
    the test MariaDB, on a free port, polling every 100 ms."""
    return {
        "GORGE_LISTEN_ADDR": "127.0.0.1:0",
        "GORGE_WEBHOOK_MYSQL_HOST": mariadb.host,
        "GORGE_WEBHOOK_MYSQL_PORT": str(mariadb.port),
        "GORGE_WEBHOOK_MYSQL_USER": mariadb.user,
        "GORGE_WEBHOOK_MYSQL_PASS": mariadb.password,
        "GORGE_WEBHOOK_NAMESPACE": namespace,
        "GORGE_WEBHOOK_POLL_INTERVAL_MS": "100",
    }


_phid_serial = count(1)


class HeraldDB:
    """Synchronous set-up and assertions on one herald database."""

    def __init__(self, mariadb, name: str) -> None:
        self.mariadb = mariadb
        self.name = name
        self.conn = mariadb.connect(name)

    def execute(self, sql: str, params: tuple = ()) -> int:
        with self.conn.cursor() as cur:
            return cur.execute(sql, params)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def insert_hook(
        self,
        *,
        uri: str,
        phid: str | None = None,
        status: str = "enabled",
        key: str = "k" * 32,
        name: str = "hook",
        row: dict | None = None,
    ) -> str:
        if row is not None:
            values = dict(row, webhookURI=uri)
        else:
            phid = phid or f"PHID-HWBH-{next(_phid_serial):020d}"
            values = dict(
                phid=phid,
                name=name,
                webhookURI=uri,
                viewPolicy="users",
                editPolicy="users",
                status=status,
                hmacKey=key,
                dateCreated=T0,
                dateModified=T0,
            )
        values.pop("id", None)
        columns = ", ".join(values)
        marks = ", ".join(["%s"] * len(values))
        self.execute(
            f"INSERT INTO herald_webhook ({columns}) VALUES ({marks})", tuple(values.values())
        )
        return values["phid"]

    def insert_request(
        self,
        *,
        hook: str | None = None,
        row: dict | None = None,
        properties: Any = None,
        created: int = T0,
        modified: int | None = None,
        object_phid: str = "PHID-TASK-abcdefghijklmnopqrst",
        status: str = "queued",
        result: str = "none",
        epoch: int = 0,
    ) -> int:
        if row is not None:
            values = dict(row)
            values.pop("id", None)
        else:
            if properties is None:
                properties = {
                    "retry": "never",
                    "transactionPHIDs": [],
                    "triggerPHIDs": [],
                    "silent": False,
                    "secure": False,
                }
            text = (
                properties
                if isinstance(properties, str)
                else json.dumps(properties, separators=(",", ":"))
            )
            values = dict(
                phid=f"PHID-HWBR-{next(_phid_serial):020d}",
                webhookPHID=hook,
                objectPHID=object_phid,
                status=status,
                properties=text,
                lastRequestResult=result,
                lastRequestEpoch=epoch,
                dateCreated=created,
                dateModified=created if modified is None else modified,
            )
        columns = ", ".join(values)
        marks = ", ".join(["%s"] * len(values))
        with self.conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO herald_webhookrequest ({columns}) VALUES ({marks})",
                tuple(values.values()),
            )
            return cur.lastrowid

    def request(self, request_id: int) -> dict:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT id, phid, webhookPHID, objectPHID, status, properties,"
                " lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
                " FROM herald_webhookrequest WHERE id = %s",
                (request_id,),
            )
            row = cur.fetchone()
            names = [d[0] for d in cur.description]
        out = dict(zip(names, row, strict=True))
        for key in ("phid", "webhookPHID", "objectPHID"):
            if isinstance(out[key], bytes):
                out[key] = out[key].decode()
        return out

    def status_counts(self) -> dict[str, int]:
        return dict(
            self.query("SELECT status, COUNT(*) FROM herald_webhookrequest GROUP BY status")
        )

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def herald(mariadb, herald_db):
    db = HeraldDB(mariadb, herald_db)
    yield db
    db.close()


@dataclass
class Harness:
    """A webhook service built in-process (not started): drive ``tick()`` by hand."""

    service: Any
    clock: task.Clock
    registry: CollectorRegistry
    extra: list = field(default_factory=list)

    @property
    def dispatcher(self):
        return self.service.part("dispatcher")

    @property
    def store(self) -> WebhookStore:
        return self.service.part("store")

    async def run_tick(self, timeout: float = 20.0) -> None:
        """One poll, then wait (bounded, on the real reactor) for what it started."""
        await Deferred.fromCoroutine(self.dispatcher.tick())
        assert await self.dispatcher.wait_idle(timeout, reactor), "deliveries did not finish"

    def metric(self, name: str, **labels) -> float:
        value = self.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value

    async def close(self) -> None:
        await Deferred.fromCoroutine(self.service.part("transport").close())
        self.service.part("store").close()


@pytest.fixture
def make_harness(mariadb, herald_db):
    made: list[Harness] = []

    def make(
        *,
        clock: task.Clock | None = None,
        db_clock: task.Clock | None = None,
        resolver=None,
        http_client=None,
        **overrides,
    ) -> Harness:
        """``db_clock``: the database's own clock, when it is not the daemon's."""
        clock = clock or task.Clock()
        if clock.seconds() == 0:
            clock.advance(T0)
        settings = webhook_settings(mariadb.settings(herald_db), **overrides)
        registry = CollectorRegistry()
        store = WebhookStore.mysql(settings.mysql, reactor, db_clock=db_clock or clock)
        service = build_webhook_service(
            settings,
            reactor,
            store=store,
            clock=clock,
            registry=registry,
            resolver=resolver,
            http_client=http_client,
        )
        harness = Harness(service=service, clock=clock, registry=registry)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        pytest_twisted.blockon(Deferred.fromCoroutine(harness.close()))


@pytest.fixture
def listen():
    """Serve a site on 127.0.0.1 for the test; returns its base URL."""
    ports = []

    def start(site) -> str:
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        ports.append(port)
        return f"http://127.0.0.1:{port.getHost().port}"

    yield start
    for port in ports:
        pytest_twisted.blockon(port.stopListening())


class CapturedLog(list):
    """Every log event emitted while the fixture is active."""

    def names(self) -> list[str]:
        return [(e.get("log_format") or "").split(" ", 1)[0] for e in self]

    def named(self, name: str) -> list[dict]:
        return [e for e, n in zip(self, self.names(), strict=True) if n == name]

    def rendered(self) -> str:
        from twisted.logger import formatEvent

        return "\n".join(
            formatEvent(e)
            + " "
            + repr(sorted((k, v) for k, v in e.items() if not k.startswith("log_")))
            for e in self
        )


@pytest.fixture
def captured_log():
    from twisted.logger import globalLogPublisher

    events = CapturedLog()
    globalLogPublisher.addObserver(events.append)
    yield events
    globalLogPublisher.removeObserver(events.append)
