"""One behaviour, all backends: random operation sequences applied to the
in-memory reference model and to a real backend must agree after every step
(task fields, stats, list, and every answer or error).

pytest-twisted runs tests inside the reactor, and hypothesis rules are
synchronous, so the state machine runs in a worker thread and hands each
backend call to the reactor with ``blockingCallFromThread``."""

from __future__ import annotations

import pytest
import pytest_twisted
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from twisted.internet import task, threads
from twisted.internet.defer import Deferred

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import (
    Completion,
    EnqueueRequest,
    Followup,
    InvalidArgument,
    Report,
    ReportResult,
)
from gorge.taskqueue.store import LeaseConflict, TaskNotFound, TaskStateError
from tests.taskqueue.conftest import T0, redis_backend_available

pytestmark = pytest.mark.integration

LEASE = 600
IDS = st.integers(min_value=1, max_value=10)
# Competing holders: the same tasks are leased by both, expire, and are taken
# over; results are reported unfenced (r4, Phorge's PHP) or fenced by either.
OWNERS = ["w1", "22413:1795947021:vm:1"]
FENCES = st.sampled_from([None, *OWNERS])
# Follow-ups of a success: a priority of their own or their parent's, maybe
# delayed (absolute seconds around the machine's clock).
FOLLOWUPS = st.lists(
    st.builds(
        Followup,
        st.builds(
            EnqueueRequest,
            st.sampled_from(["A", "B"]),
            st.sampled_from(["", "{}", '{"t":"é"}']),
            st.sampled_from([1000, 3000]),
            st.sampled_from([None, "PHID-X"]),
            st.sampled_from([None, "PHID-Y"]),
            st.sampled_from([None, T0 + 30, T0 + 5000]),
        ),
        st.booleans(),
    ),
    max_size=3,
).map(tuple)
SETTINGS = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


