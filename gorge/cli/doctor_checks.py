"""The prerequisites of docs/phorge.md, one function each, on a
:class:`Site` read once. Every function returns its :class:`Check`s and
never raises for what it finds: a broken site is an answer, not a crash."""

from __future__ import annotations

import ipaddress
import json
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gorge.cli.apiclient import Refused, ServiceUnavailable
from gorge.cli.doctor_grants import DDL, parse_grants
from gorge.cli.doctor_report import OK, Check, fail, ok, skip, warn
from gorge.cli.doctor_site import LIBRARY, TOKEN_PROBE, Daemon, PhorgeView
from gorge.cli.doctor_version import check_version
from gorge.config import ConfigError, MySQLSettings
from gorge.webhook import silent as webhook_silent
from gorge.webhook.settings import WebhookSettings, load_webhook_settings

GUIDE = "docs/phorge.md"
WORKER_TABLES = ("worker_activetask", "worker_archivetask", "worker_taskdata", "lisk_counter")
QUEUE_NEEDS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


@dataclass
class Site:
    """Both sides of the site, as read at the start of the run."""

    daemons: Mapping[str, Daemon]
    phorge: PhorgeView | None
    phorge_problem: str  # why there is no PhorgeView ("" when there is one)
    timeout: float = 10.0
    # Answers already fetched (worker stats), so each is asked once.
    cache: dict[str, Any] = field(default_factory=dict)

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
        webhook = self.daemons.get("webhook")
        if webhook is None:
            return None
        return load_webhook_settings(webhook.env)


def _needs_phorge(site: Site, name: str) -> Check | None:
    if site.phorge is None:
        return skip(name, f"Phorge's configuration not read ({site.phorge_problem})")
    return None


def _webhook_against_phorge(site: Site, name: str) -> WebhookSettings | list[Check]:
    """gorge-webhook's settings for a check that compares them with Phorge's,
    or that check's whole answer when there is nothing to compare: no
    gorge-webhook here, Phorge's side unread, or settings that do not load."""
    if "webhook" not in site.daemons:
        return []
    if (skipped := _needs_phorge(site, name)) is not None:
        return [skipped]
    try:
        webhook = site.webhook_settings()
    except ConfigError as e:
        return [fail(name, f"gorge-webhook's settings: {e}", "correct webhook.env")]
    assert webhook is not None
    return webhook


# -- the daemons ------------------------------------------------------------------


def check_daemons(site: Site) -> list[Check]:
    """Each deployed daemon ready with its token, then (when it is) the API
    version it speaks (gorge/cli/doctor_version.py)."""
    library_needs = site.phorge.gorge_api_version if site.phorge is not None else None
    checks = []
    for daemon in site.daemons.values():
        ready = _daemon(daemon, site.timeout)
        checks.append(ready)
        if ready.status == OK:
            checks.append(check_version(daemon, site.timeout, library_needs))
    for name in ("taskqueue", "worker"):
        if name not in site.daemons:
            checks.append(
                fail(
                    f"gorge-{name}",
                    "not deployed (no settings file)",
                    f"create {name}.env from conf/{name}.env.example ({GUIDE}, before you start)",
                )
            )
    return checks


def _daemon(daemon: Daemon, timeout: float) -> Check:
    name = daemon.product
    unit = f"systemctl status {name}; its log says why"
    try:
        status, body = daemon.plain_get("/readyz", timeout)
    except OSError as e:
        reason = getattr(e, "reason", e)
        return fail(
            name, f"no answer at {daemon.url} ({reason})", f"start it: systemctl start {name}"
        )
    if status != 200:
        reason = body.get("reason") if isinstance(body, dict) else None
        return fail(name, f"not ready at {daemon.url}: {reason or f'HTTP {status}'}", unit)
    try:
        daemon.api(timeout).get(TOKEN_PROBE[daemon.name])
    except ServiceUnavailable as e:
        return fail(
            name,
            str(e),
            f"GORGE_SERVICE_TOKEN in {daemon.name}.env must be the running daemon's; "
            f"restart it after changing the file",
        )
    except Refused as e:
        return fail(name, f"refused the doctor's call: {e.message}", unit)
    return ok(name, f"ready at {daemon.url}, service token accepted")


# -- Phorge's side ------------------------------------------------------------------


