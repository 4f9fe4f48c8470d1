"""How ``gorge doctor`` reads the two sides of a switched-over site.

gorge's side: the daemons' own settings files, read as the systemd units
read them (``gorge.env``, then the daemon's ``<service>.env``, which wins),
and each daemon's HTTP API at the address and with the token those files
give it. A daemon counts as deployed when its ``<service>.env`` exists.

Phorge's side: ``phorge/scripts/gorge-doctor.php`` run with Phorge's
checkout, which loads Phorge as its own scripts do and reports the
effective value of each setting (``bin/config get`` shows only the local
and database sources, not an environment file or the default), the
libraries Phorge loaded, and the taskmasters its daemon log has running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gorge.cli.apiclient import ApiClient, Refused, ServiceUnavailable
from gorge.cli.doctor.report import Check, fail, skip
from gorge.config import ConfigError
from gorge.taskqueue.settings import TaskQueueSettings, load_taskqueue_settings
from gorge.webhook.settings import WebhookSettings, load_webhook_settings

SERVICES = ("taskqueue", "worker", "webhook", "mailer")
DEFAULT_LISTEN = {"taskqueue": ":8090", "worker": ":8170", "webhook": ":8160", "mailer": ":8110"}
API_PREFIX = {"taskqueue": "queue", "worker": "worker", "webhook": "webhook", "mailer": "mailer"}
# A cheap call under each API that needs the service token.
TOKEN_PROBE = {"taskqueue": "stats", "worker": "stats", "webhook": "stats", "mailer": "mailers"}
SHARED_FILE = "gorge.env"
DEFAULT_ENV_DIR = "/etc/gorge"
# Beside the gorge package, as the worker finds its executor script.
LIBRARY = Path(__file__).resolve().parents[3] / "phorge" / "src"
DOCTOR_SCRIPT = Path(__file__).resolve().parents[3] / "phorge" / "scripts" / "gorge-doctor.php"

# How the daemons whose settings a check compares load them at start-up;
# the doctor loads them the same way, from the same files.
SettingsLoader = Callable[[Mapping[str, str]], Any]
LOADERS: Mapping[str, SettingsLoader] = {
    "taskqueue": load_taskqueue_settings,
    "webhook": load_webhook_settings,
}

_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)\Z")


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= and docker's --env-file
    take them: blank lines and ``#``/``;`` comments skipped, one pair of
    surrounding quotes removed."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        key, value = match.group(1), match.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key] = value
    return values


class SiteUnreadable(Exception):
    """The site's configuration cannot be read at all; the message says why."""


def read_env_dir(directory: Path) -> dict[str, dict[str, str]]:
    """Each deployed daemon's environment: the shared file, then its own."""
    if not directory.is_dir():
        raise SiteUnreadable(f"{directory} is not a directory (set --env-dir)")
    shared_path = directory / SHARED_FILE
    try:
        shared = parse_env_file(shared_path.read_text()) if shared_path.exists() else {}
        environments = {}
        for name in SERVICES:
            own = directory / f"{name}.env"
            if own.exists():
                environments[name] = {**shared, **parse_env_file(own.read_text())}
    except OSError as e:
        raise SiteUnreadable(f"cannot read the settings in {directory}: {e.strerror}") from None
    if not environments:
        raise SiteUnreadable(
            f"no daemon's settings in {directory} (taskqueue.env, worker.env, webhook.env, "
            "mailer.env; see conf/*.env.example)"
        )
    return environments


def base_url(name: str, env: Mapping[str, str]) -> str:
    """Where the daemon listens, as a URL a client on this host can use."""
    listen = env.get("GORGE_LISTEN_ADDR") or DEFAULT_LISTEN[name]
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if env.get("GORGE_TLS_CERT") else "http"
    return f"{scheme}://{host}:{port}"


