"""A throwaway Phorge on a throwaway MariaDB, for the real-Phorge tests and
``bench/phorge.py``.

Phorge's code is used where it lies and nothing is written into that
checkout: ``GORGE_PHORGE_ROOT`` (with ``arcanist/`` beside it) when it is
set, else the per-user cache ``scripts/phorge-checkout.sh`` fills at the
commits pinned in ``phorge/tested-with``. Each
instance keeps its configuration in its own temporary directory. Phorge reads
a configuration file named by ``PHABRICATOR_ENV`` as
``<root>/conf/<PHABRICATOR_ENV>.conf.php``, so the variable holds the path of
our file relative to ``<root>/conf``. That file returns the contents of a JSON
file beside it, which the caller rewrites to change a setting (the web server
reads it on every request; daemons read it when they start).

Each instance has its own storage namespace on the MariaDB and its own
``cluster.instance``, so ``bin/phd`` only sees its own daemons.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.utils import getProcessOutputAndValue

from gorge_testing.procs import free_port

ROOT_VARIABLE = "GORGE_PHORGE_ROOT"
CACHE_VARIABLE = "GORGE_PHORGE_CACHE"
REPO_ROOT = Path(__file__).resolve().parents[1]
# The one place naming the Phorge and Arcanist commits the library is tested on.
TESTED_WITH = REPO_ROOT / "phorge" / "tested-with"
CHECKOUT_SCRIPT = "scripts/phorge-checkout.sh"
PHP_DIR = Path(__file__).resolve().parent / "php"
ROUTER = PHP_DIR / "router.php"
HELPER = PHP_DIR / "phorge_helper.php"

# Bounds for waits on work that crosses several processes (PHP web requests,
# twistd daemons, MariaDB) on a loaded two-core machine.
BOUND = 90.0
STEP = 0.1

_serial = itertools.count(1)


class PhorgeError(AssertionError):
    """A Phorge command failed; the message carries its output."""


@dataclass(frozen=True)
class Checkout:
    root: Path
    arcanist: Path
    php: str
    # Where it was found: ROOT_VARIABLE, or "the cache".
    source: str = ROOT_VARIABLE

    def commits(self) -> dict[str, str | None]:
        """The full commit of each checkout, None where it is no git checkout."""
        return {"phorge": git_commit(self.root), "arcanist": git_commit(self.arcanist)}

    def describe(self) -> str:
        parts = [f"phorge {self.root} (from {self.source})"]
        for name, commit in self.commits().items():
            if commit:
                parts.append(f"{name} {commit[:10]}")
        pinned = pinned_commits()
        if self.commits() != pinned:
            phorge, arcanist = pinned["phorge"][:10], pinned["arcanist"][:10]
            parts.append(f"not the pinned phorge {phorge} / arcanist {arcanist}")
        return ", ".join(parts)


def git_commit(path: Path) -> str | None:
    if not (path / ".git").exists() or shutil.which("git") is None:
        return None
    done = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


def pinned_commits() -> dict[str, str]:
    """``phorge/tested-with``: {"phorge": sha, "arcanist": sha}."""
    values = {}
    for line in TESTED_WITH.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            values[key.strip()] = value.strip()
    return {"phorge": values["PHORGE_COMMIT"], "arcanist": values["ARCANIST_COMMIT"]}


def cached_checkout_root() -> Path:
    """Where ``scripts/phorge-checkout.sh`` puts the pinned Phorge (it may be absent)."""
    cache = os.environ.get(CACHE_VARIABLE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "gorge",
    )
    return Path(cache) / f"phorge-{pinned_commits()['phorge'][:10]}" / "phorge"


def find_checkout() -> tuple[Checkout | None, str | None]:
    """The Phorge checkout for the tests: (checkout, None), or (None, why not).

    ``GORGE_PHORGE_ROOT`` first; else the pinned checkout in the per-user
    cache. Neither is (None, None): the real-Phorge tests are skipped.
    """
    raw = os.environ.get(ROOT_VARIABLE, "")
    source = ROOT_VARIABLE
    if not raw:
        cached = cached_checkout_root()
        if not (cached / "bin" / "storage").is_file():
            return None, None
        raw, source = str(cached), "the cache"
    root = Path(raw).resolve()
    if not (root / "bin" / "storage").is_file() or not (root / "webroot" / "index.php").is_file():
        return (
            None,
            f"{ROOT_VARIABLE}={raw} is not a Phorge checkout (no bin/storage or webroot/index.php)",
        )
    arcanist = root.parent / "arcanist"
    if not (arcanist / "bin" / "arc").is_file():
        return None, f"{ROOT_VARIABLE}={raw}: no arcanist checkout beside it at {arcanist}"
    php = shutil.which("php")
    if php is None:
        return None, (
            f"a Phorge checkout is at {root} but there is no php on PATH; "
            "./scripts/test.sh installs it (php-cli php-mysql php-curl php-mbstring "
            "php-xml php-zip php-gd php-intl)"
        )
    return Checkout(root, arcanist, php, source), None


async def until(check, what: str, bound: float = BOUND, watch=()) -> Any:
    """Poll ``check`` on the reactor until it returns something truthy;
    a check that needs the reactor itself (a page load, a metrics read) may
    answer an awaitable, which is awaited.

    ``watch`` lists processes that must stay alive meanwhile; one that exits
    ends the wait at once with its log.
    """
    deadline = reactor.seconds() + bound
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        for process in watch:
            process.require_alive()
        if reactor.seconds() > deadline:
            raise AssertionError(f"not reached within {bound:g}s: {what}")
        await deferLater(reactor, STEP)


class Background:
    """A long-running child process (its own process group, output to a log)."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def require_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with status {self.proc.returncode}:\n{self.log_text()[-3000:]}"
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            # PHP's built-in server forks its workers into the same group.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)
        if not self._log.closed:
            self._log.close()