def check_library(site: Site) -> list[Check]:
    name = "library"
    if (skipped := _needs_phorge(site, name)) is not None:
        return [skipped]
    assert site.phorge is not None
    libraries = site.setting("load-libraries") or []
    fix = (
        f"./bin/config set load-libraries '{json.dumps([*_as_list(libraries), str(LIBRARY)])}'"
        " (keep the entries already there)"
    )
    if not site.phorge.gorge_loaded:
        return [
            fail(name, f"Phorge does not load the gorge library (load-libraries: {libraries})", fix)
        ]
    if not (site.phorge.worker_execute and site.phorge.gorge_mailer):
        return [
            fail(name, "the gorge library loaded without worker.execute or the mail adapter", fix)
        ]
    return [ok(name, "Phorge loads the gorge library (worker.execute, the gorge mailer)")]


def _as_list(value: Any) -> list:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list) else []


def check_taskmasters(site: Site) -> list[Check]:
    name = "taskmasters"
    if (skipped := _needs_phorge(site, name)) is not None:
        return [skipped]
    assert site.phorge is not None
    count = site.setting("phd.taskmasters")
    if count != 0:
        return [
            fail(
                name,
                f"phd.taskmasters is {count}: Phorge's taskmasters run tasks beside gorge-worker",
                "./bin/config set phd.taskmasters 0; ./bin/phd stop; ./bin/phd start --keep-leases",
            )
        ]
    running = site.phorge.running_taskmasters
    if running:
        return [
            fail(
                name,
                f"phd.taskmasters is 0 but {running} taskmaster daemon(s) still run",
                "./bin/phd stop; ./bin/phd start --keep-leases",
            )
        ]
    return [ok(name, "phd.taskmasters is 0 and no taskmaster runs")]


def check_namespace(site: Site) -> list[Check]:
    name = "namespace"
    ours: dict[str, str] = {}
    queue = site.daemons.get("taskqueue")
    if queue is not None:
        ours["GORGE_TASKQUEUE_NAMESPACE"] = queue.env.get("GORGE_TASKQUEUE_NAMESPACE") or "phorge"
    try:
        webhook = site.webhook_settings()
    except ConfigError as e:
        return [fail(name, f"gorge-webhook's settings: {e}", "correct webhook.env")]
    if webhook is not None:
        ours["GORGE_WEBHOOK_NAMESPACE"] = webhook.namespace
    if site.phorge is None:
        values = set(ours.values())
        if len(values) > 1:
            return [
                fail(name, f"the daemons disagree: {ours}", "set both to storage.default-namespace")
            ]
        return [skip(name, f"Phorge's configuration not read ({site.phorge_problem})")]
    phorge = site.setting("storage.default-namespace")
    wrong = {k: v for k, v in ours.items() if v != phorge}
    if wrong:
        settings = ", ".join(f"{k}={v}" for k, v in wrong.items())
        return [
            fail(
                name,
                f"storage.default-namespace is {phorge!r} but {settings}",
                f"set {' and '.join(wrong)} to {phorge} and restart the daemon(s)",
            )
        ]
    return [ok(name, f"{phorge!r} everywhere")]


# -- database grants --------------------------------------------------------------


def check_grants(site: Site, connect: Callable[[MySQLSettings], Any]) -> list[Check]:
    checks = []
    queue = site.daemons.get("taskqueue")
    if queue is not None:
        backend = queue.env.get("GORGE_TASKQUEUE_BACKEND") or "mysql"
        if backend != "mysql":
            checks.append(
                fail(
                    "grants.taskqueue",
                    f"GORGE_TASKQUEUE_BACKEND={backend}: stock Phorge writes its tasks to MySQL",
                    "GORGE_TASKQUEUE_BACKEND=mysql",
                )
            )
        else:
            from gorge.taskqueue.settings import load_taskqueue_settings

            try:
                mysql = load_taskqueue_settings(queue.env).mysql
            except ConfigError as e:
                return [
                    fail(
                        "grants.taskqueue",
                        f"gorge-taskqueue's settings: {e}",
                        "correct taskqueue.env",
                    )
                ]
            needs = {table: QUEUE_NEEDS for table in WORKER_TABLES}
            checks.append(_grants("grants.taskqueue", mysql, needs, connect))
    try:
        webhook = site.webhook_settings()
    except ConfigError:
        webhook = None  # check_namespace names it
    if webhook is not None:
        hook_needs = {
            "herald_webhook": frozenset({"SELECT"}),
            "herald_webhookrequest": frozenset({"SELECT", "UPDATE"}),
        }
        checks.append(_grants("grants.webhook", webhook.mysql, hook_needs, connect))
    return checks


