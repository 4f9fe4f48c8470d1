"""Phorge's database topology (``cluster.databases``) as where a daemon connects.

A site that runs Phorge's database cluster keeps its hosts in
``cluster.databases``: masters (one per partition, each listing the
application databases it holds, one of them the ``default`` partition) and
the replicas that follow them. When a master fails the operator promotes a
replica by editing that list. A daemon given the file the list is kept in
(``GORGE_<SERVICE>_MYSQL_TOPOLOGY_FILE``) connects where Phorge itself
writes its application's rows, and follows an edit on SIGHUP.

The master is chosen as ``PhabricatorDatabaseRef::getMasterDatabaseRefForApplication``
chooses it: disabled hosts are left out first; then the enabled master whose
``partition`` names the application, else the enabled master of the default
partition; with a single master, that master. Replicas are never written to
and so never chosen. User, password and port missing from an entry come
from the file's ``mysql.user``/``mysql.pass``/``mysql.port`` when it is a
``local.json``, else from the daemon's own settings, as Phorge takes them
from its ``mysql.*`` options.

The file may hold what ``bin/config get cluster.databases`` prints (the
``config`` list of sources, the local one first), a ``local.json`` object
with a ``cluster.databases`` key, or the list alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.internet.threads import deferToThreadPool

from gorge.config import ConfigError, MySQLSettings
from gorge.db.database import Database
from gorge.db.engine import MySQLEngine
from gorge.log.logger import Logger

__all__ = [
    "DatabaseHost",
    "MasterFollower",
    "Topology",
    "TopologySource",
    "parse_topology",
    "read_topology_file",
    "repoint",
]

log = Logger()

CONFIG_KEY = "cluster.databases"
DEFAULT_PARTITION = "default"
_ROLES = ("master", "replica")
# PhabricatorClusterDatabasesConfigType's map of allowed keys and their types.
_FIELDS: dict[str, tuple[type, ...]] = {
    "host": (str,),
    "role": (str,),
    "port": (int,),
    "user": (str,),
    "pass": (str,),
    "disabled": (bool,),
    "master": (str,),
    "partition": (list,),
    "persistent": (bool,),
}


@dataclass(frozen=True)
class DatabaseHost:
    """One entry of ``cluster.databases``, defaults filled in."""

    host: str
    port: int
    user: str
    password: str = dataclasses.field(repr=False)
    is_master: bool
    disabled: bool = False
    #: The application databases a master holds (``default`` included), as listed.
    partition: tuple[str, ...] = ()
    #: For a replica: the ``host:port`` of the master it follows.
    master: str = ""

    @property
    def key(self) -> str:
        """PhabricatorDatabaseRef::getRefKey."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Topology:
    hosts: tuple[DatabaseHost, ...]

    @property
    def partitioned(self) -> bool:
        return sum(1 for host in self.hosts if host.is_master) > 1

    def master_for(self, application: str) -> DatabaseHost | None:
        """The enabled master that holds ``application`` (``worker``, ``herald``),
        as Phorge picks it; None when there is none."""
        masters = [host for host in self.hosts if host.is_master and not host.disabled]
        if not self.partitioned:
            # One master holds everything (Phorge makes it the default partition).
            return masters[0] if masters else None
        default = None
        for master in masters:
            if application in master.partition:
                return master
            if DEFAULT_PARTITION in master.partition and default is None:
                default = master
        return default


def _typed_entry(index: int, entry: object) -> Mapping[str, Any]:
    if not isinstance(entry, dict):
        raise ValueError(f"entry {index} is not an object describing a database host")
    for key, value in entry.items():
        kinds = _FIELDS.get(key)
        if kinds is None:
            raise ValueError(f"entry {index}: unknown key {key!r}")
        # JSON's true/false are not ports, nor 3306.0 a boolean.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ValueError(f"entry {index}: {key!r} must be a {kinds[0].__name__}")
    for key in ("host", "role"):
        if key not in entry:
            raise ValueError(f"entry {index}: {key!r} is missing")
    if entry["role"] not in _ROLES:
        raise ValueError(f"entry {index}: role {entry['role']!r} is not master or replica")
    partition = entry.get("partition")
    if partition is not None and not all(isinstance(item, str) for item in partition):
        raise ValueError(f"entry {index}: 'partition' must be a list of strings")
    port = entry.get("port")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"entry {index}: port {port} is out of range")
    return entry


def _password(given: str | None, default: str) -> str:
    return given if given not in (None, "", "0") else default


