"""The record of keyed sends (gorge/mailer/sendrecords.py) on a real SQLite
file and on the session's MariaDB: the fence, the outcome, the release of a
send that handed nothing over, restarts, and the bounds in time and size.
The database's clock follows an injected one."""

from __future__ import annotations

import itertools

import pytest
import pytest_twisted
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred, gatherResults

from gorge.mailer.dispatcher import Answer, send_failed
from gorge.mailer.sendrecords import Claimed, Pending, Recorded, SendRecords, key_hash

ACCEPTED = Answer(200, None, mailer_key="smtp", message_id="<m@x>")
UNKNOWN = Answer(502, "ERR_OUTCOME_UNKNOWN", "smtp (smtp): outcome unknown: lost reply")
PERMANENT = Answer(422, "ERR_PERMANENT_FAILURE", "smtp (smtp): 550 5.1.1 no such user")
_databases = itertools.count()


class Opened:
    """One store kind, reopened at will on the same file or database (a restart)."""

    def __init__(self, kind: str, where, clock: task.Clock) -> None:
        self.kind = kind
        self.where = where
        self.clock = clock
        self.records = self.open()

    def open(self) -> SendRecords:
        if self.kind == "sqlite":
            return SendRecords.sqlite(self.where, reactor, db_clock=self.clock)
        return SendRecords.mysql(self.where, reactor, db_clock=self.clock)

    def restart(self) -> SendRecords:
        self.records.close()
        self.records = self.open()
        return self.records


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.integration)])
def store(request, tmp_path):
    clock = task.Clock()
    clock.advance(1_800_000_000)
    if request.param == "sqlite":
        opened = Opened("sqlite", str(tmp_path / "records.sqlite3"), clock)
    else:
        mariadb = request.getfixturevalue("mariadb")
        name = f"t_mailer_records_{next(_databases)}"
        conn = mariadb.connect()
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        conn.close()
        opened = Opened("mysql", mariadb.settings(name), clock)
    yield opened
    opened.records.close()


@pytest_twisted.ensureDeferred
async def test_the_first_claim_wins_and_the_next_ones_see_it_pending(store):
    records, digest = store.records, key_hash("PHID-MTAM-first")
    assert await records.claim(digest) == Claimed()
    store.clock.advance(7)
    assert await records.claim(digest) == Pending(age=7)
    assert await records.read(digest) == Pending(age=7)
    assert await records.read(key_hash("PHID-MTAM-other")) is None


@pytest.mark.parametrize("answer", [ACCEPTED, UNKNOWN, PERMANENT])
@pytest_twisted.ensureDeferred
async def test_a_finished_send_is_answered_with_its_answer(store, answer):
    records, digest = store.records, key_hash("PHID-MTAM-done")
    await records.claim(digest)
    await records.finish(digest, answer)
    assert await records.claim(digest) == Recorded(answer)
    assert await records.count() == 1


@pytest_twisted.ensureDeferred
async def test_a_send_that_handed_nothing_over_frees_its_key(store):
    records, digest = store.records, key_hash("PHID-MTAM-retry")
    await records.claim(digest)
    await records.finish(digest, send_failed("all mailers failed, last error: 421 later"))
    assert await records.read(digest) is None
    assert await records.claim(digest) == Claimed()


@pytest_twisted.ensureDeferred
async def test_the_record_outlives_a_restart(store):
    done, begun = key_hash("PHID-MTAM-done"), key_hash("PHID-MTAM-begun")
    await store.records.claim(done)
    await store.records.finish(done, ACCEPTED)
    await store.records.claim(begun)

    records = store.restart()

    assert await records.claim(done) == Recorded(ACCEPTED)
    # A send whose process ended before its outcome was written stays fenced.
    assert isinstance(await records.claim(begun), Pending)


@pytest_twisted.ensureDeferred
async def test_settling_a_send_without_outcome_keeps_a_late_outcome(store):
    records = store.records
    lost, late = key_hash("PHID-MTAM-lost"), key_hash("PHID-MTAM-late")
    for digest in (lost, late):
        await records.claim(digest)
    await records.finish(late, ACCEPTED)

    assert await records.settle(lost, UNKNOWN) == Recorded(UNKNOWN)
    assert await records.settle(late, UNKNOWN) == Recorded(ACCEPTED)


@pytest_twisted.ensureDeferred
async def test_rows_older_than_the_retention_are_pruned(store):
    records = store.records
    old, new = key_hash("PHID-MTAM-old"), key_hash("PHID-MTAM-new")
    await records.claim(old)
    await records.finish(old, ACCEPTED)
    store.clock.advance(3600)
    await records.claim(new)
    await records.finish(new, ACCEPTED)
    store.clock.advance(1)

    removed = await records.prune(retention=3600, max_entries=100, abandon_after=60)

    assert removed == 1
    assert await records.read(old) is None
    assert await records.read(new) == Recorded(ACCEPTED)


@pytest_twisted.ensureDeferred
async def test_over_the_size_bound_the_oldest_finished_rows_go_but_no_send_under_way(store):
    records = store.records
    under_way = key_hash("PHID-MTAM-0")
    await records.claim(under_way)
    finished = [key_hash(f"PHID-MTAM-{n}") for n in range(1, 6)]
    for digest in finished:
        await records.claim(digest)
        await records.finish(digest, ACCEPTED)

    removed = await records.prune(retention=86400, max_entries=2, abandon_after=60)

    assert removed == 3
    assert await records.read(under_way) == Pending(age=0)
    assert [await records.read(d) for d in finished] == [None] * 3 + [Recorded(ACCEPTED)] * 2

    # Once no send can be under way any more, it goes too.
    store.clock.advance(61)
    assert await records.prune(retention=86400, max_entries=2, abandon_after=60) == 1
    assert await records.read(under_way) is None


@pytest_twisted.ensureDeferred
async def test_long_texts_are_kept_within_their_columns(store):
    records, digest = store.records, key_hash("k" * 255)
    answer = Answer(200, None, mailer_key="m" * 300, message_id="i" * 300)
    await records.claim(digest)
    await records.finish(digest, answer)
    recorded = await records.read(digest)
    assert recorded == Recorded(Answer(200, None, mailer_key="m" * 255, message_id="i" * 255))


@pytest_twisted.ensureDeferred
async def test_two_processes_claiming_one_key_at_once_let_one_of_them_send(store):
    other = store.open()  # a replica on the same file or database
    try:
        digests = [key_hash(f"PHID-MTAM-race-{n}") for n in range(20)]
        for digest in digests:
            both = await gatherResults(
                [Deferred.fromCoroutine(r.claim(digest)) for r in (store.records, other)]
            )
            assert sorted(type(s).__name__ for s in both) == ["Claimed", "Pending"]
    finally:
        other.close()
