"""The gorge daemons of one throwaway Phorge, as real ``twistd`` processes."""

from __future__ import annotations

import signal
from pathlib import Path

import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gorge_testing.phorge import BOUND, STEP, PhorgeSite
from gorge_testing.procs import free_port
from gorge_testing.twistd import TwistdDaemon, daemon_environ

QUEUE_TOKEN = "queue-token"
MAILER_TOKEN = "mailer-token"
WORKER_SUFFIX = ":gorge-worker"  # how gorge-worker's lease owners end
DAEMONS = ("taskqueue", "worker", "mailer", "webhook")
PHP_PATHS = ("executors", "conduit")


class Daemon(TwistdDaemon):
    def __init__(self, tapname: str, env: dict[str, str], log_path: Path, port: int) -> None:
        self.name = tapname
        self.port = port
        environ = daemon_environ(
            {"GORGE_LISTEN_ADDR": f"127.0.0.1:{port}", "GORGE_LOG_LEVEL": "info", **env},
            drop=("GORGE_",),
        )
        super().__init__(tapname, environ, log_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def require_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with status {self.proc.returncode}:\n{self.log_text()[-3000:]}"
            )

    async def wait_ready(self, path: str = "/readyz") -> None:
        deadline = reactor.seconds() + BOUND
        last = "no answer"
        while True:
            self.require_alive()
            try:
                response = await treq.get(self.url + path, timeout=10)
                body = await response.content()
                if response.code == 200:
                    return
                last = f"HTTP {response.code}: {body[:300]!r}"
            except Exception as exc:  # noqa: BLE001 - not listening yet
                last = repr(exc)
            if reactor.seconds() > deadline:
                raise AssertionError(f"{self.name} not ready ({last}):\n{self.log_text()[-3000:]}")
            await deferLater(reactor, STEP)

    async def terminate(self) -> int:
        """SIGTERM, then wait for the exit (a worker drains and reports first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = reactor.seconds() + BOUND
        while self.proc.poll() is None:
            if reactor.seconds() > deadline:
                self.kill()
                raise AssertionError(f"{self.name} ignored SIGTERM:\n{self.log_text()[-3000:]}")
            await deferLater(reactor, STEP)
        self.kill()  # closes the log
        return self.proc.returncode


class GorgeStack:
    """gorge-taskqueue, gorge-worker, gorge-mailer and gorge-webhook for one site.

    ``poll_ms`` is the worker's and the webhook's poll interval (None: their
    defaults, what an operator gets). The worker calls ``worker.execute`` on
    the site only once :attr:`worker_token` is set; the mailer needs
    ``smtp_port``. ``php`` says where the worker runs PHP tasks: in local
    PHP executors on the site's checkout ("executors"), or through
    ``worker.execute`` on the site's web server ("conduit").
    """

    def __init__(
        self,
        site: PhorgeSite,
        workdir: Path,
        smtp_port: int | None = None,
        poll_ms: int | None = 100,
        php: str = "conduit",
    ) -> None:
        if php not in PHP_PATHS:
            raise ValueError(f"php must be one of {PHP_PATHS}, not {php!r}")
        self.php = php
        self.site = site
        self.dir = workdir
        self.smtp_port = smtp_port
        self.poll_ms = poll_ms
        self.ports = {name: free_port() for name in DAEMONS}
        self.daemons: dict[str, Daemon] = {}
        self.worker_token = ""
        self._starts = 0

    @property
    def mailer_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['mailer']}"

    def _mysql(self, prefix: str) -> dict[str, str]:
        db = self.site.mariadb
        return {
            f"{prefix}MYSQL_HOST": db.host,
            f"{prefix}MYSQL_PORT": str(db.port),
            f"{prefix}MYSQL_USER": db.user,
            f"{prefix}MYSQL_PASS": db.password,
            f"{prefix}NAMESPACE": self.site.namespace,
        }

    def _poll(self, setting: str) -> dict[str, str]:
        return {} if self.poll_ms is None else {setting: str(self.poll_ms)}

    def environment(self, name: str) -> dict[str, str]:
        if name == "taskqueue":
            return {
                "GORGE_SERVICE_TOKEN": QUEUE_TOKEN,
                "GORGE_TASKQUEUE_BACKEND": "mysql",
                **self._mysql("GORGE_TASKQUEUE_"),
            }
        if name == "worker":
            env = {
                "GORGE_WORKER_TASK_QUEUE_URL": f"http://127.0.0.1:{self.ports['taskqueue']}",
                "GORGE_WORKER_TASK_QUEUE_TOKEN": QUEUE_TOKEN,
                "GORGE_WORKER_NATIVE_TEST_WORKER": "1",
                "GORGE_WORKER_WEBHOOK_OWNER": "gorge-webhook",
                **self._poll("GORGE_WORKER_POLL_INTERVAL_MS"),
            }
            if self.php == "executors":
                env.update(
                    {
                        "GORGE_WORKER_PHORGE_ROOT": str(self.site.checkout.root),
                        "GORGE_WORKER_PHP_BINARY": self.site.checkout.php,
                        # As for bin/phd: the executors read the site's
                        # configuration through PHABRICATOR_ENV.
                        **{k: self.site.env[k] for k in ("PHABRICATOR_ENV", "TMPDIR")},
                    }
                )
            elif self.worker_token:
                env.update(
                    {
                        # worker.execute on Phorge's own /api/, with the bot's API token.
                        "GORGE_WORKER_CONDUIT_URL": self.site.base_uri,
                        "GORGE_WORKER_CONDUIT_TOKEN": self.worker_token,
                        # One probe at start-up is enough to prove the method answers.
                        "GORGE_WORKER_CONDUIT_PROBE_SEC": "3600",
                    }
                )
            return env
        if name == "mailer":
            if self.smtp_port is None:
                raise ValueError("gorge-mailer needs an SMTP port")
            return {
                "GORGE_SERVICE_TOKEN": MAILER_TOKEN,
                "GORGE_MAILER_TYPE": "smtp",
                "GORGE_MAILER_KEY": "sink",
                "SMTP_HOST": "127.0.0.1",
                "SMTP_PORT": str(self.smtp_port),
                "GORGE_MAILER_MAX_RETRIES": "0",
                "GORGE_MAILER_SEND_TIMEOUT": "20",
                "GORGE_MAILER_STRICT": "1",
                # The site's own record of keyed sends, not one in the source tree.
                "GORGE_MAILER_IDEMPOTENCY_DB": str(self.dir / "mailer-idempotency.sqlite3"),
            }
        if name == "webhook":
            return {
                "GORGE_WEBHOOK_OUTBOUND_BLACKLIST": "none",
                **self._poll("GORGE_WEBHOOK_POLL_INTERVAL_MS"),
                **self._mysql("GORGE_WEBHOOK_"),
            }
        raise ValueError(name)

    def start(self, name: str, **overrides: str) -> Daemon:
        self._starts += 1
        daemon = Daemon(
            f"gorge-{name}",
            {**self.environment(name), **overrides},
            self.dir / f"{name}-{self._starts}.log",
            self.ports[name],
        )
        self.daemons[name] = daemon
        return daemon

    async def start_ready(self, name: str, **overrides: str) -> Daemon:
        daemon = self.start(name, **overrides)
        await daemon.wait_ready()
        return daemon

    async def stop(self, name: str) -> int:
        return await self.daemons.pop(name).terminate()

    def alive(self) -> list[Daemon]:
        return list(self.daemons.values())

    def kill_all(self) -> None:
        for daemon in self.daemons.values():
            daemon.kill()
        self.daemons.clear()