def parse_topology(
    entries: object, *, default_port: int, default_user: str, default_password: str
) -> Topology:
    """``cluster.databases``' value; ValueError says what is wrong, with
    the checks Phorge makes before it uses the list (PhabricatorDatabaseRefParser)."""
    if not isinstance(entries, list):
        raise ValueError(f"{CONFIG_KEY} is not a list of database hosts")
    hosts = []
    for index, raw in enumerate(entries):
        entry = _typed_entry(index, raw)
        hosts.append(
            DatabaseHost(
                host=entry["host"],
                port=entry.get("port", default_port),
                user=entry.get("user", default_user),
                # A password PHP counts as false ("" or "0") takes the default.
                password=_password(entry.get("pass"), default_password),
                is_master=entry["role"] == "master",
                disabled=entry.get("disabled", False),
                partition=tuple(entry.get("partition") or ()),
                master=entry.get("master", ""),
            )
        )
    topology = Topology(tuple(hosts))
    _check(topology, entries)
    return topology


def _check(topology: Topology, entries: Sequence[Mapping[str, Any]]) -> None:
    seen: set[str] = set()
    for host in topology.hosts:
        if host.key in seen:
            raise ValueError(f"{host.key} is listed twice")
        seen.add(host.key)
    masters = [host.key for host in topology.hosts if host.is_master]
    owners: dict[str, str] = {}
    for host, entry in zip(topology.hosts, entries, strict=True):
        if host.is_master:
            if topology.partitioned and "partition" not in entry:
                raise ValueError(f"master {host.key} has no 'partition' (there are several)")
            if not topology.partitioned:
                continue
            for application in host.partition:
                if application in owners:
                    raise ValueError(
                        f"masters {owners[application]} and {host.key} both hold {application!r}"
                    )
                owners[application] = host.key
            continue
        if "partition" in entry:
            raise ValueError(f"replica {host.key} has a 'partition' (only masters have one)")
        if host.master and host.master not in masters:
            raise ValueError(f"replica {host.key} follows {host.master}, which is not a master")
        if not host.master and topology.partitioned:
            raise ValueError(f"replica {host.key} does not say which 'master' it follows")
        if not masters:
            raise ValueError(f"replica {host.key} has no master to follow")


def _entries_in(document: object) -> tuple[object, Mapping[str, Any]]:
    """The ``cluster.databases`` value in one of the file's three shapes,
    and the ``mysql.*`` defaults found beside it."""
    if isinstance(document, list):
        return document, {}
    if not isinstance(document, dict):
        raise ValueError(f"expected {CONFIG_KEY}: a list, or an object holding it")
    if CONFIG_KEY in document:  # conf/local/local.json
        return document[CONFIG_KEY], document
    sources = document.get("config")
    if isinstance(sources, list):  # bin/config get cluster.databases
        for source in sources:
            if (
                isinstance(source, dict)
                and source.get("key") == CONFIG_KEY
                and source.get("status") == "set"
            ):
                return source.get("value"), {}
        raise ValueError(f"{CONFIG_KEY} is not set in any source of this 'bin/config get' output")
    raise ValueError(f"no {CONFIG_KEY} in this file")


def read_topology_file(
    path: str, *, default_port: int, default_user: str, default_password: str
) -> Topology:
    """Read and check the file; OSError or ValueError (JSON included) says why not."""
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    entries, local = _entries_in(document)
    port = local.get("mysql.port")
    user = local.get("mysql.user")
    password = local.get("mysql.pass")
    return parse_topology(
        entries,
        default_port=int(port)
        if isinstance(port, int | str) and str(port).isdigit()
        else default_port,
        default_user=user if isinstance(user, str) and user else default_user,
        default_password=password if isinstance(password, str) and password else default_password,
    )


@dataclass(frozen=True)
class TopologySource:
    """Where a daemon's master comes from: the file, the application database
    to find in it, and the daemon's own settings (TLS, timeouts, pool size,
    database name, and the defaults for what an entry leaves out)."""

    path: str
    application: str
    #: The setting that names the file, for error lines.
    setting: str
    base: MySQLSettings

    def resolve(self) -> MySQLSettings:
        """The base settings pointed at the application's master; ValueError
        (or OSError) when the file cannot be read, is not valid, or names no
        enabled master for the application."""
        topology = read_topology_file(
            self.path,
            default_port=self.base.port,
            default_user=self.base.user,
            default_password=self.base.password,
        )
        master = topology.master_for(self.application)
        if master is None:
            raise ValueError(f"no enabled master holds {self.application!r}")
        return dataclasses.replace(
            self.base,
            host=master.host,
            port=master.port,
            user=master.user,
            password=master.password,
        )

    def load(self) -> MySQLSettings:
        """:meth:`resolve` at start-up: a bad file is a ConfigError naming the setting."""
        try:
            return self.resolve()
        except OSError as e:
            raise ConfigError(self.setting, f"{self.path!r}: {e.strerror or e}") from None
        except ValueError as e:
            raise ConfigError(self.setting, f"{self.path!r}: {e}") from None


