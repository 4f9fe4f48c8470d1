"""Service-tree plumbing shared by the four daemons.

The one way to build a daemon's tree (:class:`ServiceTree`: named children
started in order and stopped in reverse, parts reachable by name), a poll
loop that never overlaps itself, tracking of in-flight work for bounded
drains, the HTTP listener, the ``makeService`` boundary (configuration
errors, log output under twistd), and systemd's notify protocol."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from twisted.application.service import IService

from gorge.app.tree import DaemonRoot
from gorge.config import ConfigError
from gorge.log.logger import Logger
from gorge.log.output import make_observer

log = Logger()


def _twistd_prints_to_stdout(server_options: Mapping[str, Any] | None) -> bool:
    """Whether twistd would print its own default lines to stdout: not
    daemonized, and no ``--logger``, ``--logfile`` or ``--syslog`` chosen."""
    if server_options is None:
        return False
    return (
        bool(server_options.get("nodaemon"))
        and not server_options.get("logger")
        and not server_options.get("syslog")
        and server_options.get("logfile") in (None, "", "-")
    )


def run_make_service(
    service_name: str,
    build: Callable[[], IService],
    environ: Mapping[str, str] | None = None,
    options: Any = None,
) -> IService:
    """Call ``build``; a :class:`ConfigError` becomes one stderr line and exit 2.

    ``options`` are the plugin's parsed twistd options: when twistd would
    print its default lines to stdout, the service's log observer is
    installed instead (see :class:`DaemonRoot`). The log settings are
    checked in every case.
    """
    try:
        observer = make_observer(os.environ if environ is None else environ, sys.stdout)
        service = build()
    except ConfigError as e:
        sys.stderr.write(f"{service_name}: {e}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None
    if isinstance(service, DaemonRoot) and _twistd_prints_to_stdout(
        getattr(options, "parent", None)
    ):
        service.log_observer = observer
    return service
