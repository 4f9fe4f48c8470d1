"""Sending once per Idempotency-Key (gorge/mailer/idempotency.py) on a real
SQLite file: a repeated key is answered with the first answer, a key in
flight shares its send, a hang-up does not stop a keyed send, a send without
a recorded outcome is never repeated, the record outlives a restart; and the
HTTP side of it (the header, the replay mark, settings)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ClientFactory, Protocol

from gorge.app.inflight import InFlight
from gorge.config import ConfigError
from gorge.mailer.dispatcher import Answer, Dispatcher
from gorge.mailer.idempotency import ABANDON_GRACE, KeyedAnswer, KeyedSends, parse_key
from gorge.mailer.metrics import MailerMetrics
from gorge.mailer.outcome import Outcome
from gorge.mailer.sendrecords import Recorded, SendRecords, key_hash
from gorge.mailer.settings import load_mailer_settings
from tests.mailer.conftest import TOKEN, make_harness, parsed_message, valid_message

KEY = "PHID-MTAM-abcdefghijklmnopqrst"
MESSAGE = parsed_message()
SEND_TIMEOUT = 25
ACCEPTED = Answer(200, None, mailer_key="held", message_id="id-1")


@dataclass
class Held:
    """A backend whose sends wait until the test answers them; once
    :attr:`answer` is set, later sends get it at once."""

    key: str = "held"
    type: str = "fake"
    priority: int = 1
    answer: Outcome | None = None
    calls: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    cancelled: int = 0
    waiting: list[Deferred] = field(default_factory=list)

    async def send(self, message, *, deadline):
        self.calls += 1
        if self.answer is not None:
            return self.answer
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)

        def cancel(d: Deferred) -> None:
            self.cancelled += 1
            d.callback(Outcome.unknown("attempt cancelled"))

        d: Deferred = Deferred(cancel)
        self.waiting.append(d)
        try:
            return await d
        finally:
            self.in_flight -= 1

    def release(self, outcome: Outcome) -> None:
        self.answer = outcome
        while self.waiting:
            self.waiting.pop(0).callback(outcome)


def keyed_sends(path, backend, *, clock=None, db_clock=None, poll_interval=1.0) -> KeyedSends:
    metrics = MailerMetrics(CollectorRegistry())
    dispatcher = Dispatcher(
        [backend],
        clock=reactor,
        metrics=metrics,
        max_retries=0,
        retry_wait=0,
        send_timeout=SEND_TIMEOUT,
    )
    return KeyedSends(
        lambda: SendRecords.sqlite(str(path), reactor, db_clock=db_clock),
        dispatcher,
        clock=clock if clock is not None else reactor,
        metrics=metrics,
        inflight=InFlight(),
        running=set(),
        retention=7 * 86400,
        max_entries=1000,
        poll_interval=poll_interval,
    )


async def turn() -> None:
    d: Deferred = Deferred()
    reactor.callLater(0.005, d.callback, None)
    await d


async def until(condition, what: str, limit: int = 2000) -> None:
    """Let the reactor run until ``condition()`` holds (bounded)."""
    for _ in range(limit):
        if condition():
            return
        await turn()
    raise AssertionError(f"not reached: {what}")


@pytest.fixture
def sends(tmp_path):
    opened: list[KeyedSends] = []

    def make(backend, **kw) -> KeyedSends:
        k = keyed_sends(tmp_path / "records.sqlite3", backend, **kw)
        opened.append(k)
        return k

    yield make
    for k in opened:
        k.close()


@pytest_twisted.ensureDeferred
async def test_a_repeated_key_is_answered_with_the_first_answer_and_not_sent_again(sends):
    backend = Held(answer=Outcome.accepted("id-1"))
    keyed = sends(backend)

    first = await keyed.send(KEY, MESSAGE, None)
    second = await keyed.send(KEY, MESSAGE, None)
    other = await keyed.send(KEY + "-other", MESSAGE, None)

    assert (first.answer, first.replayed) == (ACCEPTED, False)
    assert (second.answer, second.replayed) == (ACCEPTED, True)
    assert other.replayed is False
    assert backend.calls == 2  # the first key once, the other key once


@pytest_twisted.ensureDeferred
async def test_requests_with_a_key_in_flight_share_its_one_send(sends):
    backend = Held()
    keyed = sends(backend)

    first = keyed.send(KEY, MESSAGE, None)
    await until(lambda: backend.waiting, "the first send reached the backend")
    second = keyed.send(KEY, MESSAGE, None)
    backend.release(Outcome.accepted("id-1"))

    assert (await first).answer == ACCEPTED
    shared = await second
    assert (shared.answer, shared.replayed) == (ACCEPTED, True)
    assert backend.calls == 1


@pytest_twisted.ensureDeferred
async def test_a_client_that_goes_away_does_not_stop_its_keyed_send(sends):
    backend = Held()
    keyed = sends(backend)

    waiting = keyed.send(KEY, MESSAGE, None)
    await until(lambda: backend.waiting, "the send reached the backend")
    waiting.cancel()  # what the HTTP layer does when the client hangs up
    waiting.addErrback(lambda failure: None)
    backend.release(Outcome.accepted("id-1"))
    await until(lambda: not keyed._sharing, "the send finished")

    assert backend.cancelled == 0
    assert await keyed.records.read(key_hash(KEY)) == Recorded(ACCEPTED)
    again = await keyed.send(KEY, MESSAGE, None)
    assert (again.answer, backend.calls) == (ACCEPTED, 1)


@pytest.mark.parametrize(
    "outcome,code",
    [
        (Outcome.unknown("lost reply after the dot"), "ERR_OUTCOME_UNKNOWN"),
        (Outcome.rejected_message("550 5.1.1 no such user"), "ERR_PERMANENT_FAILURE"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_an_outcome_that_may_have_delivered_or_never_will_is_not_sent_again(
    sends, outcome, code
):
    backend = Held(answer=outcome)
    keyed = sends(backend)

    first = await keyed.send(KEY, MESSAGE, None)
    second = await keyed.send(KEY, MESSAGE, None)

    assert first.answer.code == second.answer.code == code
    assert second.answer == first.answer
    assert backend.calls == 1


@pytest_twisted.ensureDeferred
async def test_a_send_that_handed_nothing_over_is_sent_again_on_the_next_request(sends):
    backend = Held(answer=Outcome.transient("421 4.3.2 try later"))
    keyed = sends(backend)

    first = await keyed.send(KEY, MESSAGE, None)
    backend.answer = Outcome.accepted("id-1")
    second = await keyed.send(KEY, MESSAGE, None)

    assert first.answer.code == "ERR_SEND_FAILED"
    assert (second.answer, second.replayed, backend.calls) == (ACCEPTED, False, 2)


@pytest_twisted.ensureDeferred
async def test_the_record_outlives_a_restart(sends):
    backend = Held(answer=Outcome.accepted("id-1"))
    before = sends(backend)
    await before.send(KEY, MESSAGE, None)
    before.close()

    after = sends(backend)  # a new process on the same file
    replayed = await after.send(KEY, MESSAGE, None)

    assert (replayed.answer, replayed.replayed, backend.calls) == (ACCEPTED, True, 1)


@pytest_twisted.ensureDeferred
async def test_a_send_whose_process_ended_mid_send_is_settled_unknown_not_sent(sends):
    db_clock = task.Clock()
    db_clock.advance(1_800_000_000)
    backend = Held(answer=Outcome.accepted("id-1"))
    keyed = sends(backend, db_clock=db_clock)
    # The fence another process wrote before it died mid-send.
    await keyed.records.claim(key_hash(KEY))
    db_clock.advance(SEND_TIMEOUT + ABANDON_GRACE)

    settled = await keyed.send(KEY, MESSAGE, None)
    again = await keyed.send(KEY, MESSAGE, None)

    assert settled.answer.code == "ERR_OUTCOME_UNKNOWN"
    assert "never recorded" in settled.answer.message
    assert again.answer == settled.answer and again.replayed
    assert backend.calls == 0


@pytest_twisted.ensureDeferred
async def test_a_send_under_way_in_another_process_is_waited_for(sends, tmp_path):
    poll_clock = task.Clock()
    backend = Held(answer=Outcome.accepted("never"))
    keyed = sends(backend, clock=poll_clock)
    elsewhere = SendRecords.sqlite(str(tmp_path / "records.sqlite3"), reactor)
    try:
        await elsewhere.claim(key_hash(KEY))
        answer = keyed.send(KEY, MESSAGE, None)
        await until(lambda: keyed._pauses, "waiting for the other send")
        await elsewhere.finish(key_hash(KEY), ACCEPTED)
        poll_clock.advance(keyed.poll_interval)
        waited = await answer
    finally:
        elsewhere.close()

    assert (waited.answer, waited.replayed, backend.calls) == (ACCEPTED, True, 0)


@pytest_twisted.ensureDeferred
async def test_a_send_still_under_way_elsewhere_after_the_send_timeout_is_asked_again_later(sends):
    poll_clock = task.Clock()
    backend = Held(answer=Outcome.accepted("never"))
    keyed = sends(backend, clock=poll_clock)
    await keyed.records.claim(key_hash(KEY))  # as another process would

    answer = keyed.send(KEY, MESSAGE, None)
    for _ in range(SEND_TIMEOUT):
        await until(lambda: keyed._pauses or answer.called, "the next poll")
        poll_clock.advance(keyed.poll_interval)
    later = await answer

    assert later.answer.code == "ERR_SEND_FAILED" and later.answer.status == 502
    assert "ask again later" in later.answer.message
    assert backend.calls == 0


@pytest_twisted.ensureDeferred
async def test_an_unavailable_store_sends_nothing_and_says_so(tmp_path):
    backend = Held(answer=Outcome.accepted("id-1"))
    keyed = keyed_sends(tmp_path / "missing" / "records.sqlite3", backend)
    try:
        answer = await keyed.send(KEY, MESSAGE, None)
    finally:
        keyed.close()

    assert answer.answer.code == "ERR_SEND_FAILED"
    assert "idempotency store is unavailable" in answer.answer.message
    assert backend.calls == 0


# --- property: any interleaving of same-key requests sends at most once -------

STAGES = ("with the first", "during its send", "after its answer")
OUTCOMES = {
    "accepted": Outcome.accepted("id-1"),
    "unknown": Outcome.unknown("lost reply"),
    "rejected": Outcome.rejected_message("550 no"),
    "transient": Outcome.transient("421 later"),
}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arrivals=st.lists(
        st.tuples(st.sampled_from(STAGES), st.sampled_from(["this", "replica"])), max_size=6
    ),
    outcome=st.sampled_from(sorted(OUTCOMES)),
)
@pytest_twisted.ensureDeferred
async def test_any_interleaving_of_one_key_sends_at_most_once(tmp_path_factory, arrivals, outcome):
    path = tmp_path_factory.mktemp("interleaving") / "records.sqlite3"
    backend = Held()
    # Two processes on one file: this one and a replica, which waits by polling.
    processes = {
        "this": keyed_sends(path, backend, poll_interval=0.01),
        "replica": keyed_sends(path, backend, poll_interval=0.01),
    }
    try:
        first = processes["this"].send(KEY, MESSAGE, None)
        answers = []
        for stage in STAGES:
            if stage == "during its send":
                await until(lambda: backend.waiting, "a send reached the backend")
            if stage == "after its answer":
                backend.release(OUTCOMES[outcome])
                answers.append(await first)
            answers += [processes[p].send(KEY, MESSAGE, None) for s, p in arrivals if s == stage]
        results = [a if isinstance(a, KeyedAnswer) else await a for a in answers]
    finally:
        for process in processes.values():
            process.close()

    assert backend.most_in_flight == 1  # never two sends of one key at once
    if outcome == "transient":
        return  # nothing was accepted: a later request may send again
    assert backend.calls == 1
    assert all(r.answer == results[0].answer for r in results)
    # One request sent (a replica's, if it claimed the key first); every other
    # one was answered with that send's answer.
    assert [r.replayed for r in results].count(False) == 1


# --- the HTTP side -------------------------------------------------------------


def keyed_env(tmp_path, **extra: str) -> dict[str, str]:
    return {
        "GORGE_SERVICE_TOKEN": TOKEN,
        "GORGE_MAILER_CONFIG": '[{"key":"t","type":"test"}]',
        "GORGE_MAILER_IDEMPOTENCY_DB": str(tmp_path / "records.sqlite3"),
        **extra,
    }


@pytest.fixture
def http(tmp_path):
    harnesses = []

    def make(**extra: str):
        h = make_harness(keyed_env(tmp_path, **extra), clock=reactor)
        harnesses.append(h)
        return h

    yield make
    for h in harnesses:
        keyed = h.service.part("keyed-sends")
        if keyed is not None:
            keyed.close()


async def post_keyed(h, key: str | None):
    headers = {"Idempotency-Key": key} if key is not None else {}
    response = await h._pumped(
        h.client.post(
            "http://mailer/api/mailer/send",
            data=json.dumps({"message": valid_message()}).encode(),
            headers={
                "Content-Type": ["application/json"],
                "X-Service-Token": [TOKEN],
                **{k: [v] for k, v in headers.items()},
            },
        )
    )
    body = json.loads(await h._pumped(response.content()))
    return response.code, body, response.headers.getRawHeaders("Idempotent-Replayed")


@pytest_twisted.ensureDeferred
async def test_a_repeated_key_over_http_is_answered_the_same_and_marked_replayed(http):
    h = http()
    first = await post_keyed(h, KEY)
    second = await post_keyed(h, KEY)

    assert first == (200, {"data": {"mailerKey": "t", "messageId": "test-1"}}, None)
    assert second == (200, first[1], ["true"])
    assert h.backends["t"].accepted == 1
    _, _, metrics = await h.get("/metrics")
    assert b'gorge_mailer_idempotent_sends_total{result="replayed"} 1.0' in metrics
    assert b'gorge_sql_transactions_total{outcome="ok",txn="claim"} 2.0' in metrics


@pytest_twisted.ensureDeferred
async def test_without_a_key_or_with_the_store_off_every_request_sends(http):
    for h, key in ((http(), None), (http(GORGE_MAILER_IDEMPOTENCY_STORE="off"), KEY)):
        await post_keyed(h, key)
        await post_keyed(h, key)
        assert h.backends["t"].accepted == 2


@pytest.mark.parametrize("key", ["has space", "x" * 256, "caf\u00e9"])
@pytest_twisted.ensureDeferred
async def test_an_unusable_key_is_a_bad_request(http, key):
    h = http()
    status, body, _ = await post_keyed(h, key)
    assert status == 400 and body["error"]["code"] == "ERR_BAD_REQUEST"
    assert "Idempotency-Key" in body["error"]["message"]
    assert h.backends["t"].attempts == 0


def test_parse_key_takes_one_visible_ascii_key():
    assert parse_key(None) is None and parse_key([b""]) is None
    assert parse_key([KEY.encode(), KEY.encode()]) == KEY
    with pytest.raises(ValueError, match="once"):
        parse_key([b"a", b"b"])


@pytest_twisted.ensureDeferred
async def test_a_keyed_send_goes_on_after_the_client_hung_up(http):
    h = http()
    backend = Held()
    h.service.part("dispatcher").backends[:] = [backend]
    port = reactor.listenTCP(0, h.service.part("site"), interface="127.0.0.1")
    body = json.dumps({"message": valid_message()}).encode()
    lost: Deferred = Deferred()

    class Client(Protocol):
        def connectionMade(self):
            self.transport.write(
                b"POST /api/mailer/send HTTP/1.1\r\nHost: x\r\nX-Service-Token: %s\r\n"
                b"Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (TOKEN.encode(), KEY.encode(), len(body), body)
            )

        def connectionLost(self, reason):
            lost.callback(None)

    try:
        connector = reactor.connectTCP(
            "127.0.0.1", port.getHost().port, ClientFactory.forProtocol(Client)
        )
        await until(lambda: backend.waiting, "the send reached the backend")
        tracked = len(h.service.part("api").inflight)
        connector.disconnect()
        await lost
        # The server noticed: the answer it was to write is no longer awaited.
        await until(lambda: len(h.service.part("api").inflight) < tracked, "the hang-up noticed")
        backend.release(Outcome.accepted("id-1"))
        keyed = h.service.part("keyed-sends")
        await until(lambda: not keyed._sharing, "the send finished")
    finally:
        await port.stopListening()

    assert backend.cancelled == 0
    assert await keyed.records.read(key_hash(KEY)) == Recorded(ACCEPTED)
    status, _, replayed = await post_keyed(h, KEY)
    assert (status, replayed, backend.calls) == (200, ["true"], 1)


@pytest_twisted.ensureDeferred
async def test_shutdown_waits_for_a_keyed_send_whose_client_hung_up(http, tmp_path):
    h = http()
    backend = Held()
    h.service.part("dispatcher").backends[:] = [backend]
    api = h.service.part("api")
    h.service.startService()
    port = reactor.listenTCP(0, h.service.part("site"), interface="127.0.0.1")
    body = json.dumps({"message": valid_message()}).encode()

    class Client(Protocol):
        def connectionMade(self):
            self.transport.write(
                b"POST /api/mailer/send HTTP/1.1\r\nHost: x\r\nX-Service-Token: %s\r\n"
                b"Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (TOKEN.encode(), KEY.encode(), len(body), body)
            )

    try:
        connector = reactor.connectTCP(
            "127.0.0.1", port.getHost().port, ClientFactory.forProtocol(Client)
        )
        await until(lambda: backend.waiting, "the send reached the backend")
        connector.disconnect()
        await until(lambda: len(api.inflight) == 1, "only the send itself left in flight")
    finally:
        await port.stopListening()

    stopped = h.service.stopService()
    for _ in range(20):
        await turn()
    assert not stopped.called  # the drain waits for the send, not for its gone client
    backend.release(Outcome.accepted("id-1"))
    await stopped.addTimeout(10, reactor)

    records = SendRecords.sqlite(str(tmp_path / "records.sqlite3"), reactor)
    try:
        assert await records.read(key_hash(KEY)) == Recorded(ACCEPTED)
    finally:
        records.close()
    assert backend.cancelled == 0


# --- settings -------------------------------------------------------------------


def test_idempotency_defaults(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    s = load_mailer_settings({}).idempotency
    assert (s.store, s.sqlite_path, s.mysql) == ("sqlite", "gorge-mailer-idempotency.sqlite3", None)
    assert (s.retention, s.max_entries) == (7 * 86400, 1_000_000)
    state = load_mailer_settings({"STATE_DIRECTORY": str(tmp_path)}).idempotency
    assert state.sqlite_path == str(tmp_path / "gorge-mailer-idempotency.sqlite3")


def test_mysql_store_settings():
    s = load_mailer_settings(
        {
            "GORGE_MAILER_IDEMPOTENCY_STORE": "mysql",
            "GORGE_MAILER_IDEMPOTENCY_MYSQL_HOST": "db",
            "GORGE_MAILER_IDEMPOTENCY_MYSQL_PASS": "hunter2",
        }
    ).idempotency
    assert s.mysql is not None
    assert (s.mysql.host, s.mysql.database, s.mysql.password) == ("db", "gorge_mailer", "hunter2")


@pytest.mark.parametrize(
    "env,setting",
    [
        ({"GORGE_MAILER_IDEMPOTENCY_STORE": "redis"}, "GORGE_MAILER_IDEMPOTENCY_STORE"),
        (
            {"GORGE_MAILER_IDEMPOTENCY_RETENTION_SEC": "7d"},
            "GORGE_MAILER_IDEMPOTENCY_RETENTION_SEC",
        ),
        (
            {"GORGE_MAILER_IDEMPOTENCY_RETENTION_SEC": "60"},
            "GORGE_MAILER_IDEMPOTENCY_RETENTION_SEC",
        ),
        ({"GORGE_MAILER_IDEMPOTENCY_MAX_ENTRIES": "10"}, "GORGE_MAILER_IDEMPOTENCY_MAX_ENTRIES"),
        ({"GORGE_MAILER_IDEMPOTENCY_DB": "/nonexistent/x.sqlite3"}, "GORGE_MAILER_IDEMPOTENCY_DB"),
        ({"GORGE_MAILER_IDEMPOTENCY_DB": "/"}, "GORGE_MAILER_IDEMPOTENCY_DB"),
        (
            {
                "GORGE_MAILER_IDEMPOTENCY_STORE": "mysql",
                "GORGE_MAILER_IDEMPOTENCY_MYSQL_DATABASE": "gorge`; DROP",
            },
            "GORGE_MAILER_IDEMPOTENCY_MYSQL_DATABASE",
        ),
        (
            {
                "GORGE_MAILER_IDEMPOTENCY_STORE": "mysql",
                "GORGE_MAILER_IDEMPOTENCY_MYSQL_PORT": "0",
            },
            "GORGE_MAILER_IDEMPOTENCY_MYSQL_PORT",
        ),
    ],
)
def test_bad_idempotency_settings_stop_start_up(env, setting):
    with pytest.raises(ConfigError) as e:
        load_mailer_settings(env)
    assert e.value.setting == setting
    assert "\n" not in str(e.value)


def test_a_bad_idempotency_setting_exits_2_with_one_line(monkeypatch, capsys):
    from gorge.mailer.service import Options, makeService

    for name in list(__import__("os").environ):
        if name.startswith(("GORGE_", "SMTP_", "MAILER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GORGE_MAILER_IDEMPOTENCY_DB", "/nonexistent/records.sqlite3")
    options = Options()
    options.parseOptions([])
    with pytest.raises(SystemExit) as e:
        makeService(options)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "gorge-mailer: GORGE_MAILER_IDEMPOTENCY_DB: directory '/nonexistent'"
        " does not exist or is not writable\n"
    )