def repoint(db: Database, settings: MySQLSettings, reactor: Any) -> Deferred[Any]:
    """Move ``db`` to the master ``settings`` name: transactions from now on
    run on a new pool, the old one closes once the transactions it runs have
    ended, and the new master is asked at once whether it takes writes, so
    work waiting for a writable database resumes without waiting for the
    next health check. Fires when both are done."""
    engine = db.engine
    if not isinstance(engine, MySQLEngine):
        raise TypeError(f"only a MySQL database follows a topology, not {engine.name}")
    old = db.pool
    new = engine.make_pool(settings, reactor)
    # What the database wrapped around the old pool's session set-up.
    new.openfun = old.openfun
    db.pool = new
    return gatherResults([Deferred.fromCoroutine(db.ping()), _retire(old, reactor)])


def _retire(pool: adbapi.ConnectionPool, reactor: Any) -> Deferred[None]:
    # ConnectionPool.close() joins the pool's threads, which would hold the
    # reactor for as long as a statement on the old master runs (a master
    # that went away: up to the read timeout). Its triggers come off here,
    # in the reactor thread; the join happens in a thread of the reactor's.
    for trigger in ("shutdownID", "startID"):
        trigger_id = getattr(pool, trigger)
        if trigger_id:
            reactor.removeSystemEventTrigger(trigger_id)
            setattr(pool, trigger, None)
    return deferToThreadPool(reactor, reactor.getThreadPool(), pool.finalClose)


def _endpoint(settings: MySQLSettings) -> tuple[str, int, str, str]:
    return (settings.host, settings.port, settings.user, settings.password)


class MasterFollower:
    """Reads the topology file again on :meth:`reload` (SIGHUP) and, when the
    application's master is another host (or the same one with other
    credentials), hands the new settings to each of ``targets`` (a database's
    :meth:`~gorge.db.database.Database.repoint`, the webhook's lock sessions).

    A file that cannot be used now is logged and changes nothing: the daemon
    stays on the master it has, whose own health decides whether it is ready.
    ``name`` prefixes the events: ``WEBHOOK_DB_MASTER_CHANGED``,
    ``_DB_TOPOLOGY_UNCHANGED``, ``_DB_TOPOLOGY_REJECTED``.
    """

    def __init__(
        self,
        source: TopologySource,
        current: MySQLSettings,
        targets: Iterable[Callable[[MySQLSettings], Deferred[Any] | None]],
        *,
        name: str,
    ) -> None:
        self._source = source
        self.current = current
        self._targets = list(targets)
        prefix = name.upper()
        self._changed_event = (
            prefix + "_DB_MASTER_CHANGED application={application} from={old} to={new}"
        )
        self._unchanged_event = (
            prefix + "_DB_TOPOLOGY_UNCHANGED application={application} master={master}"
        )
        self._rejected_event = prefix + "_DB_TOPOLOGY_REJECTED setting={setting} reason={reason}"
        self._failed_event = prefix + "_DB_REPOINT_FAILED"

    def reload(self) -> Deferred[None]:
        """Read the file once; fires when every target has moved (at once
        when nothing changed). A target that fails is logged, never raised."""
        source = self._source
        try:
            wanted = source.resolve()
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            log.error(self._rejected_event, setting=source.setting, reason=reason)
            return succeed(None)
        if _endpoint(wanted) == _endpoint(self.current):
            log.info(
                self._unchanged_event,
                application=source.application,
                master=f"{wanted.host}:{wanted.port}",
            )
            return succeed(None)
        old, self.current = self.current, wanted
        log.warn(
            self._changed_event,
            application=source.application,
            old=f"{old.host}:{old.port}",
            new=f"{wanted.host}:{wanted.port}",
        )
        moves = [maybeDeferred(target, wanted) for target in self._targets]
        done: Deferred[Any] = gatherResults(moves, consumeErrors=True)
        done.addCallbacks(
            lambda _: None, lambda f: log.failure(self._failed_event, f.value.subFailure)
        )
        return done
