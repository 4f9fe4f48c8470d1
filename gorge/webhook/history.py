"""The delivery log: requests read back newest first, by id or PHID, and replays.

gorge-webhook keeps no history table of its own: Phorge's
``herald_webhookrequest`` is the log (docs/webhook.md, "Delivery log and
replay"). Every listing reads one window of the primary key at a time, so
a call reads a bounded number of rows whatever its filters;
gorge/webhook/deliverylog.py says what the answers mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gorge.db import Database
from gorge.webhook.observation import Observation
from gorge.webhook.queuedrows import Seen
from gorge.webhook.rows import FAILED, SENT, marks, text

LIST_WINDOW = 2000  # ids per statement of the delivery log's listing
LIST_BUDGET = 10_000  # ids one listing call reads at most
SINCE_SLACK = 60  # seconds: how much older a row with a higher id may be

_REQUEST_COLUMNS = (
    "id, phid, webhookPHID, objectPHID, status, properties,"
    " lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
)

# Newest first, one window of the primary key at a time: a call reads a
# bounded number of rows whatever the filters (fragments from LIST_FILTERS).
SQL_LIST_WINDOW = (
    f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest"
    " WHERE id < %s AND id >= %s{filters} ORDER BY id DESC LIMIT %s"
)

LIST_FILTERS = {
    "hook": " AND webhookPHID = %s",
    "status": " AND status = %s",
    "result": " AND lastRequestResult = %s",
    "since": " AND dateCreated >= %s",
}

# The lowest id created at or after a second: one entry of key_collect(dateCreated).
SQL_FIRST_ID_SINCE = (
    "SELECT id FROM herald_webhookrequest WHERE dateCreated >= %s"
    " ORDER BY dateCreated ASC, id ASC LIMIT 1"
)

SQL_REQUEST_BY_ID = f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest WHERE id = %s"

SQL_REQUEST_BY_PHID = f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest WHERE phid = %s"

# A hook's finished requests created in a time range, oldest first from an id on.
SQL_REPLAY_RANGE = (
    f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest"
    " WHERE webhookPHID = %s AND dateCreated >= %s AND dateCreated < %s"
    " AND status IN ({statuses}) AND id > %s ORDER BY id ASC LIMIT %s"
)

# A replay puts a finished row back in the state Phorge inserts it in: queued,
# no attempt made, dateModified = dateCreated (an untouched row, a candidate at
# once for every replica). Only over the state read, so a row that changed
# meanwhile is not replayed twice, and never a row that is still queued.
SQL_REPLAY = (
    "UPDATE herald_webhookrequest"
    " SET status = 'queued', lastRequestResult = 'none', lastRequestEpoch = 0,"
    " dateModified = dateCreated"
    " WHERE id = %s AND status = %s AND dateModified = %s"
)


@dataclass(frozen=True)
class RequestRow:
    """One row of ``herald_webhookrequest``, every column."""

    id: int
    phid: str
    hook_phid: str
    object_phid: str
    status: str
    properties: str
    last_result: str
    last_epoch: int
    date_created: int
    date_modified: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RequestRow:
        return cls(
            id=int(row[0]),
            phid=text(row[1]),
            hook_phid=text(row[2]),
            object_phid=text(row[3]),
            status=text(row[4]),
            properties=text(row[5]),
            last_result=text(row[6]),
            last_epoch=int(row[7]),
            date_created=int(row[8]),
            date_modified=int(row[9]),
        )

    def seen(self) -> Seen:
        return Seen(
            id=self.id,
            hook=self.hook_phid,
            status=self.status,
            result=self.last_result,
            epoch=self.last_epoch,
            created=self.date_created,
            modified=self.date_modified,
        )


@dataclass(frozen=True)
class RequestPage:
    rows: list[RequestRow]
    next_cursor: int | None  # ids below this may match too; None: nothing older matches


@dataclass(frozen=True)
class Replay:
    """A row put back to queued: as it was, and as it is now."""

    before: RequestRow
    after: RequestRow


class NotReplayable(Exception):
    """The row is queued (or changed while it was being replayed)."""

    def __init__(self, row: RequestRow) -> None:
        super().__init__(row.status)
        self.row = row


@dataclass(frozen=True)
class RangeReplay:
    replayed: list[Replay]
    skipped: list[RequestRow]  # changed between the read and the replay
    next_after_id: int | None  # more may match above this id; None: the range is done


class History:
    """Listings, single requests and replays; a replayed row is handed to the
    queue view at once, so this process offers it at its next poll."""

    def __init__(self, db: Database, observation: Observation) -> None:
        self._db = db
        self._observation = observation
        self._view = observation.view

    async def list_requests(
        self,
        *,
        limit: int,
        cursor: int | None = None,
        hook: str | None = None,
        status: str | None = None,
        result: str | None = None,
        since: int | None = None,
        window: int = LIST_WINDOW,
        budget: int = LIST_BUDGET,
    ) -> RequestPage:
        """Requests newest first, filtered; at most ``budget`` ids are read per call."""
        filters = {"hook": hook, "status": status, "result": result, "since": since}
        used = [(name, value) for name, value in filters.items() if value is not None]
        statement = SQL_LIST_WINDOW.format(filters="".join(LIST_FILTERS[n] for n, _ in used))
        values = [
            value.encode("utf-8") if isinstance(value, str) and name == "hook" else value
            for name, value in used
        ]

        def scan(txn) -> RequestPage:
            lowest, highest = self._observation.read_bounds(txn)
            if lowest is None or highest is None:
                return RequestPage([], None)
            floor = lowest
            if since is not None:
                # Commit order is not id order: rows up to a minute older than
                # ``since`` may carry higher ids (docs/webhook.md, Polling).
                self._db.execute(txn, SQL_FIRST_ID_SINCE, (max(since - SINCE_SLACK, 0),))
                first = txn.fetchone()
                if first is None:
                    return RequestPage([], None)
                floor = max(floor, int(first[0]))
            upper = highest + 1 if cursor is None else min(cursor, highest + 1)
            rows: list[RequestRow] = []
            read = 0
            while upper > floor and read < budget:
                low = max(floor, upper - window, upper - (budget - read))
                wanted = limit - len(rows)
                self._db.execute(txn, statement, (upper, low, *values, wanted))
                found = [RequestRow.from_row(row) for row in txn.fetchall()]
                rows.extend(found)
                if len(found) == wanted:
                    return RequestPage(rows, found[-1].id if found[-1].id > floor else None)
                read += upper - low
                upper = low
            return RequestPage(rows, upper if upper > floor else None)

        return await self._db.run("list_requests", scan)

    def _read_request(self, txn, request: int | str) -> RequestRow | None:
        if isinstance(request, int):
            self._db.execute(txn, SQL_REQUEST_BY_ID, (request,))
        else:
            self._db.execute(txn, SQL_REQUEST_BY_PHID, (request.encode("utf-8"),))
        row = txn.fetchone()
        return None if row is None else RequestRow.from_row(row)

    async def request(self, request: int | str) -> RequestRow | None:
        """One request by id or PHID."""
        return await self._db.run("request", self._read_request, request)

    def _replay_rows(self, txn, rows: list[RequestRow]) -> tuple[list[Replay], list[RequestRow]]:
        replayed, skipped = [], []
        for row in rows:
            self._db.execute(txn, SQL_REPLAY, (row.id, row.status, row.date_modified))
            if txn.rowcount == 1:
                after = self._read_request(txn, row.id)
                if after is not None:
                    replayed.append(Replay(before=row, after=after))
                    continue
            skipped.append(row)
        return replayed, skipped

    def _requeued(self, replays: list[Replay], stamp: int) -> None:
        for replay in replays:
            self._view.requeued(replay.after.seen(), replay.before.status, stamp)

    async def replay(self, request: int | str) -> Replay | None:
        """Put a sent or failed request back in the queue; None when there is no
        such request. Raises NotReplayable for a queued one."""
        await self._observation.load()

        def replay(txn) -> tuple[RequestRow | None, list[Replay]]:
            row = self._read_request(txn, request)
            if row is None or row.status not in (SENT, FAILED):
                return row, []
            replayed, skipped = self._replay_rows(txn, [row])
            return (self._read_request(txn, row.id) if skipped else row), replayed

        row, replayed = await self._db.run("replay", replay)
        if replayed:
            # This process offers the row at its next poll (docs/webhook.md).
            self._requeued(replayed, self._view.stamp())
            return replayed[0]
        if row is None:
            return None
        raise NotReplayable(row)

    async def replay_range(
        self,
        *,
        hook: str,
        since: int,
        until: int,
        statuses: Sequence[str],
        after_id: int = 0,
        limit: int = 1000,
    ) -> RangeReplay:
        """Replay a hook's finished requests created in ``since <= dateCreated < until``,
        oldest first, at most ``limit`` per call, from ``after_id`` on."""
        await self._observation.load()
        statement = SQL_REPLAY_RANGE.format(statuses=marks(len(statuses)))

        def replay(txn) -> tuple[list[Replay], list[RequestRow], bool]:
            self._db.execute(
                txn, statement, (hook.encode("utf-8"), since, until, *statuses, after_id, limit + 1)
            )
            rows = [RequestRow.from_row(row) for row in txn.fetchall()]
            more = len(rows) > limit
            replayed, skipped = self._replay_rows(txn, rows[:limit])
            return replayed, skipped, more

        replayed, skipped, more = await self._db.run("replay_range", replay)
        self._requeued(replayed, self._view.stamp())
        last = max([r.before.id for r in replayed] + [r.id for r in skipped], default=after_id)
        return RangeReplay(replayed=replayed, skipped=skipped, next_after_id=last if more else None)
