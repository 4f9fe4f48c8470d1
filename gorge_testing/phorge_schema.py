"""Phorge's tables that gorge reads and writes, declared as facts.

These are the columns, types and keys that Phorge's own storage upgrade
creates (Phorge ``07c1a51310`` on MariaDB 10.11, a utf8mb4-capable server,
so every table is ``utf8mb4`` / ``utf8mb4_bin``). The test fixtures build
throwaway databases from them; nothing here is read at run time.

Facts worth knowing when reading a test:

* ``herald_webhookrequest`` has no index on ``status``: only the primary
  key, ``key_phid``, ``key_ratelimit(webhookPHID, lastRequestResult,
  lastRequestEpoch)`` (Phorge's "too many failures lately" check) and
  ``key_collect(dateCreated)`` (garbage collection).
* ``worker_activetask.id`` and ``worker_archivetask.id`` are not
  auto-increment: ids come from the ``lisk_counter`` row named
  ``worker_activetask`` in the same database, which holds the last id
  issued. An archived task keeps its active id. ``worker_taskdata.id`` is a
  plain auto-increment.
* PHIDs are ``varbinary(64)``, epochs ``int(10) unsigned``, JSON blobs
  ``longtext``.
"""

from __future__ import annotations

from dataclasses import dataclass

CHARSET = "utf8mb4"
COLLATION = "utf8mb4_bin"

EPOCH = "int(10) unsigned NOT NULL"
EPOCH_OR_NULL = "int(10) unsigned DEFAULT NULL"
PHID = "varbinary(64) NOT NULL"
PHID_OR_NULL = "varbinary(64) DEFAULT NULL"
ID = "int(10) unsigned NOT NULL"
SERIAL = "int(10) unsigned NOT NULL AUTO_INCREMENT"
TEXT = "longtext NOT NULL"


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]
    primary: tuple[str, ...] = ("id",)
    unique: tuple[tuple[str, tuple[str, ...]], ...] = ()
    keys: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def create_statement(self) -> str:
        def cols(names: tuple[str, ...]) -> str:
            return ",".join(f"`{name}`" for name in names)

        lines = [f"  `{name}` {definition}" for name, definition in self.columns]
        lines.append(f"  PRIMARY KEY ({cols(self.primary)})")
        lines += [f"  UNIQUE KEY `{name}` ({cols(on)})" for name, on in self.unique]
        lines += [f"  KEY `{name}` ({cols(on)})" for name, on in self.keys]
        body = ",\n".join(lines)
        return (
            f"CREATE TABLE IF NOT EXISTS `{self.name}` (\n{body}\n) ENGINE=InnoDB"
            f" DEFAULT CHARSET={CHARSET} COLLATE={COLLATION}"
        )


HERALD = (
    Table(
        "herald_webhook",
        (
            ("id", SERIAL),
            ("phid", PHID),
            ("name", "varchar(128) NOT NULL"),
            ("webhookURI", TEXT),
            ("viewPolicy", PHID),
            ("editPolicy", PHID),
            ("status", "varchar(32) NOT NULL"),
            ("hmacKey", "varchar(32) NOT NULL"),
            ("dateCreated", EPOCH),
            ("dateModified", EPOCH),
        ),
        unique=(("key_phid", ("phid",)),),
        keys=(("key_status", ("status",)),),
    ),
    Table(
        "herald_webhookrequest",
        (
            ("id", SERIAL),
            ("phid", PHID),
            ("webhookPHID", PHID),
            ("objectPHID", PHID),
            ("status", "varchar(32) NOT NULL"),
            ("properties", TEXT),
            ("lastRequestResult", "varchar(32) NOT NULL"),
            ("lastRequestEpoch", EPOCH),
            ("dateCreated", EPOCH),
            ("dateModified", EPOCH),
        ),
        unique=(("key_phid", ("phid",)),),
        keys=(
            ("key_ratelimit", ("webhookPHID", "lastRequestResult", "lastRequestEpoch")),
            ("key_collect", ("dateCreated",)),
        ),
    ),
    # When a request's object is the webhook itself (``bin/webhook call``
    # without an object), its transaction PHIDs come from this table.
    Table(
        "herald_webhooktransaction",
        (
            ("id", SERIAL),
            ("phid", PHID),
            ("authorPHID", PHID),
            ("objectPHID", PHID),
            ("viewPolicy", PHID),
            ("editPolicy", PHID),
            ("commentPHID", PHID_OR_NULL),
            ("commentVersion", ID),
            ("transactionType", "varchar(32) NOT NULL"),
            ("oldValue", TEXT),
            ("newValue", TEXT),
            ("contentSource", TEXT),
            ("metadata", TEXT),
            ("dateCreated", EPOCH),
            ("dateModified", EPOCH),
        ),
        unique=(("key_phid", ("phid",)),),
        keys=(("key_object", ("objectPHID",)),),
    ),
)

