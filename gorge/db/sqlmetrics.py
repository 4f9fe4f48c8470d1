"""The transactions of a :class:`~gorge.sql.Database`, by description, on /metrics."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from gorge.db.database import Database


class TransactionMetrics(Collector):
    """Read at scrape time: running a transaction costs a few additions, no more."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def collect(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "gorge_sql_transactions",
            "SQL transactions by description and outcome.",
            labels=["txn", "outcome"],
        )
        retries = CounterMetricFamily(
            "gorge_sql_transaction_retries",
            "Transactions run again after a deadlock, lock wait timeout or locked file.",
            labels=["txn"],
        )
        seconds = SummaryMetricFamily(
            "gorge_sql_transaction_seconds",
            "Time from start to answer, retries included.",
            labels=["txn"],
        )
        for txn, done in sorted(self._database.transactions.items()):
            runs.add_metric([txn, "ok"], done.ok)
            runs.add_metric([txn, "error"], done.failed)
            runs.add_metric([txn, "timeout"], done.timed_out)
            retries.add_metric([txn], done.retries)
            seconds.add_metric([txn], done.count, done.seconds)
        yield runs
        yield retries
        yield seconds