class PhorgeSite:
    """One Phorge instance: configuration, storage, web server, commands."""

    def __init__(
        self, checkout: Checkout, mariadb, workdir: Path, label: str, libraries: Sequence[Path] = ()
    ) -> None:
        self.checkout = checkout
        self.mariadb = mariadb
        self.dir = workdir
        self.namespace = f"g{os.getpid()}{label}{next(_serial)}"
        self.web_port = free_port()
        self.base_uri = f"http://127.0.0.1:{self.web_port}"
        self.web: Background | None = None
        self._connections: dict[str, pymysql.connections.Connection] = {}
        for sub in ("tmp", "log"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        self.config: dict[str, Any] = {
            "mysql.host": mariadb.host,
            "mysql.port": mariadb.port,
            "mysql.user": mariadb.user,
            "mysql.pass": mariadb.password,
            "storage.default-namespace": self.namespace,
            "cluster.instance": self.namespace,
            "load-libraries": [str(path) for path in libraries],
            "phabricator.base-uri": self.base_uri + "/",
            "phabricator.timezone": "UTC",
            "phd.log-directory": str(workdir / "log"),
            "metamta.default-address": "noreply@example.com",
            "pygments.enabled": False,
        }
        self._conf_file = workdir / "instance.conf.php"
        self._conf_file.write_text(
            "<?php\n\n// Written by gorge_testing.phorge for one throwaway instance.\n"
            "return json_decode(file_get_contents(__DIR__.'/instance.json'), true);\n"
        )
        self._write_config()

    # -- configuration ---------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        relative = os.path.relpath(self._conf_file, self.checkout.root / "conf")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GORGE_", "PHABRICATOR_"))}
        env.update(
            {
                "PHABRICATOR_ENV": relative[: -len(".conf.php")],
                "TMPDIR": str(self.dir / "tmp"),
            }
        )
        return env

    def _write_config(self) -> None:
        path = self.dir / "instance.json"
        staging = path.with_suffix(".new")
        staging.write_text(json.dumps(self.config, indent=2))
        staging.replace(path)  # a request never reads half a file

    def configure(self, settings: dict[str, Any]) -> None:
        """Set (or, with None, remove) Phorge settings."""
        for key, value in settings.items():
            if value is None:
                self.config.pop(key, None)
            else:
                self.config[key] = value
        self._write_config()

    # -- commands --------------------------------------------------------------

    def bin_sync(self, *argv: str, stdin: bytes = b"") -> str:
        """Run ``bin/<argv>`` and wait (only while no server in this process must answer)."""
        done = subprocess.run(
            [str(self.checkout.root / "bin" / argv[0]), *argv[1:]],
            input=stdin,
            capture_output=True,
            env=self.env,
            cwd=self.checkout.root,
            timeout=600,
        )
        if done.returncode != 0:
            raise PhorgeError(
                f"bin/{' '.join(argv)} exited with {done.returncode}:\n"
                f"{done.stdout.decode(errors='replace')[-3000:]}\n"
                f"{done.stderr.decode(errors='replace')[-3000:]}"
            )
        return done.stdout.decode(errors="replace")

    async def run(self, argv: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
        """Run a command without blocking the reactor: (status, stdout, stderr)."""
        out, err, status = await getProcessOutputAndValue(
            argv[0],
            argv[1:],
            env=self.env,
            path=str(self.checkout.root),
            reactor=reactor,
            stdinBytes=stdin,
        )
        return status, out.decode(errors="replace"), err.decode(errors="replace")

    async def bin(self, *argv: str, stdin: bytes = b"", check: bool = True) -> tuple[int, str, str]:
        status, out, err = await self.run(
            [str(self.checkout.root / "bin" / argv[0]), *argv[1:]], stdin
        )
        if check and status != 0:
            raise PhorgeError(
                f"bin/{' '.join(argv)} exited with {status}:\n{out[-3000:]}\n{err[-3000:]}"
            )
        return status, out, err

    def helper_sync(self, command: str, timeout: float = 300, **args: Any) -> dict:
        done = subprocess.run(
            [self.checkout.php, str(HELPER), str(self.checkout.root), command, json.dumps(args)],
            capture_output=True,
            env=self.env,
            cwd=self.checkout.root,
            timeout=timeout,
        )
        return self._helper_answer(
            command,
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    async def helper(self, command: str, **args: Any) -> dict:
        """Run php/phorge_helper.php: Phorge's own classes do the writing."""
        status, out, err = await self.run(
            [self.checkout.php, str(HELPER), str(self.checkout.root), command, json.dumps(args)]
        )
        return self._helper_answer(command, status, out, err)

    @staticmethod
    def _helper_answer(command: str, status: int, out: str, err: str) -> dict:
        if status != 0:
            raise PhorgeError(
                f"phorge_helper.php {command} exited with {status}:\n{out[-3000:]}\n{err[-3000:]}"
            )
        return json.loads(out.strip().splitlines()[-1])

    # -- storage ---------------------------------------------------------------

    def upgrade_storage(self) -> None:
        self.bin_sync("storage", "upgrade", "--force")

    def connection(self, database: str) -> pymysql.connections.Connection:
        if database not in self._connections:
            self._connections[database] = self.mariadb.connect(f"{self.namespace}_{database}")
        return self._connections[database]

    def rows(self, database: str, sql: str, *args: Any) -> list[dict]:
        with self.connection(database).cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(sql, args)
            # Phorge stores PHIDs and much else in binary columns.
            return [
                {
                    k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                    for k, v in row.items()
                }
                for row in cur.fetchall()
            ]

    def execute(self, database: str, sql: str, *args: Any) -> int:
        with self.connection(database).cursor() as cur:
            return cur.execute(sql, args)

    # -- web -------------------------------------------------------------------

    def start_web(self) -> None:
        env = {**self.env, "PHP_CLI_SERVER_WORKERS": "4"}
        self.web = Background(
            "php -S (Phorge)",
            [
                self.checkout.php,
                "-S",
                f"127.0.0.1:{self.web_port}",
                "-t",
                str(self.checkout.root / "webroot"),
                str(ROUTER),
            ],
            env,
            self.checkout.root,
            self.dir / "web.log",
        )

    async def wait_web(self) -> None:
        async def answers() -> bool:
            try:
                envelope = await self.conduit("conduit.ping", {}, token=None)
            except Exception:  # noqa: BLE001 - not listening yet
                return False
            return envelope.get("error_code") is None

        web = self.web
        assert web is not None, "start the web server first"
        deadline = reactor.seconds() + BOUND
        while not await answers():
            web.require_alive()
            if reactor.seconds() > deadline:
                raise AssertionError(
                    f"Phorge's web server did not answer:\n{web.log_text()[-3000:]}"
                )
            await deferLater(reactor, STEP)

    async def conduit(self, method: str, params: dict, token: str | None) -> dict:
        """One Conduit call the way Arcanist and gorge-worker make it; the envelope."""
        params = {**params, "__conduit__": {"token": token} if token else {}}
        response = await treq.post(
            f"{self.base_uri}/api/{method}",
            data={"params": json.dumps(params), "output": "json"},
            timeout=120,
        )
        return json.loads(await response.content())

    async def call(self, method: str, params: dict, token: str) -> Any:
        envelope = await self.conduit(method, params, token)
        if envelope.get("error_code"):
            raise PhorgeError(f"{method}: [{envelope['error_code']}] {envelope.get('error_info')}")
        return envelope["result"]

    # -- daemons (Phorge's own) --------------------------------------------------

    async def phd_stop(self) -> None:
        await self.bin("phd", "stop", check=False)

    def close(self) -> None:
        if self.web is not None:
            self.web.stop()
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
        # The instance's daemons, if the caller left them running.
        subprocess.run(
            [str(self.checkout.root / "bin" / "phd"), "stop"],
            env=self.env,
            cwd=self.checkout.root,
            capture_output=True,
            timeout=120,
        )