def _model(coro):
    """The memory store never waits: drive its coroutine to the end at once."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the memory store awaited something")


def _outcome(call):
    try:
        return ("ok", call())
    except (TaskNotFound, LeaseConflict, TaskStateError, InvalidArgument) as e:
        return ("error", type(e).__name__)


def _shape(value):
    if isinstance(value, ReportResult):
        error = value.error
        return (
            value.task_id,
            value.task_class,
            type(error).__name__ if error else None,
            getattr(error, "message", None),
            [child.to_json() for child in value.children],
        )
    if isinstance(value, Completion):
        return value.archived.to_json(), [child.to_json() for child in value.children]
    if isinstance(value, list):
        return [_shape(v) for v in value]
    if hasattr(value, "to_json"):
        return value.to_json()
    return value


def _in_reactor(make_deferred):
    from twisted.internet import reactor

    return threads.blockingCallFromThread(reactor, make_deferred)


class _Reset:
    """Per-backend: a fresh, empty store sharing the long-lived connection."""

    def __init__(self, backend: str, request) -> None:
        from twisted.internet import reactor

        self.backend = backend
        self._request = request
        self._reactor = reactor
        if backend == "mysql":
            from gorge.db.mysql import make_pool

            mariadb = request.getfixturevalue("mariadb")
            self._pool = make_pool(mariadb.settings(mariadb.create_database("worker")), reactor)
        elif backend == "sqlite":
            from gorge.taskqueue.sqlite import make_sqlite_pool

            path = request.getfixturevalue("tmp_path") / "stateful.sqlite3"
            self._pool = make_sqlite_pool(str(path), reactor)
        else:
            from gorge.db.redis import make_redis

            self._redis_server = request.getfixturevalue("redis_server")
            self._conn = make_redis(self._redis_server.settings())

    def fresh(self, clock):
        if self.backend == "mysql":
            from gorge.taskqueue.mysql import MySQLTaskStore

            def wipe(txn):
                for table in (
                    "worker_activetask",
                    "worker_archivetask",
                    "worker_taskdata",
                    "lisk_counter",
                ):
                    txn.execute(f"TRUNCATE TABLE {table}")

            _in_reactor(lambda: self._pool.runInteraction(wipe))
            return MySQLTaskStore(self._pool, clock, reactor=self._reactor, db_clock=clock)
        if self.backend == "sqlite":
            from gorge.taskqueue.sqlite import SQLiteTaskStore

            def wipe(txn):
                for table in (
                    "worker_activetask",
                    "worker_archivetask",
                    "worker_taskdata",
                    "lisk_counter",
                    "sqlite_sequence",
                ):
                    txn.execute(f"DELETE FROM {table}")

            _in_reactor(lambda: self._pool.runInteraction(wipe))
            return SQLiteTaskStore(self._pool, clock, reactor=self._reactor)
        from gorge.db.clock import HostTime
        from gorge.taskqueue.redis import RedisTaskStore

        return RedisTaskStore(
            self._conn,
            clock=clock,
            time=HostTime(clock),
            key_prefix=self._redis_server.unique_prefix("sm"),
        )

    async def close(self) -> None:
        if self.backend == "redis":
            await self._conn.disconnect()
        else:
            self._pool.close()


def _machine(reset: _Reset):
    class QueueMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = task.Clock()
            self.clock.advance(T0)
            self.model = MemoryTaskStore(self.clock)
            self.real = reset.fresh(self.clock)

        def both(self, method: str, *args):
            expected = _outcome(lambda: _model(getattr(self.model, method)(*args)))
            actual = _outcome(
                lambda: _in_reactor(
                    lambda: Deferred.fromCoroutine(getattr(self.real, method)(*args))
                )
            )
            return _shape(expected[1]), _shape(actual[1]), expected[0], actual[0]

        def check(self, method: str, *args, drop_data: bool = False):
            expected, actual, ek, ak = self.both(method, *args)
            if drop_data and ek == ak == "ok":
                expected = {k: v for k, v in expected.items() if k != "data"}
                actual = {k: v for k, v in actual.items() if k != "data"}
            assert (ak, actual) == (ek, expected), f"{reset.backend}: {method}{args}"

        @rule(
            task_class=st.sampled_from(["A", "B"]),
            data=st.sampled_from(["{}", '{"t":"é ✓ 😀"}', "[]", ""]),
            priority=st.sampled_from([1000, 2000, 3000]),
            delay=st.sampled_from([None, None, 30, 900]),
            phid=st.sampled_from([None, "PHID-TASK-tzdxqbs3s4qsrzbtcoun"]),
        )
        def enqueue(self, task_class, data, priority, delay, phid):
            delay_until = None if delay is None else int(self.clock.seconds()) + delay
            request = EnqueueRequest(task_class, data, priority, phid, None, delay_until)
            self.check("enqueue", request, drop_data=True)

        @rule(
            owner=st.sampled_from(OWNERS),
            limit=st.integers(1, 4),
            classes=st.sampled_from([None, ["A"], ["B"], ["A", "B"]]),
        )
        def lease(self, owner, limit, classes):
            self.check("lease", owner, limit, LEASE, classes)

        @rule(task_id=IDS, duration=st.integers(0, 10**7), owner=FENCES)
        def complete(self, task_id, duration, owner):
            self.check("complete", task_id, duration, owner)

        @rule(task_id=IDS, duration=st.integers(0, 10**7), followups=FOLLOWUPS, owner=FENCES)
        def complete_with_followups(self, task_id, duration, followups, owner):
            """Children appear, with the parent's priority unless their own,
            exactly as in the model; a replay or a refusal inserts none."""
            self.check("complete_with_followups", task_id, duration, followups, owner)

        @rule(
            task_id=IDS,
            permanent=st.booleans(),
            retry_wait=st.sampled_from([0, 5, 300]),
            owner=FENCES,
        )
        def fail(self, task_id, permanent, retry_wait, owner):
            self.check("fail", task_id, permanent, retry_wait, owner)

        @rule(task_id=IDS, duration=st.sampled_from([-3, 0, 5, 60, 4000]), owner=FENCES)
        def yield_(self, task_id, duration, owner):
            self.check("yield_", task_id, duration, owner)

        @rule(
            reports=st.lists(
                st.one_of(
                    st.builds(
                        Report,
                        IDS,
                        st.just("complete"),
                        st.integers(0, 10**7),
                        followups=FOLLOWUPS,
                    ),
                    st.builds(
                        Report,
                        IDS,
                        st.just("fail"),
                        permanent=st.booleans(),
                        retry_wait=st.sampled_from([0, 5, 300, 2**32]),
                    ),
                    st.builds(Report, IDS, st.just("yield"), st.sampled_from([-3, 0, 60, 2**32])),
                ),
                min_size=1,
                max_size=6,
            ),
            owner=FENCES,
        )
        def report(self, reports, owner):
            """A batch answers and changes exactly what its single calls would."""
            self.check("report", reports, owner)

        @rule(
            owner=st.sampled_from(OWNERS),
            task_ids=st.lists(IDS, min_size=1, max_size=4),
            duration=st.sampled_from([1, 300, LEASE, 2 * LEASE]),
        )
        def renew(self, owner, task_ids, duration):
            self.check("renew", owner, task_ids, duration)

        @rule(task_id=IDS)
        def cancel(self, task_id):
            self.check("cancel", task_id)

        @rule(task_id=IDS, ahead=st.sampled_from([-10, 0, 45, 900]))
        def delay(self, task_id, ahead):
            self.check("delay", task_id, max(0, int(self.clock.seconds()) + ahead))

        @rule(task_id=IDS, priority=st.sampled_from([1, 2000, 4000]))
        def set_priority(self, task_id, priority):
            self.check("set_priority", task_id, priority)

        @rule(task_id=IDS)
        def free(self, task_id):
            self.check("free", task_id)

        @rule(task_id=IDS, repeat=st.booleans())
        def retry(self, task_id, repeat):
            self.check("retry", task_id, repeat)

        @rule(task_id=IDS)
        def requeue(self, task_id):
            self.check("requeue", task_id)

        @rule(
            result=st.sampled_from([None, 0, 1, 2]),
            task_class=st.sampled_from([None, "A"]),
            limit=st.sampled_from([1, 3, 100]),
            offset=st.sampled_from([0, 1, 4]),
        )
        def list_archived(self, result, task_class, limit, offset):
            self.check("list_archived", result, task_class, limit, offset)

        @rule(task_ids=st.lists(IDS, min_size=1, max_size=4), mark=st.integers(1, 50))
        def copy_in(self, task_ids, mark):
            """Import copies of some active tasks, as a migration into this queue does."""
            self.check("export_tasks", task_ids)
            tasks = _model(self.model.export_tasks(task_ids))
            self.check("import_tasks", tasks, "gorge-migrate-from-x", mark)
            self.check("migration_mark", "gorge-migrate-from-x")

        @rule(task_ids=st.lists(IDS, min_size=1, max_size=4))
        def move_out(self, task_ids):
            """Delete some active tasks, as a migration out of this queue does."""
            tasks = _model(self.model.export_tasks(task_ids))
            self.check("delete_tasks", tasks)

        @rule(task_ids=st.lists(IDS, min_size=1, max_size=4))
        def awaken(self, task_ids):
            self.check("awaken", task_ids)

        @rule(task_id=IDS)
        def get(self, task_id):
            self.check("get_task", task_id)
            self.check("get_archived", task_id)

        @rule(seconds=st.sampled_from([1, 4, 6, 31, 301, LEASE + 1, 3601]))
        def tick(self, seconds):
            self.clock.advance(seconds)

        @invariant()
        def same_observable_state(self):
            self.check("stats")
            self.check("oldest_waiting")
            self.check("list_tasks", 1000, 0)
            self.check("active_ids")

    return QueueMachine


@pytest.mark.parametrize("backend", ["mysql", "sqlite", "redis"])
@pytest_twisted.ensureDeferred
async def test_backend_behaves_like_the_model(backend, request):
    if backend == "redis" and not redis_backend_available():
        pytest.skip("gorge.taskqueue.redis is not there yet")
    reset = _Reset(backend, request)
    try:
        await threads.deferToThread(run_state_machine_as_test, _machine(reset), settings=SETTINGS)
    finally:
        await reset.close()