WORKER = (
    Table(
        "worker_activetask",
        (
            ("id", ID),
            ("taskClass", "varchar(64) NOT NULL"),
            ("leaseOwner", "varchar(64) DEFAULT NULL"),
            ("leaseExpires", EPOCH_OR_NULL),
            ("failureCount", ID),
            ("dataID", ID),
            ("failureTime", EPOCH_OR_NULL),
            ("priority", ID),
            ("objectPHID", PHID_OR_NULL),
            ("dateCreated", EPOCH),
            ("dateModified", EPOCH),
            ("containerPHID", PHID_OR_NULL),
        ),
        keys=(
            ("leaseExpires", ("leaseExpires",)),
            ("key_failuretime", ("failureTime",)),
            ("taskClass", ("taskClass",)),
            ("key_owner", ("leaseOwner", "priority", "id")),
            ("key_object", ("objectPHID",)),
            ("key_container", ("containerPHID",)),
        ),
    ),
    Table(
        "worker_archivetask",
        (
            ("id", ID),
            ("taskClass", "varchar(64) NOT NULL"),
            ("leaseOwner", "varchar(64) DEFAULT NULL"),
            ("leaseExpires", EPOCH_OR_NULL),
            ("failureCount", ID),
            ("dataID", ID),
            ("result", ID),
            ("duration", "bigint(20) unsigned NOT NULL"),
            ("dateCreated", EPOCH),
            ("dateModified", EPOCH),
            ("priority", ID),
            ("objectPHID", PHID_OR_NULL),
            ("archivedEpoch", EPOCH_OR_NULL),
            ("containerPHID", PHID_OR_NULL),
        ),
        keys=(
            ("dateCreated", ("dateCreated",)),
            ("key_modified", ("dateModified",)),
            ("key_object", ("objectPHID",)),
            ("key_container", ("containerPHID",)),
        ),
    ),
    Table("worker_taskdata", (("id", SERIAL), ("data", TEXT))),
    Table(
        "lisk_counter",
        (
            ("counterName", "varchar(32) NOT NULL"),
            ("counterValue", "bigint(20) unsigned NOT NULL"),
        ),
        primary=("counterName",),
    ),
)

# Phorge's configuration stored in the database (``bin/config set --database``,
# the web UI); gorge-webhook reads ``phabricator.silent`` from it.
CONFIG = (
    Table(
        "config_entry",
        (
            ("id", SERIAL),
            ("phid", PHID),
            ("namespace", "varchar(64) NOT NULL"),
            ("configKey", "varchar(64) NOT NULL"),
            ("value", TEXT),
            ("isDeleted", "tinyint(1) NOT NULL"),
            ("dateCreated", EPOCH),
            ("dateModified", EPOCH),
        ),
        unique=(("key_phid", ("phid",)), ("key_name", ("namespace", "configKey"))),
    ),
)

SCHEMAS: dict[str, tuple[Table, ...]] = {"herald": HERALD, "worker": WORKER, "config": CONFIG}


def tables(schema: str) -> tuple[Table, ...]:
    try:
        return SCHEMAS[schema]
    except KeyError:
        raise ValueError(f"unknown schema {schema!r}; expected one of {sorted(SCHEMAS)}") from None


def create_statements(schema: str, database: str) -> list[str]:
    """Statements that create ``database`` holding the tables of ``schema``."""
    return [
        f"CREATE DATABASE IF NOT EXISTS `{database}` "
        f"DEFAULT CHARACTER SET {CHARSET} COLLATE {COLLATION}",
        f"USE `{database}`",
        *(table.create_statement() for table in tables(schema)),
    ]
