"""The SQL store's read side: counts, pages of tasks and of the archive."""

from __future__ import annotations

from twisted.internet.defer import Deferred

from gorge.taskqueue.model import (
    ARCHIVE_COLUMNS,
    ArchivedTask,
    Stats,
    Task,
    archived_from_columns,
)
from gorge.taskqueue.sql_calls import A_COLS, COLS, T_COLS, SqlCalls
from gorge.taskqueue.store import (
    TaskNotFound,
)
from gorge.taskqueue.waiting import HEAD_ROWS, MAX_PRIORITIES, Waiting, oldest_waiting

# Newest first by the archive time; Phorge keys dateModified, and sets it on archive too.
LIST_ARCHIVED = (
    f"SELECT {A_COLS} FROM worker_archivetask{{where}}"
    " ORDER BY dateModified DESC, id DESC LIMIT %s OFFSET %s"
)
STATS = (
    # activeCount and archivedCount are kept by gorge/taskqueue/counts.py: a
    # COUNT(*) would read a whole table. failureTime is set with every failure
    # (ours and Phorge's), so key_failuretime serves the failed count.
    "SELECT (SELECT COUNT(*) FROM worker_activetask"
    "   WHERE leaseOwner IS NOT NULL AND leaseOwner <> '' AND leaseExpires >= %s),"
    " (SELECT COUNT(*) FROM worker_activetask"
    "   WHERE failureTime IS NOT NULL AND failureCount > 0)"
)
# Phorge has no (priority, id) key: each half is read in key_owner's order
# (leaseOwner, priority, id), never the whole table; a page needs at most
# offset + limit rows of each.
LIST = (
    f"SELECT {COLS} FROM (SELECT {COLS} FROM worker_activetask WHERE leaseOwner IS NULL"
    " ORDER BY priority, id LIMIT %s) AS unleased"
    f" UNION ALL SELECT {COLS} FROM (SELECT {COLS} FROM worker_activetask"
    " WHERE leaseOwner IS NOT NULL ORDER BY priority, id LIMIT %s) AS leased"
    " ORDER BY priority, id LIMIT %s OFFSET %s"
)
# The heads of the queue (gorge/taskqueue/waiting.py), all in Phorge's keys:
# the next priority holding unowned tasks is one probe of key_owner
# (leaseOwner, priority, id), its first rows a range of key_owner in id
# order, and the tasks come due again a range of leaseExpires. A head row
# that is delayed (leaseExpires set) is dropped after the read: in the WHERE
# clause the planner would walk leaseExpires' NULLs instead, through every
# priority.
NEXT_WAITING_PRIORITY = (
    "SELECT MIN(priority) FROM worker_activetask WHERE leaseOwner IS NULL AND priority > %s"
)
WAITING_HEAD = (
    "SELECT taskClass, priority, dateCreated, leaseExpires FROM worker_activetask"
    " WHERE leaseOwner IS NULL AND priority = %s ORDER BY id LIMIT %s"
)
# Waiting since the expiry, never since before the task was created: a retry
# (Phorge's unarchive) sets leaseExpires to 0.
DUE_AGAIN_HEAD = (
    "SELECT taskClass, priority, GREATEST(leaseExpires, dateCreated) FROM worker_activetask"
    " WHERE leaseExpires < %s ORDER BY leaseExpires LIMIT %s"
)
# What held lease calls watch: the primary key's last entry (Phorge's own
# inserts included) and one probe of the leaseExpires index for tasks that
# came due since the last check.  Both are index lookups.
WAKE_CHECK = (
    "SELECT (SELECT MAX(id) FROM worker_activetask),"
    " EXISTS(SELECT 1 FROM worker_activetask WHERE leaseExpires >= %s AND leaseExpires < %s)"
)
GET = (
    f"SELECT {T_COLS}, COALESCE(d.data, '') FROM worker_activetask t"
    " LEFT JOIN worker_taskdata d ON d.id = t.dataID WHERE t.id = %s"
)

# Moving tasks between backends.  The ledger is a row of lisk_counter named

_INT64_MAX = 2**63 - 1  # the largest LIMIT both databases take


class SqlReads(SqlCalls):
    """Reads of :class:`gorge.taskqueue.store.TaskStore` over the worker tables."""

    async def list_archived(
        self, result: int | None, task_class: str | None, limit: int, offset: int
    ) -> list[ArchivedTask]:
        where: list[str] = []
        args: list[int | str] = []
        if result is not None:
            where.append("result = %s")
            args.append(result)
        if task_class is not None:
            where.append("taskClass = %s")
            args.append(task_class)
        statement = LIST_ARCHIVED.format(where=" WHERE " + " AND ".join(where) if where else "")

        def read(txn) -> list[ArchivedTask]:
            self._exec(txn, statement, (*args, limit, offset))
            return [
                archived_from_columns(dict(zip(ARCHIVE_COLUMNS, row, strict=True)))
                for row in txn.fetchall()
            ]

        return await self.db.run("list_archived", read)

    async def stats(self) -> Stats:
        # One read at a time: each brings the kept counts up to date from the last.
        return await self._stats_lock.run(lambda: Deferred.fromCoroutine(self._stats()))

    async def _stats(self) -> Stats:
        now = await self._now()

        def read(txn):
            self._exec(txn, STATS, (now,))
            leased, failed = txn.fetchone()
            return int(leased), int(failed), self._counts.read(txn, self._exec, now)

        # The first read counts whole tables: its length grows with them, and
        # each of its statements is bounded by the driver.
        leased, failed, found = await self.db.run("stats", read, bounded=self._counts.loaded)
        active, archived = self._counts.apply(found)
        return Stats(active=active, leased=leased, archived=archived, failed=failed)

    async def oldest_waiting(self) -> Waiting:
        now = await self._now()

        def read(txn) -> list[tuple[str, int, int]]:
            heads: list[tuple[str, int, int]] = []
            priority = -1
            for _ in range(MAX_PRIORITIES):
                self._exec(txn, NEXT_WAITING_PRIORITY, (priority,))
                (found,) = txn.fetchone()
                if found is None:
                    break
                priority = int(found)
                self._exec(txn, WAITING_HEAD, (priority, HEAD_ROWS))
                heads.extend(row[:3] for row in txn.fetchall() if row[3] is None)
            self._exec(txn, DUE_AGAIN_HEAD, (now, HEAD_ROWS))
            heads.extend(txn.fetchall())
            return [(str(c), int(p), int(t)) for c, p, t in heads]

        return oldest_waiting(now, await self.db.run("oldest_waiting", read))

    async def list_tasks(self, limit: int, offset: int) -> list[Task]:
        each = min(limit + offset, _INT64_MAX)  # rows a page can need from each half

        def read(txn) -> list[Task]:
            self._exec(txn, LIST, (each, each, limit, offset))
            return [self._task_row(row) for row in txn.fetchall()]

        return await self.db.run("list_tasks", read)

    async def get_task(self, task_id: int) -> Task:
        def read(txn) -> Task:
            self._exec(txn, GET, (task_id,))
            row = txn.fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            return self._task_row(row, with_data=True)

        return await self.db.run("get_task", read)

    async def wake_check(self, since: int, now: int) -> tuple[int, bool]:
        def read(txn) -> tuple[int, bool]:
            self._exec(txn, WAKE_CHECK, (since, now))
            highest, due = txn.fetchone()
            return int(highest or 0), bool(due)

        return await self.db.run("wake_check", read)
