"""gorge-worker as a ``twistd`` process with one test-only native class.

``recorded_worker.tac`` runs :func:`application_from_env`: the service the
``gorge-worker`` plugin builds (the same :func:`build_worker_service` on
settings from the same ``GORGE_WORKER_*`` environment) plus
:data:`TASK_CLASS`, whose handler appends one JSON line per run to the file
``RECORDED_RUNS_FILE`` names (the task's id, lease owner and lease as the
queue handed them over, and this process's pid) before it does anything
else. With ``RECORDED_RUNS_HOLD=1`` a run then waits until it is cancelled
(a lost lease, a stop); otherwise it succeeds at once.

The line is one ``write`` to a file opened with ``O_APPEND``, so it is on
disk (and whole) before the handler returns, however the process ends
afterwards: a SIGKILLed worker's runs are all in the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from twisted.application.service import Application, IService
from twisted.internet.defer import Deferred, succeed

TASK_CLASS = "RecordedWorker"
RUNS_FILE = "RECORDED_RUNS_FILE"
HOLD = "RECORDED_RUNS_HOLD"


def recording_handler(path: Path, hold: bool) -> Callable[[dict, str | None], Deferred]:
    def handler(task: dict, data: str | None) -> Deferred:
        line = json.dumps(
            {
                "taskID": task["id"],
                "leaseOwner": task.get("leaseOwner"),
                "leaseExpires": task.get("leaseExpires"),
                "leaseSeconds": task.get("leaseSeconds"),
                "pid": os.getpid(),
            }
        )
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode() + b"\n")
        finally:
            os.close(fd)
        return Deferred() if hold else succeed(None)

    return handler


def runs(path: Path) -> list[dict]:
    """The runs recorded so far, in the order they started."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def application_from_env(environ: Mapping[str, str] = os.environ) -> Application:
    from twisted.internet import reactor

    from gorge.worker.service import build_worker_service
    from gorge.worker.settings import load_worker_settings

    handler = recording_handler(Path(environ[RUNS_FILE]), environ.get(HOLD) == "1")
    service: IService = build_worker_service(
        load_worker_settings(environ), reactor, extra_handlers={TASK_CLASS: handler}
    )
    application = Application("gorge-worker")
    service.setServiceParent(application)
    return application
