"""A long delivery history in ``herald_webhookrequest``, filled the fast way.

``INSERT … SELECT`` doubles the table per statement, so a million finished
rows take about twenty statements. Used by the tests that check no query
reads the history, and by ``bench/webhook.py --history``.
"""

from __future__ import annotations

import json

HISTORY_PROPERTIES = json.dumps(
    {
        "retry": "forever",
        "transactionPHIDs": ["PHID-XACT-TASK-aaaaaaaaaaaaaaa"],
        "triggerPHIDs": ["PHID-HRUL-cccccccccccccccccccc"],
        "silent": False,
        "secure": False,
        "errorType": "http",
        "errorCode": 200,
    },
    separators=(",", ":"),
)

_COLUMNS = (
    "webhookPHID, objectPHID, status, properties, lastRequestResult, lastRequestEpoch,"
    " dateCreated, dateModified"
)


def fill_history(
    conn, rows: int, hooks: list[str], *, created: int, failed_every: int = 10
) -> None:
    """Append ``rows`` finished requests of ``hooks``, all created at ``created`` (old).

    Every ``failed_every``-th row is ``failed``/``fail`` (a retry=never
    request that failed), the others ``sent``/``okay``. ``conn`` is a pymysql
    connection in autocommit mode; nothing else may insert meanwhile.
    """
    if rows <= 0:
        return
    with conn.cursor() as cur:
        seed = min(rows, max(len(hooks), failed_every))
        cur.executemany(
            "INSERT INTO herald_webhookrequest (phid, " + _COLUMNS + ")"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    f"PHID-HWBR-s{created}-{n}",
                    hooks[n % len(hooks)],
                    f"PHID-TASK-{n:020d}",
                    "failed" if n % failed_every == 0 else "sent",
                    HISTORY_PROPERTIES,
                    "fail" if n % failed_every == 0 else "okay",
                    created,
                    created,
                    created + 1,
                )
                for n in range(seed)
            ],
        )
        cur.execute(
            "SELECT id FROM herald_webhookrequest WHERE phid = %s", (f"PHID-HWBR-s{created}-0",)
        )
        (first,) = cur.fetchone()
        done, step = seed, 0
        while done < rows:
            step += 1
            cur.execute("SELECT MAX(id) FROM herald_webhookrequest")
            (last,) = cur.fetchone()
            cur.execute(
                "INSERT INTO herald_webhookrequest (phid, " + _COLUMNS + ")"
                " SELECT CONCAT('PHID-HWBR-h', %s, '-', %s, '-', id), "
                + _COLUMNS
                + " FROM herald_webhookrequest WHERE id >= %s AND id <= %s ORDER BY id LIMIT %s",
                (created, step, first, last, min(rows - done, done)),
            )
            done += cur.rowcount