@dataclass(frozen=True)
class Daemon:
    """One deployed daemon: its settings, address and token."""

    name: str
    env: Mapping[str, str] = field(repr=False)
    url: str
    token: str = field(default="", repr=False)

    @property
    def product(self) -> str:
        return f"gorge-{self.name}"

    def api(self, timeout: float) -> ApiClient:
        return ApiClient(
            self.url,
            f"/api/{API_PREFIX[self.name]}/",
            noun=self.product,
            product=self.product,
            token=self.token,
            timeout=timeout,
        )

    def plain_get(self, path: str, timeout: float) -> tuple[int, Any]:
        """A GET outside the API envelope (``/readyz``, ``/version``): status, JSON or None."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, None


def daemons_of(environments: Mapping[str, Mapping[str, str]]) -> dict[str, Daemon]:
    return {
        name: Daemon(name, env, base_url(name, env), env.get("GORGE_SERVICE_TOKEN", ""))
        for name, env in environments.items()
    }


@dataclass(frozen=True)
class PhorgeView:
    """What Phorge itself reports (gorge-doctor.php config)."""

    config: Mapping[str, Any]
    libraries: tuple[str, ...]
    worker_execute: bool
    gorge_mailer: bool
    running_taskmasters: int
    # GorgeDaemon::REQUIRED_API_VERSION when the library is loaded.
    gorge_api_version: str | None = None

    @property
    def gorge_loaded(self) -> bool:
        return "gorge" in self.libraries


class PhorgeScript:
    """Runs ``gorge-doctor.php`` with a Phorge checkout, in Phorge's environment
    (``PHABRICATOR_ENV`` as bin/phd has it)."""

    def __init__(
        self, root: Path, php: str, environ: Mapping[str, str], timeout: float = 120.0
    ) -> None:
        self.root = root
        self.php = php
        self.environ = dict(environ)
        self.timeout = timeout

    def run(self, command: str, params: Mapping[str, Any] | None = None) -> dict:
        # Checked here too, not only by the script: a wrong --phorge-root is
        # the likelier mistake, and it must be named even where PHP is missing.
        if not (self.root / "scripts" / "init" / "init-script.php").is_file():
            raise SiteUnreadable(
                f"{self.root} is not a Phorge checkout (no scripts/init/init-script.php)"
            )
        argv = [self.php, str(DOCTOR_SCRIPT), str(self.root), command]
        if params is not None:
            argv.append(json.dumps(params))
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self.environ,
                cwd=self.root,
                timeout=self.timeout,
            )
        except FileNotFoundError:
            raise SiteUnreadable(f"no PHP at {self.php!r} (set --php)") from None
        except subprocess.TimeoutExpired:
            raise SiteUnreadable(f"Phorge did not load within {self.timeout:g}s") from None
        lines = done.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            said = (done.stderr or done.stdout).strip().splitlines()
            raise SiteUnreadable(
                f"Phorge at {self.root} did not answer (exit {done.returncode}): "
                f"{said[-1] if said else 'no output'}"
            )
        if "error" in answer:
            raise SiteUnreadable(f"Phorge at {self.root}: {answer['error']}")
        return answer

    def view(self) -> PhorgeView:
        answer = self.run("config")
        return PhorgeView(
            config=answer.get("config") or {},
            libraries=tuple(answer.get("libraries") or ()),
            worker_execute=bool(answer.get("workerExecute")),
            gorge_mailer=bool(answer.get("gorgeMailer")),
            running_taskmasters=int(answer.get("runningTaskmasters") or 0),
            gorge_api_version=(
                str(answer["gorgeApiVersion"]) if answer.get("gorgeApiVersion") else None
            ),
        )


def phorge_environ(base: Mapping[str, str], phorge_env: str) -> dict[str, str]:
    """The doctor's own environment for Phorge's PHP, with ``--phorge-env``."""
    environ = {k: v for k, v in base.items() if not k.startswith("GORGE_")}
    if phorge_env:
        environ["PHABRICATOR_ENV"] = phorge_env
    return environ


def default_phorge_root(environments: Mapping[str, Mapping[str, str]]) -> str:
    """The checkout gorge-worker's executors or gorge-webhook already name."""
    for name, setting in (
        ("worker", "GORGE_WORKER_PHORGE_ROOT"),
        ("webhook", "GORGE_WEBHOOK_PHORGE_ROOT"),
    ):
        value = environments.get(name, {}).get(setting, "")
        if value:
            return value
    return ""


def existing(path: str) -> str:
    return path if path and os.path.isdir(path) else ""


@dataclass
class Site:
    """Both sides of the site, as read at the start of the run."""

    daemons: Mapping[str, Daemon]
    phorge: PhorgeView | None
    phorge_problem: str  # why there is no PhorgeView ("" when there is one)
    timeout: float = 10.0
    # Answers already fetched (worker stats), so each is asked once.
    cache: dict[str, Any] = field(default_factory=dict)
    loaders: Mapping[str, SettingsLoader] = field(default_factory=lambda: dict(LOADERS))
    # Each daemon's settings (or the ConfigError they gave) once loaded: the
    # checks share one load per run, as the daemon itself loads them once.
    _settings: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def setting(self, key: str) -> Any:
        assert self.phorge is not None
        return self.phorge.config.get(key)

    def worker_stats(self) -> dict | None:
        if "worker-stats" not in self.cache:
            worker = self.daemons.get("worker")
            stats = None
            if worker is not None:
                try:
                    stats = worker.api(self.timeout).get("stats")
                except (ServiceUnavailable, Refused):
                    stats = None
            self.cache["worker-stats"] = stats
        return self.cache["worker-stats"]

    def webhook_settings(self) -> WebhookSettings | None:
        """gorge-webhook's settings, None when it is not deployed; raises
        ConfigError when they do not load."""
        return self._settings_of("webhook")

    def taskqueue_settings(self) -> TaskQueueSettings | None:
        """gorge-taskqueue's settings, as :meth:`webhook_settings`."""
        return self._settings_of("taskqueue")

    def _settings_of(self, name: str) -> Any:
        daemon = self.daemons.get(name)
        if daemon is None:
            return None
        if name not in self._settings:
            try:
                self._settings[name] = self.loaders[name](daemon.env)
            except ConfigError as e:
                self._settings[name] = e
        loaded = self._settings[name]
        if isinstance(loaded, ConfigError):
            raise loaded
        return loaded


def needs_phorge(site: Site, name: str) -> Check | None:
    if site.phorge is None:
        return skip(name, f"Phorge's configuration not read ({site.phorge_problem})")
    return None


def webhook_against_phorge(site: Site, name: str) -> WebhookSettings | list[Check]:
    """gorge-webhook's settings for a check that compares them with Phorge's,
    or that check's whole answer when there is nothing to compare: no
    gorge-webhook here, Phorge's side unread, or settings that do not load."""
    if "webhook" not in site.daemons:
        return []
    if (skipped := needs_phorge(site, name)) is not None:
        return [skipped]
    try:
        webhook = site.webhook_settings()
    except ConfigError as e:
        return [fail(name, f"gorge-webhook's settings: {e}", "correct webhook.env")]
    assert webhook is not None
    return webhook