def _grants(name: str, mysql: MySQLSettings, needs: Mapping[str, frozenset[str]], connect) -> Check:
    account = f"{mysql.user}@{mysql.host}:{mysql.port}"
    try:
        connection = connect(mysql)
    except Exception as e:  # noqa: BLE001 - any driver error is the answer
        from gorge.db.mysql import error_reason

        return fail(
            name,
            f"{account} cannot open {mysql.database}: {error_reason(e)}",
            f"check the MySQL settings and that {mysql.database} exists (the namespace)",
        )
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW GRANTS FOR CURRENT_USER()")
            lines = [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()
    grants = parse_grants(lines)
    missing = []
    ddl: set[str] = set()
    for table, privileges in needs.items():
        held = grants.on(mysql.database, table)
        lacking = privileges - held
        if lacking:
            missing.append(f"{', '.join(sorted(lacking))} on {table}")
        ddl |= held & DDL
    if missing:
        via_roles = " (grants through roles are not followed)" if grants.roles else ""
        return fail(
            name,
            f"{account} lacks {'; '.join(missing)} in {mysql.database}{via_roles}",
            f"GRANT {', '.join(sorted(set().union(*needs.values())))} ON `{mysql.database}`.* "
            f"TO the daemon's account",
        )
    if ddl:
        return warn(
            name,
            f"{account} may also {', '.join(sorted(ddl))} in {mysql.database}",
            "the schema is Phorge's: give the daemon's account no DDL rights",
        )
    return ok(name, f"{account} has what it needs in {mysql.database}, no DDL")


# -- the Conduit bot ----------------------------------------------------------------


def check_conduit_bot(site: Site, post: Callable[[str, dict], dict]) -> list[Check]:
    name = "conduit-bot"
    worker = site.daemons.get("worker")
    if worker is None:
        return []
    url = worker.env.get("GORGE_WORKER_CONDUIT_URL", "")
    token = worker.env.get("GORGE_WORKER_CONDUIT_TOKEN", "")
    if not url:
        if worker.env.get("GORGE_WORKER_PHORGE_ROOT"):
            return [
                skip(
                    name,
                    "PHP tasks run in local executors (GORGE_WORKER_PHORGE_ROOT); no bot needed",
                )
            ]
        return [skip(name, "gorge-worker runs no PHP (neither executors nor Conduit)")]
    base = url.rstrip("/")
    try:
        answer = post(
            f"{base}/api/worker.execute", {"taskClass": "", "__conduit__": {"token": token}}
        )
    except OSError as e:
        return [fail(name, f"cannot reach Phorge at {base}: {e}", "check GORGE_WORKER_CONDUIT_URL")]
    code = answer.get("error_code")
    info = answer.get("error_info") or ""
    if code == "ERR-NO-TASK-CLASS":
        who = ""
        try:
            me = post(f"{base}/api/user.whoami", {"__conduit__": {"token": token}})
            if isinstance(me.get("result"), dict):
                who = f" as {me['result'].get('userName')}"
        except OSError:
            pass
        return [ok(name, f"the token calls worker.execute{who} (an administrator)")]
    fixes = {
        "ERR-NOT-ADMIN": "the bot is no administrator: ./bin/user empower --user <bot>",
        "ERR-INVALID-AUTH": "the token is wrong or revoked: generate a new one for the bot "
        "and set GORGE_WORKER_CONDUIT_TOKEN",
        "ERR-CONDUIT-CALL": "Phorge's web server has not loaded the library (load-libraries) "
        "or it is older than gorge-worker",
    }
    return [
        fail(
            name,
            f"worker.execute answered [{code}] {info}".strip(),
            fixes.get(code or "", f"see {GUIDE}, step 2"),
        )
    ]


def conduit_post(timeout: float) -> Callable[[str, dict], dict]:
    def post(url: str, params: dict) -> dict:
        body = urllib.parse.urlencode({"params": json.dumps(params), "output": "json"}).encode()
        request = urllib.request.Request(url, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        try:
            answer = json.loads(raw)
        except ValueError:
            raise OSError(f"{url} answered without Conduit's JSON") from None
        return answer if isinstance(answer, dict) else {}

    return post


# -- webhooks -----------------------------------------------------------------------


def check_webhook_owner(site: Site) -> list[Check]:
    name = "webhook-owner"
    worker = site.daemons.get("worker")
    if worker is None:
        return []
    stats = site.worker_stats()
    owner = stats.get("webhookOwner") if isinstance(stats, dict) else None
    source = "gorge-worker reports"
    if not isinstance(owner, str):
        owner = worker.env.get("GORGE_WORKER_WEBHOOK_OWNER", "")
        source = "worker.env says"
    deployed = "webhook" in site.daemons
    if deployed and owner != "gorge-webhook":
        return [
            fail(
                name,
                f"gorge-webhook is deployed but {source} GORGE_WORKER_WEBHOOK_OWNER={owner!r}: "
                "Phorge's HeraldWebhookWorker would deliver beside it",
                "GORGE_WORKER_WEBHOOK_OWNER=gorge-webhook in worker.env, restart gorge-worker",
            )
        ]
    if not deployed and owner == "gorge-webhook":
        return [
            fail(
                name,
                f"{source} GORGE_WORKER_WEBHOOK_OWNER=gorge-webhook but gorge-webhook is not "
                "deployed: no one delivers webhooks",
                "deploy gorge-webhook (webhook.env), or GORGE_WORKER_WEBHOOK_OWNER=phorge",
            )
        ]
    named = _daemons_setting(site)
    if named is not None and ("webhook" in named) != deployed:
        return [
            fail(
                name,
                f"gorge.daemons {'names' if 'webhook' in named else 'leaves out'} gorge-webhook, "
                f"which is {'' if deployed else 'not '}deployed: Phorge's setup check disagrees",
                "make gorge.daemons name exactly the deployed daemons "
                "(./bin/config set gorge.daemons)",
            )
        ]
    return [
        ok(
            name,
            f"{source} {owner or 'unset'}, "
            f"gorge-webhook {'deployed' if deployed else 'not deployed'}",
        )
    ]


def _daemons_setting(site: Site) -> dict | None:
    if site.phorge is None:
        return None
    value = site.setting("gorge.daemons")
    return value if isinstance(value, dict) and value else None


def _networks(items: Any) -> set | None:
    try:
        return {ipaddress.ip_network(str(item), strict=False) for item in items or ()}
    except ValueError:
        return None


def _few(items: list[str]) -> str:
    return ", ".join(items[:4]) + (" ..." if len(items) > 4 else "")


def check_outbound_policy(site: Site) -> list[Check]:
    name = "outbound-policy"
    webhook = _webhook_against_phorge(site, name)
    if isinstance(webhook, list):
        return webhook
    phorge = _networks(site.setting("security.outbound-blacklist"))
    ours = set(webhook.outbound_blacklist)
    if phorge is None:
        return [fail(name, "security.outbound-blacklist is not a list of networks", "correct it")]
    if phorge == ours:
        return [ok(name, f"gorge-webhook refuses the same {len(ours)} networks as Phorge")]
    only_phorge = sorted(str(n) for n in phorge - ours)
    only_ours = sorted(str(n) for n in ours - phorge)
    parts = []
    if only_phorge:
        parts.append(f"Phorge refuses {_few(only_phorge)} and gorge-webhook does not")
    if only_ours:
        parts.append(f"gorge-webhook refuses {_few(only_ours)} and Phorge does not")
    value = ",".join(str(n) for n in sorted(phorge, key=str)) or "none"
    return [
        fail(
            name,
            "; ".join(parts),
            f"GORGE_WEBHOOK_OUTBOUND_BLACKLIST={value} in webhook.env "
            "(empty for Phorge's default), restart gorge-webhook",
        )
    ]


def read_silent(settings: WebhookSettings, connect) -> tuple[bool, str]:
    """``phabricator.silent`` where gorge-webhook reads it (gorge/webhook/silent.py)."""
    if webhook_silent.SOURCE_DATABASE in settings.silent_from:
        import dataclasses

        conn = connect(dataclasses.replace(settings.mysql, database=settings.config_database))
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    webhook_silent.SQL_SILENT.format(database=settings.config_database),
                    (webhook_silent.CONFIG_NAMESPACE, webhook_silent.KEY),
                )
                rows = cursor.fetchall()
        finally:
            conn.close()
        if rows:
            raw = rows[0][0]
            text = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
            return webhook_silent.php_truthy(json.loads(text)), "database"
    if webhook_silent.SOURCE_LOCAL in settings.silent_from and settings.phorge_root:
        path = Path(settings.phorge_root) / webhook_silent.LOCAL_JSON
        if path.exists():
            document = json.loads(path.read_text())
            if isinstance(document, dict) and webhook_silent.KEY in document:
                return webhook_silent.php_truthy(document[webhook_silent.KEY]), "local"
    return False, "default"


def check_silent(site: Site, connect) -> list[Check]:
    name = "silent"
    webhook = _webhook_against_phorge(site, name)
    if isinstance(webhook, list):
        return webhook
    phorge = webhook_silent.php_truthy(site.setting("phabricator.silent"))
    try:
        ours, source = read_silent(webhook, connect)
    except Exception as e:  # noqa: BLE001 - unreadable is the answer
        return [
            fail(
                name,
                f"cannot read phabricator.silent where gorge-webhook does: {e}",
                "see docs/webhook.md, Silent mode",
            )
        ]
    sources = ",".join(webhook.silent_from) or "none"
    if phorge == ours:
        return [
            ok(
                name,
                f"phabricator.silent is {str(phorge).lower()} "
                f"for Phorge and gorge-webhook ({source})",
            )
        ]
    return [
        fail(
            name,
            f"Phorge is {'silent' if phorge else 'not silent'} but gorge-webhook reads "
            f"{str(ours).lower()} ({source}; GORGE_WEBHOOK_SILENT_FROM={sources}): "
            + (
                "it would deliver webhooks Phorge keeps back"
                if phorge
                else "it would fail every webhook"
            ),
            "set phabricator.silent with ./bin/config set (local or database, where gorge-webhook "
            "reads it; GORGE_WEBHOOK_PHORGE_ROOT for local.json), not in an environment file",
        )
    ]


# -- mail ---------------------------------------------------------------------------


def mailer_order(mailers: list) -> list[dict]:
    """Outbound mailers in the order Phorge tries them (PhabricatorMetaMTAMail::newMailers):
    by ``priority``, highest first; without one, -1, -2, ... in list order. Mailers of one
    priority are shuffled, so the order is a list of groups flattened."""
    next_priority = -1
    ranked = []
    for spec in mailers:
        if not isinstance(spec, dict):
            continue
        priority = spec.get("priority")
        if not priority:
            priority = next_priority
            next_priority -= 1
        if spec.get("outbound", True):
            ranked.append({**spec, "_priority": priority})
    return sorted(ranked, key=lambda s: -s["_priority"])


def check_mailer(site: Site) -> list[Check]:
    name = "mailer"
    if "mailer" not in site.daemons:
        return []
    if (skipped := _needs_phorge(site, name)) is not None:
        return [skipped]
    mailer = site.daemons["mailer"]
    mailers = site.setting("cluster.mailers") or []
    ordered = mailer_order(mailers if isinstance(mailers, list) else [])
    ours = [s for s in ordered if s.get("type") == "gorge"]
    entry_fix = f"add an entry of type gorge first in cluster.mailers ({GUIDE}, step 3)"
    if not ours:
        return [
            fail(
                name,
                "cluster.mailers has no entry of type gorge: Phorge sends mail itself",
                entry_fix,
            )
        ]
    first = ours[0]
    if ordered[0] is not first and ordered[0]["_priority"] >= first["_priority"]:
        tied = ordered[0]["_priority"] == first["_priority"]
        return [
            fail(
                name,
                f"Phorge tries {ordered[0].get('key')!r} "
                f"{'as often as' if tied else 'before'} the gorge entry",
                "put the gorge entry first (or give it the highest priority)",
            )
        ]
    options = first.get("options") or {}
    uri = str(options.get("uri", "")).rstrip("/")
    if uri != mailer.url:
        return [
            fail(
                name,
                f"the gorge entry's uri is {uri!r}, gorge-mailer listens at {mailer.url}",
                f"set its uri to {mailer.url}",
            )
        ]
    if str(options.get("token", "")) != mailer.token:
        return [
            fail(
                name,
                "the gorge entry's token is not gorge-mailer's GORGE_SERVICE_TOKEN",
                "copy mailer.env's GORGE_SERVICE_TOKEN into the entry's options.token",
            )
        ]
    return [
        ok(
            name,
            f"{first.get('key')!r} (type gorge, {mailer.url}) is the first mailer Phorge tries",
        )
    ]
