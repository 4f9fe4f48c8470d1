"""The canaries of ``gorge doctor``: real work sent through the switched-over
site and watched to its end.

* task: ``PhabricatorTestWorker`` enqueued on gorge-taskqueue, leased and
  completed by gorge-worker (natively with GORGE_WORKER_NATIVE_TEST_WORKER,
  else in PHP: the path every delegated task takes) and archived as a
  success under one of gorge-worker's lease owners;
* webhook: Phorge's Herald webhook "gorge doctor canary" pointed at a
  receiver the doctor listens with, one test request queued the way
  Herald's "New Test Request" does, delivered by gorge-webhook, the POST's
  ``X-Phabricator-Webhook-Signature`` checked against the hook's HMAC key;
  the hook is disabled again afterwards;
* mail (only with ``--mail-to``): ``bin/mail send-test --mailer gorge``, so
  the mail goes through Phorge's adapter and gorge-mailer to the address.

Waits are bounded by ``--timeout``; the clock and the pause are injected."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gorge.cli.apiclient import Refused, ServiceUnavailable
from gorge.cli.doctor.report import Check, fail, ok, skip
from gorge.cli.doctor.site import PhorgeScript, Site, SiteUnreadable

CANARY_CLASS = "PhabricatorTestWorker"
SIGNATURE_HEADER = "X-Phabricator-Webhook-Signature"


@dataclass
class Waiting:
    """Bounded polling: ``clock`` (seconds), ``pause`` (sleep) and the bound."""

    clock: Callable[[], float]
    pause: Callable[[float], None]
    bound: float
    step: float = 0.25

    def until(self, check: Callable[[], Any]) -> Any:
        deadline = self.clock() + self.bound
        while True:
            value = check()
            if value or self.clock() >= deadline:
                return value
            self.pause(self.step)


def task_canary(site: Site, waiting: Waiting) -> list[Check]:
    name = "canary.task"
    queue = site.daemons.get("taskqueue")
    if queue is None or "worker" not in site.daemons:
        return [skip(name, "needs gorge-taskqueue and gorge-worker")]
    api = queue.api(site.timeout)
    try:
        task = api.post("enqueue", {"taskClass": CANARY_CLASS, "data": "{}"})
    except (ServiceUnavailable, Refused) as e:
        return [fail(name, f"enqueue refused: {e}", "see gorge-taskqueue's log")]
    task_id = task["id"]

    def archived() -> dict | None:
        try:
            return api.get(f"archived/{task_id}")
        except Refused:
            return None  # 404: not archived yet
        except ServiceUnavailable:
            return None

    row = waiting.until(archived)
    if not row:
        return [
            fail(
                name,
                f"task {task_id} ({CANARY_CLASS}) not completed within {waiting.bound:g}s",
                "is gorge-worker leasing? see its /readyz and log "
                f"(WORKER_TASK_OUTCOME task_id={task_id})",
            )
        ]
    owner = row.get("leaseOwner") or ""
    if row.get("result") != 0:
        return [
            fail(
                name,
                f"task {task_id} archived with result {row.get('result')} (not success)",
                f"see gorge-worker's log for task_id={task_id}",
            )
        ]
    # gorge-worker's lease owners are "<host>:<pid>:<start>:gorge-worker:<lease call>".
    if ":gorge-worker" not in owner:
        return [
            fail(
                name,
                f"task {task_id} was completed by {owner!r}, not gorge-worker",
                "stop Phorge's taskmasters (phd.taskmasters 0)",
            )
        ]
    return [
        ok(
            name,
            f"task {task_id} enqueued, leased and completed by gorge-worker "
            f"in {row.get('duration', 0)} us",
        )
    ]


@dataclass
class Receiver:
    """A one-purpose HTTP receiver on its own thread, for the webhook canary."""

    host: str
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                posts.append(({k: v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return None

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self._server.server_address[1]}/gorge-doctor"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def signature_ok(key: str, body: bytes, signature: str) -> bool:
    expected = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature.strip().lower())


def webhook_canary(
    site: Site, script: PhorgeScript | None, waiting: Waiting, listen: str
) -> list[Check]:
    name = "canary.webhook"
    if "webhook" not in site.daemons:
        return [skip(name, "gorge-webhook is not deployed")]
    if script is None or site.phorge is None:
        return [skip(name, f"needs Phorge's checkout ({site.phorge_problem or '--phorge-root'})")]
    try:
        settings = site.webhook_settings()
    except Exception as e:  # noqa: BLE001 - check_namespace names it
        return [skip(name, f"gorge-webhook's settings: {e}")]
    assert settings is not None
    address = ipaddress.ip_address(listen)
    if any(address in network for network in settings.outbound_blacklist):
        return [
            skip(
                name,
                f"gorge-webhook refuses {listen} (its outbound blacklist, as Phorge's): "
                "give --canary-listen an address of this host it may reach",
            )
        ]
    receiver = Receiver(listen)
    try:
        try:
            made = script.run("webhook-canary", {"uri": receiver.uri})
        except SiteUnreadable as e:
            return [fail(name, f"cannot create the test request: {e}", "see the message")]
        request_phid = made["requestPHID"]
        posted = waiting.until(lambda: receiver.posts)
        if not posted:
            state = _request_state(site, request_phid)
            return [
                fail(
                    name,
                    f"no POST for {request_phid} within {waiting.bound:g}s ({state})",
                    "see gorge-webhook's log for the request",
                )
            ]
        headers, body = posted[0]
        signature = {k.lower(): v for k, v in headers.items()}.get(SIGNATURE_HEADER.lower(), "")
        if not signature_ok(made["hmacKey"], body, signature):
            return [
                fail(
                    name,
                    f"the POST for {request_phid} carries a wrong signature",
                    "see docs/webhook.md",
                )
            ]
        if len(posted) > 1:
            return [
                fail(
                    name,
                    f"{len(posted)} POSTs for one request: delivered twice",
                    "check GORGE_WORKER_WEBHOOK_OWNER and phd.taskmasters",
                )
            ]
        return [ok(name, f"{request_phid} delivered once by gorge-webhook, signature verified")]
    finally:
        receiver.close()
        try:
            script.run("webhook-canary-off")
        except SiteUnreadable:
            pass


def _request_state(site: Site, phid: str) -> str:
    try:
        found = site.daemons["webhook"].api(site.timeout).get(f"requests/{phid}")
    except (ServiceUnavailable, Refused) as e:
        return f"gorge-webhook: {e}"
    return (
        f"status {found.get('status')}, last result {found.get('lastRequestResult')}, "
        f"error {found.get('errorType')}/{found.get('errorCode')}"
    )


def mail_canary(site: Site, root: Path | None, script: PhorgeScript | None, to: str) -> list[Check]:
    name = "canary.mail"
    if not to:
        return []
    if "mailer" not in site.daemons:
        return [skip(name, "gorge-mailer is not deployed")]
    if script is None or root is None:
        return [skip(name, f"needs Phorge's checkout ({site.phorge_problem or '--phorge-root'})")]
    done = subprocess.run(
        [
            str(root / "bin" / "mail"),
            "send-test",
            "--to",
            to,
            "--mailer",
            "gorge",
            "--subject",
            "gorge doctor test mail",
        ],
        input="Sent by gorge doctor through Phorge's gorge mailer and gorge-mailer.\n",
        capture_output=True,
        text=True,
        env=script.environ,
        cwd=root,
        timeout=script.timeout,
    )
    said = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode != 0:
        return [
            fail(
                name,
                f"bin/mail send-test failed: {said[-1] if said else done.returncode}",
                "see gorge-mailer's log (MAILER_*)",
            )
        ]
    return [
        ok(
            name,
            f"sent to {to} through gorge-mailer ({said[-1] if said else 'sent'}); "
            "check that it arrived",
        )
    ]
