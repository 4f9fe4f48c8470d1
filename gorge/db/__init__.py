"""The SQL layer the stores stand on: an engine per database kind, one way to run
a transaction (gorge/sql/database.py), and its metrics."""

from gorge.db.database import (
    ATTEMPTS,
    DEADLINE,
    Database,
    DatabaseReadOnly,
    Transactions,
    TransactionTimeout,
)
from gorge.db.engine import Engine, MySQLEngine, SQLiteEngine

__all__ = [
    "ATTEMPTS",
    "DEADLINE",
    "Database",
    "DatabaseReadOnly",
    "Engine",
    "MySQLEngine",
    "SQLiteEngine",
    "TransactionTimeout",
    "Transactions",
]
